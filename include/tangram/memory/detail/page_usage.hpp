// SPDX-License-Identifier: Apache-2.0
/**
 * @file memory/detail/page_usage.hpp
 * @brief How many pages a sequence's groups use, own alone or share, and the one footprint
 * computation of a turn (admission, next turn, fork) built on those counts.
 */
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>

#include "tangram/memory/detail/chunk_rules.hpp"
#include "tangram/memory/detail/group_lookup.hpp"
#include "tangram/memory/detail/head_lengths.hpp"
#include "tangram/memory/detail/page_table_storage.hpp"
#include "tangram/memory/detail/sequence_table.hpp"
#include "tangram/memory/detail/turn_footprint.hpp"
#include "tangram/plan/footprint.hpp"

namespace tangram::detail {

/// @brief The kinds of turn `page_usage::size_turn` sizes.
enum class turn_kind : std::uint8_t {
  admit,      ///< a new request of N prompt and T decode tokens
  next_turn,  ///< an ended session continues with N more prompt and T decode tokens
  fork,       ///< a child of a sequence in decode or ended
  restore,    ///< a parked session's next turn: its history held in fresh, exclusive pages
  prefix,     ///< a request over a pinned prefix: the next turn of a child sharing its pages
};

/**
 * @brief Read-only page counts over a manager's parts (it holds references to them, so it lives
 * inside the manager). Every query is noexcept and allocation-free.
 */
template <class Pool>
class page_usage {
 public:
  /// @param max_chunk_tokens the manager's chunk bound: a turn's pooled groups stage at most
  ///        min(max_chunk_tokens, its prompt) tokens before an eviction (elastic reservation)
  /// @param share_compressed_prefix manager_options::share_compressed_prefix
  page_usage(group_lookup const& groups,
             sequence_table const& sequences,
             page_table_storage const& page_table,
             head_lengths const& lengths,
             Pool const& pool,
             std::int64_t max_chunk_tokens,
             bool share_compressed_prefix = true) noexcept
      : groups_(groups),
        sequences_(sequences),
        page_table_(page_table),
        lengths_(lengths),
        pool_(pool),
        max_chunk_tokens_(max_chunk_tokens),
        share_compressed_prefix_(share_compressed_prefix) {}

  /// Pages group g of slot s holds while a chunk of c tokens (history n after it) is prepared: a
  /// static group its lengths after the chunk; a pooled group stages the chunk after its longest
  /// head (the eviction then picks its length).
  [[nodiscard]] std::int64_t pages_after_chunk(std::int32_t s,
                                               std::int32_t g,
                                               std::int64_t n,
                                               std::int64_t c) const noexcept {
    if (!groups_.pooled(g)) return groups_.pages_after(g, n);
    return groups_.pages_for(static_cast<std::int64_t>(page_table_.longest_base(s, g)) +
                             lengths_.appended(s) + c);
  }

  /// Pages a turn of `prompt_tokens` (>= 1) prompt tokens lets its pooled groups hold beyond
  /// their limit while a chunk is prepared: no chunk exceeds min(max_chunk_tokens, prompt).
  [[nodiscard]] std::int64_t staging_pages(std::int64_t prompt_tokens) const {
    return groups_.staging_pages(std::min(max_chunk_tokens_, prompt_tokens));
  }

  /// Pages the pooled groups of slot s still need to decode its remaining tokens: each grows to
  /// its longest base length plus the turn's T decode tokens.
  [[nodiscard]] std::int64_t pooled_decode_need(std::int32_t s) const noexcept {
    std::int64_t need = 0;
    for (auto g : groups_.pooled_groups())
      need += std::max<std::int64_t>(0, decode_end_pages(s, g) - page_table_.count(s, g));
    return need;
  }

  /// Pages group g of slot s uses for its current lengths: enough for its longest head, or the
  /// filled pages of a sliding ring.
  [[nodiscard]] std::int64_t in_use(std::int32_t s, std::int32_t g) const noexcept {
    if (groups_.is_sliding(g))
      return std::min<std::int64_t>(groups_.pages_for(lengths_.tokens(s)), groups_.ring_pages(g));
    return groups_.pages_for(static_cast<std::int64_t>(page_table_.longest_base(s, g)) +
                             lengths_.appended(s));
  }
  /// Pages of (s, g) after the first `keep` that only this sequence references: those a
  /// `page_flow::return_to_reservation(s, g, keep)` gives back to its reservation (a page a
  /// pending copy still reads stays referenced). Scans only the tail, and only after a fork.
  [[nodiscard]] std::int64_t exclusive_tail(std::int32_t s,
                                            std::int32_t g,
                                            std::int64_t keep) const noexcept {
    std::int64_t held = page_table_.count(s, g);
    if (keep >= held) return 0;
    if (!sequences_[s].may_share) return held - keep;
    std::int64_t count = 0;
    for (std::int64_t p = keep; p < held; ++p)
      count += pool_.ref_count(page_table_.entry(s, g, p)) == 1;
    return count;
  }
  /// Pages among the first `keep` of (s, g) that only this sequence references (all of them
  /// unless it was forked: the scan is skipped otherwise).
  [[nodiscard]] std::int64_t exclusive(std::int32_t s,
                                       std::int32_t g,
                                       std::int64_t keep) const noexcept {
    if (!sequences_[s].may_share) return keep;
    std::int64_t count = 0;
    for (std::int64_t p = 0; p < keep; ++p)
      count += pool_.ref_count(page_table_.entry(s, g, p)) == 1;
    return count;
  }
  /// Tokens flat head h of slot s may keep once the history reaches n with a chunk of c
  /// (`expected_kept` of chunk_rules.hpp; all candidates for a pooled head).
  [[nodiscard]] std::int64_t expected_kept(std::int32_t s,
                                           std::int32_t h,
                                           std::int64_t n,
                                           std::int64_t c) const noexcept {
    auto g = groups_.head_slot_of(h).group;
    return detail::expected_kept(groups_.head_rule_of(h),
                                 lengths_.held(s, h),
                                 n,
                                 c,
                                 groups_.pooled(g),
                                 page_table_.pinned(s, g));
  }
  /// Leading tokens flat head h of slot s keeps in place (its group's pinned prefix tokens).
  [[nodiscard]] std::int64_t pinned_tokens(std::int32_t s, std::int32_t h) const noexcept {
    return page_table_.pinned(s, groups_.head_slot_of(h).group);
  }
  /// Tokens flat head h of slot s holds (a sliding head: its window's share of the tokens seen).
  [[nodiscard]] std::int64_t head_tokens(std::int32_t s, std::int32_t h) const noexcept {
    auto g = groups_.head_slot_of(h).group;
    if (groups_.is_sliding(g)) return std::min<std::int64_t>(lengths_.tokens(s), groups_.window(g));
    return lengths_.held(s, h);
  }
  /// Leading pages of group g that every head has filled (never written again): shareable.
  [[nodiscard]] std::int64_t shareable(std::int32_t s, std::int32_t g) const noexcept {
    if (groups_.is_sliding(g)) return 0;
    return (static_cast<std::int64_t>(page_table_.shortest_base(s, g)) + lengths_.appended(s)) /
           groups_.page_tokens();
  }

  /// Leading pages of group g that no later turn writes: an append-only (uncompressed) group's
  /// shareable pages; a compressed group's pinned ones (a shared prefix's pages, which the
  /// eviction keeps in place); 0 otherwise (a ring wraps over its pages). A turn keeps these
  /// shared by reference instead of copying them.
  [[nodiscard]] std::int64_t unwritten(std::int32_t s, std::int32_t g) const noexcept {
    if (groups_.append_only(g)) return shareable(s, g);
    return page_table_.pinned(s, g) / groups_.page_tokens();
  }

  /// Checks slot s's pinned prefix tokens: per group a multiple of P, within the pages the list
  /// holds and at most every head's length; none in a sliding group.
  /// @throw logic_error naming the slot, the group and the values.
  void check_pinned(std::int32_t s) const {
    for (std::int32_t g = 0; g < groups_.num_groups(); ++g) {
      std::int64_t pin = page_table_.pinned(s, g), shortest = pin;
      if (!groups_.is_sliding(g))
        for (auto const* m = groups_.members_begin(g); m != groups_.members_end(g); ++m)
          shortest = std::min<std::int64_t>(shortest, lengths_.held(s, *m));
      TANGRAM_EXPECTS(pin == 0 || (pin > 0 && pin % groups_.page_tokens() == 0 &&
                                   pin <= static_cast<std::int64_t>(page_table_.count(s, g)) *
                                              groups_.page_tokens() &&
                                   shortest == pin && !groups_.is_sliding(g)),
                      logic_error,
                      "slot ",
                      s,
                      " group ",
                      g,
                      ": ",
                      pin,
                      " pinned tokens (",
                      page_table_.count(s, g),
                      " pages, shortest head ",
                      shortest,
                      ")");
    }
  }

  /// The most pinned pages a compressed group with static budgets keeps over a history of
  /// `tokens` (n + N): the pages every head's budget retains, floor(min retained / P). A pin past
  /// a head's budget (a prefix that decoded before it was pinned) would take the room the turn
  /// reserved for its answer. No bound for other groups (an elastic turn's limit covers its pins).
  [[nodiscard]] std::int64_t pin_cap(std::int32_t g, std::int64_t tokens) const noexcept {
    if (groups_.append_only(g) || groups_.pooled(g) || groups_.is_sliding(g))
      return std::numeric_limits<std::int64_t>::max();
    std::int64_t least = std::numeric_limits<std::int64_t>::max();
    for (auto const* m = groups_.members_begin(g); m != groups_.members_end(g); ++m)
      least = std::min(least, retained_tokens(groups_.head_rule_of(*m), tokens));
    return least / groups_.page_tokens();
  }

  /// Leading pages of group g of pinned prefix s that a request admitted over it keeps shared:
  /// the pages every head has filled, for an append-only group and for a compressed one (its
  /// eviction, static or elastic, keeps them in place: kv_cache_view::pinned); 0 for a sliding
  /// ring, and for a compressed group when `share_compressed_prefix` is off; at most `pin_cap`
  /// over the request's `tokens` (n + N).
  [[nodiscard]] std::int64_t prefix_shared(std::int32_t s,
                                           std::int32_t g,
                                           std::int64_t tokens) const noexcept {
    if (groups_.is_sliding(g)) return 0;
    if (!groups_.append_only(g) && !share_compressed_prefix_) return 0;
    return std::min(shareable(s, g), pin_cap(g, tokens));
  }
  /// Pages of group g that a next turn of slot s over `tokens` (n + N) keeps shared: its
  /// `unwritten` ones, at most `pin_cap`.
  [[nodiscard]] std::int64_t kept_unwritten(std::int32_t s,
                                            std::int32_t g,
                                            std::int64_t tokens) const noexcept {
    return std::min(unwritten(s, g), pin_cap(g, tokens));
  }

  /// Pages group g of slot s (in decode) holds once its turn reaches `max_new` decode tokens: a
  /// growing group its longest head after them, a sliding ring its pages after the turn's tokens.
  [[nodiscard]] std::int64_t decode_end(std::int32_t s,
                                        std::int32_t g,
                                        std::int64_t max_new) const noexcept {
    if (groups_.is_sliding(g))
      return std::min<std::int64_t>(
          groups_.pages_for(lengths_.tokens(s) - sequences_[s].decoded + max_new),
          groups_.ring_pages(g));
    return groups_.pages_for(static_cast<std::int64_t>(page_table_.longest_base(s, g)) + max_new);
  }

  /**
   * @brief `try_extend`: slot s (in decode) grows its turn to `max_new` decode tokens in all.
   * Per group into `out`: a static group's target becomes max(target, decode_end) and it reserves
   * the difference; the pooled groups (elastic) reserve together what their decode now needs
   * beyond their shared budget, sum over g of max(0, decode_end - held) - budget; a list whose
   * capacity is below its new end grows (the segment moves).
   */
  void size_extension(std::int32_t s, std::int64_t max_new, turn_footprint& out) const noexcept {
    out.clear();
    std::int64_t pooled_need = 0;
    for (std::int32_t g = 0; g < groups_.num_groups(); ++g) {
      std::int64_t end = decode_end(s, g, max_new);
      std::int64_t cap = page_table_.capacity(s, g);
      if (groups_.pooled(g)) {
        // A pooled group's target only bounds its list; its pages come from the shared budget.
        pooled_need += std::max<std::int64_t>(0, end - page_table_.count(s, g));
        std::int64_t grown = std::max<std::int64_t>(page_table_.target(s, g), end);
        out.add(g, grown, grown, 0, std::max(cap, end), cap);
      } else {
        std::int64_t target = page_table_.target(s, g), grown = std::max(target, end);
        out.add(g, grown, target, 0, std::max(cap, grown), cap);
      }
    }
    out.set_pooled_target(std::max<std::int64_t>(0, pooled_need - page_table_.pooled_budget(s)),
                          page_table_.pooled_limit(s));
  }

  /**
   * @brief The most decode tokens `rollback` may remove from slot s now (0 unless in decode):
   * the decode tokens of this turn, less where the pages the rolled-back positions occupy are
   * shared (with a fork, or by a copy the engine has not completed: a rollback would rewrite
   * them), and, for a sliding ring that already wrapped (more tokens written than its
   * ring_pages * P positions), at most ring_pages * P - W less the tokens already rolled back
   * since the highest position written (older tokens the window needs again were overwritten).
   */
  [[nodiscard]] std::int64_t max_rollback(std::int32_t s) const noexcept {
    auto const& st = sequences_[s];
    if (st.phase != sequence_phase::decode) return 0;
    std::int64_t limit = st.decoded, a = lengths_.appended(s), t = lengths_.tokens(s);
    std::int64_t P = groups_.page_tokens();
    for (std::int32_t g = 0; g < groups_.num_groups() && limit > 0; ++g) {
      if (groups_.is_sliding(g)) {
        // The ring holds positions [written - ring, written): the window after k fewer tokens,
        // [t - k - W, t - k), must lie in it once the ring wrapped.
        std::int64_t ring = static_cast<std::int64_t>(groups_.ring_pages(g)) * P;
        if (st.written_tokens > ring)
          limit = std::min(limit, ring - groups_.window(g) - (st.written_tokens - t));
        for (std::int32_t p = 0; st.may_share && p < page_table_.count(s, g); ++p)
          if (pool_.ref_count(page_table_.entry(s, g, p)) > 1) limit = 0;
        continue;
      }
      // Positions from shortest_base + a - k on are rewritten: no page from there may be shared.
      for (std::int64_t p = page_table_.count(s, g) - 1; st.may_share && p >= 0; --p) {
        if (pool_.ref_count(page_table_.entry(s, g, p)) == 1) continue;
        limit = std::min(
            limit, std::max<std::int64_t>(0, page_table_.shortest_base(s, g) + a - (p + 1) * P));
        break;
      }
    }
    return std::max<std::int64_t>(0, limit);
  }

  /**
   * @brief The one footprint computation of admission, continue_turn and fork, group by group
   * into `out`: what group g may hold when the turn completes, how much of it is already held
   * without a reservation, the pages to copy and the page-list entries needed.
   * - admit: target = group_pages(rule, N, T); nothing held.
   * - next_turn (slot s, history n): target = group_pages(rule, n + N, T); the first
   *   min(held, target) pages stay, those only s references need no reservation and the shared
   *   ones are copied, except the `unwritten` ones (kept shared, no reservation); the list keeps
   *   max(held, target) entries.
   * - prefix (pinned prefix s, n tokens): as next_turn for a new child that shares every page of
   *   s (none exclusive): the `unwritten` pages stay shared, the rest of the kept ones are copied;
   *   the list is new.
   * - fork (parent s): the child's target is the parent's (decode) or what it uses (ended);
   *   fully written pages are shared, the rest of what the parent uses is copied.
   * - restore (a parked session, no slot yet): as next_turn over `restore_held[g]` pages per
   *   group, every one exclusive (drawn fresh for the history), none copied; the list is new.
   *   The history pages are not part of the footprint: the caller reserves them on top.
   * @param tokens N for admit, n + N for next_turn and restore; unused for fork (as are s for
   *        admit and restore, and prompt_tokens and max_new_tokens for fork).
   * @param prompt_tokens N, the turn's prompt (>= 1 except for fork): bounds its chunks, so its
   *        staging (elastic).
   * @param restore_held restore only: the session's pages per group.
   */
  void size_turn(turn_kind kind,
                 std::int32_t s,
                 std::int64_t tokens,
                 std::int64_t prompt_tokens,
                 std::int64_t max_new_tokens,
                 turn_footprint& out,
                 std::int32_t const* restore_held = nullptr) const {
    out.clear();
    if (!groups_.pooled_groups().empty())
      size_pooled(kind, s, tokens, prompt_tokens, max_new_tokens, out, restore_held);
    for (std::int32_t g = 0; g < groups_.num_groups(); ++g) {
      if (groups_.pooled(g)) continue;
      std::int64_t target = 0, already_held = 0, copies = 0, capacity = 0, current = 0;
      switch (kind) {
        case turn_kind::admit:
          target   = group_pages(groups_.rule(g), tokens, max_new_tokens, groups_.page_tokens());
          capacity = target;
          break;
        case turn_kind::next_turn:
        case turn_kind::prefix: {
          bool child        = kind == turn_kind::prefix;
          std::int64_t held = page_table_.count(s, g);
          target = group_pages(groups_.rule(g), tokens, max_new_tokens, groups_.page_tokens());
          std::int64_t keep = std::min(held, target);
          std::int64_t pinned =
              std::min(child ? prefix_shared(s, g, tokens) : kept_unwritten(s, g, tokens), keep);
          // Exclusive pages among the kept, plus the shared ones below the pin (never copied).
          already_held = child ? pinned : exclusive(s, g, keep) + pinned - exclusive(s, g, pinned);
          copies       = keep - already_held;
          capacity     = std::max(held, target);
          current      = child ? 0 : page_table_.capacity(s, g);
          break;
        }
        case turn_kind::restore: {
          std::int64_t held = restore_held[g];
          target = group_pages(groups_.rule(g), tokens, max_new_tokens, groups_.page_tokens());
          already_held = std::min(held, target);  // fresh pages: all exclusive
          capacity     = std::max(held, target);
          break;
        }
        case turn_kind::fork: {
          auto used    = in_use(s, g);
          target       = sequences_[s].phase == sequence_phase::decode
                             ? std::int64_t{page_table_.target(s, g)}
                             : used;
          already_held = shareable(s, g);
          copies       = used - already_held;
          capacity     = target;
          break;
        }
      }
      out.add(g, target, already_held, copies, capacity, current);
    }
  }

  /**
   * @brief What `park` hands out for slot s (ended or in decode): its lengths, the pages its heads
   * use per group (a turn's list may hold more, with nothing in them: not copied) and those pages
   * in list order; a turn in decode also its decoded and reserved answer tokens (`mid_turn`).
   * Allocates the value only.
   */
  [[nodiscard]] parked_session describe(std::int32_t s,
                                        std::uint64_t fingerprint,
                                        std::int64_t page_bytes) const {
    auto const& st = sequences_[s];
    parked_session p;
    p.plan_fingerprint = fingerprint;
    p.page_bytes       = page_bytes;
    p.seq_tokens       = lengths_.tokens(s);
    p.appended         = lengths_.appended(s);
    p.written_tokens   = std::max<std::int64_t>(st.written_tokens, lengths_.tokens(s));
    p.head_base_len.assign(lengths_.base(s), lengths_.base(s) + groups_.num_heads());
    p.group_pages.resize(static_cast<std::size_t>(groups_.num_groups()));
    std::int64_t total = 0;
    for (std::int32_t g = 0; g < groups_.num_groups(); ++g) total += in_use(s, g);
    p.device_pages.reserve(static_cast<std::size_t>(total));
    for (std::int32_t g = 0; g < groups_.num_groups(); ++g) {
      auto use                                   = in_use(s, g);
      p.group_pages[static_cast<std::size_t>(g)] = static_cast<std::int32_t>(use);
      auto const* list                           = page_table_.list(s, g);
      p.device_pages.insert(p.device_pages.end(), list, list + use);
    }
    if (st.phase == sequence_phase::decode) {
      p.mid_turn = true;
      p.decoded  = st.decoded;
      p.max_new  = st.max_new;
    }
    return p;
  }

  /**
   * @brief `try_resume`: a session parked mid-turn (`p`, checked) resumes its turn with
   * `max_new` (>= p.decoded) answer tokens in all. Per group into `out`, from the session's
   * lengths: a growing group's target is its longest head after the whole answer,
   * ceil((longest base + max_new) / P); a sliding ring's min(ceil((seq_tokens - decoded + max_new)
   * / P), ring pages); it holds `group_pages[g]` fresh pages (the caller reserves them on top) and
   * reserves the rest. The pooled groups (elastic) share the sum of their targets, which is also
   * their limit (as for a fork in decode: no chunk is left to evict).
   */
  void size_resume(parked_session const& p, std::int64_t max_new, turn_footprint& out) const {
    out.clear();
    std::int64_t pooled_target = 0;
    for (std::int32_t g = 0; g < groups_.num_groups(); ++g) {
      std::int64_t held = p.group_pages[static_cast<std::size_t>(g)], end = 0;
      if (groups_.is_sliding(g)) {
        end = std::min<std::int64_t>(groups_.pages_for(p.seq_tokens - p.decoded + max_new),
                                     groups_.ring_pages(g));
      } else {
        std::int64_t longest = 0;
        for (auto const* m = groups_.members_begin(g); m != groups_.members_end(g); ++m)
          longest = std::max<std::int64_t>(longest, p.head_base_len[static_cast<std::size_t>(*m)]);
        end = groups_.pages_for(longest + max_new);
      }
      end = std::max(end, held);
      if (groups_.pooled(g)) {
        pooled_target += end;
        out.add_pooled(g, held, 0, end, 0);
      } else {
        out.add(g, end, held, 0, end, 0);
      }
    }
    out.set_pooled_target(pooled_target, pooled_target);
  }

 private:
  /// Pages group g of slot s holds once its remaining decode tokens are appended.
  [[nodiscard]] std::int64_t decode_end_pages(std::int32_t s, std::int32_t g) const noexcept {
    return groups_.pages_for(static_cast<std::int64_t>(page_table_.longest_base(s, g)) +
                             sequences_[s].max_new);
  }

  /**
   * The pooled groups of a turn under elastic reservation (docs/memory.md#elastic-reservation),
   * with `elastic_turn_pages(limit, decode, staging, uncompressed)` = min(limit + max(G_c ceil(T /
   * P), staging), G_c ceil((tokens + T) / P)): a turn stages chunks only before its first decode
   * token, and no group holds more pages than its longest head's tokens need:
   * - admit: shared target elastic_turn_pages(R(N), ...) with staging G_c ceil(min(chunk, N) / P);
   *   a list never needs more than ceil((N + T) / P) entries, nor more than the target;
   * - next_turn: limit max(R(n + N), held), target elastic_turn_pages(limit, ...) (held pages
   *   count against it; those a fork shares are copied, since compaction rewrites the whole group,
   *   and the target counts each copy once more: an eviction may drop a copy before the engine
   *   completed it);
   * - fork: the child's target is what the parent's groups reach by the end of its decode (its
   *   use, when ended); fully written pages are shared, the rest copied.
   */
  void size_pooled(turn_kind kind,
                   std::int32_t s,
                   std::int64_t tokens,
                   std::int64_t prompt_tokens,
                   std::int64_t max_new_tokens,
                   turn_footprint& out,
                   std::int32_t const* restore_held) const {
    auto const& pooled = groups_.pooled_groups();
    auto decode_pages =
        static_cast<std::int64_t>(pooled.size()) * groups_.pages_for(max_new_tokens);
    if (kind == turn_kind::fork) {
      std::int64_t target = 0;
      for (auto g : pooled) {
        auto used = in_use(s, g), shared = shareable(s, g);
        auto end = sequences_[s].phase == sequence_phase::decode
                       ? std::max(used, decode_end_pages(s, g))
                       : used;
        target += end;
        out.add_pooled(g, shared, used - shared, end, 0);
      }
      out.set_pooled_target(target, target);
      return;
    }
    std::int64_t held_total = 0, copies = 0, pinned_floors = 0;
    bool pinned_any      = false;
    std::int64_t longest = groups_.pages_for(tokens + max_new_tokens);
    bool child           = kind == turn_kind::prefix;  // shares every page: copied unless pinned
    // Pages a group keeps shared (a pinned prefix's, never copied): the child's share of the
    // prefix, or what a next turn keeps of its pin.
    auto pinned_pages = [&](std::int32_t g, std::int64_t held) {
      return std::min(child ? prefix_shared(s, g, tokens) : kept_unwritten(s, g, tokens), held);
    };
    // Exclusive pages among the held, plus the shared ones below the pin (never copied).
    auto already_held = [&](std::int32_t g, std::int64_t held) {
      auto pin = pinned_pages(g, held);
      return child ? pin : exclusive(s, g, held) + pin - exclusive(s, g, pin);
    };
    if (kind == turn_kind::next_turn || child)
      for (auto g : pooled) {
        auto held = page_table_.count(s, g);
        auto pin  = pinned_pages(g, held);
        held_total += held;
        copies += held - already_held(g, held);
        pinned_any = pinned_any || pin > 0;
        pinned_floors += groups_.pooled_floor_pages(pin * groups_.page_tokens());
      }
    if (kind == turn_kind::restore)
      for (auto g : pooled) held_total += restore_held[g];
    // A copy's new page is held by the list and by the pending copy until the engine completes
    // it; an eviction that drops it before then frees nothing, so the target covers it twice.
    // Pinned groups: the eviction keeps their pinned and protected pages, the limit covers them.
    std::int64_t limit = std::max(groups_.pooled_pages(tokens), held_total);
    if (pinned_any) limit = std::max(limit, pinned_floors);
    std::int64_t whole = static_cast<std::int64_t>(pooled.size()) * longest;  // uncompressed
    std::int64_t target =
        elastic_turn_pages(limit, decode_pages, staging_pages(prompt_tokens), whole) + copies;
    for (auto g : pooled) {
      std::int64_t held = 0, exclusive_held = 0, current = 0;
      if (kind == turn_kind::next_turn || child) {
        held           = page_table_.count(s, g);
        exclusive_held = already_held(g, held);
        current        = child ? 0 : page_table_.capacity(s, g);
      } else if (kind == turn_kind::restore) {
        held = exclusive_held = restore_held[g];
      }
      out.add_pooled(g,
                     exclusive_held,
                     held - exclusive_held,
                     std::max(held, std::min(longest, target)),
                     current);
    }
    out.set_pooled_target(target, limit);
  }

  group_lookup const& groups_;
  sequence_table const& sequences_;
  page_table_storage const& page_table_;
  head_lengths const& lengths_;
  Pool const& pool_;
  std::int64_t max_chunk_tokens_ = 1;
  bool share_compressed_prefix_  = true;
};

}  // namespace tangram::detail
