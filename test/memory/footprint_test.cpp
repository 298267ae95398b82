// SPDX-License-Identifier: Apache-2.0
// The reservation planner is exact: requests run to completion (random budgets, N, T, chunk
// sizes, early stops, several turns) never hold more than what was reserved, the peak of a turn
// decoded to its end equals M(r), and no page is ever reclaimed. Also on the real Llama plans.
#include "tangram/plan/footprint.hpp"
#include "memory_fixtures.hpp"
#include "storm/engine_sim.hpp"
#include "tangram/eval/sim/simulated_memory_resource.hpp"
#include "tangram/memory/host_memory_resource.hpp"

using namespace tangram;
using namespace tangram::test;

namespace {

std::int64_t held_pages(kv_cache_manager const& m, sequence_id id) {
  std::int64_t t = 0;
  for (std::int32_t g = 0; g < m.num_groups(); ++g) t += m.group_page_count(id, g);
  return t;
}

/// Runs one session of several turns on its own manager; checks the bounds after every call.
void run_session(static_plan const& plan,
                 std::mt19937& rng,
                 std::int64_t max_prompt,
                 std::int64_t max_new,
                 bool with_data) {
  host_memory_resource host;
  simulated_memory_resource sim_mr;
  manager_options o;
  o.num_pages         = 4 * footprint_pages(plan, max_prompt * 4, max_new * 4) + 64;
  o.max_sequences     = 2;
  memory_resource& mr = with_data ? static_cast<memory_resource&>(host) : sim_mr;
  kv_cache_manager m(plan, mr, o);
  engine_sim sim(m, static_cast<std::uint32_t>(rng()), 0.0);
  auto rnd = [&](std::int64_t lo, std::int64_t hi) {
    return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng);
  };
  std::int64_t N = rnd(1, max_prompt), T = rnd(0, max_new);
  auto id = sim.admit(N, T);
  REQUIRE(id);
  std::int64_t turns = rnd(1, 4);
  for (std::int64_t turn = 0; turn < turns; ++turn) {
    auto const& q        = sim.sequences().at(id->slot);
    std::int64_t n_total = q.n + N;
    // Reserved now + held = what the turn may ever hold: sum_g max(held_g, final_g).
    std::int64_t bound = 0, exact_final = footprint_pages(plan, n_total, T);
    for (std::int32_t g = 0; g < m.num_groups(); ++g)
      bound +=
          std::max<std::int64_t>(m.group_page_count(*id, g),
                                 group_pages(plan.grouping.groups[static_cast<std::size_t>(g)].rule,
                                             n_total,
                                             T,
                                             plan.geometry.page_tokens));
    if (turn == 0) CHECK(bound == exact_final);  // first turn: M(r) exactly
    std::int64_t peak = held_pages(m, *id);
    auto track        = [&] {
      auto h = held_pages(m, *id);
      peak   = std::max(peak, h);
      REQUIRE(h <= bound);
      REQUIRE(h + m.info(*id).reserved_pages <= bound);
    };
    while (sim.sequences().at(id->slot).prompt_remaining > 0) {
      sim.chunk(*id, rnd(1, sim.sequences().at(id->slot).prompt_remaining));
      track();
    }
    bool early         = rnd(0, 3) == 0;
    std::int64_t steps = early ? rnd(0, T) : T;
    for (std::int64_t t = 0; t < steps; ++t) {
      sim.decode({*id});
      track();
    }
    if (with_data) sim.verify();
    if (!early || steps == T) {
      // Decoded to the end: the turn holds exactly its final footprint.
      CHECK(held_pages(m, *id) == exact_final);
      if (turn == 0) CHECK(peak == exact_final);  // M(r) is tight
    }
    CHECK(m.stats().reclaimed_pages == 0);
    sim.end_turn(*id);
    if (turn + 1 < turns) {
      N = rnd(1, max_prompt);
      T = rnd(0, max_new);
      REQUIRE(sim.continue_turn(*id, N, T));
    }
  }
  sim.free(*id);
  CHECK(m.pool().stats().used == 0);
  CHECK(m.pool().stats().reserved == 0);
}

}  // namespace

TEST_CASE("M(r) bounds and equals the pages a request really uses (tiny plans, data checked)",
          "[memory][footprint]") {
  std::mt19937 rng(21);
  for (int trial = 0; trial < 150; ++trial) {
    std::vector<double> budgets(8);
    for (auto& b : budgets) b = std::uniform_real_distribution<double>(0.02, 1.0)(rng);
    auto P    = static_cast<std::int32_t>(2 + rng() % 6);
    auto plan = tiny_plan(budgets, P, 2, static_cast<std::int32_t>(2 + rng() % 20));
    INFO("trial " << trial);
    run_session(plan, rng, 80, 40, true);
  }
}

TEST_CASE("M(r) is exact on the real Llama-3.1-8B plans", "[memory][footprint][profiles]") {
  std::mt19937 rng(5);
  for (auto scorer : {"snapkv", "ea", "keydiff", "fastkvzip"}) {
    auto plan = llama_plan(scorer);
    INFO(scorer);
    for (int trial = 0; trial < 2; ++trial) run_session(plan, rng, 16000, 500, false);
  }
}
