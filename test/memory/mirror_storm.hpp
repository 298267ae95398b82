// SPDX-License-Identifier: Apache-2.0
// Random operation storms for view mirrors, shared by the host-only test of the mirror's ranges
// (test/memory/view_mirror_test.cpp) and the test of kv_view_mirror's CUDA code against a fake
// runtime (test/fake_cuda). Each trial builds a random tiny plan (static or elastic reservation,
// host or simulated pool, small arenas that repack, small journals that overflow, a max_batch
// below the slots) and walks engine_sim through admissions, chunks with fused eviction, decode
// steps (speculative counts too), appends, rollbacks, extensions, turn ends, next turns, forks,
// frees, aborts mid-chunk and batch changes, handing the manager to the mirror after most steps.
#pragma once

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "engine_sim.hpp"
#include "memory_fixtures.hpp"

namespace tangram::test {

/// What one mirror sync did, as the mirror under test reports it.
struct mirror_sync_kind {
  bool full       = false;  ///< uploaded the whole block
  bool batch_only = false;  ///< uploaded only batch_slots
};

/// Counts over all trials of `mirror_storms`.
struct mirror_storm_totals {
  std::int64_t syncs = 0, full = 0, incremental = 0, batch_only = 0, resyncs = 0;
};

/**
 * Runs `trials` storms of `ops` steps. `make(m, rng)` builds the mirror of a trial's manager; the
 * mirror's `sync(m)` syncs (and checks) and returns a `mirror_sync_kind`. Most steps end with a
 * sync; some let the journal accumulate (every trial ends with one). The batch is set again
 * whenever a member was freed, as an engine must before `view()`.
 */
template <class Make>
mirror_storm_totals mirror_storms(int trials, int ops, std::uint32_t seed, Make make) {
  auto uniform = [](std::mt19937& rng, std::int64_t lo, std::int64_t hi) {
    return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng);
  };
  auto pick = [](auto const& v, std::mt19937& rng) { return v[rng() % v.size()]; };
  mirror_storm_totals t;
  for (int trial = 0; trial < trials; ++trial) {
    std::mt19937 rng(seed + static_cast<std::uint32_t>(trial));
    std::vector<double> budgets(8);
    for (auto& b : budgets) b = std::uniform_real_distribution<double>(0.05, 1.0)(rng);
    auto P      = static_cast<std::int32_t>(uniform(rng, 2, 5));
    auto Hp     = pick(std::vector<std::int32_t>{1, 2, 4}, rng);
    auto window = static_cast<std::int32_t>(uniform(rng, 3, 12));
    auto scope =
        Hp == 4
            ? grouping_scope::global
            : pick(std::vector<grouping_scope>{grouping_scope::global, grouping_scope::layer}, rng);
    reservation_options res = static_reservation();
    if (trial % 4 == 3) res = elastic_reservation(0.2);
    auto plan = tiny_plan(budgets, P, Hp, window, scope, res);
    host_memory_resource host;
    simulated_memory_resource simulated;
    memory_resource& mr = trial % 2 ? static_cast<memory_resource&>(host) : simulated;
    manager_options o;
    o.num_pages     = uniform(rng, 80, 400);
    o.max_sequences = static_cast<std::int32_t>(uniform(rng, 4, 10));
    o.max_batch     = static_cast<std::int32_t>(uniform(rng, 1, o.max_sequences));
    // Small arenas force repacking (full resync); a small journal overflows into one.
    o.index_capacity   = trial % 3 == 0 ? o.num_pages + 40 : 0;
    o.max_view_changes = trial % 3 == 1 ? 6 : 0;
    kv_cache_manager m(plan, mr, o);
    engine_sim sim(m, static_cast<std::uint32_t>(trial), 0.25);
    auto mirror = make(m, rng);
    INFO("trial " << trial << " P " << P << " Hp " << Hp << " W " << window << " max_batch "
                  << o.max_batch << " journal " << m.options().max_view_changes
                  << (res.mode == reservation_mode::elastic ? " elastic" : ""));

    auto in_phase = [&](sequence_phase ph) {
      std::vector<sequence_id> out;
      for (auto const& [s, q] : sim.sequences())
        if (q.phase == ph) out.push_back(q.id);
      return out;
    };
    // A random batch of `kind`, padded to a random fixed capacity half of the time.
    auto random_batch = [&](batch_kind kind) {
      auto ids = sim.ids();
      std::shuffle(ids.begin(), ids.end(), rng);
      ids.resize(std::min<std::size_t>(ids.size(),
                                       static_cast<std::size_t>(uniform(rng, 0, o.max_batch))));
      auto padded = rng() % 2 ? 0 : static_cast<std::size_t>(uniform(
                                        rng, static_cast<std::int64_t>(ids.size()), o.max_batch));
      m.set_batch(kind, ids, padded);
    };

    for (int step = 0; step < ops; ++step) {
      INFO("step " << step);
      int op = static_cast<int>(rng() % 100);
      if (op < 12) {
        (void)sim.admit(uniform(rng, 1, 40), uniform(rng, 0, 20));
      } else if (op < 30) {
        auto pre = in_phase(sequence_phase::prefill);
        if (!pre.empty()) {
          auto id = pick(pre, rng);
          sim.chunk(id, uniform(rng, 1, sim.sequences().at(id.slot).prompt_remaining));
        }
      } else if (op < 52) {
        std::vector<sequence_id> batch;
        for (auto id : in_phase(sequence_phase::decode)) {
          auto const& q = sim.sequences().at(id.slot);
          if (q.decoded < q.max_new && rng() % 3 != 0 &&
              batch.size() < static_cast<std::size_t>(o.max_batch))
            batch.push_back(id);
        }
        if (!batch.empty()) {
          std::vector<std::int32_t> tokens;
          if (rng() % 3 == 0)  // speculative: several tokens per member, 0 allowed
            for (auto id : batch) {
              auto const& q = sim.sequences().at(id.slot);
              tokens.push_back(static_cast<std::int32_t>(uniform(rng, 0, q.max_new - q.decoded)));
            }
          sim.decode(batch, tokens);
        }
      } else if (op < 57) {
        auto dec = in_phase(sequence_phase::decode);
        if (!dec.empty()) {
          auto id       = pick(dec, rng);
          auto const& q = sim.sequences().at(id.slot);
          if (q.decoded < q.max_new) sim.append(id, uniform(rng, 1, q.max_new - q.decoded));
        }
      } else if (op < 62) {
        auto dec = in_phase(sequence_phase::decode);
        if (!dec.empty()) {
          auto id = pick(dec, rng);
          if (auto k = m.max_rollback(id); k > 0) sim.rollback(id, uniform(rng, 1, k));
        }
      } else if (op < 66) {
        auto dec = in_phase(sequence_phase::decode);
        if (!dec.empty()) (void)sim.extend(pick(dec, rng), uniform(rng, 1, 30));
      } else if (op < 72) {
        auto dec = in_phase(sequence_phase::decode);
        if (!dec.empty()) sim.end_turn(pick(dec, rng));
      } else if (op < 78) {
        auto ended = in_phase(sequence_phase::ended);
        if (!ended.empty())
          (void)sim.continue_turn(pick(ended, rng), uniform(rng, 1, 20), uniform(rng, 0, 15));
      } else if (op < 83) {
        auto cand  = in_phase(sequence_phase::decode);
        auto ended = in_phase(sequence_phase::ended);
        cand.insert(cand.end(), ended.begin(), ended.end());
        if (!cand.empty()) (void)sim.fork(pick(cand, rng));
      } else if (op < 89) {
        auto ids = sim.ids();
        if (!ids.empty()) sim.free(pick(ids, rng));
      } else if (op < 91) {
        auto pre = in_phase(sequence_phase::prefill);
        if (!pre.empty()) {
          auto id = pick(pre, rng);
          sim.abort_mid_chunk(id, uniform(rng, 1, sim.sequences().at(id.slot).prompt_remaining));
        }
      } else {
        random_batch(rng() % 2 ? batch_kind::decode : batch_kind::prefill);
      }
      for (auto kind : {batch_kind::decode, batch_kind::prefill}) {
        bool stale = false;
        for (std::int32_t r = 0; r < m.batch_size(kind) - m.batch_padding(kind); ++r)
          stale |= !m.contains(m.batch_sequence(kind, r));
        if (stale) random_batch(kind);
      }
      if (rng() % 4 != 0 || step + 1 == ops) {
        t.resyncs += m.changes().full_resync;
        auto kind = mirror.sync(m);
        ++t.syncs;
        t.full += kind.full;
        t.incremental += !kind.full;
        t.batch_only += kind.batch_only;
      }
    }
  }
  return t;
}

}  // namespace tangram::test
