// SPDX-License-Identifier: Apache-2.0
// The shared state of an operation storm (see driver.hpp for what a storm checks).
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "config.hpp"
#include "engine_sim.hpp"
#include "tangram/eval/sim/simulated_memory_resource.hpp"
#include "tangram/interop/flashinfer.hpp"
#include "tangram/memory/host_memory_resource.hpp"
#include "tangram/memory/memory_resource.hpp"
#include "totals.hpp"

namespace tangram::test {

/// The state of one storm and the checks every operation shares: its resource, manager and
/// engine_sim model, the random draws, the "does not fit changes nothing" and misuse checks, the
/// journal mirror and the FlashInfer export check. The operations are in lifecycle.hpp,
/// parking.hpp and misuse.hpp; the walk in driver.hpp.
class storm_state {
 public:
  storm_state(storm_config const& cfg, std::uint64_t seed, std::int64_t check_every = 1)
      : cfg_(cfg),
        rng_(static_cast<std::mt19937::result_type>(seed ^ (seed >> 32))),
        check_every_(std::max<std::int64_t>(1, check_every)) {
    if (cfg_.host)
      resource_ = std::make_unique<host_memory_resource>();
    else
      resource_ = std::make_unique<simulated_memory_resource>();
    manager_ = std::make_unique<kv_cache_manager>(cfg_.plan, *resource_, cfg_.options);
    sim_     = std::make_unique<engine_sim>(*manager_, static_cast<std::uint32_t>(rng_()), 0.25);
    G_       = manager_->num_groups();
    LH_      = cfg_.plan.num_layers * cfg_.plan.num_kv_heads;
    mirror_full_resync();
  }

  storm_totals const& totals() const { return t_; }

 protected:
  // ----- helpers -------------------------------------------------------------------------------

  std::int64_t uniform(std::int64_t lo, std::int64_t hi) {
    return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng_);
  }
  /// Live sequences in phase `ph`, pinned prefixes left out (read-only: only the prefix
  /// operation, free and the checks use them).
  std::vector<sequence_id> phase(sequence_phase ph) const {
    std::vector<sequence_id> out;
    for (auto const& [s, q] : sim_->sequences())
      if (q.phase == ph && !is_prefix(q.id)) out.push_back(q.id);
    return out;
  }
  bool is_prefix(sequence_id id) const {
    return std::find(prefixes_.begin(), prefixes_.end(), id) != prefixes_.end();
  }
  sequence_id pick(std::vector<sequence_id> const& v) { return v[rng_() % v.size()]; }
  /// Keeps the first max_batch members (set_batch refuses more).
  void cap_batch(std::vector<sequence_id>& batch) const {
    auto cap = static_cast<std::size_t>(manager_->options().max_batch);
    if (batch.size() > cap) batch.resize(cap);
  }
  void graveyard(sequence_id id) {
    if (graveyard_.size() < 64)
      graveyard_.push_back(id);
    else
      graveyard_[rng_() % graveyard_.size()] = id;
  }
  bool index_is_small() const { return cfg_.options.index_capacity != 0; }
  /// The page-id arena may refuse a request whose pages fit: when it was made small, or while
  /// forks share pages (each holder's page list has its own entries, so the lists of forked
  /// sequences can hold more entries than the pool has pages; the default arena, 2 x pages +
  /// 4 x slots x groups, is sized for unshared lists).
  bool arena_may_refuse() {
    if (index_is_small()) return true;
    auto& m = *manager_;
    forked_.erase(
        std::remove_if(
            forked_.begin(), forked_.end(), [&](sequence_id id) { return !m.contains(id); }),
        forked_.end());
    return !forked_.empty();
  }
  /// Counts a refusal although pages and a slot were free (the arena's answer).
  void note_refusal(bool fits, bool ok) {
    if (fits && !ok) ++t_.index_refusals;
  }

  /// Runs a call expected to answer "does not fit" or to succeed; when it may not fit, the whole
  /// observable state must be unchanged after a refusal.
  template <class Call>
  bool fits_or_unchanged(bool may_fail, Call&& call) {
    ++t_.calls;
    if (!may_fail) return call();
    auto ids    = sim_->ids();
    auto before = snapshot(*manager_, ids);
    bool ok     = call();
    if (!ok) {
      auto after = snapshot(*manager_, ids);
      // Only the rejection counters (admit, continue, fork) may move.
      REQUIRE(after.numbers.size() == before.numbers.size());
      for (std::size_t k = 0; k < before.numbers.size(); ++k)
        if (k != 1 && k != 3 && k != 5) REQUIRE(after.numbers[k] == before.numbers[k]);
      ++t_.unchanged_checks;
    }
    return ok;
  }

  template <class Exception, class Call>
  void expect_misuse(char const* piece, Call&& call) {
    auto ids    = sim_->ids();
    auto before = snapshot(*manager_, ids);
    bool threw  = false;
    std::string msg;
    try {
      call();
    } catch (Exception const& e) {
      msg   = e.what();
      threw = true;
    }
    INFO("misuse expected to throw with \"" << piece << "\", got: " << msg);
    REQUIRE(threw);
    REQUIRE(msg.find(piece) != std::string::npos);
    REQUIRE(snapshot(*manager_, ids) == before);
    ++t_.misuses;
    ++t_.misuse_by_kind[misuse_kind_];
    ++t_.calls;
  }

  // ----- journal mirror and FlashInfer export --------------------------------------------------

  void mirror_full_resync() {
    auto v = manager_->view();
    auto e = manager_->view_extents();
    m_offset_.assign(v.page_offset, v.page_offset + e.page_offset);
    m_pages_.assign(v.pages, v.pages + e.pages);
    m_base_.assign(v.head_base_len, v.head_base_len + e.head_base_len);
    m_appended_.assign(v.appended, v.appended + e.slots);
    m_tokens_.assign(v.seq_tokens, v.seq_tokens + e.slots);
    // Sized once for every batch: the largest set_batch accepts.
    REQUIRE(e.batch == manager_->options().max_batch);
    REQUIRE(e.batch >= 1);
    manager_->clear_view_changes();
  }

  /// An engine that mirrors the page tables from view_changes() only must see what the manager
  /// sees, for every live sequence.
  void check_journal() {
    auto& m = *manager_;
    auto c  = m.changes();
    auto v  = m.view();
    if (c.full_resync) {
      mirror_full_resync();
    } else {
      for (std::size_t k = 0; k < c.num_page_entries; ++k)
        m_pages_[static_cast<std::size_t>(c.page_entries[k])] = v.pages[c.page_entries[k]];
      for (std::size_t k = 0; k < c.num_slots; ++k) {
        auto s = static_cast<std::size_t>(c.slots[k]);
        for (std::size_t g = 0; g < static_cast<std::size_t>(G_); ++g)
          m_offset_[s * static_cast<std::size_t>(G_) + g] =
              v.page_offset[s * static_cast<std::size_t>(G_) + g];
        for (std::size_t h = 0; h < static_cast<std::size_t>(LH_); ++h)
          m_base_[s * static_cast<std::size_t>(LH_) + h] =
              v.head_base_len[s * static_cast<std::size_t>(LH_) + h];
      }
      for (std::size_t k = 0; k < c.num_counter_slots; ++k) {
        auto s         = static_cast<std::size_t>(c.counter_slots[k]);
        m_appended_[s] = v.appended[s];
        m_tokens_[s]   = v.seq_tokens[s];
      }
      m.clear_view_changes();
    }
    for (auto id : sim_->ids()) {
      auto s = static_cast<std::size_t>(id.slot);
      REQUIRE(m_appended_[s] == v.appended[s]);
      REQUIRE(m_tokens_[s] == v.seq_tokens[s]);
      for (std::int32_t h = 0; h < LH_; ++h)
        REQUIRE(m_base_[s * static_cast<std::size_t>(LH_) + static_cast<std::size_t>(h)] ==
                v.head_base_len[s * static_cast<std::size_t>(LH_) + static_cast<std::size_t>(h)]);
      for (std::int32_t g = 0; g < G_; ++g) {
        auto off = m_offset_[s * static_cast<std::size_t>(G_) + static_cast<std::size_t>(g)];
        REQUIRE(off ==
                v.page_offset[s * static_cast<std::size_t>(G_) + static_cast<std::size_t>(g)]);
        auto n     = m.group_page_count(id, g);
        auto pages = m.group_pages(id, g);
        for (std::int32_t p = 0; p < n; ++p)
          REQUIRE(m_pages_[static_cast<std::size_t>(off + p)] == pages[p]);
      }
    }
  }

  /// The FlashInfer CSR of a random layer lists, per (request, head), the head's length and the
  /// pages of its group (growing heads) at its column.
  void check_export() {
    auto& m  = *manager_;
    auto ids = sim_->ids();
    if (ids.empty()) return;
    cap_batch(ids);
    m.set_batch(ids);
    auto layer =
        static_cast<std::int32_t>(check_rng_() % static_cast<std::uint32_t>(cfg_.plan.num_layers));
    export_flashinfer_layer(m, layer, fi_);
    auto H  = cfg_.plan.num_kv_heads;
    auto Hp = cfg_.plan.geometry.group_size;
    auto v  = m.view();
    REQUIRE(fi_.indptr.size() == ids.size() * static_cast<std::size_t>(H) + 1);
    for (std::size_t r = 0; r < ids.size(); ++r) {
      for (std::int32_t h = 0; h < H; ++h) {
        auto j   = r * static_cast<std::size_t>(H) + static_cast<std::size_t>(h);
        auto len = m.head_len(ids[r], layer, h);
        REQUIRE(fi_.kv_len(j) - fi_.first_page_skip[j] == len);
        auto hs = v.slot_of(layer, h);
        if (v.group_window[hs.group] > 0) continue;
        REQUIRE(fi_.first_page_skip[j] == 0);
        auto pages = m.group_pages(ids[r], hs.group);
        for (auto k = fi_.indptr[j]; k < fi_.indptr[j + 1]; ++k) {
          auto virt = fi_.indices[static_cast<std::size_t>(k)];
          REQUIRE(virt % (2 * Hp) == hs.column);
          REQUIRE(virt / (2 * Hp) == pages[k - fi_.indptr[j]]);
        }
      }
    }
  }

  storm_config const& cfg_;
  std::mt19937 rng_;
  std::mt19937 check_rng_{7};  ///< the checks' own draws: the walk is the same for any check_every
  std::int64_t check_every_;
  std::unique_ptr<memory_resource> resource_;
  std::unique_ptr<kv_cache_manager> manager_;
  std::unique_ptr<engine_sim> sim_;
  std::int32_t G_ = 0, LH_ = 0;
  std::vector<sequence_id> graveyard_;
  std::vector<sequence_id> prefixes_;  ///< pinned prefixes (some may have been freed since)
  std::vector<sequence_id> forked_;    ///< parents and children of forks (may share pages)
  std::size_t misuse_kind_ = 0;
  struct parking_entry {  ///< a sequence between park and complete_park
    sequence_id id;
    parked_session session;
    std::vector<std::byte> host;
    bool copied = false;  ///< copied out already (else just before complete_park)
  };
  std::vector<parking_entry> parking_;
  std::vector<engine_sim::parked> parked_;  ///< sessions in host memory (restorable again)
  std::vector<std::int32_t> m_offset_, m_pages_, m_base_, m_appended_, m_tokens_;
  flashinfer_paged_kv fi_;
  storm_totals t_;
};

}  // namespace tangram::test
