// SPDX-License-Identifier: Apache-2.0
// A miniature engine over a host-memory kv_cache_manager, plus an independent model of what every
// sequence must hold. The "engine" writes real K/V tags into the pages through the view (fused
// eviction = pick kept tokens among held + chunk, then write them compacted), so any page placed
// in two sequences without copy-on-write, released too early, or mislocated shows up as wrong
// data. The model also predicts every group's page count, target and reservation from the plan
// alone (footprint formulas), without looking at the manager's internals.
//
// Elastic reservation (plan.options.reservation.mode == elastic): the eviction of each chunk
// draws a random need per compressed head in [min(protect, candidates), candidates], chooses the
// compressed groups' lengths with the optimal reference::select_group_lengths within the turn's
// limit, and keeps min(group length, candidates) tokens per head (sometimes a few fewer, never
// below min(protect, candidates)). The model predicts from the plan and the formulas alone:
// admission = admission_footprint_pages; the limit R(N) (elastic_compressed_pages), or
// max(R(n + N), held) on a next turn, or what the parent's groups reach by the end of its decode
// on a fork; the staged pages after prepare_chunk (ceil((longest + c) / P) per group); each
// compressed group's pages after a commit (ceil(longest kept / P)); the shared budget
// (admission: min(R(N) + max(G_c ceil(T / P), staging), G_c ceil((N + T) / P)); each chunk and
// decode step draws what the groups grow by and unkept staging returns; after the last chunk
// exactly the decode need, sum of ceil((longest + T) / P) - held; next turn: min(limit +
// max(G_c ceil(T / P), staging), G_c ceil((n + N + T) / P)) + copies - held;
// fork: sum of the parent's decode ends - pages in use; 0 once ended); and each compressed group's
// list bound (group_target). Not checked: the reservation while a chunk is prepared but not
// committed (the storm verifies only between calls), and the exclusive/shared split a next turn
// reserves before its copy-on-write copies run (only the total after the copies is predicted).
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "tangram/memory/kv_cache_manager.hpp"
#include "tangram/plan/elastic_reservation.hpp"
#include "tangram/plan/elastic_selection.hpp"
#include "tangram/plan/footprint.hpp"
#include "test_support.hpp"

namespace tangram::test {

struct sim_sequence {
  sequence_id id;
  std::vector<std::vector<float>> tags;  // [L*H] held tokens, oldest first
  std::int64_t n                = 0;     // tokens seen
  sequence_phase phase          = sequence_phase::prefill;
  std::int64_t prompt_remaining = 0;
  std::int64_t max_new          = 0;
  std::int64_t decoded          = 0;
  std::vector<std::int64_t> held, target;  // per group, predicted
  // Elastic reservation, predicted: the compressed groups' shared budget (pages still promised
  // to them) and the turn's limit after each chunk's eviction (elastic_page_limit).
  std::int64_t pooled_budget = 0;
  std::int64_t pooled_limit  = 0;
  // Sliding heads: the tags decode pushed out of the window this turn, oldest first (a rollback
  // brings them back; the ring still holds them when max_rollback allowed it).
  std::vector<std::vector<float>> dropped;
  bool parked_mid_turn = false;  // parking (or parked) from decode: its turn resumes
};

/// Everything observable about a manager, for "nothing changed" checks.
struct manager_snapshot {
  std::vector<std::int64_t> numbers;
  friend bool operator==(manager_snapshot const& a, manager_snapshot const& b) {
    return a.numbers == b.numbers;
  }
};

template <class Manager>
manager_snapshot snapshot(Manager const& m, std::vector<sequence_id> const& ids) {
  manager_snapshot s;
  auto& v = s.numbers;
  auto st = m.stats();
  for (auto x : {st.admitted,
                 st.rejected,
                 st.turns_continued,
                 st.continue_rejected,
                 st.forks,
                 st.fork_rejected,
                 st.freed,
                 st.pages_drawn,
                 st.surplus_pages_released,
                 st.reclaimed_pages,
                 st.page_copies,
                 st.staging_pages_returned,
                 st.spare_pages_kept})
    v.push_back(x);
  auto ps = m.pool().stats();
  for (auto x : {ps.free,
                 ps.reserved,
                 ps.used,
                 ps.peak_used,
                 ps.allocations,
                 ps.frees,
                 ps.retired,
                 ps.retirements,
                 m.current_epoch(),
                 m.released_epoch()})
    v.push_back(x);
  m.pool().for_each_retired([&](page_id p, std::int64_t e) {
    v.push_back(p);
    v.push_back(e);
  });
  for (page_id p = 0; p < m.pool().capacity(); ++p) v.push_back(m.pool().ref_count(p));
  v.push_back(m.live_sequences());
  for (auto kind : {batch_kind::decode, batch_kind::prefill}) {
    v.push_back(m.batch_size(kind));
    v.push_back(m.batch_padding(kind));
    for (std::int32_t r = 0; r < m.batch_size(kind) - m.batch_padding(kind); ++r)
      v.push_back(m.batch_sequence(kind, r).slot);
  }
  for (auto id : ids) {
    if (!m.contains(id)) {
      v.push_back(-1);
      continue;
    }
    auto i = m.info(id);
    for (auto x : {static_cast<std::int64_t>(i.phase),
                   i.seq_tokens,
                   i.appended,
                   i.prompt_remaining,
                   i.chunk_pending,
                   i.max_new,
                   i.decoded,
                   i.reserved_pages,
                   i.held_pages})
      v.push_back(x);
    v.push_back(m.elastic_page_limit(id));
    for (std::int32_t g = 0; g < m.num_groups(); ++g) {
      v.push_back(m.group_target(id, g));
      v.push_back(m.group_reserved(id, g));
      auto n = m.group_page_count(id, g);
      auto p = m.group_pages(id, g);
      v.insert(v.end(), p, p + n);
    }
    for (std::int32_t l = 0; l < m.plan().num_layers; ++l)
      for (std::int32_t h = 0; h < m.plan().num_kv_heads; ++h) v.push_back(m.head_len(id, l, h));
  }
  for (auto c : m.pending_copies()) {
    v.push_back(c.src);
    v.push_back(c.dst);
  }
  return s;
}

class engine_sim {
 public:
  engine_sim(kv_cache_manager& m, std::uint32_t seed, double keep_fewer_probability = 0.2)
      : m_(m), plan_(m.plan()), rng_(seed), keep_fewer_(keep_fewer_probability) {
    L_       = plan_.num_layers;
    H_       = plan_.num_kv_heads;
    P_       = plan_.geometry.page_tokens;
    G_       = plan_.num_groups();
    data_    = m.pool().kind() == memory_kind::host;  // simulated pools: counts only
    elastic_ = plan_.options.reservation.mode == reservation_mode::elastic;
    Hp_      = plan_.grouping.group_size;
    protect_ = plan_.profile.protected_tokens();
    pooled_.assign(static_cast<std::size_t>(G_), false);
    for (std::int32_t g = 0; elastic_ && g < G_; ++g) {
      if (rule(g).kind != layer_kind::compressed) continue;
      pooled_[static_cast<std::size_t>(g)] = true;
      pooled_members_.emplace_back();
      for (auto mb : plan_.grouping.groups[static_cast<std::size_t>(g)].members)
        pooled_members_.back().push_back(mb.layer * H_ + mb.head);
    }
    Gc_        = static_cast<std::int64_t>(pooled_members_.size());
    max_chunk_ = m.options().max_chunk_tokens;
  }

  bool elastic() const { return elastic_; }
  /// Elastic evictions run, and the wanted tokens they clipped (the limit bound the selection).
  std::int64_t elastic_evictions() const { return elastic_evictions_; }
  std::int64_t elastic_clipped() const { return elastic_clipped_; }
  bool pooled(std::int32_t g) const { return pooled_[static_cast<std::size_t>(g)]; }

  /// R(n): the compressed groups' pages after n tokens, from the plan's scorer and margin.
  std::int64_t elastic_limit(std::int64_t n) const {
    scorer_total t{plan_.profile.target_keep_ratio, protect_, plan_.options.reservation.basis};
    return elastic_compressed_pages(t, Gc_ * Hp_, Hp_, P_, plan_.options.reservation.margin, n);
  }

  /// Pages compressed group g of q reaches by the end of its decode (its use once ended).
  std::int64_t pooled_decode_end(sim_sequence const& q, std::int32_t g) const {
    auto used = in_use(q, g);
    if (q.phase != sequence_phase::decode) return used;
    return std::max(used, ceil_div(longest(q, g) - q.decoded + q.max_new, P_));
  }

  /// An upper bound of the pages a fork of q reserves (its parent's targets, or what it uses).
  std::int64_t fork_reservation_bound(sim_sequence const& q) const {
    std::int64_t ub = 0;
    for (std::int32_t g = 0; g < G_; ++g)
      ub += pooled(g)                           ? pooled_decode_end(q, g)
            : q.phase == sequence_phase::decode ? q.target[static_cast<std::size_t>(g)]
                                                : in_use(q, g);
    return ub;
  }

  /// An upper bound of the pages a next turn of (N, T) reserves for q (the whole footprint after
  /// n + N tokens; elastic: the compressed groups' target without counting what they hold).
  std::int64_t continue_reservation_bound(sim_sequence const& q,
                                          std::int64_t N,
                                          std::int64_t T) const {
    if (!elastic_) return footprint_pages(plan_, q.n + N, T);
    std::int64_t ub = 0, held = 0;
    for (std::int32_t g = 0; g < G_; ++g) {
      if (pooled(g))
        held += q.held[static_cast<std::size_t>(g)];
      else
        ub += group_pages(rule(g), q.n + N, T, P_);
    }
    // + held: the copies of shared pages, at most every held page.
    return ub + std::max(elastic_limit(q.n + N), held) + Gc_ * ceil_div(T, P_) + staging(N) + held;
  }

  std::map<std::int32_t, sim_sequence>& sequences() { return seqs_; }
  std::vector<sequence_id> ids() const {
    std::vector<sequence_id> out;
    for (auto const& [s, q] : seqs_) out.push_back(q.id);
    return out;
  }
  std::mt19937& rng() { return rng_; }
  /// What the last `admit` answered (the reason when it did not fit).
  admit_result const& last_admit() const { return last_admit_; }

  std::optional<sequence_id> admit(std::int64_t N, std::int64_t T) {
    last_admit_ = m_.admit(N, T);
    auto id     = last_admit_.id;
    if (!id) return std::nullopt;
    sim_sequence q;
    q.id = *id;
    q.tags.assign(static_cast<std::size_t>(L_ * H_), {});
    q.prompt_remaining = N;
    q.max_new          = T;
    q.held.assign(static_cast<std::size_t>(G_), 0);
    q.target.resize(static_cast<std::size_t>(G_));
    for (std::int32_t g = 0; g < G_; ++g)
      q.target[static_cast<std::size_t>(g)] = group_pages(rule(g), N, T, P_);
    if (elastic_) {
      q.pooled_limit  = elastic_limit(N);
      q.pooled_budget = turn_pages(q.pooled_limit, N, N, T);
      for (std::int32_t g = 0; g < G_; ++g)
        if (pooled(g))
          q.target[static_cast<std::size_t>(g)] = std::min(ceil_div(N + T, P_), q.pooled_budget);
    }
    // Admission reserves exactly admission_footprint_pages: the model's parts add up to it.
    std::int64_t reserved = q.pooled_budget;
    for (std::int32_t g = 0; g < G_; ++g)
      if (!pooled(g)) reserved += q.target[static_cast<std::size_t>(g)];
    REQUIRE(reserved == admission_footprint_pages(plan_, N, T, m_.options().max_chunk_tokens));
    REQUIRE(m_.info(*id).reserved_pages == reserved);
    seqs_[id->slot] = q;
    return id;
  }

  /// One prefill chunk with fused eviction (elastic: the per-chunk group-length selection);
  /// `prepared`: prepare_chunk(id, c) was already called (and nothing since changed the state).
  void chunk(sequence_id id, std::int64_t c, bool prepared = false) {
    auto& q        = seqs_.at(id.slot);
    std::int64_t n = q.n + c;
    if (!prepared) m_.prepare_chunk(id, c);
    for (std::int32_t g = 0; g < G_; ++g) {
      auto gi = static_cast<std::size_t>(g);
      if (pooled(g))  // staged: the chunk after the group's longest head
        REQUIRE(m_.group_page_count(id, g) ==
                std::max(q.held[gi], ceil_div(longest(q, g) + c, P_)));
      else
        q.held[gi] = std::max(q.held[gi], need_pages(g, n));
    }
    auto elastic_kept = elastic_ ? elastic_eviction(q, id, c) : std::vector<std::int64_t>{};
    // Candidates per head: held tags (read back through the view: must match the model) + chunk.
    std::vector<std::int32_t> kept(static_cast<std::size_t>(L_ * H_));
    std::vector<std::vector<float>> next(static_cast<std::size_t>(L_ * H_));
    for (std::int32_t h = 0; h < L_ * H_; ++h) {
      auto cand = q.tags[static_cast<std::size_t>(h)];
      for (std::int64_t t = 0; t < c; ++t) cand.push_back(next_tag_++);
      auto const& r = plan_.rules[static_cast<std::size_t>(h)];
      std::vector<float> keep;
      if (r.kind == layer_kind::uncompressed) {
        keep = cand;
      } else if (r.kind == layer_kind::sliding_window) {
        auto w = std::min<std::size_t>(cand.size(), static_cast<std::size_t>(r.window));
        keep.assign(cand.end() - static_cast<std::ptrdiff_t>(w), cand.end());
      } else {
        std::int64_t k = 0;
        if (elastic_) {
          k = elastic_kept[static_cast<std::size_t>(h)];
        } else {
          auto e =
              std::min<std::int64_t>(retained_tokens(r, n), static_cast<std::int64_t>(cand.size()));
          k = e;
          if (std::uniform_real_distribution<double>(0, 1)(rng_) < keep_fewer_)
            k = std::max<std::int64_t>(0, e - static_cast<std::int64_t>(rng_() % 4));
        }
        if (!data_) {  // counts only: which tokens does not matter
          next[static_cast<std::size_t>(h)].assign(cand.begin(), cand.begin() + k);
          kept[static_cast<std::size_t>(h)] = static_cast<std::int32_t>(k);
          continue;
        }
        // A random order-preserving subset of k candidates.
        std::vector<std::size_t> idx(cand.size());
        for (std::size_t i = 0; i < idx.size(); ++i) idx[i] = i;
        std::shuffle(idx.begin(), idx.end(), rng_);
        idx.resize(static_cast<std::size_t>(k));
        std::sort(idx.begin(), idx.end());
        for (auto i : idx) keep.push_back(cand[i]);
      }
      kept[static_cast<std::size_t>(h)] = static_cast<std::int32_t>(keep.size());
      next[static_cast<std::size_t>(h)] = std::move(keep);
    }
    std::vector<std::int32_t> expected(kept.size());
    m_.expected_kept(id, c, expected.data());
    for (std::int32_t h = 0; h < L_ * H_; ++h) {
      auto const& r = plan_.rules[static_cast<std::size_t>(h)];
      if (r.kind == layer_kind::compressed)
        REQUIRE(kept[static_cast<std::size_t>(h)] <= expected[static_cast<std::size_t>(h)]);
      else
        REQUIRE(kept[static_cast<std::size_t>(h)] == expected[static_cast<std::size_t>(h)]);
    }
    m_.commit_chunk(id, kept);
    q.tags = std::move(next);
    q.dropped.assign(static_cast<std::size_t>(L_ * H_), {});  // rollback reaches this turn only
    q.n = n;
    q.prompt_remaining -= c;
    if (q.prompt_remaining == 0) q.phase = sequence_phase::decode;
    std::int64_t pooled_held = 0;
    for (std::int32_t g = 0; g < G_; ++g) {
      auto gi = static_cast<std::size_t>(g);
      if (pooled(g)) {
        // Each compressed group holds ceil(longest kept / P); the staging it did not keep went
        // back into the shared budget.
        auto now = in_use(q, g);
        q.pooled_budget -= now - q.held[gi];
        q.held[gi] = now;
        pooled_held += now;
      } else {
        q.held[gi] = std::min(q.held[gi], q.target[gi]);
      }
    }
    if (elastic_) {
      REQUIRE(pooled_held <= q.pooled_limit);
      REQUIRE(q.pooled_budget >= 0);
      if (q.phase == sequence_phase::decode) {
        // The shared budget becomes exactly what the T decode tokens need (never less).
        std::int64_t need = 0;
        for (std::int32_t g = 0; g < G_; ++g)
          if (pooled(g))
            need += ceil_div(longest(q, g) + q.max_new, P_) - q.held[static_cast<std::size_t>(g)];
        REQUIRE(q.pooled_budget >= need);
        q.pooled_budget = need;
      }
    }
    // The engine's fused eviction writes the kept tokens compacted into the group's pages.
    write_all(q);
  }

  /// Prepares a chunk and then frees the sequence before committing (an abort mid-chunk).
  void abort_mid_chunk(sequence_id id, std::int64_t c) {
    m_.prepare_chunk(id, c);
    free(id);
  }

  /// One decode step over `batch`: one token each, or `tokens[r]` for member r (speculative
  /// decoding, `decode_step(counts)`).
  void decode(std::vector<sequence_id> const& batch, std::vector<std::int32_t> const& tokens = {}) {
    m_.set_batch(batch);
    if (tokens.empty())
      m_.decode_step();
    else
      m_.decode_step(tokens);
    auto v = m_.view();
    for (std::int32_t r = 0; r < static_cast<std::int32_t>(batch.size()); ++r)
      appended(v, r, tokens.empty() ? 1 : tokens[static_cast<std::size_t>(r)]);
  }

  /**
   * One mixed step, as vLLM v1 / SGLang schedule it: the prefill batch `pre` (chunk `chunks[i]`
   * for pre[i]) and the decode batch `dec` set side by side, each padded to a fixed capacity
   * (`pad_pre`, `pad_dec`: 0 or >= the member count), both views taken before either "kernel"
   * runs; then `decode_step()` over the padded decode batch, the decode tokens written through
   * the decode view and the chunks evicted through the prefill view. Checks both views
   * independently: members in order, padding requests in the padding slot with no tokens, the
   * padding slot's rows zero, both views sharing every page-table array.
   */
  void mixed_step(std::vector<sequence_id> const& pre,
                  std::vector<std::int64_t> const& chunks,
                  std::vector<sequence_id> const& dec,
                  std::size_t pad_pre,
                  std::size_t pad_dec) {
    m_.set_batch(batch_kind::prefill, pre, pad_pre);
    m_.set_batch(batch_kind::decode, dec, pad_dec);
    for (std::size_t i = 0; i < pre.size(); ++i) m_.prepare_chunk(pre[i], chunks[i]);
    m_.decode_step();
    auto pv = m_.view(batch_kind::prefill), dv = m_.view(batch_kind::decode);
    check_batch_view(pv, pre, pad_pre);
    check_batch_view(dv, dec, pad_dec);
    REQUIRE(pv.pages == dv.pages);
    REQUIRE(pv.page_offset == dv.page_offset);
    REQUIRE(pv.head_base_len == dv.head_base_len);
    REQUIRE(pv.appended == dv.appended);
    REQUIRE(pv.seq_tokens == dv.seq_tokens);
    REQUIRE(pv.padding_slot == m_.max_sequences());
    REQUIRE(dv.padding_slot == m_.max_sequences());
    REQUIRE(m_.batch_padding(batch_kind::decode) ==
            dv.batch_size - static_cast<std::int32_t>(dec.size()));
    for (std::int32_t r = 0; r < static_cast<std::int32_t>(dec.size()); ++r) appended(dv, r, 1);
    for (std::size_t i = 0; i < pre.size(); ++i) chunk(pre[i], chunks[i], true);
  }

  /// `append_tokens(id, k)`: k speculative tokens for one sequence, written through its view.
  void append(sequence_id id, std::int64_t k) {
    m_.append_tokens(id, k);
    m_.set_batch({id});
    appended(m_.view(), 0, k);
  }

  /// `rollback(id, k)`: the last k tokens of every head go; sliding heads get back the tokens
  /// they had pushed out of their window; pages past what the heads use return to the budgets
  /// (under deferred reuse as the sequence's spares: same budgets, the pool not involved).
  void rollback(sequence_id id, std::int64_t k) {
    m_.rollback(id, k);
    auto& q = seqs_.at(id.slot);
    q.n -= k;
    q.decoded -= k;
    for (std::int32_t h = 0; h < L_ * H_; ++h) {
      auto hi        = static_cast<std::size_t>(h);
      auto& t        = q.tags[hi];
      auto const& ru = plan_.rules[hi];
      if (ru.kind != layer_kind::sliding_window) {
        t.resize(t.size() - static_cast<std::size_t>(k));
        continue;
      }
      // The tokens this turn pushed out, then the window: drop the last k, keep the new window.
      auto& d = q.dropped[hi];
      std::vector<float> all(d);
      all.insert(all.end(), t.begin(), t.end());
      REQUIRE(static_cast<std::int64_t>(all.size()) >= k);
      all.resize(all.size() - static_cast<std::size_t>(k));
      auto w = std::min<std::int64_t>(q.n, ru.window);
      REQUIRE(static_cast<std::int64_t>(all.size()) >= w);
      t.assign(all.end() - static_cast<std::ptrdiff_t>(w), all.end());
      d.assign(all.begin(), all.end() - static_cast<std::ptrdiff_t>(w));
    }
    for (std::int32_t g = 0; g < G_; ++g) {
      auto gi  = static_cast<std::size_t>(g);
      auto now = std::min(q.held[gi], in_use(q, g));
      if (pooled(g)) q.pooled_budget += q.held[gi] - now;  // back into the shared budget
      q.held[gi] = now;
    }
  }

  /// Pages `try_extend(q, more)` reserves, from the model: each static group's target grows to
  /// the pages its heads reach after max_new + more decode tokens (`static_pages`); the
  /// compressed groups of an elastic plan reserve what their decode then needs beyond their
  /// shared budget (`pooled_pages`).
  struct extension {
    std::int64_t static_pages = 0, pooled_pages = 0;
    std::int64_t total() const { return static_pages + pooled_pages; }
  };
  extension extension_pages(sim_sequence const& q, std::int64_t more) const {
    extension e;
    std::int64_t pooled_need = 0;
    for (std::int32_t g = 0; g < G_; ++g) {
      auto end = extension_end(q, g, q.max_new + more);
      if (pooled(g))
        pooled_need += std::max<std::int64_t>(0, end - q.held[static_cast<std::size_t>(g)]);
      else
        e.static_pages += std::max<std::int64_t>(0, end - q.target[static_cast<std::size_t>(g)]);
    }
    e.pooled_pages = std::max<std::int64_t>(0, pooled_need - q.pooled_budget);
    return e;
  }

  /// `try_extend(id, more)`; the model follows when it fits.
  bool extend(sequence_id id, std::int64_t more) {
    auto& q  = seqs_.at(id.slot);
    auto e   = extension_pages(q, more);
    auto res = m_.info(id).reserved_pages;
    if (!m_.try_extend(id, more)) return false;
    REQUIRE(m_.info(id).reserved_pages == res + e.total());
    q.max_new += more;
    q.pooled_budget += e.pooled_pages;
    for (std::int32_t g = 0; g < G_; ++g) {
      auto gi      = static_cast<std::size_t>(g);
      q.target[gi] = std::max(q.target[gi], extension_end(q, g, q.max_new));
    }
    return true;
  }

  /// Pages group g of q (in decode) reaches after `max_new` decode tokens in its turn.
  std::int64_t extension_end(sim_sequence const& q, std::int32_t g, std::int64_t max_new) const {
    if (rule(g).kind == layer_kind::sliding_window)
      return std::min(ceil_div(q.n - q.decoded + max_new, P_), ring_pages(rule(g), P_));
    return ceil_div(longest(q, g) - q.decoded + max_new, P_);
  }

  void end_turn(sequence_id id) {
    m_.end_turn(id);
    auto& q = seqs_.at(id.slot);
    q.phase = sequence_phase::ended;
    for (std::int32_t g = 0; g < G_; ++g)
      q.held[static_cast<std::size_t>(g)] = q.target[static_cast<std::size_t>(g)] = in_use(q, g);
    q.pooled_budget = 0;  // the limit stays the ended turn's
  }

  bool continue_turn(sequence_id id, std::int64_t N, std::int64_t T) {
    // Compressed pages a fork still shares: the turn copies them and counts each once more in
    // its target (an eviction may drop a copy before the engine completed it).
    std::int64_t shared = 0;
    for (std::int32_t g = 0; elastic_ && g < G_; ++g) {
      if (!pooled(g)) continue;
      auto const* pages = m_.group_pages(id, g);
      for (std::int32_t p = 0; p < m_.group_page_count(id, g); ++p)
        shared += m_.pool().ref_count(pages[p]) > 1;
    }
    if (!m_.continue_turn(id, N, T)) return false;
    copy_pages();
    next_turn(seqs_.at(id.slot), N, T, shared);
    return true;
  }

  /// The model of a next turn of (N, T) on q (ended), `shared` compressed pages copied on write.
  void next_turn(sim_sequence& q, std::int64_t N, std::int64_t T, std::int64_t shared) {
    q.phase            = sequence_phase::prefill;
    q.prompt_remaining = N;
    q.max_new          = T;
    q.decoded          = 0;
    for (std::int32_t g = 0; g < G_; ++g)
      if (!pooled(g)) q.target[static_cast<std::size_t>(g)] = group_pages(rule(g), q.n + N, T, P_);
    if (elastic_) {
      // Limit max(R(n + N), held); target limit + G_c ceil(T / P) + staging; the held pages
      // count against it (those shared with a fork were copied from the budget).
      std::int64_t held = 0;
      for (std::int32_t g = 0; g < G_; ++g)
        if (pooled(g)) held += q.held[static_cast<std::size_t>(g)];
      q.pooled_limit      = std::max(elastic_limit(q.n + N), held);
      std::int64_t target = turn_pages(q.pooled_limit, q.n + N, N, T) + shared;
      q.pooled_budget     = target - held;
      for (std::int32_t g = 0; g < G_; ++g) {
        auto gi = static_cast<std::size_t>(g);
        if (pooled(g))
          q.target[gi] = std::max(q.held[gi], std::min(ceil_div(q.n + N + T, P_), target));
      }
    }
  }

  /// A session parked in host memory: the manager's descriptor, the host pages (host pools;
  /// empty for simulated ones) and the model of what it holds.
  struct parked {
    parked_session session;
    std::vector<std::byte> host;
    sim_sequence model;
  };

  /// `park(id)` (ended or in decode): the model enters phase parking (pages and any reservation
  /// still held). The returned session lists the first pages its heads use in every group (a
  /// turn's list may hold more, with nothing in them), to copy out (`copy_out`) before
  /// `complete_park`; a turn in decode carries its decoded and reserved answer tokens.
  parked_session park(sequence_id id) {
    auto& q  = seqs_.at(id.slot);
    bool mid = q.phase == sequence_phase::decode;
    auto p   = m_.park(id);
    REQUIRE(p.host_pages() == static_cast<std::int64_t>(p.device_pages.size()));
    REQUIRE(p.mid_turn == mid);
    REQUIRE(p.decoded == (mid ? q.decoded : 0));
    REQUIRE(p.max_new == (mid ? q.max_new : 0));
    REQUIRE(p.seq_tokens == q.n);
    std::int64_t k = 0;
    for (std::int32_t g = 0; g < G_; ++g) {
      REQUIRE(p.group_pages[static_cast<std::size_t>(g)] == in_use(q, g));
      auto const* pages = m_.group_pages(id, g);
      for (std::int32_t i = 0; i < in_use(q, g); ++i)
        REQUIRE(p.device_pages[static_cast<std::size_t>(k++)] == pages[i]);
    }
    q.phase           = sequence_phase::parking;
    q.parked_mid_turn = mid;
    return p;
  }

  /// The engine's copy-out of a park: host page k <- device page k (host pools only).
  std::vector<std::byte> copy_out(parked_session const& p) const {
    std::vector<std::byte> host;
    if (!data_) return host;
    host.resize(static_cast<std::size_t>(p.host_pages() * p.page_bytes));
    copy_pages_to_host(
        m_.pool().base(), p.page_bytes, p.device_pages.data(), p.device_pages.size(), host.data());
    return host;
  }

  /// `complete_park(id)` after the copy-out: the sequence leaves the manager and the model; the
  /// returned value holds what an engine keeps.
  parked complete_park(sequence_id id, parked_session session, std::vector<std::byte> host) {
    m_.complete_park(id);
    parked out{std::move(session), std::move(host), seqs_.at(id.slot)};
    out.model.phase = out.model.parked_mid_turn ? sequence_phase::decode : sequence_phase::ended;
    seqs_.erase(id.slot);
    return out;
  }

  void cancel_park(sequence_id id) {
    m_.cancel_park(id);
    auto& q           = seqs_.at(id.slot);
    q.phase           = q.parked_mid_turn ? sequence_phase::decode : sequence_phase::ended;
    q.parked_mid_turn = false;
  }

  /// The engine's copy-in of a restore: device page `r.device_pages[k]` <- host page k of `p`
  /// (host pools only; one new page per host page).
  void copy_in(parked const& p, restored_session const& r) {
    REQUIRE(static_cast<std::int64_t>(r.device_pages.size()) == p.session.host_pages());
    if (data_)
      copy_pages_from_host(m_.pool().base(),
                           p.session.page_bytes,
                           r.device_pages.data(),
                           r.device_pages.size(),
                           p.host.data());
  }

  /// `try_resume(p, T)` of a turn parked in decode; when it fits, the host pages are copied into
  /// the new pages and the model is the parked one in decode with T answer tokens in all: each
  /// group holds the pages its heads use and targets what its longest head reaches after the
  /// whole answer (the compressed groups of an elastic plan share their targets, also their
  /// limit); the reservation is the targets less the held pages (resume_pages less the history).
  std::optional<sequence_id> resume(parked const& p, std::int64_t T) {
    auto need = m_.resume_pages(p.session, T);
    auto r    = m_.try_resume(p.session, T);
    if (!r) return std::nullopt;
    copy_in(p, *r);
    auto q            = p.model;
    q.id              = r->id;
    q.phase           = sequence_phase::decode;
    q.parked_mid_turn = false;
    q.max_new         = T;
    q.pooled_budget = q.pooled_limit = 0;
    std::int64_t reserved            = 0;
    for (std::int32_t g = 0; g < G_; ++g) {
      auto gi      = static_cast<std::size_t>(g);
      q.held[gi]   = in_use(q, g);
      q.target[gi] = std::max(q.held[gi], extension_end(q, g, T));
      if (pooled(g)) {
        q.pooled_limit += q.target[gi];
        q.pooled_budget += q.target[gi] - q.held[gi];
      } else {
        reserved += q.target[gi] - q.held[gi];
      }
    }
    reserved += q.pooled_budget;
    REQUIRE(m_.info(r->id).reserved_pages == reserved);
    REQUIRE(need == reserved + p.session.host_pages());
    seqs_[r->id.slot] = q;
    return r->id;
  }

  /// `try_unpark(p, N, T)`; when it fits, the host pages are copied into the new pages and the
  /// model is the parked one after a next turn (nothing shared: no copy on write).
  std::optional<sequence_id> unpark(parked const& p, std::int64_t N, std::int64_t T) {
    auto r = m_.try_unpark(p.session, N, T);
    if (!r) return std::nullopt;
    copy_in(p, *r);
    auto q = p.model;
    q.id   = r->id;
    next_turn(q, N, T, 0);
    seqs_[r->id.slot] = q;
    return r->id;
  }

  std::optional<sequence_id> fork(sequence_id id) {
    auto child = m_.fork(id);
    if (!child) return std::nullopt;
    copy_pages();
    auto q = seqs_.at(id.slot);
    q.id   = *child;
    // Elastic: the child's compressed groups may reach what the parent's reach by the end of
    // its decode; those pages are its limit, and what they do not use yet its budget.
    q.pooled_budget = q.pooled_limit = 0;
    for (std::int32_t g = 0; g < G_; ++g) {
      auto gi    = static_cast<std::size_t>(g);
      q.held[gi] = in_use(q, g);
      if (pooled(g)) {
        q.target[gi] = pooled_decode_end(q, g);
        q.pooled_limit += q.target[gi];
        q.pooled_budget += q.target[gi] - q.held[gi];
      } else if (q.phase == sequence_phase::ended) {
        q.target[gi] = in_use(q, g);
      }
    }
    seqs_[child->slot] = q;
    return child;
  }

  void free(sequence_id id) {
    m_.free(id);
    seqs_.erase(id.slot);
  }

  /// Checks every sequence token by token through the view, the model's page counts and
  /// reservations, and the reference counts against the owners found in the page lists.
  void verify() {
    auto list = ids();
    // The manager lists exactly the model's sequences, with their phases.
    auto live = m_.sequences();
    REQUIRE(live.size() == list.size());
    for (std::size_t k = 0; k < live.size(); ++k) {
      REQUIRE(live[k].id == list[k]);
      REQUIRE(live[k].phase == seqs_.at(list[k].slot).phase);
    }
    m_.set_batch(list);
    auto v = m_.view();
    std::vector<std::uint32_t> owners(static_cast<std::size_t>(m_.pool().capacity()), 0);
    std::int64_t reserved = 0;
    for (std::int32_t r = 0; r < static_cast<std::int32_t>(list.size()); ++r) {
      auto const& q = seqs_.at(list[static_cast<std::size_t>(r)].slot);
      auto info     = m_.info(q.id);
      REQUIRE(info.phase == q.phase);
      REQUIRE(info.seq_tokens == q.n);
      REQUIRE(info.prompt_remaining == q.prompt_remaining);
      REQUIRE(info.decoded == q.decoded);
      REQUIRE(v.seq_tokens[v.seq_slot(r)] == q.n);
      for (std::int32_t h = 0; h < L_ * H_; ++h) {
        auto const& t = q.tags[static_cast<std::size_t>(h)];
        REQUIRE(v.head_len(r, h / H_, h % H_) == static_cast<std::int32_t>(t.size()));
        REQUIRE(m_.head_len(q.id, h / H_, h % H_) == static_cast<std::int64_t>(t.size()));
        for (std::size_t i = 0; data_ && i < t.size(); ++i) {
          auto loc = v.locate(r, h / H_, h % H_, static_cast<std::int32_t>(i));
          auto col = v.slot_of(h / H_, h % H_).column;
          for (std::int32_t x = 0; x < plan_.geometry.head_dim; ++x) {
            float k  = v.element_ptr<float>(loc, col, 0)[x];
            float vv = v.element_ptr<float>(loc, col, 1)[x];
            if (k != t[i] + static_cast<float>(x) || vv != -(t[i] + static_cast<float>(x))) {
              INFO("slot " << q.id.slot << " layer " << h / H_ << " head " << h % H_ << " token "
                           << i << " of " << t.size() << " page " << loc.page << ": K " << k
                           << " expected " << t[i] + x);
              REQUIRE(false);
            }
          }
        }
      }
      std::int64_t res = 0;
      for (std::int32_t g = 0; g < G_; ++g) {
        auto gi = static_cast<std::size_t>(g);
        INFO("slot " << q.id.slot << " group " << g << " phase " << to_string(q.phase));
        REQUIRE(m_.group_page_count(q.id, g) == q.held[gi]);
        REQUIRE(m_.group_target(q.id, g) == q.target[gi]);
        REQUIRE(m_.group_pages_in_use(q.id, g) == in_use(q, g));
        bool holds_turn = q.phase != sequence_phase::ended &&
                          (q.phase != sequence_phase::parking || q.parked_mid_turn);
        std::int64_t model_res =
            !holds_turn || pooled(g) ? 0 : q.target[gi] - std::min(q.held[gi], q.target[gi]);
        REQUIRE(m_.group_reserved(q.id, g) == model_res);
        res += model_res;
        auto pages = m_.group_pages(q.id, g);
        for (std::int32_t p = 0; p < m_.group_page_count(q.id, g); ++p)
          ++owners[static_cast<std::size_t>(pages[p])];
      }
      {
        INFO("slot " << q.id.slot << " phase " << to_string(q.phase) << " shared budget");
        REQUIRE(m_.elastic_page_limit(q.id) == q.pooled_limit);
        res += q.pooled_budget;
      }
      REQUIRE(info.reserved_pages == res);
      reserved += res;
      // Deferred reuse: spares back part of `res` with pages the sequence still references.
      m_.for_each_spare_page(q.id, [&](page_id p) {
        ++owners[static_cast<std::size_t>(p)];
        --reserved;  // not in the pool's reserved count
      });
    }
    REQUIRE(m_.pending_copies().empty());
    std::int64_t used = 0;
    for (page_id p = 0; p < m_.pool().capacity(); ++p) {
      REQUIRE(m_.pool().ref_count(p) == owners[static_cast<std::size_t>(p)]);
      used += owners[static_cast<std::size_t>(p)] > 0;
    }
    auto ps = m_.pool().stats();
    REQUIRE(ps.used == used);
    REQUIRE(ps.reserved == reserved);
    REQUIRE(ps.used + ps.reserved <= ps.capacity);
    REQUIRE(m_.stats().reclaimed_pages == 0);
    m_.check_invariants();
  }

  head_rule const& rule(std::int32_t g) const {
    return plan_.grouping.groups[static_cast<std::size_t>(g)].rule;
  }

  std::int64_t in_use(sim_sequence const& q, std::int32_t g) const {
    auto const& r = rule(g);
    if (r.kind == layer_kind::sliding_window) return std::min(ceil_div(q.n, P_), ring_pages(r, P_));
    std::int64_t longest = 0;
    for (auto m : plan_.grouping.groups[static_cast<std::size_t>(g)].members)
      longest = std::max<std::int64_t>(
          longest,
          static_cast<std::int64_t>(
              q.tags[static_cast<std::size_t>(m.layer * H_ + m.head)].size()));
    return ceil_div(longest, P_);
  }

  /// The longest member head of group g, in tokens.
  std::int64_t longest(sim_sequence const& q, std::int32_t g) const {
    std::int64_t out = 0;
    for (auto mb : plan_.grouping.groups[static_cast<std::size_t>(g)].members)
      out = std::max<std::int64_t>(
          out,
          static_cast<std::int64_t>(
              q.tags[static_cast<std::size_t>(mb.layer * H_ + mb.head)].size()));
    return out;
  }

  /// The compressed groups' flat member heads, in group order (elastic; empty otherwise).
  std::vector<std::vector<std::int32_t>> const& pooled_members() const { return pooled_members_; }

 private:
  /// Elastic eviction of one chunk: a random need per compressed head, the optimal group lengths
  /// within the limit, each head keeping min(length, candidates) (a few fewer sometimes, never
  /// below its protected tokens). Returns kept counts per flat head (compressed heads only).
  std::vector<std::int64_t> elastic_eviction(sim_sequence const& q,
                                             sequence_id id,
                                             std::int64_t c) {
    REQUIRE(m_.elastic_page_limit(id) == q.pooled_limit);
    std::vector<std::int64_t> needs, cand;
    std::vector<std::int32_t> order;
    for (auto const& grp : pooled_members_)
      for (auto h : grp) {
        auto k = static_cast<std::int64_t>(q.tags[static_cast<std::size_t>(h)].size()) + c;
        needs.push_back(
            std::uniform_int_distribution<std::int64_t>(std::min(protect_, k), k)(rng_));
        cand.push_back(k);
        order.push_back(static_cast<std::int32_t>(order.size()));
      }
    reference::elastic_selection_input sel;
    sel.needs        = &needs;
    sel.members      = &order;
    sel.group_size   = Hp_;
    sel.page_tokens  = P_;
    sel.candidates   = q.n + c;
    sel.protect      = protect_;
    sel.budget_pages = q.pooled_limit;
    auto r           = reference::select_group_lengths(sel);
    REQUIRE(r.fits);  // the limit always covers the protected floors
    REQUIRE(r.pages_used <= q.pooled_limit);
    ++elastic_evictions_;
    elastic_clipped_ += r.wanted_clipped();
    std::vector<std::int64_t> kept(static_cast<std::size_t>(L_ * H_), 0);
    std::size_t i = 0;
    for (std::size_t k = 0; k < pooled_members_.size(); ++k) {
      auto len = r.group_pages[k] * P_;
      for (auto h : pooled_members_[k]) {
        auto x = std::min(len, cand[i++]);
        if (std::uniform_real_distribution<double>(0, 1)(rng_) < keep_fewer_)
          x = std::max(std::min(protect_, x), x - static_cast<std::int64_t>(rng_() % 4));
        kept[static_cast<std::size_t>(h)] = x;
      }
    }
    return kept;
  }

  /// Request r of view v appended k tokens: the model pushes k tags per head (a sliding head
  /// drops the oldest past its window, kept for a rollback), writes the last ones through the
  /// view, and counts the pages drawn.
  void appended(kv_cache_view const& v, std::int32_t r, std::int64_t k) {
    auto& q = seqs_.at(v.seq_slot(r));
    q.n += k;
    q.decoded += k;
    if (q.dropped.empty()) q.dropped.assign(static_cast<std::size_t>(L_ * H_), {});
    for (std::int32_t h = 0; h < L_ * H_; ++h) {
      auto hi        = static_cast<std::size_t>(h);
      auto& t        = q.tags[hi];
      auto const& ru = plan_.rules[hi];
      for (std::int64_t j = 0; j < k; ++j) {
        t.push_back(next_tag_++);
        if (ru.kind == layer_kind::sliding_window &&
            t.size() > static_cast<std::size_t>(ru.window)) {
          auto& d = q.dropped[hi];
          d.push_back(t.front());
          if (d.size() > static_cast<std::size_t>(2 * P_)) d.erase(d.begin());
          t.erase(t.begin());
        }
      }
      auto from = t.size() - std::min(t.size(), static_cast<std::size_t>(k));
      for (auto i = from; i < t.size(); ++i)
        write_token(v, r, h / H_, h % H_, static_cast<std::int32_t>(i), t[i]);
    }
    for (std::int32_t g = 0; g < G_; ++g) {
      auto gi  = static_cast<std::size_t>(g);
      auto now = std::max(q.held[gi], in_use(q, g));
      if (pooled(g)) q.pooled_budget -= now - q.held[gi];  // drawn from the shared budget
      q.held[gi] = now;
    }
  }

  std::int64_t need_pages(std::int32_t g, std::int64_t n) const {
    auto const& r = rule(g);
    if (r.kind == layer_kind::sliding_window) return std::min(ceil_div(n, P_), ring_pages(r, P_));
    return ceil_div(retained_tokens(r, n), P_);
  }

  void copy_pages() {
    if (data_)
      m_.execute_page_copies_host();
    else
      m_.complete_page_copies();
  }

  void write_token(kv_cache_view const& v,
                   std::int32_t r,
                   std::int32_t l,
                   std::int32_t h,
                   std::int32_t i,
                   float tag) {
    if (!data_) return;
    auto loc = v.locate(r, l, h, i);
    auto col = v.slot_of(l, h).column;
    REQUIRE(m_.pool().ref_count(loc.page) == 1);  // never write a shared page
    for (std::int32_t x = 0; x < plan_.geometry.head_dim; ++x) {
      v.element_ptr<float>(loc, col, 0)[x] = tag + static_cast<float>(x);
      v.element_ptr<float>(loc, col, 1)[x] = -(tag + static_cast<float>(x));
    }
  }

  /// What the eviction kernel leaves in the pages of q, written through the prefill batch's view
  /// (the decode batch stays as it is, as in an engine's mixed step).
  /// A batch view of `ids` padded to `padded` (0: none), checked against the model.
  void check_batch_view(kv_cache_view const& v,
                        std::vector<sequence_id> const& ids,
                        std::size_t padded) {
    auto n = static_cast<std::int32_t>(ids.size());
    REQUIRE(v.batch_size == static_cast<std::int32_t>(padded == 0 ? ids.size() : padded));
    auto pad = v.padding_slot;
    REQUIRE(pad == m_.max_sequences());
    for (std::int32_t r = 0; r < v.batch_size; ++r) {
      REQUIRE(v.is_padding(r) == (r >= n));
      if (r < n) {
        REQUIRE(v.batch_slots[r] == ids[static_cast<std::size_t>(r)].slot);
        continue;
      }
      REQUIRE(v.batch_slots[r] == pad);
      for (std::int32_t h = 0; h < L_ * H_; ++h) REQUIRE(v.head_len(r, h / H_, h % H_) == 0);
    }
    // The padding slot's rows hold nothing (every kernel reads zeros there).
    REQUIRE(v.appended[pad] == 0);
    REQUIRE(v.seq_tokens[pad] == 0);
    for (std::int32_t g = 0; g < G_; ++g)
      REQUIRE(v.page_offset[static_cast<std::int64_t>(pad) * G_ + g] == 0);
    for (std::int32_t h = 0; h < L_ * H_; ++h)
      REQUIRE(v.head_base_len[static_cast<std::int64_t>(pad) * L_ * H_ + h] == 0);
  }

  void write_all(sim_sequence const& q) {
    if (!data_) return;
    std::vector<sequence_id> one{q.id};
    m_.set_batch(batch_kind::prefill, one);
    auto v = m_.view(batch_kind::prefill);
    for (std::int32_t h = 0; h < L_ * H_; ++h) {
      auto const& t = q.tags[static_cast<std::size_t>(h)];
      for (std::size_t i = 0; i < t.size(); ++i)
        write_token(v, 0, h / H_, h % H_, static_cast<std::int32_t>(i), t[i]);
    }
  }

  kv_cache_manager& m_;
  static_plan const& plan_;
  std::mt19937 rng_;
  double keep_fewer_;
  std::int32_t L_ = 0, H_ = 0, P_ = 0, G_ = 0;
  float next_tag_       = 1;
  bool data_            = true;
  bool elastic_         = false;
  std::int32_t Hp_      = 1;
  std::int64_t protect_ = 0, Gc_ = 0, max_chunk_ = 1;
  /// Elastic staging of a turn of N prompt tokens: one chunk, at most min(max_chunk, N) tokens,
  /// in every compressed group.
  [[nodiscard]] std::int64_t staging(std::int64_t N) const {
    return elastic_ ? Gc_ * ceil_div(std::min(max_chunk_, N), P_) : 0;
  }
  /// The compressed groups' shared total of a turn of N prompt and T decode tokens that ends at
  /// `tokens` (n + N): the limit plus the larger of the answer's pages and the staging (a turn
  /// stages only before it decodes), capped at what the groups hold uncompressed after the turn.
  [[nodiscard]] std::int64_t turn_pages(std::int64_t limit,
                                        std::int64_t tokens,
                                        std::int64_t N,
                                        std::int64_t T) const {
    return std::min(limit + std::max(Gc_ * ceil_div(T, P_), staging(N)),
                    Gc_ * ceil_div(tokens + T, P_));
  }
  std::int64_t elastic_evictions_ = 0, elastic_clipped_ = 0;
  std::vector<bool> pooled_;
  std::vector<std::vector<std::int32_t>> pooled_members_;
  std::map<std::int32_t, sim_sequence> seqs_;
  admit_result last_admit_;
};

}  // namespace tangram::test
