// SPDX-License-Identifier: Apache-2.0
// Issue 13: arrival-rate sweeps (the same sessions at every rate, the same arrivals and answers
// for every policy at a rate) and the keep ratio as compressed and as stored.
#include <map>
#include <tuple>

#include "../memory/memory_fixtures.hpp"
#include "contended_replay.hpp"
#include "tangram/eval/sim/elastic_policy.hpp"
#include "tangram/eval/sim/policies.hpp"
#include "tangram/eval/sim/rate_sweep.hpp"
#include "tangram/eval/sim/replay.hpp"
#include "tangram/model/presets.hpp"
#include "test_support.hpp"

using namespace tangram;
using namespace tangram::sim;

TEST_CASE("at_arrival_rate divides the arrivals and keeps every turn", "[rate_sweep]") {
  workload_options wo;
  wo.sessions     = 6;
  wo.turns        = 2;
  wo.arrival_rate = 1;
  auto unit       = generate_workload(wo);
  auto fast       = at_arrival_rate(unit, 4);
  REQUIRE(fast.sessions.size() == unit.sessions.size());
  for (std::size_t i = 0; i < unit.sessions.size(); ++i) {
    CHECK(fast.sessions[i].arrival_s == Approx(unit.sessions[i].arrival_s / 4));
    REQUIRE(fast.sessions[i].turns.size() == unit.sessions[i].turns.size());
    for (std::size_t k = 0; k < unit.sessions[i].turns.size(); ++k) {
      CHECK(fast.sessions[i].turns[k].prompt_tokens == unit.sessions[i].turns[k].prompt_tokens);
      CHECK(fast.sessions[i].turns[k].output_tokens == unit.sessions[i].turns[k].output_tokens);
      CHECK(fast.sessions[i].turns[k].think_s == unit.sessions[i].turns[k].think_s);
    }
  }
  CHECK(unit.sessions.back().arrival_s > 0);
  TANGRAM_REQUIRE_THROWS_WITH_ALL(at_arrival_rate(unit, 0), invalid_argument, "arrival rate", "got 0");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(sweep_arrival_rates(unit, {1, -2}, [](workload const&) {
                                    return std::vector<replay_result>{};
                                  }),
                                  invalid_argument, "got -2");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      sweep_arrival_rates(unit, {}, [](workload const&) { return std::vector<replay_result>{}; }),
      invalid_argument, "got 0");
}

TEST_CASE("a rate sweep gives every policy the same arrivals and answers at each rate", "[rate_sweep]") {
  test::contended_replay fx;
  workload_options wo = test::contended_replay::options();
  wo.sessions         = 12;
  wo.turns            = 2;
  wo.arrival_rate     = 1;
  auto unit           = generate_workload(wo);
  // (session, turn) -> (ready time of a first turn, answer), per policy and rate.
  using seen_map = std::map<std::pair<std::int32_t, std::int32_t>, std::pair<double, std::int64_t>>;
  std::vector<std::map<std::string, seen_map>> seen;
  std::vector<double> const rates = {0.5, 2, 8};
  auto points = sweep_arrival_rates(unit, rates, [&](workload const& w) {
    seen.emplace_back();
    std::vector<std::unique_ptr<kv_policy>> ps;
    ps.push_back(
        std::make_unique<unified_policy>(fx.plan, unified_mode::full_kv, fx.kv, 12, 12, 131073));
    ps.push_back(std::make_unique<unified_policy>(
        fx.plan, unified_mode::compressed_reclaim, fx.kv, 12, 12, 131073));
    // Static Tangram reserving every answer up front (window 0): contention only adds admission
    // waits, which the TTFT check below relies on. With answer windows (the default, as the
    // elastic column runs) more turns start at once and the median can fall with the rate.
    tangram_policy_options upfront;
    upfront.answers.window_tokens = 0;
    ps.push_back(std::make_unique<tangram_policy>(fx.plan, fx.kv, 12, 12, upfront));
    ps.push_back(make_tangram_elastic_policy(fx.plan, fx.kv, 12, 12, 8192));
    std::vector<replay_result> rs;
    for (auto& p : ps) {
      replay_options o;
      auto& mine = seen.back()[p->name()];
      o.on_turn  = [&mine](std::int32_t s, std::int32_t turn, double ready, std::int64_t answer) {
        mine[{s, turn}] = {turn == 0 ? ready : 0.0, answer};
      };
      rs.push_back(replay(w, *p, fx.cost, o));
    }
    return rs;
  });
  REQUIRE(points.size() == rates.size());
  REQUIRE(seen.size() == rates.size());
  for (std::size_t k = 0; k < rates.size(); ++k) {
    INFO("rate " << rates[k]);
    CHECK(points[k].rate == rates[k]);
    CHECK(points[k].last_arrival_s == Approx(unit.sessions.back().arrival_s / rates[k]));
    REQUIRE(points[k].results.size() == 4);
    auto const& ref = seen[k].at("full_kv");
    // Every turn of every session, its first turn at the unit arrival / rate, answers as drawn.
    REQUIRE(ref.size() == 24);
    for (auto const& [key, v] : ref) {
      auto const& spec = unit.sessions[static_cast<std::size_t>(key.first)];
      if (key.second == 0) CHECK(v.first == Approx(spec.arrival_s / rates[k]));
      CHECK(v.second == spec.turns[static_cast<std::size_t>(key.second)].output_tokens);
    }
    for (auto const& [name, m] : seen[k]) {
      INFO(name);
      CHECK(m == ref);
    }
    for (auto const& r : points[k].results) {
      CHECK(r.generated_tokens == fx.output_tokens(unit));
      CHECK(r.completed_requests == 24);
    }
  }
  // Faster arrivals never make up-front-reserving tangram's median time to first token shorter
  // on this workload.
  CHECK(points[2].results[2].modelled_ttft_p50_s >= points[0].results[2].modelled_ttft_p50_s);
}

TEST_CASE("the stored keep ratio counts whole pages over the uncompressed tokens (hand-worked)", "[rate_sweep][keep]") {
  // One session, one turn: a 100-token prompt prefilled in one step and one answer token (sampled
  // by that step), so the run is one step and its memory is that step's. full_kv on 16-token
  // layer-wide pages holds ceil(100 / 16) = 7 pages a layer: stored = 7 x 16 / 100 = 1.12, and as
  // compressed it keeps every token: 1.
  test::contended_replay fx;
  REQUIRE(fx.plan.options.page_tokens == 16);
  workload w;
  w.sessions.push_back({0.0, {{100, 1, 0.0}}});
  unified_policy full(fx.plan, unified_mode::full_kv, fx.kv, 1, 1, 4096);
  auto r = replay(w, full, fx.cost);
  REQUIRE(r.steps == 1);
  CHECK(r.compressed_keep_ratio == Approx(1.0));
  CHECK(r.stored_keep_ratio == Approx(112.0 / 100.0));
  // The time-weighted bytes of that one step: 100 tokens live in 112 held, nothing reserved.
  CHECK(r.mean_live_bytes / r.mean_held_bytes == Approx(100.0 / 112.0));
  CHECK(r.mean_allocated_bytes == Approx(r.mean_held_bytes));
  CHECK(r.mean_allocated_bytes == Approx(r.kv_bytes_allocated_peak));

  // Tangram on a 60000-token prompt, in one step (past the rules' protected prefix): its heads keep their budgets' share, and
  // whole group pages hold at least that; the decode reservation (unbacked) is not counted, so
  // it stores less than it allocates.
  workload w2;
  w2.sessions.push_back({0.0, {{60000, 1, 0.0}}});
  tangram_policy tangram(fx.plan, fx.kv, 1, 1);
  replay_options one_step;
  one_step.prefill_chunk     = 65536;
  one_step.step_token_budget = 65536;
  auto t = replay(w2, tangram, fx.cost, one_step);
  REQUIRE(t.steps == 1);
  CHECK(t.compressed_keep_ratio < 0.9);
  CHECK(t.compressed_keep_ratio > 0.1);
  CHECK(t.stored_keep_ratio >= t.compressed_keep_ratio);
  CHECK(t.stored_keep_ratio * 60000 * static_cast<double>(fx.model.kv_bytes_per_token()) <
        t.kv_bytes_allocated_peak);
  // Live within held (page rounding) within allocated (+ the unbacked decode reservation).
  CHECK(t.mean_live_bytes <= t.mean_held_bytes);
  CHECK(t.mean_held_bytes < t.mean_allocated_bytes);
  CHECK(t.mean_allocated_bytes == Approx(t.kv_bytes_allocated_peak));
}
