// SPDX-License-Identifier: Apache-2.0
// Operation storms for view mirrors, shared by the host-only test of the mirror's ranges
// (test/memory/view_mirror_test.cpp) and the test of kv_view_mirror's CUDA code against a fake
// runtime (test/fake_cuda). Each trial is a storm (driver.hpp) on a random tiny config (static or
// elastic reservation, host or simulated pool, small arenas that repack, small journals that
// overflow, a max_batch below the slots) with the mirror mix (every view-changing call, random
// batches of both kinds, padded or not), all of the storm's checks but its own journal mirror
// (the mirror under test consumes view_changes()), and the mirror synced after most steps.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "driver.hpp"

namespace tangram::test {

/// What one mirror sync did, as the mirror under test reports it.
struct mirror_sync_kind {
  bool full       = false;  ///< uploaded the whole block
  bool batch_only = false;  ///< uploaded only batch_slots
};

/// Counts over all trials of `mirror_storms`.
struct mirror_storm_totals {
  std::int64_t syncs = 0, full = 0, incremental = 0, batch_only = 0, resyncs = 0;
  storm_totals storm;  ///< what the storms did
};

/// Syncs `mirror` after 3 of 4 steps; first sets a fresh batch of each kind whose members were
/// freed, as an engine must before `view()`.
template <class Mirror>
struct mirror_sync_observer : storm::observer {
  Mirror& mirror;
  std::mt19937& rng;
  mirror_storm_totals& t;
  mirror_sync_observer(Mirror& mi, std::mt19937& r, mirror_storm_totals& to)
      : mirror(mi), rng(r), t(to) {}

  void after_step(kv_cache_manager& m) override {
    if (rng() % 4 != 0) sync(m);
  }
  void sync(kv_cache_manager& m) {
    for (auto kind : {batch_kind::decode, batch_kind::prefill}) {
      bool stale = false;
      for (std::int32_t r = 0; r < m.batch_size(kind) - m.batch_padding(kind); ++r)
        stale |= !m.contains(m.batch_sequence(kind, r));
      if (!stale) continue;
      std::vector<sequence_id> ids;
      for (auto const& s : m.sequences())
        if (rng() % 2 && ids.size() < static_cast<std::size_t>(m.options().max_batch))
          ids.push_back(s.id);
      m.set_batch(kind, ids);
    }
    t.resyncs += m.changes().full_resync;
    auto kind = mirror.sync(m);
    ++t.syncs;
    t.full += kind.full;
    t.incremental += !kind.full;
    t.batch_only += kind.batch_only;
  }
};

/**
 * Runs `trials` storms of `ops` steps. `make(m, rng)` builds the mirror of a trial's manager; the
 * mirror's `sync(m)` syncs (and checks) and returns a `mirror_sync_kind`. Most steps end with a
 * sync; some let the journal accumulate; every trial ends with a drain and a sync.
 */
template <class Make>
mirror_storm_totals mirror_storms(int trials, int ops, std::uint32_t seed, Make make) {
  mirror_storm_totals t;
  for (int trial = 0; trial < trials; ++trial) {
    std::mt19937 rng(seed + static_cast<std::uint32_t>(trial));
    tiny_knobs k;
    k.elastic         = trial % 4 == 3;
    k.simulated       = trial % 2 == 0;
    k.small_index     = trial % 3 == 0;
    k.small_journal   = trial % 3 == 1;
    k.small_max_batch = true;
    auto cfg          = random_tiny_config("mirror trial " + std::to_string(trial), rng, k);
    cfg.mix           = mirror_mix();
    cfg.journal_check = false;
    INFO(cfg.name << " max_batch " << cfg.options.max_batch << " journal "
                  << cfg.options.max_view_changes);
    storm s(cfg, seed + static_cast<std::uint32_t>(trial));
    {
      auto mirror = make(s.manager(), rng);
      mirror_sync_observer<decltype(mirror)> o(mirror, rng, t);
      s.observe(&o);
      for (int step = 0; step < ops; ++step) {
        INFO("step " << step);
        s.step();
      }
      s.observe(nullptr);
      s.drain();
      o.sync(s.manager());
    }
    s.finish();
    t.storm.add(s.totals());
  }
  return t;
}

}  // namespace tangram::test
