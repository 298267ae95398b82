// SPDX-License-Identifier: Apache-2.0
// The state and the checks of engine_sim (engine_sim.hpp): the model of every sequence, its
// predictions from the plan and the footprint formulas, verify() against the manager, and the
// helpers that write K/V tags through the view. The operations are in engine_sim.hpp.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "tangram/kernels/head_cursor.hpp"
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
  // Per group, predicted: leading tokens on a pinned prefix's shared pages (a request admitted
  // over a prefix, or a fork of one); empty: none. The eviction keeps them in place.
  std::vector<std::int64_t> pinned;
};

class engine_model {
 public:
  engine_model(kv_cache_manager& m, std::uint32_t seed, double keep_fewer_probability = 0.2)
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
      pooled_group_ids_.push_back(g);
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

  /// The most pinned pages static compressed group g keeps over `tokens` (n + N): floor(min over
  /// its heads of retained_tokens / P); no bound for other groups.
  std::int64_t pin_cap_pages(std::int32_t g, std::int64_t tokens) const {
    if (pooled(g) || rule(g).kind != layer_kind::compressed)
      return std::numeric_limits<std::int64_t>::max();
    std::int64_t least = std::numeric_limits<std::int64_t>::max();
    for (auto mb : plan_.grouping.groups[static_cast<std::size_t>(g)].members)
      least = std::min(least, retained_tokens(plan_.rule(mb.layer, mb.head), tokens));
    return least / P_;
  }

  /// Pinned tokens of group g of q (0 without a pin).
  std::int64_t pin(sim_sequence const& q, std::int32_t g) const {
    return q.pinned.empty() ? 0 : q.pinned[static_cast<std::size_t>(g)];
  }
  /// Elastic: the pages the eviction keeps at least in q's compressed groups when one of them is
  /// pinned (each pinned group its pinned and protected tokens, the others the protected ones);
  /// 0 without a pin. A turn's limit covers them.
  std::int64_t pinned_floor_pages(sim_sequence const& q) const {
    std::int64_t floors = 0;
    bool any            = false;
    for (std::int32_t g = 0; g < G_; ++g)
      if (pooled(g)) {
        any = any || pin(q, g) > 0;
        floors += ceil_div(pin(q, g) + protect_, P_);
      }
    return any ? floors : 0;
  }

  /// R(n): the compressed groups' pages after n tokens, from the plan's scorer and margin.
  std::int64_t elastic_limit(std::int64_t n) const {
    scorer_total t{plan_.profile.target_keep_ratio, protect_, plan_.options.reservation.basis};
    return elastic_compressed_pages(
        t, Gc_ * Hp_, Hp_, P_, plan_.options.reservation.margin_or_default(), n);
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
    // + held: the copies of shared pages, at most every held page; a pinned turn's limit at most
    // one page more per group than its protected floors above the pins.
    return ub + std::max({elastic_limit(q.n + N), held, pinned_floor_pages(q)}) +
           Gc_ * ceil_div(T, P_) + staging(N) + held;
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
    std::vector<std::uint32_t> owners(static_cast<std::size_t>(m_.pool().capacity()), 0);
    std::int64_t reserved = 0;
    // Read through batches of at most max_batch requests (mirror storms make it small).
    auto cap = static_cast<std::size_t>(m_.options().max_batch);
    if (list.empty()) m_.set_batch(list);
    kv_cache_view v{};
    for (std::size_t at = 0; at < list.size(); ++at) {
      auto r = static_cast<std::int32_t>(at % cap);
      if (r == 0) {
        m_.set_batch(std::vector<sequence_id>(
            list.begin() + static_cast<long>(at),
            list.begin() + static_cast<long>(std::min(list.size(), at + cap))));
        v = m_.view();
      }
      auto const& q = seqs_.at(list[at].slot);
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
        REQUIRE(m_.group_pinned_tokens(q.id, g) == pin(q, g));
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

  /// Pages group g of q (in decode) reaches after `max_new` decode tokens in its turn.
  std::int64_t extension_end(sim_sequence const& q, std::int32_t g, std::int64_t max_new) const {
    if (rule(g).kind == layer_kind::sliding_window)
      return std::min(ceil_div(q.n - q.decoded + max_new, P_), ring_pages(rule(g), P_));
    return ceil_div(longest(q, g) - q.decoded + max_new, P_);
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

 protected:
  /// Elastic eviction of one chunk: a random need per compressed head, the optimal group lengths
  /// within the limit, each head keeping min(length, candidates) (a few fewer sometimes, never
  /// below its protected tokens). Returns kept counts per flat head (compressed heads only).
  std::vector<std::int64_t> elastic_eviction(sim_sequence const& q,
                                             sequence_id id,
                                             std::int64_t c) {
    REQUIRE(m_.elastic_page_limit(id) == q.pooled_limit);
    std::vector<std::int64_t> needs, cand, floors, pins;
    std::vector<std::int32_t> order;
    for (std::size_t k = 0; k < pooled_members_.size(); ++k) {
      // A pinned group keeps at least its pinned and protected tokens (kernels/elastic_eviction).
      auto p = pin(q, pooled_group_ids_[k]);
      pins.push_back(p);
      floors.push_back(p > 0 ? ceil_div(std::min(p + protect_, q.n + c), P_) : 0);
      for (auto h : pooled_members_[k]) {
        auto n = static_cast<std::int64_t>(q.tags[static_cast<std::size_t>(h)].size()) + c;
        needs.push_back(
            std::uniform_int_distribution<std::int64_t>(std::min(protect_, n), n)(rng_));
        cand.push_back(n);
        order.push_back(static_cast<std::int32_t>(order.size()));
      }
    }
    reference::elastic_selection_input sel;
    sel.needs        = &needs;
    sel.members      = &order;
    sel.group_size   = Hp_;
    sel.page_tokens  = P_;
    sel.candidates   = q.n + c;
    sel.protect      = protect_;
    sel.budget_pages = q.pooled_limit;
    sel.floors       = &floors;
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
        REQUIRE(x >= pins[k]);
        if (std::uniform_real_distribution<double>(0, 1)(rng_) < keep_fewer_)
          x = std::max({std::min(protect_, x), pins[k], x - static_cast<std::int64_t>(rng_() % 4)});
        kept[static_cast<std::size_t>(h)] = x;
      }
    }
    return kept;
  }

  /// Request r of view v appended k tokens: the model pushes k tags per head (a sliding head
  /// drops the oldest past its window, kept for a rollback), writes every one of the step's
  /// tokens (on a ring also those the step itself pushed out of the window: a rollback brings
  /// them back, docs/memory.md), and counts the pages drawn.
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
      // Held index of the step's first token: negative on a ring the step overran (its tags
      // are then the last ones of `dropped`), written at their ring positions all the same.
      auto held     = static_cast<std::int64_t>(t.size());
      auto const& d = q.dropped[hi];
      for (std::int64_t i = held - k; i < held; ++i) {
        if (i < 0) {
          // A token the step pushed past its ring as well is overwritten by a newer one of the
          // step (same position): skip it. The rest come from the end of `dropped`.
          auto c = make_head_cursor(v, r, h / H_, h % H_);
          if (-i > c.ring - c.len) continue;
          REQUIRE(static_cast<std::int64_t>(d.size()) >= -i);
        }
        write_token(v, r, h / H_, h % H_, i,
                    i >= 0 ? t[static_cast<std::size_t>(i)]
                           : d[d.size() - static_cast<std::size_t>(-i)]);
      }
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

  /// Writes `tag` at held index `i` of (r, l, h); on a ring `i` may be negative (a token the step
  /// pushed out of the window), at ring position (seq_tokens - len + i) mod ring.
  void write_token(kv_cache_view const& v,
                   std::int32_t r,
                   std::int32_t l,
                   std::int32_t h,
                   std::int64_t i,
                   float tag) {
    if (!data_) return;
    token_location loc;
    if (i >= 0) {
      loc = v.locate(r, l, h, static_cast<std::int32_t>(i));
    } else {
      auto c = make_head_cursor(v, r, l, h);
      REQUIRE(c.ring > 0);
      REQUIRE(-i <= c.ring - c.len);  // within the ring: nothing newer is overwritten
      loc = c.at_position(static_cast<std::int32_t>(((c.start + i) % c.ring + c.ring) % c.ring));
    }
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

  /// `held_before[h]` (when given): tokens head h held before the chunk; an uncompressed head's
  /// eviction only appends (kernels/eviction.hpp), so its tokens below that are not rewritten.
  void write_all(sim_sequence const& q, std::vector<std::size_t> const* held_before = nullptr) {
    if (!data_) return;
    std::vector<sequence_id> one{q.id};
    m_.set_batch(batch_kind::prefill, one);
    auto v = m_.view(batch_kind::prefill);
    for (std::int32_t h = 0; h < L_ * H_; ++h) {
      auto const& t    = q.tags[static_cast<std::size_t>(h)];
      std::size_t from = 0;
      if (held_before && plan_.rules[static_cast<std::size_t>(h)].kind == layer_kind::uncompressed)
        from = (*held_before)[static_cast<std::size_t>(h)];
      // A compressed head's pinned tokens (a shared prefix's read-only pages) stay in place: the
      // fused eviction never writes them.
      if (plan_.rules[static_cast<std::size_t>(h)].kind == layer_kind::compressed)
        from = static_cast<std::size_t>(
            pin(q, plan_.grouping.slots[static_cast<std::size_t>(h)].group));
      for (std::size_t i = from; i < t.size(); ++i)
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
  std::vector<std::int32_t> pooled_group_ids_;  ///< group id of each pooled_members_ entry
  std::map<std::int32_t, sim_sequence> seqs_;
  admit_result last_admit_;
};

}  // namespace tangram::test
