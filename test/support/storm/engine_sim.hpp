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
// on a fork; the staged pages after prepare_chunk (ceil((longest + c) / P) per group, kept after a
// commit until the prompt is in); each compressed group's pages after the last chunk's commit
// (ceil(longest kept / P)); the shared budget (admission: min(R(N) + max(G_c ceil(T / P),
// staging), G_c ceil((N + T) / P)); each chunk draws what its staging grows by and gives back what
// it shrinks by, each decode step what the groups grow by, and the last chunk's unkept staging
// returns; after the last chunk
// exactly the decode need, sum of ceil((longest + T) / P) - held; next turn: min(limit +
// max(G_c ceil(T / P), staging), G_c ceil((n + N + T) / P)) + copies - held;
// fork: sum of the parent's decode ends - pages in use; 0 once ended); and each compressed group's
// list bound (group_target). Not checked: the reservation while a chunk is prepared but not
// committed (the storm verifies only between calls), and the exclusive/shared split a next turn
// reserves before its copy-on-write copies run (only the total after the copies is predicted).
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

#include "engine_model.hpp"
#include "manager_snapshot.hpp"

namespace tangram::test {

/// The engine operations over the model of engine_model.hpp: each call drives the manager as an
/// engine would, writes the K/V tags through the view and updates the model.
class engine_sim : public engine_model {
 public:
  using engine_model::engine_model;

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
      if (pooled(g)) {
        // Staged: exactly the chunk after the group's longest head. The pages the previous chunk
        // staged stayed in the list; those beyond this need went back into the shared budget.
        // (Every page given back is credited: no copy is pending here, the storm completes a
        // turn's copies right after its admission; a page a pending copy reads would stay.)
        auto staged = ceil_div(longest(q, g) + c, P_);
        REQUIRE(m_.pending_copies().empty());
        REQUIRE(m_.group_page_count(id, g) == staged);
        q.pooled_budget -= staged - q.held[gi];
        q.held[gi] = staged;
      } else {
        q.held[gi] = std::max(q.held[gi], need_pages(g, n));
      }
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
        // A shared prefix's pinned tokens lead the candidates and are always kept, in place.
        std::int64_t pinned = pin(q, plan_.grouping.slots[static_cast<std::size_t>(h)].group);
        REQUIRE(pinned <= static_cast<std::int64_t>(q.tags[static_cast<std::size_t>(h)].size()));
        if (elastic_) {
          k = elastic_kept[static_cast<std::size_t>(h)];
        } else {
          auto e =
              std::min<std::int64_t>(retained_tokens(r, n), static_cast<std::int64_t>(cand.size()));
          e = std::max(e, pinned);
          k = e;
          if (std::uniform_real_distribution<double>(0, 1)(rng_) < keep_fewer_)
            k = std::max<std::int64_t>(pinned, e - static_cast<std::int64_t>(rng_() % 4));
        }
        REQUIRE(k >= pinned);
        if (!data_) {  // counts only: which tokens does not matter
          next[static_cast<std::size_t>(h)] = std::vector<float>(cand.begin(), cand.begin() + k);
          kept[static_cast<std::size_t>(h)] = static_cast<std::int32_t>(k);
          continue;
        }
        // The pinned candidates, then a random order-preserving subset of the others.
        std::vector<std::size_t> idx(cand.size() - static_cast<std::size_t>(pinned));
        for (std::size_t i = 0; i < idx.size(); ++i) idx[i] = static_cast<std::size_t>(pinned) + i;
        std::shuffle(idx.begin(), idx.end(), rng_);
        idx.resize(static_cast<std::size_t>(k - pinned));
        std::sort(idx.begin(), idx.end());
        for (std::int64_t i = 0; i < pinned; ++i) keep.push_back(cand[static_cast<std::size_t>(i)]);
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
    std::vector<std::size_t> held_before(static_cast<std::size_t>(L_ * H_));
    for (std::size_t h = 0; h < held_before.size(); ++h) held_before[h] = q.tags[h].size();
    q.tags = std::move(next);
    q.dropped.assign(static_cast<std::size_t>(L_ * H_), {});  // rollback reaches this turn only
    q.n = n;
    q.prompt_remaining -= c;
    if (q.prompt_remaining == 0) q.phase = sequence_phase::decode;
    std::int64_t pooled_used = 0;
    for (std::int32_t g = 0; g < G_; ++g) {
      auto gi = static_cast<std::size_t>(g);
      if (pooled(g)) {
        // Each compressed group uses ceil(longest kept / P). Until the prompt is in it keeps the
        // chunk's staged pages for the next chunk; then the staging it did not keep goes back
        // into the shared budget.
        auto now = in_use(q, g);
        pooled_used += now;
        if (q.phase == sequence_phase::decode) {
          q.pooled_budget -= now - q.held[gi];
          q.held[gi] = now;
        }
      } else {
        q.held[gi] = std::min(q.held[gi], q.target[gi]);
      }
    }
    if (elastic_) {
      REQUIRE(pooled_used <= q.pooled_limit);
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
    // The engine's fused eviction writes the kept tokens compacted into the group's pages (an
    // uncompressed head's chunk appended after what it held).
    write_all(q, &held_before);
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
    // A pinned prefix's pages stay shared, never copied.
    auto& q             = seqs_.at(id.slot);
    std::int64_t shared = 0;
    for (std::int32_t g = 0; elastic_ && g < G_; ++g) {
      if (!pooled(g)) continue;
      auto const* pages = m_.group_pages(id, g);
      for (auto p = pin(q, g) / P_; p < m_.group_page_count(id, g); ++p)
        shared += m_.pool().ref_count(pages[p]) > 1;
    }
    if (!m_.continue_turn(id, N, T)) return false;
    copy_pages();
    // The turn keeps the pin, or the part of it within what a static group keeps.
    for (std::int32_t g = 0; g < G_ && !q.pinned.empty(); ++g) {
      auto gi = static_cast<std::size_t>(g);
      if (pooled(g) || rule(g).kind != layer_kind::compressed) continue;
      auto keep =
          std::min({q.held[gi], group_pages(rule(g), q.n + N, T, P_), pin_cap_pages(g, q.n + N)});
      q.pinned[gi] = std::min(q.pinned[gi], keep * P_);
    }
    next_turn(q, N, T, shared);
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
      q.pooled_limit      = std::max({elastic_limit(q.n + N), held, pinned_floor_pages(q)});
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
    auto q = p.model;
    q.id   = r->id;
    q.pinned.clear();  // fresh pages: nothing shared, nothing pinned
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
    q.pinned.clear();  // fresh pages: nothing shared, nothing pinned
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

  /// `try_admit_with_prefix(prefix, N, T)` over a pinned prefix: the model is the prefix's after
  /// a next turn of (N, T); the pages every head of a growing group filled stay shared (pinned in
  /// a compressed group, unless `share_compressed_prefix` is off), the rest of a compressed
  /// group's held pages are copied; the tags read back through the view check that no later
  /// write reaches a shared page.
  std::optional<sequence_id> admit_with_prefix(sequence_id prefix, std::int64_t N, std::int64_t T) {
    auto child = m_.try_admit_with_prefix(prefix, N, T);
    if (!child) return std::nullopt;
    copy_pages();
    auto q          = seqs_.at(prefix.slot);
    q.id            = *child;
    std::int64_t cp = 0;
    // Shared, predicted: the pages every head of a growing group filled (the pinned tokens), at
    // most what the group keeps (a static group its target over n + N); the other held pages
    // of a compressed group are copied.
    q.pinned.assign(static_cast<std::size_t>(G_), 0);
    for (std::int32_t g = 0; g < G_; ++g) {
      auto gi = static_cast<std::size_t>(g);
      if (rule(g).kind == layer_kind::sliding_window) continue;
      if (rule(g).kind == layer_kind::compressed && !m_.options().share_compressed_prefix) {
        if (pooled(g)) cp += q.held[gi];  // copied whole
        continue;
      }
      auto shortest = std::numeric_limits<std::size_t>::max();
      for (auto mb : plan_.grouping.groups[gi].members)
        shortest =
            std::min(shortest, q.tags[static_cast<std::size_t>(mb.layer * H_ + mb.head)].size());
      auto keep =
          pooled(g) ? q.held[gi] : std::min(q.held[gi], group_pages(rule(g), q.n + N, T, P_));
      keep         = std::min(keep, pin_cap_pages(g, q.n + N));  // within every head's budget
      q.pinned[gi] = std::min(static_cast<std::int64_t>(shortest) / P_, keep) * P_;
      if (pooled(g)) cp += q.held[gi] - q.pinned[gi] / P_;
    }
    next_turn(q, N, T, cp);
    seqs_[child->slot] = q;
    return child;
  }

  void free(sequence_id id) {
    m_.free(id);
    seqs_.erase(id.slot);
  }
};

}  // namespace tangram::test
