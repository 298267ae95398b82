// SPDX-License-Identifier: Apache-2.0
// A miniature engine over a host-memory kv_cache_manager, plus an independent model of what every
// sequence must hold. The "engine" writes real K/V tags into the pages through the view (fused
// eviction = pick kept tokens among held + chunk, then write them compacted), so any page placed
// in two sequences without copy-on-write, released too early, or mislocated shows up as wrong
// data. The model also predicts every group's page count, target and reservation from the plan
// alone (footprint formulas), without looking at the manager's internals.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "tangram/memory/kv_cache_manager.hpp"
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
                 st.page_copies})
    v.push_back(x);
  auto ps = m.pool().stats();
  for (auto x : {ps.free, ps.reserved, ps.used, ps.peak_used, ps.allocations, ps.frees})
    v.push_back(x);
  for (page_id p = 0; p < m.pool().capacity(); ++p) v.push_back(m.pool().ref_count(p));
  v.push_back(m.live_sequences());
  v.push_back(m.batch_size());
  for (std::int32_t r = 0; r < m.batch_size(); ++r) v.push_back(m.batch_sequence(r).slot);
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
    L_    = plan_.num_layers;
    H_    = plan_.num_kv_heads;
    P_    = plan_.geometry.page_tokens;
    G_    = plan_.num_groups();
    data_ = m.pool().kind() == memory_kind::host;  // simulated pools: counts only
  }

  std::map<std::int32_t, sim_sequence>& sequences() { return seqs_; }
  std::vector<sequence_id> ids() const {
    std::vector<sequence_id> out;
    for (auto const& [s, q] : seqs_) out.push_back(q.id);
    return out;
  }
  std::mt19937& rng() { return rng_; }

  std::optional<sequence_id> admit(std::int64_t N, std::int64_t T) {
    auto id = m_.try_admit(N, T);
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
    seqs_[id->slot] = q;
    return id;
  }

  /// One prefill chunk with fused eviction; returns the kept counts used.
  void chunk(sequence_id id, std::int64_t c) {
    auto& q        = seqs_.at(id.slot);
    std::int64_t n = q.n + c;
    m_.prepare_chunk(id, c);
    for (std::int32_t g = 0; g < G_; ++g)
      q.held[static_cast<std::size_t>(g)] =
          std::max(q.held[static_cast<std::size_t>(g)], need_pages(g, n));
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
        auto e =
            std::min<std::int64_t>(retained_tokens(r, n), static_cast<std::int64_t>(cand.size()));
        auto k = e;
        if (std::uniform_real_distribution<double>(0, 1)(rng_) < keep_fewer_)
          k = std::max<std::int64_t>(0, e - static_cast<std::int64_t>(rng_() % 4));
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
    q.n    = n;
    q.prompt_remaining -= c;
    if (q.prompt_remaining == 0) q.phase = sequence_phase::decode;
    for (std::int32_t g = 0; g < G_; ++g)
      q.held[static_cast<std::size_t>(g)] =
          std::min(q.held[static_cast<std::size_t>(g)], q.target[static_cast<std::size_t>(g)]);
    // The engine's fused eviction writes the kept tokens compacted into the group's pages.
    write_all(q);
  }

  /// Prepares a chunk and then frees the sequence before committing (an abort mid-chunk).
  void abort_mid_chunk(sequence_id id, std::int64_t c) {
    m_.prepare_chunk(id, c);
    free(id);
  }

  void decode(std::vector<sequence_id> const& batch) {
    m_.set_batch(batch);
    m_.decode_step();
    auto v = m_.view();
    for (std::int32_t r = 0; r < static_cast<std::int32_t>(batch.size()); ++r) {
      auto& q = seqs_.at(batch[static_cast<std::size_t>(r)].slot);
      ++q.n;
      ++q.decoded;
      for (std::int32_t h = 0; h < L_ * H_; ++h) {
        auto& t = q.tags[static_cast<std::size_t>(h)];
        t.push_back(next_tag_++);
        auto const& ru = plan_.rules[static_cast<std::size_t>(h)];
        if (ru.kind == layer_kind::sliding_window && t.size() > static_cast<std::size_t>(ru.window))
          t.erase(t.begin());
        write_token(v, r, h / H_, h % H_, static_cast<std::int32_t>(t.size()) - 1, t.back());
      }
      for (std::int32_t g = 0; g < G_; ++g)
        q.held[static_cast<std::size_t>(g)] =
            std::max(q.held[static_cast<std::size_t>(g)], in_use(q, g));
    }
  }

  void end_turn(sequence_id id) {
    m_.end_turn(id);
    auto& q = seqs_.at(id.slot);
    q.phase = sequence_phase::ended;
    for (std::int32_t g = 0; g < G_; ++g)
      q.held[static_cast<std::size_t>(g)] = q.target[static_cast<std::size_t>(g)] = in_use(q, g);
  }

  bool continue_turn(sequence_id id, std::int64_t N, std::int64_t T) {
    if (!m_.continue_turn(id, N, T)) return false;
    copy_pages();
    auto& q            = seqs_.at(id.slot);
    q.phase            = sequence_phase::prefill;
    q.prompt_remaining = N;
    q.max_new          = T;
    q.decoded          = 0;
    for (std::int32_t g = 0; g < G_; ++g)
      q.target[static_cast<std::size_t>(g)] = group_pages(rule(g), q.n + N, T, P_);
    return true;
  }

  std::optional<sequence_id> fork(sequence_id id) {
    auto child = m_.fork(id);
    if (!child) return std::nullopt;
    copy_pages();
    auto q = seqs_.at(id.slot);
    q.id   = *child;
    for (std::int32_t g = 0; g < G_; ++g) {
      q.held[static_cast<std::size_t>(g)] = in_use(q, g);
      if (q.phase == sequence_phase::ended) q.target[static_cast<std::size_t>(g)] = in_use(q, g);
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
        std::int64_t model_res = q.phase == sequence_phase::ended
                                     ? 0
                                     : q.target[gi] - std::min(q.held[gi], q.target[gi]);
        REQUIRE(m_.group_reserved(q.id, g) == model_res);
        res += model_res;
        auto pages = m_.group_pages(q.id, g);
        for (std::int32_t p = 0; p < m_.group_page_count(q.id, g); ++p)
          ++owners[static_cast<std::size_t>(pages[p])];
      }
      REQUIRE(info.reserved_pages == res);
      reserved += res;
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

 private:
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

  void write_all(sim_sequence const& q) {
    if (!data_) return;
    std::vector<sequence_id> one{q.id};
    m_.set_batch(one);
    auto v = m_.view();
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
  float next_tag_ = 1;
  bool data_      = true;
  std::map<std::int32_t, sim_sequence> seqs_;
};

}  // namespace tangram::test
