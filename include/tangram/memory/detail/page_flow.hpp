// SPDX-License-Identifier: Apache-2.0
/**
 * @file memory/detail/page_flow.hpp
 * @brief Every movement of a page id between the pool (through a sequence's reservation) and the
 * page lists: draws as lengths grow, releases as they shrink, sharing and copy-on-write for forks
 * and new turns, and the decode append. The manager validates an operation, then calls these.
 */
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <utility>
#include <vector>

#include "tangram/memory/detail/copy_on_write.hpp"
#include "tangram/memory/detail/decode_buckets.hpp"
#include "tangram/memory/detail/group_lookup.hpp"
#include "tangram/memory/detail/head_lengths.hpp"
#include "tangram/memory/detail/page_table_storage.hpp"
#include "tangram/memory/detail/sequence_table.hpp"
#include "tangram/memory/detail/view_journal.hpp"
#include "tangram/memory/kv_cache_types.hpp"

namespace tangram::detail {

/**
 * @brief The mutating half of the manager's page bookkeeping. Holds references to the manager's
 * parts (it lives inside the manager). Callers validate first: a draw beyond a group's budget or
 * its reservation is an internal inconsistency (`logic_error` from the budget check or the pool),
 * never a normal outcome. Allocation-free (copies are recorded into room reserved beforehand).
 */
template <class Pool>
class page_flow {
 public:
  page_flow(group_lookup const& groups,
            sequence_table& sequences,
            page_table_storage& page_table,
            head_lengths& lengths,
            decode_buckets& buckets,
            view_journal& journal,
            copy_on_write& copies,
            Pool& pool,
            manager_stats& stats) noexcept
      : groups_(groups),
        sequences_(sequences),
        page_table_(page_table),
        lengths_(lengths),
        buckets_(buckets),
        journal_(journal),
        copies_(copies),
        pool_(pool),
        stats_(stats),
        spare_next_(pool.deferred_reuse() ? static_cast<std::size_t>(pool.capacity()) : 0, -1) {}

  /// True when a segment of `size` page-list entries can be placed, repacking the arena if needed
  /// (which moves no logical state but makes the engine upload the whole view).
  bool make_index_room(std::int64_t size) noexcept {
    if (!page_table_.has_room(size)) return false;
    if (size > 0 && page_table_.needs_compaction(size)) {
      page_table_.compact();
      journal_.note_full_resync();
      ++stats_.index_compactions;
    }
    return true;
  }

  /// A page from slot s's reservation, charged to group g's budget (not yet in a list).
  /// (A pooled group is charged to its sequence's shared budget.)
  page_id draw(std::int32_t s, std::int32_t g) {
    bool pooled = groups_.pooled(g);
    if (pooled)
      page_table_.expect_pooled_room(s, 1, "draw");
    else
      page_table_.expect_budget(s, g);
    page_id p = take(s);
    if (pooled)
      --page_table_.pooled_budget(s);
    else
      --page_table_.budget(s, g);
    ++stats_.pages_drawn;
    return p;
  }

  /// Elastic reservation: the pages of pooled group g beyond the first `keep` go back into slot
  /// s's reservation (the pool takes them back and re-promises them to s, which cannot fail: they
  /// were just freed), ready for the next chunk's staging or decode. A page still shared with a
  /// fork only loses this reference.
  /// (Under deferred reuse such a page goes on the sequence's spare stack instead: `give_back`.)
  void return_to_reservation(std::int32_t s, std::int32_t g, std::int64_t keep) noexcept {
    if (!pool_.deferred_reuse()) {  // in bulk: a chunk's staging returns ~70% of its pages
      std::int64_t n = page_table_.count(s, g) - keep;
      if (n <= 0) return;
      std::int64_t back =
          pool_.release_into(sequences_[s].reservation, page_table_.tail(s, g) - n, n);
      page_table_.truncate(s, g, keep);
      page_table_.pooled_budget(s) += back;
      stats_.staging_pages_returned += back;
      return;
    }
    while (page_table_.count(s, g) > keep) {
      if (give_back(s, page_table_.pop(s, g))) {
        ++page_table_.pooled_budget(s);
        ++stats_.staging_pages_returned;
      }
    }
  }

  /**
   * @brief A page leaves one of slot s's lists for s's own reservation. Without deferred reuse:
   * released to the pool, which re-promises it to s (cannot fail: it was just freed). With it,
   * an exclusive page stays referenced on s's spare stack (through the pool any sequence's next
   * draw could take it while a kernel on another stream still reads it, and a retired page
   * cannot back a reservation, whose draws must never fail); s's next draw takes it back. A page
   * still shared (a fork's) only loses this reference either way.
   * @return true when the page now backs s's reservation (the caller raises the budget).
   */
  bool give_back(std::int32_t s, page_id p) noexcept {
    if (!pool_.deferred_reuse()) {
      if (!pool_.release(p)) return false;
      (void)pool_.try_extend(sequences_[s].reservation, 1);
      return true;
    }
    if (pool_.ref_count(p) != 1) {
      (void)pool_.release(p);
      return false;
    }
    auto& st                                 = sequences_[s];
    spare_next_[static_cast<std::size_t>(p)] = st.spare_top;
    st.spare_top                             = p;
    ++st.spare_pages;
    ++stats_.spare_pages_kept;
    return true;
  }

  /// A page for slot s: a spare first (deferred reuse), else one drawn from its reservation.
  page_id take(std::int32_t s) {
    auto& st = sequences_[s];
    if (st.spare_pages == 0) return pool_.draw(st.reservation);
    page_id p    = st.spare_top;
    st.spare_top = spare_next_[static_cast<std::size_t>(p)];
    --st.spare_pages;
    return p;
  }

  /// Deferred reuse: releases up to `n` of slot s's spares to the pool (they retire).
  /// @return how many were released.
  std::int64_t release_spares(std::int32_t s, std::int64_t n) noexcept {
    auto& st         = sequences_[s];
    std::int64_t out = 0;
    for (; out < n && st.spare_pages > 0; ++out) {
      page_id p    = st.spare_top;
      st.spare_top = spare_next_[static_cast<std::size_t>(p)];
      --st.spare_pages;
      (void)pool_.release(p);
    }
    return out;
  }
  /// Releases every spare of slot s (end_turn, free).
  void release_spares(std::int32_t s) noexcept {
    (void)release_spares(s, sequences_[s].spare_pages);
  }

  /// Calls f(page) for each spare of slot s (invariant checks and inspection).
  template <class F>
  void for_each_spare(std::int32_t s, F&& f) const {
    for (page_id p = sequences_[s].spare_top; p >= 0; p = spare_next_[static_cast<std::size_t>(p)])
      f(p);
  }

  /// Elastic reservation, once the prompt is in: the pooled budget shrinks to what decode needs
  /// (`need` pages), the rest of the reservation returns to the pool.
  void trim_pooled_budget(std::int32_t s, std::int64_t need) {
    auto extra = page_table_.pooled_budget(s) - need;
    if (extra <= 0) return;
    pool_.release_unused(sequences_[s].reservation, extra - release_spares(s, extra));
    page_table_.pooled_budget(s) = need;
  }

  /// Appends drawn pages to (s, g) until it holds `pages`.
  void grow_to(std::int32_t s, std::int32_t g, std::int64_t pages) {
    std::int64_t n = pages - page_table_.count(s, g);
    if (n <= 0) return;
    // In bulk (one check, one pass), the same pages in the same order as n single draws: spares
    // first, then the reservation's. The reservation's are drawn first (the only step that can
    // throw), so a failure changes nothing.
    bool pooled = groups_.pooled(g);
    if (pooled)
      page_table_.expect_pooled_room(s, n, "draw");
    else
      page_table_.expect_budget(s, g, n);
    auto& st            = sequences_[s];
    std::int64_t spares = std::min(n, st.spare_pages);
    page_id* out        = page_table_.tail(s, g);
    pool_.draw(st.reservation, n - spares, out + spares);
    for (std::int64_t k = 0; k < spares; ++k) out[k] = take(s);
    auto at = page_table_.extend(s, g, static_cast<std::int32_t>(n));
    for (std::int64_t k = 0; k < n; ++k) journal_.note_entry(at + k);
    if (pooled)
      page_table_.pooled_budget(s) -= n;
    else
      page_table_.budget(s, g) -= static_cast<std::int32_t>(n);
    stats_.pages_drawn += n;
  }

  /// Releases the pages of (s, g) beyond the first `keep` as surplus; those at positions
  /// >= `reclaim_from` also count as reclaimed (drawn by the chunk that drops them).
  void release_tail(std::int32_t s,
                    std::int32_t g,
                    std::int64_t keep,
                    std::int64_t reclaim_from = std::numeric_limits<std::int64_t>::max()) noexcept {
    while (page_table_.count(s, g) > keep) {
      page_id p = page_table_.pop(s, g);
      if (page_table_.count(s, g) >= reclaim_from) ++stats_.reclaimed_pages;
      ++stats_.surplus_pages_released;
      pool_.release(p);
    }
  }

  /// A parked session's history: `count` pages drawn for (s, g) straight from slot s's
  /// reservation (not from the group's budget, which is the next turn's), appended to its list and
  /// to `out` (room reserved by the caller), in list order.
  void restore_pages(std::int32_t s,
                     std::int32_t g,
                     std::int64_t count,
                     std::vector<page_id>& out) {
    page_id* drawn = page_table_.tail(s, g);
    pool_.draw(sequences_[s].reservation, count, drawn);
    auto at = page_table_.extend(s, g, static_cast<std::int32_t>(count));
    for (std::int64_t k = 0; k < count; ++k) journal_.note_entry(at + k);
    out.insert(out.end(), drawn, drawn + count);
    stats_.pages_drawn += count;
  }

  /**
   * @brief Restores parked session `p` (checked) into a new slot in `phase` when it fits: a free
   * slot, `fp`'s reservation plus the history's pages, and page-table room; then the slot's lists
   * sized by `fp`, the session's lengths, its history in fresh pages (appended to `out` in the
   * session's order), the turn's targets and budgets, its decode buckets. The caller sets the
   * turn's counters. @return the slot, or nullopt with nothing changed ("does not fit"; the arena
   * may have been repacked). Allocates `out`'s room only, before any change.
   */
  std::optional<std::int32_t> try_restore(parked_session const& p,
                                          turn_footprint const& fp,
                                          sequence_phase phase,
                                          std::vector<page_id>& out) {
    std::int64_t history = p.host_pages(), pages = fp.reserve_total() + history;
    if (sequences_.full() || pages > pool_.available_pages() ||
        !make_index_room(fp.capacity_total()))
      return std::nullopt;
    out.reserve(static_cast<std::size_t>(history));
    // Checked: nothing below fails.
    std::int32_t s = sequences_.take(phase, std::move(*pool_.try_reserve(pages)));
    page_table_.open(s, fp);
    std::copy(p.head_base_len.begin(), p.head_base_len.end(), lengths_.base(s));
    lengths_.appended(s) = p.appended;
    lengths_.tokens(s)   = static_cast<std::int32_t>(p.seq_tokens);
    for (std::int32_t g = 0; g < groups_.num_groups(); ++g) {
      restore_pages(s, g, p.group_pages[static_cast<std::size_t>(g)], out);
      refresh_base_range(s, g);
    }
    page_table_.start_turn(s, fp);
    rebuild_buckets(s);
    sequences_[s].written_tokens = p.written_tokens;
    journal_.note_slot(s);
    stats_.pages_restored += history;
    return s;
  }

  /// Drops every page reference of slot s, its spares' too (its lists stay allocated until the
  /// caller closes them).
  void release_all(std::int32_t s) noexcept {
    release_spares(s);
    for (std::int32_t g = 0; g < groups_.num_groups(); ++g)
      if (page_table_.count(s, g) > 0)  // in bulk: a list's pages are scattered over the pool
        (void)pool_.release(page_table_.list(s, g), page_table_.count(s, g));
  }

  /// A new turn will overwrite pages [from, keep) of (s, g) (those below `from` it never writes:
  /// `page_usage::unwritten`): each one a fork still shares is replaced by a fresh page, and the
  /// copy is recorded (our reference moves to the copy, which releases it once the engine
  /// copied). Only a forked sequence can share pages; the scan is skipped for everyone else,
  /// keeping continue_turn O(groups) on the common path.
  void copy_shared_head(std::int32_t s, std::int32_t g, std::int64_t from, std::int64_t keep) {
    for (std::int64_t p = from; sequences_[s].may_share && p < keep; ++p) {
      page_id src = page_table_.entry(s, g, p);
      if (pool_.ref_count(src) == 1) continue;
      page_id dst = draw(s, g);
      pool_.retain(dst);
      journal_.note_entry(page_table_.set_entry(s, g, p, dst));
      copies_.record(src, dst);
      ++stats_.page_copies;
    }
  }

  /// Fills child c's list of group g from parent s: the first `shared` pages by reference, the
  /// pages up to `in_use` (which heads may still write) as recorded copies into drawn pages.
  void share_into_fork(
      std::int32_t s, std::int32_t c, std::int32_t g, std::int64_t shared, std::int64_t in_use) {
    page_table_.longest_base(c, g)  = page_table_.longest_base(s, g);
    page_table_.shortest_base(c, g) = page_table_.shortest_base(s, g);
    for (std::int64_t p = 0; p < shared; ++p) {
      page_id pg = page_table_.entry(s, g, p);
      pool_.retain(pg);
      journal_.note_entry(page_table_.push(c, g, pg));
    }
    for (std::int64_t p = shared; p < in_use; ++p) {
      page_id src = page_table_.entry(s, g, p);
      page_id dst = draw(c, g);
      journal_.note_entry(page_table_.push(c, g, dst));
      pool_.retain(src);
      pool_.retain(dst);
      copies_.record(src, dst);
      ++stats_.page_copies;
    }
  }

  /// Longest and shortest base length of group g's heads (0 for a sliding ring).
  void refresh_base_range(std::int32_t s, std::int32_t g) noexcept {
    std::int32_t longest = 0, shortest = 0;
    if (!groups_.is_sliding(g)) {
      auto const* base = lengths_.base(s);
      shortest         = std::numeric_limits<std::int32_t>::max();
      for (auto const* m = groups_.members_begin(g); m != groups_.members_end(g); ++m) {
        longest  = std::max(longest, base[*m]);
        shortest = std::min(shortest, base[*m]);
      }
    }
    page_table_.longest_base(s, g)  = longest;
    page_table_.shortest_base(s, g) = shortest;
  }

  /// After a chunk's lengths are recorded: each group's base range, then its pages beyond this
  /// turn's target (decode tokens of the previous turn that the recompression dropped) return to
  /// the pool, then the decode buckets are rebuilt. A pooled group's staged pages beyond its
  /// longest head return to the reservation once the prompt is in; until then the group keeps
  /// them for the next chunk's staging (`prepare_chunk` gives back what it does not need), so a
  /// chunk moves only the pages its kept lengths grow by, not a whole chunk's staging twice.
  void settle_after_chunk(std::int32_t s) noexcept {
    sequences_[s].written_tokens = lengths_.tokens(s);
    bool prompt_in               = sequences_[s].phase != sequence_phase::prefill;
    for (std::int32_t g = 0; g < groups_.num_groups(); ++g) {
      refresh_base_range(s, g);
      if (groups_.pooled(g)) {  // elastic: staged pages the eviction did not keep
        if (prompt_in)
          return_to_reservation(s, g, groups_.pages_for(page_table_.longest_base(s, g)));
      } else {
        release_tail(s, g, page_table_.target(s, g), page_table_.count_before_chunk(s, g));
      }
    }
    rebuild_buckets(s);
  }

  /// Re-sorts slot s's growing groups by the decode step at which each starts a page.
  void rebuild_buckets(std::int32_t s) noexcept {
    buckets_.rebuild(
        s, [&](std::int32_t g) { return groups_.mod_page(page_table_.longest_base(s, g)); });
  }

  /// `tokens` decode tokens for slot s, one after another (the caller checked its decode room).
  void append_decode_tokens(std::int32_t s, std::int64_t tokens) {
    for (std::int64_t k = 0; k < tokens; ++k) append_decode_token(s);
  }

  /// Removes the last `tokens` decode tokens of slot s (the caller checked `max_rollback`): the
  /// counters go back, and every page the group no longer uses (exclusive: checked) returns to
  /// the sequence's reservation and to its group's budget (the pooled budget for a pooled group),
  /// so the tokens can be appended again without a new reservation (under deferred reuse through
  /// the sequence's spare stack, `give_back`, not through the pool).
  void rollback_decode_tokens(std::int32_t s, std::int64_t tokens) noexcept {
    auto t = static_cast<std::int32_t>(tokens);
    lengths_.appended(s) -= t;
    lengths_.tokens(s) -= t;
    sequences_[s].decoded -= tokens;
    journal_.note_counters(s);
    for (std::int32_t g = 0; g < groups_.num_groups(); ++g) {
      std::int64_t keep =
          groups_.is_sliding(g)
              ? std::min<std::int64_t>(groups_.pages_for(lengths_.tokens(s)), groups_.ring_pages(g))
              : groups_.pages_for(static_cast<std::int64_t>(page_table_.longest_base(s, g)) +
                                  lengths_.appended(s));
      while (page_table_.count(s, g) > keep) {
        (void)give_back(s, page_table_.pop(s, g));  // exclusive (checked): cannot fail
        if (groups_.pooled(g))
          ++page_table_.pooled_budget(s);
        else
          ++page_table_.budget(s, g);
        ++stats_.rollback_pages_returned;
      }
    }
  }

  /// One decode token for slot s (the caller checked its decode room): counts it and draws a page
  /// for each group that crosses a page boundary, O(those groups).
  void append_decode_token(std::int32_t s) {
    auto a = ++lengths_.appended(s);
    auto n = ++lengths_.tokens(s);
    ++sequences_[s].decoded;
    sequences_[s].written_tokens = std::max<std::int64_t>(sequences_[s].written_tokens, n);
    journal_.note_counters(s);
    std::int32_t P = groups_.page_tokens();
    std::int32_t b = groups_.mod_page(P + 1 - groups_.mod_page(a));  // (1 - a) mod P
    // The bucket's end is read once: drawing a page writes int32 arrays the compiler would
    // otherwise have to assume alias it.
    auto const* end = buckets_.bucket_end(s, b);
    for (auto const* g = buckets_.bucket_begin(s, b); g != end; ++g)
      grow_to(
          s, *g, groups_.pages_for(static_cast<std::int64_t>(page_table_.longest_base(s, *g)) + a));
    if (!groups_.sliding_groups().empty() && groups_.mod_page(n - 1) == 0) {
      for (auto g : groups_.sliding_groups())
        grow_to(s, g, std::min<std::int64_t>(groups_.pages_for(n), groups_.ring_pages(g)));
    }
  }

 private:
  group_lookup const& groups_;
  sequence_table& sequences_;
  page_table_storage& page_table_;
  head_lengths& lengths_;
  decode_buckets& buckets_;
  view_journal& journal_;
  copy_on_write& copies_;
  Pool& pool_;
  manager_stats& stats_;
  std::vector<page_id> spare_next_;  ///< deferred reuse: spare stacks, linked through the pages
};

}  // namespace tangram::detail
