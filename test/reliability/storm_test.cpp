// SPDX-License-Identifier: Apache-2.0
// A short operation storm on every config of storm/config.hpp (the soak driver, tools/soak, runs
// the same storms for millions of operations), plus the resource fault cases of faults.hpp.
#include <string>

#include "faults.hpp"
#include "storm/driver.hpp"
#include "tangram/memory/host_memory_resource.hpp"

using namespace tangram;
using namespace tangram::test;

// [slow]: about 2 s natively, about 60 s under valgrind.
TEST_CASE("operation storms keep every invariant on tiny and real plans",
          "[reliability][storm][slow]") {
  storm_totals all;
  std::int64_t tiny_elastic_misuse = 0;  // misuse kind 14, over the tiny elastic configs
  std::int64_t elastic_forks       = 0;  // forks over every elastic config
  for (auto const& cfg : storm_configs()) {
    // Tiny plans: every step checked; real plans: every 8th step (and in full at each drain).
    bool tiny          = cfg.name.rfind("tiny", 0) == 0;
    std::int64_t ops   = tiny ? 3000 : 300;
    std::int64_t every = tiny ? 1 : 8;
    std::uint64_t seed = 20240 + all.drains;
    INFO("config " << cfg.name << " seed " << seed);
    storm s(cfg, seed, every);
    for (std::int64_t i = 0; i < ops; ++i) {
      INFO("op " << i);
      s.step();
    }
    s.finish();
    auto const& t = s.totals();
    if (cfg.name.find("elastic") != std::string::npos) {
      // Every elastic config reached the per-chunk selection and turns; together they forked
      // (a 300-step real-model config may draw no fork since the prefix operation joined the
      // mix: seed 20267 under ASan); the tiny ones (3000 steps each) together also the elastic
      // misuse case.
      CHECK(t.elastic_evictions > 20);
      CHECK(t.continued > 0);
      elastic_forks += t.forks;
      if (tiny) tiny_elastic_misuse += t.misuse_by_kind[14];
    }
    all.add(t);
  }
  CHECK(tiny_elastic_misuse > 0);
  CHECK(elastic_forks > 0);
  INFO("ops " << all.ops << " misuses " << all.misuses << " unchanged " << all.unchanged_checks
              << " forks " << all.forks << " continued " << all.continued << " parks " << all.parks
              << " cancelled " << all.park_cancels << " unparks " << all.unparks << " refused "
              << all.unpark_rejected);
  // The walk reached every path it is meant to check.
  CHECK(all.admitted > 100);
  CHECK(all.admit_rejected > 20);
  CHECK(all.unchanged_checks > 20);
  CHECK(all.completed_turns > 50);
  CHECK(all.continued > 20);
  CHECK(all.forks > 20);
  // Shared prefixes: pinned, requests admitted over them (some refused), forked, misuse refused.
  INFO("prefix pins " << all.prefix_pins << " admits " << all.prefix_admits << " refused "
                      << all.prefix_rejected << " forks " << all.prefix_forks << " misuses "
                      << all.prefix_misuses);
  CHECK(all.prefix_pins > 10);
  CHECK(all.prefix_admits > 20);
  CHECK(all.prefix_rejected > 0);
  CHECK(all.prefix_forks > 5);
  CHECK(all.prefix_misuses > 5);
  CHECK(all.aborts > 10);
  CHECK(all.full_pool_bursts > 0);
  CHECK(all.bad_sizes > 10);  // hostile sizes: rejected, state unchanged
  // Growing and speculative decode: extensions that fit and that did not, multi-token steps and
  // rollbacks of rejected tokens.
  CHECK(all.extended > 20);
  CHECK(all.extend_rejected > 0);
  CHECK(all.speculative_steps > 20);
  CHECK(all.rollbacks > 20);
  // Idle sessions parked in host memory, some parks cancelled, restores that fit and did not.
  CHECK(all.parks > 20);
  CHECK(all.park_cancels > 0);
  CHECK(all.unparks > 20);
  CHECK(all.unpark_rejected > 0);
  // Running turns parked (some to make a refused growth fit, by the answer window's order) and
  // resumed where they stopped.
  INFO("running parks " << all.running_parks << " growth parks " << all.growth_parks << " resumes "
                        << all.resumes << " refused " << all.resume_rejected);
  CHECK(all.running_parks > 10);
  CHECK(all.growth_parks > 5);
  CHECK(all.resumes > 2);
  CHECK(all.resume_rejected > 0);
  // Elastic configs: the group-length selection ran, the limit bound it (wanted tokens clipped),
  // and commits past the limit were refused with nothing changed.
  CHECK(all.elastic_evictions > 100);
  CHECK(all.elastic_clipped > 0);
  CHECK(all.limit_refusals > 0);
  for (std::size_t k = 0; k < storm_totals::misuse_kinds; ++k) {
    INFO("misuse case " << k);
    CHECK(all.misuse_by_kind[k] > 0);
  }
}

TEST_CASE("the unchanged-state comparison sees every kind of change", "[reliability][storm]") {
  // Guards the storm's "does not fit changes nothing" check against being vacuous.
  auto plan = tiny_plan(tiny_budgets());
  host_memory_resource mr;
  manager_options o;
  o.num_pages     = 60;
  o.max_sequences = 3;
  kv_cache_manager m(plan, mr, o);
  auto a  = *m.try_admit(6, 2);
  auto s0 = snapshot(m, {a});
  m.prepare_chunk(a, 3);
  auto s1 = snapshot(m, {a});
  CHECK_FALSE(s1 == s0);  // pages drawn, chunk pending
  m.free(a);
  CHECK_FALSE(snapshot(m, {a}) == s1);
  auto b  = *m.try_admit(1, 0);
  auto s2 = snapshot(m, {b});
  m.set_batch({b});
  CHECK_FALSE(snapshot(m, {b}) == s2);  // the batch is part of the state
}

TEST_CASE("resource faults at construction are out_of_memory and leak nothing",
          "[reliability][faults]") {
  std::int64_t faults = 0;
  faults += run_resource_faults(tiny_plan(tiny_budgets()), 64, true, 1);
  faults +=
      run_resource_faults(tiny_plan(tiny_budgets(), 3, 1, 7, grouping_scope::layer), 100, true, 2);
  auto configs = storm_configs();
  for (auto const& c : configs) {
    INFO(c.name);
    faults += run_resource_faults(c.plan, fault_case_pages(c, 2048), c.host, 3);
  }
  CHECK(faults == 12 * static_cast<std::int64_t>(2 + configs.size()));
}
