// SPDX-License-Identifier: Apache-2.0
// Thousands of random operations across many sequences on random tiny plans, through the shared
// storm driver (test/support/storm/) with the lifecycle mix: admissions, chunks with fused
// eviction, decode and speculative steps, mixed steps of prefill chunks beside decodes on two
// padded batches (and misuse of the padding), growth, turn ends, next turns, forks, frees, aborts
// mid-chunk, park (ended sessions and turns in decode, shared pages too) / complete_park /
// cancel_park / try_unpark / try_resume through a host copy of the pages, full-pool bursts and
// every misuse case of the storm. After every operation the engine_sim model checks,
// independently of the manager's own bookkeeping: every held token's K/V read back through the
// view, each group's page count / target / reservation from the footprint formulas, reference
// counts = owners found in the page lists, used + reserved <= capacity; plus the view journal
// and the FlashInfer export. Each misuse must throw naming the value and leave every observable
// number unchanged; each trial ends with a drain to an empty pool.
#include <string>

#include "storm/driver.hpp"

using namespace tangram;
using namespace tangram::test;

TEST_CASE("random lifecycles keep pages, references, reservations and data consistent",
          "[memory][manager][property]") {
  const int trials = 6, ops = 1500;
  storm_totals all;
  for (int trial = 0; trial < trials; ++trial) {
    std::mt19937 rng(1000 + static_cast<std::uint32_t>(trial));
    tiny_knobs k;
    k.small_index = trial % 2 == 1;  // small arenas force repacking
    auto cfg      = random_tiny_config("property trial " + std::to_string(trial), rng, k);
    cfg.mix       = lifecycle_mix();
    INFO(cfg.name << " pages " << cfg.options.num_pages << " slots " << cfg.options.max_sequences);
    storm s(cfg, 1000 + static_cast<std::uint64_t>(trial));
    for (int step = 0; step < ops; ++step) {
      INFO("step " << step);
      s.step();
    }
    s.finish();
    all.add(s.totals());
  }
  INFO("ops " << all.ops << " misuses " << all.misuses << " forks " << all.forks << " continued "
              << all.continued << " rejected " << all.admit_rejected << " / "
              << all.continue_rejected << " / " << all.fork_rejected);
  CHECK(all.ops == trials * ops);
  // The random walk really exercised the interesting paths.
  CHECK(all.misuses > 100);
  CHECK(all.forks > 20);
  CHECK(all.continued > 20);
  CHECK(all.admit_rejected + all.continue_rejected + all.fork_rejected > 0);
  INFO("parks " << all.parks << " cancels " << all.park_cancels << " unparks " << all.unparks
                << " refusals " << all.unpark_rejected << " forked parks " << all.shared_parks);
  CHECK(all.parks > 30);
  CHECK(all.park_cancels > 3);
  CHECK(all.unparks > 20);
  CHECK(all.shared_parks > 0);
  INFO("running parks " << all.running_parks << " resumes " << all.resumes << " refusals "
                        << all.resume_rejected);
  CHECK(all.running_parks > 10);
  CHECK(all.resumes > 5);
  INFO("mixed steps " << all.mixed_steps << " padding requests " << all.padded_requests
                      << " padding misuses " << all.misuse_by_kind[storm_totals::misuse_kinds]);
  CHECK(all.mixed_steps > 50);
  CHECK(all.padded_requests > 100);
  CHECK(all.misuse_by_kind[storm_totals::misuse_kinds] > 0);
}
