// SPDX-License-Identifier: Apache-2.0
// Issue 13: no oracle (max_tokens reserved, answers drawn separately and the same for every
// policy), the unified baseline driven by each input's own retention, and the cost accounting
// (the time breakdown sums to the makespan, reclamation = operations x constant, switching one
// cost off changes only its term), and the sensitivity sweep.
#include <algorithm>
#include <map>
#include <utility>

#include "../memory/memory_fixtures.hpp"
#include "contended_replay.hpp"
#include "tangram/eval/sim/elastic_policy.hpp"
#include "tangram/eval/sim/policies.hpp"
#include "tangram/eval/sim/replay.hpp"
#include "tangram/eval/sim/retention_needs.hpp"
#include "tangram/eval/sim/sensitivity.hpp"
#include "tangram/eval/sim/serving_costs.hpp"
#include "test_support.hpp"

using namespace tangram;
using namespace tangram::sim;

namespace {

std::shared_ptr<retention_needs const> own_needs(static_plan const& plan) {
  elastic_needs n;
  n.samples = load_retention_samples(test::data_path("profiles/snapkv/llama-3.1-8b-instruct.json"));
  return std::make_shared<retention_needs>(plan, std::move(n));
}

/// Forwards to a policy and records what the replay asked of it: per session, the max_new of
/// every start_turn and the decode tokens appended per turn.
class recording final : public kv_policy {
 public:
  explicit recording(kv_policy& inner) : inner_(inner) {}
  std::string name() const override { return inner_.name(); }
  bool start_turn(
      std::int32_t s, std::int64_t h, std::int64_t p, std::int64_t t, std::int64_t r) override {
    bool ok = inner_.start_turn(s, h, p, t, r);
    if (ok) reserved[s].push_back(t);
    return ok;
  }
  bool prefill_chunk(std::int32_t s, std::int64_t n) override { return inner_.prefill_chunk(s, n); }
  double prefill_chunk_extra_bytes(std::int32_t s) const override {
    return inner_.prefill_chunk_extra_bytes(s);
  }
  bool decode(std::vector<std::int32_t> const& ss) override {
    bool ok    = inner_.decode(ss);
    auto moved = inner_.take_parked();  // parked to make room: they decoded nothing
    parked_.insert(parked_.end(), moved.begin(), moved.end());
    if (!ok) return false;
    for (auto s : ss)
      if (std::find(moved.begin(), moved.end(), s) == moved.end()) decoded[s] += 1;
    return true;
  }
  std::vector<std::int32_t> take_parked() override {
    auto more = inner_.take_parked();
    parked_.insert(parked_.end(), more.begin(), more.end());
    return std::exchange(parked_, {});
  }
  bool park_idle(std::int32_t s) override { return inner_.park_idle(s); }
  host_traffic take_host_traffic() override { return inner_.take_host_traffic(); }
  void end_turn(std::int32_t s) override { inner_.end_turn(s); }
  void release(std::int32_t s) override { inner_.release(s); }
  double kv_bytes_read(std::int32_t s) const override { return inner_.kv_bytes_read(s); }
  double kv_bytes_read_padded(std::int32_t s) const override {
    return inner_.kv_bytes_read_padded(s);
  }
  double attended_tokens(std::int32_t s) const override { return inner_.attended_tokens(s); }
  policy_memory memory() const override { return inner_.memory(); }
  double capacity_bytes() const override { return inner_.capacity_bytes(); }
  bool idle_kv_is_prefix_cache() const override { return inner_.idle_kv_is_prefix_cache(); }

  std::map<std::int32_t, std::vector<std::int64_t>> reserved;
  std::map<std::int32_t, std::int64_t> decoded;

 private:
  kv_policy& inner_;
  std::vector<std::int32_t> parked_;
};

/// The four policies of `simulate` on the contended fixture (the baseline on its own retention).
std::vector<std::unique_ptr<kv_policy>> four_policies(test::contended_replay const& fx) {
  std::vector<std::unique_ptr<kv_policy>> ps;
  ps.push_back(
      std::make_unique<unified_policy>(fx.plan, unified_mode::full_kv, fx.kv, 24, 24, 131073));
  ps.push_back(std::make_unique<unified_policy>(
      fx.plan, unified_mode::compressed_reclaim, fx.kv, 24, 24, 131073, own_needs(fx.plan)));
  ps.push_back(std::make_unique<tangram_policy>(fx.plan, fx.kv, 24, 24));
  ps.push_back(make_tangram_elastic_policy(fx.plan, fx.kv, 24, 24, 8192));
  return ps;
}

/// Every cost on, at round values.
step_charges all_charges() {
  step_charges c;
  c.reclaim_s_per_page = 2e-6;
  c.padded_reads       = true;
  c.decode_skew        = 1.3;
  c.replan_fraction    = 0.2;
  c.step_overhead_s    = 1e-3;
  return c;
}

}  // namespace

TEST_CASE("no oracle: turns reserve max_tokens and every policy decodes the same answers",
          "[replay][issue13]") {
  test::contended_replay fx;
  for (std::int64_t max_tokens : {std::int64_t{4096}, std::int64_t{200}}) {
    INFO("max_tokens " << max_tokens);
    // The answers the workload draws, cut at the reservation.
    std::map<std::int32_t, std::int64_t> answers;
    std::int64_t cut = 0;
    for (std::size_t s = 0; s < fx.work.sessions.size(); ++s)
      for (auto const& t : fx.work.sessions[s].turns) {
        answers[static_cast<std::int32_t>(s)] += std::min(t.output_tokens, max_tokens);
        cut += t.output_tokens > max_tokens;
      }
    replay_options o;
    o.max_tokens = max_tokens;
    o.charges    = all_charges();
    for (auto& p : four_policies(fx)) {
      recording rec(*p);
      auto r = replay(fx.work, rec, fx.cost, o);
      INFO(r.policy);
      CHECK(r.rejected_sessions == 0);
      CHECK(r.truncated_answers == cut);
      CHECK(r.completed_requests == 24 * 3);
      // The reservation is max_tokens (the contexts here leave room), never the answer length; a
      // turn admitted again after a preemption (full_kv, vLLM v1) reserves what it has left.
      for (auto const& [s, list] : rec.reserved) {
        CHECK(list.front() == max_tokens);
        for (auto t : list) CHECK(t <= max_tokens);
        if (r.preemptions + r.idle_evictions == 0)
          for (auto t : list) CHECK(t == max_tokens);
      }
      // Same answers, session by session (the first token of a turn comes with its prefill).
      for (auto const& [s, n] : answers) CHECK(rec.decoded[s] + 3 == n);
    }
  }
}

TEST_CASE("a turn's reservation is capped by the context it has left", "[replay][issue13]") {
  test::contended_replay fx;
  workload w;
  w.sessions.push_back({0.0, {{1000, 50, 0.0}, {500, 50, 0.0}}});
  replay_options o;
  o.max_tokens  = 4096;
  o.max_context = 1000 + 50 + 500 + 300;  // turn 1 has 850 tokens of context left, turn 2 300
  tangram_policy tp(fx.plan, fx.kv, 1, 1);
  recording rec(tp);
  auto r = replay(w, rec, fx.cost, o);
  CHECK(rec.reserved[0] == std::vector<std::int64_t>{850, 300});
  CHECK(r.generated_tokens == 100);
  CHECK(r.reserved_decode_tokens == 850 + 300);
}

TEST_CASE("tangram returns the unused reservation at the end of the turn", "[replay][issue13]") {
  test::contended_replay fx;
  tangram_policy tp(fx.plan, fx.kv, 1, 1);
  REQUIRE(tp.start_turn(0, 0, 2000, 4096, 0));
  REQUIRE(tp.prefill_chunk(0, 2000));
  for (int i = 0; i < 10; ++i) REQUIRE(tp.decode({0}));
  auto before = tp.manager().pool().reserved_pages();
  CHECK(before > 0);
  tp.end_turn(0);
  CHECK(tp.manager().pool().reserved_pages() < before);
  CHECK(tp.manager().pool().reserved_pages() == 0);
}

TEST_CASE("the unified baseline keeps each input's own retention, not the padded budgets",
          "[replay][issue13]") {
  test::contended_replay fx;
  auto needs = own_needs(fx.plan);
  unified_policy own(fx.plan, unified_mode::compressed_reclaim, fx.kv, 2, 2, 131073, needs);
  unified_policy padded(fx.plan, unified_mode::compressed_reclaim, fx.kv, 2, 2, 131073);
  CHECK(own.own_retention());
  CHECK_FALSE(padded.own_retention());
  std::int64_t const n = 30000;
  for (std::int32_t s = 0; s < 2; ++s) {
    REQUIRE(own.start_turn(s, 0, n, 10, 0));
    REQUIRE(padded.start_turn(s, 0, n, 10, 0));
    REQUIRE(own.prefill_chunk(s, n));
    REQUIRE(padded.prefill_chunk(s, n));
    auto const& b = own.baseline();
    for (std::int32_t l = 0; l < fx.plan.num_layers; ++l)
      for (std::int32_t h = 0; h < fx.plan.num_kv_heads; ++h) {
        auto i = l * fx.plan.num_kv_heads + h;
        if (fx.plan.rules[static_cast<std::size_t>(i)].kind != layer_kind::compressed) continue;
        CHECK(b.head_len(s, l, h) == needs->need(s, i, n, n));
      }
    // mu + 2 sigma budgets pad every head: the input's own retention holds less.
    CHECK(own.kv_bytes_read(s) < padded.kv_bytes_read(s));
  }
  // Sessions 0 and 1 use different samples.
  CHECK(own.kv_bytes_read(0) != own.kv_bytes_read(1));
}

TEST_CASE("the time breakdown sums to the makespan, reclamation = operations x constant",
          "[replay][issue13]") {
  test::contended_replay fx;
  replay_options o;
  o.charges               = all_charges();
  o.charges.control_plane = true;  // measured: the only term that differs between runs
  for (auto& p : four_policies(fx)) {
    auto r = replay(fx.work, *p, fx.cost, o);
    INFO(r.policy);
    CHECK(r.time.sum() == Approx(r.modelled_makespan_s).epsilon(1e-9));
    CHECK(r.time.control_plane_s > 0);
    // The control plane by call: the terms add up to the whole measured time, and all of it is
    // charged (ended turns and releases between steps included, the last ones at the end).
    CHECK(r.control_plane.sum() ==
          Approx(r.control_plane_us_per_step * 1e-6 * static_cast<double>(r.steps)).epsilon(1e-9));
    CHECK(r.time.control_plane_s == Approx(r.control_plane.sum()).epsilon(1e-9));
    CHECK(r.control_plane.admission_s > 0);
    CHECK(r.control_plane.prefill_chunks_s > 0);
    CHECK(r.control_plane.decode_s > 0);
    CHECK(r.control_plane.end_turn_s > 0);
    CHECK(r.control_plane.release_s > 0);
    // The reclaiming baseline must reclaim here, or the check below would be 0 == 0.
    if (r.policy == "unified_nonuniform") REQUIRE(r.reclaim_ops > 0);
    CHECK(r.time.reclamation_s == Approx(static_cast<double>(r.reclaim_ops) * 2e-6));
    CHECK(r.time.overhead_s == Approx(static_cast<double>(r.steps) * 1e-3));
    CHECK(r.time.replanning_s == Approx(0.2 * (r.time.weights_s + r.time.decode_attention_s)));
    CHECK(r.modelled_requests_per_s == Approx(r.completed_requests / r.modelled_makespan_s));
  }
}

TEST_CASE("switching one cost off changes only its own term", "[replay][issue13]") {
  // All sessions at t = 0, no think time: the schedule does not depend on time, so every other
  // term must stay exactly as it was.
  test::contended_replay fx;
  auto wo         = test::contended_replay::options();
  wo.think_mean_s = 0;
  auto work       = generate_workload(wo);
  unified_policy base(
      fx.plan, unified_mode::compressed_reclaim, fx.kv, 24, 24, 131073, own_needs(fx.plan));
  replay_options on;
  on.charges = all_charges();
  auto all   = replay(work, base, fx.cost, on);
  REQUIRE(all.reclaim_ops > 0);
  auto without = [&](auto&& off) {
    replay_options o = on;
    off(o.charges);
    unified_policy p(
        fx.plan, unified_mode::compressed_reclaim, fx.kv, 24, 24, 131073, own_needs(fx.plan));
    return replay(work, p, fx.cost, o);
  };
  auto same_except = [&](replay_result const& r, double time_breakdown::*term) {
    for (auto field : {&time_breakdown::prefill_s,
                       &time_breakdown::eviction_pass_s,
                       &time_breakdown::decode_attention_s,
                       &time_breakdown::weights_s,
                       &time_breakdown::reclamation_s,
                       &time_breakdown::replanning_s,
                       &time_breakdown::overhead_s,
                       &time_breakdown::control_plane_s,
                       &time_breakdown::idle_s}) {
      if (field == term) {
        CHECK(r.time.*field == 0);
        CHECK(all.time.*field > 0);
      } else {
        CHECK(r.time.*field == Approx(all.time.*field));
      }
    }
    CHECK(r.steps == all.steps);
    CHECK(r.modelled_makespan_s == Approx(all.modelled_makespan_s - all.time.*term));
  };
  same_except(without([](step_charges& c) { c.reclaim_s_per_page = 0; }),
              &time_breakdown::reclamation_s);
  same_except(without([](step_charges& c) { c.step_overhead_s = 0; }), &time_breakdown::overhead_s);
  same_except(without([](step_charges& c) { c.replan_fraction = 0; }),
              &time_breakdown::replanning_s);
}

TEST_CASE("charges are validated, naming the field", "[replay][issue13][errors]") {
  test::contended_replay fx;
  tangram_policy tp(fx.plan, fx.kv, 24, 24);
  replay_options o;
  o.charges.decode_skew = 0.5;
  CHECK_THROWS_WITH(replay(fx.work, tp, fx.cost, o), Catch::Contains("charges.decode_skew"));
  o            = {};
  o.max_tokens = 0;
  CHECK_THROWS_WITH(replay(fx.work, tp, fx.cost, o), Catch::Contains("replay.max_tokens"));
}

TEST_CASE("the sensitivity sweep replays only what changes and brackets the default verdict",
          "[replay][issue13]") {
  serving_costs costs;
  costs.planner_skew = 1.1;  // a measured planner that does not balance perfectly
  std::map<std::string, replay_result> defaults;
  auto result = [](std::string name, double tps, double resident, std::int64_t reclaims) {
    replay_result r;
    r.policy                 = name;
    r.modelled_tokens_per_s  = tps;
    r.mean_resident_sessions = resident;
    r.reclaim_ops            = reclaims;
    return r;
  };
  defaults["unified_nonuniform"] = result("unified_nonuniform", 100, 10, 1000);
  defaults["tangram"]            = result("tangram", 120, 9, 0);
  std::vector<std::pair<std::string, step_charges>> calls;
  auto rep = sweep_sensitivity(
      costs,
      defaults,
      "unified_nonuniform",
      {"tangram"},
      [&](std::string const& name, step_charges const& ch) {
        calls.emplace_back(name, ch);
        // slower baseline with a larger reclaim or re-planning charge
        // and faster when it reads live tokens only
        double t = 100 /
                   (1 + ch.reclaim_s_per_page * 1e4 + ch.replan_fraction + ch.step_overhead_s) *
                   (ch.padded_reads ? 1.0 : 1.25);
        return result(name, name == "tangram" ? 120 : t, 10, 0);
      });
  auto vars = uncalibrated_variations(costs);
  CHECK(rep.points.size() == vars.size());
  CHECK(vars.size() == 11);
  // Tangram has no reclaim operations and pays no re-planning, skew or read-mode change: only the
  // overhead variations replay it; the baseline replays at every point but the padded-reads one
  // (the default).
  std::int32_t tangram_runs = 0;
  for (auto const& [name, ch] : calls) tangram_runs += name == "tangram";
  CHECK(tangram_runs == 2);
  CHECK(rep.replays == static_cast<std::int32_t>(calls.size()));
  CHECK(rep.replays == 12);
  // The balanced-planner point: the baseline re-plans with skew 1 everywhere.
  auto const& balanced = rep.points[6];
  CHECK(balanced.variation.constant == "baseline_balance");
  CHECK(balanced.variation.end == "perfect");
  CHECK(balanced.variation.costs.charges_for("unified_nonuniform").skew_for(7) == 1.0);
  CHECK(balanced.variation.costs.charges_for("unified_nonuniform").replan_fraction ==
        costs.replan_fraction);
  // The masked-kernel point: the baseline replayed with live reads, Tangram with its default.
  auto const& masked = rep.points[10];
  CHECK(masked.variation.constant == "baseline_reads");
  CHECK(masked.variation.end == "masked");
  CHECK(rep.points[9].variation.end == "padded");
  double masked_baseline =
      100 / (1 + costs.reclaim_s_per_page * 1e4 + costs.replan_fraction + costs.step_overhead_s) *
      1.25;
  CHECK(masked.verdicts.at("tangram").tokens_per_s_ratio == Approx(120 / masked_baseline));
  CHECK(rep.points[9].verdicts.at("tangram").tokens_per_s_ratio == Approx(1.2));  // the default run
  auto const& range = rep.range.at("tangram");
  CHECK(range.low.tokens_per_s_ratio <= 1.2);
  CHECK(range.high.tokens_per_s_ratio >= 1.2);
  CHECK(range.low.tokens_per_s_ratio <= range.high.tokens_per_s_ratio);
}

namespace {

// A replay result that only carries what a verdict reads.
replay_result verdict_result(std::string name, double tps, double resident) {
  replay_result r;
  r.policy                 = std::move(name);
  r.modelled_tokens_per_s  = tps;
  r.mean_resident_sessions = resident;
  return r;
}

// The default run of the sweeps below: the baseline at 100 tok/s and 10 resident, tangram 120
// and 9.
std::map<std::string, replay_result> verdict_defaults() {
  return {{"unified_nonuniform", verdict_result("unified_nonuniform", 100, 10)},
          {"tangram", verdict_result("tangram", 120, 9)}};
}

}  // namespace

TEST_CASE("on a masked kernel the baseline reads live tokens, Tangram keeps paying its pages",
          "[replay][issue13]") {
  serving_costs costs;
  costs.baseline_masked_reads = true;
  CHECK_FALSE(costs.charges_for("unified_nonuniform").padded_reads);
  // The ablation's steps keep Tangram's reads (they differ from it only by layout and split).
  for (char const* own_kernel :
       {"tangram", "tangram_elastic", "full_kv", "reservation_only", "+head_groups"})
    CHECK(costs.charges_for(own_kernel).padded_reads);
  // --no-padded-reads turns padding off for everyone, whatever the baseline's kernel.
  costs.padded_reads          = false;
  costs.baseline_masked_reads = false;
  CHECK_FALSE(costs.charges_for("unified_nonuniform").padded_reads);
  CHECK_FALSE(costs.charges_for("tangram").padded_reads);
}

TEST_CASE("the masked-kernel baseline reads fewer bytes in the same replay", "[replay][issue13]") {
  test::contended_replay fx;
  auto run = [&](bool masked) {
    serving_costs costs;
    costs.baseline_masked_reads = masked;
    replay_options o;
    o.charges = costs.charges_for("unified_nonuniform");
    unified_policy p(
        fx.plan, unified_mode::compressed_reclaim, fx.kv, 24, 24, 131073, own_needs(fx.plan));
    return replay(fx.work, p, fx.cost, o);
  };
  auto padded = run(false);
  auto masked = run(true);
  // Same schedule (reads do not change admission), less attention time: whole layer-wide pages
  // hold more than the live tokens.
  CHECK(masked.generated_tokens == padded.generated_tokens);
  CHECK(masked.completed_requests == padded.completed_requests);
  CHECK(masked.time.decode_attention_s < padded.time.decode_attention_s);
}

TEST_CASE("a turn's own max_tokens is what admission reserves", "[replay][issue13]") {
  test::contended_replay fx;
  auto work = fx.work;
  // Every other session's turns ask for 300 tokens; the rest take the run's 4096.
  for (std::size_t s = 0; s < work.sessions.size(); s += 2)
    for (auto& t : work.sessions[s].turns) t.max_tokens = 300;
  replay_options o;
  o.max_tokens = 4096;
  for (auto& p : four_policies(fx)) {
    recording rec(*p);
    auto r = replay(work, rec, fx.cost, o);
    INFO(r.policy);
    std::int64_t cut = 0;
    for (std::size_t s = 0; s < work.sessions.size(); ++s) {
      std::int64_t want = s % 2 == 0 ? 300 : 4096;
      for (auto const& t : work.sessions[s].turns) cut += t.output_tokens > want;
      auto const& list = rec.reserved.at(static_cast<std::int32_t>(s));
      CHECK(list.front() == want);
      for (auto t : list) CHECK(t <= want);
    }
    CHECK(r.truncated_answers == cut);
  }
}

TEST_CASE("the sensitivity sweep replays every policy at each end of max_tokens",
          "[replay][issue13]") {
  serving_costs costs;
  auto defaults = verdict_defaults();
  std::vector<std::pair<std::string, std::int64_t>> calls;
  max_tokens_variation mt;
  mt.rerun = [&](std::string const& name, std::int64_t max_new) {
    calls.emplace_back(name, max_new);
    // tangram: 150 tok/s at 512, 90 at 8192; the baseline 100 either way; resident 9 vs 10
    return verdict_result(
        name, name == "tangram" ? (max_new == 512 ? 150 : 90) : 100, name == "tangram" ? 9 : 10);
  };
  auto sweep = [&] {
    return sweep_sensitivity(
        costs,
        defaults,
        "unified_nonuniform",
        {"tangram"},
        [&](std::string const& name, step_charges const&) { return defaults.at(name); },
        &mt);
  };
  auto rep = sweep();
  auto n   = uncalibrated_variations(costs).size();
  REQUIRE(rep.points.size() == n + 2);
  auto const& lo = rep.points[n];
  auto const& hi = rep.points[n + 1];
  CHECK(lo.variation.constant == "max_tokens");
  CHECK(lo.variation.end == "low");
  CHECK(lo.variation.value == 512);
  CHECK(hi.variation.value == 8192);
  CHECK(lo.verdicts.at("tangram").tokens_per_s_ratio == Approx(1.5));
  CHECK(hi.verdicts.at("tangram").tokens_per_s_ratio == Approx(0.9));
  CHECK(calls == std::vector<std::pair<std::string, std::int64_t>>{{"unified_nonuniform", 512},
                                                                   {"tangram", 512},
                                                                   {"unified_nonuniform", 8192},
                                                                   {"tangram", 8192}});
  CHECK(rep.range.at("tangram").low.tokens_per_s_ratio == Approx(0.9));
  CHECK(rep.range.at("tangram").high.tokens_per_s_ratio == Approx(1.5));
  // The rest of the context (vLLM's default) is a third point when given.
  calls.clear();
  mt.context        = 131072;
  auto with_context = sweep();
  REQUIRE(with_context.points.size() == n + 3);
  CHECK(with_context.points[n + 2].variation.end == "context");
  CHECK(with_context.points[n + 2].variation.value == 131072);
  CHECK(calls.size() == 6);
  CHECK(calls[4] == std::pair<std::string, std::int64_t>{"unified_nonuniform", 131072});
  // tangram at 131072 (the mock's "not 512" branch): 0.9x
  CHECK(with_context.points[n + 2].verdicts.at("tangram").tokens_per_s_ratio == Approx(0.9));
}

TEST_CASE("the sensitivity sweep replays only the baseline under the other admission rule",
          "[replay][issue13]") {
  serving_costs costs;
  auto defaults = verdict_defaults();
  for (bool default_chunk : {true, false}) {
    INFO("default rule chunk: " << default_chunk);
    std::vector<bool> calls;
    admission_variation adm;
    adm.default_chunk  = default_chunk;
    adm.rerun_baseline = [&](bool chunk) {
      calls.push_back(chunk);
      // the other rule: the baseline at 80 tok/s and 8 resident sessions
      return verdict_result("unified_nonuniform", 80, 8);
    };
    auto same_charges = [&](std::string const& name, step_charges const&) {
      return defaults.at(name);
    };
    auto rep = sweep_sensitivity(
        costs, defaults, "unified_nonuniform", {"tangram"}, same_charges, nullptr, &adm);
    auto without =
        sweep_sensitivity(costs, defaults, "unified_nonuniform", {"tangram"}, same_charges);
    auto n = uncalibrated_variations(costs).size();
    REQUIRE(rep.points.size() == n + 2);
    CHECK(calls == std::vector<bool>{!default_chunk});  // one replay: the baseline, the other rule
    CHECK(rep.replays == without.replays + 1);
    auto const& chunk = rep.points[n];
    auto const& whole = rep.points[n + 1];
    CHECK(chunk.variation.constant == "baseline_admission");
    CHECK(chunk.variation.end == "chunk");
    CHECK(whole.variation.end == "whole");
    auto const& at_default = default_chunk ? chunk : whole;
    auto const& at_other   = default_chunk ? whole : chunk;
    CHECK(at_default.verdicts.at("tangram").tokens_per_s_ratio == Approx(1.2));
    CHECK(at_default.verdicts.at("tangram").mean_resident_ratio == Approx(0.9));
    CHECK(at_other.verdicts.at("tangram").tokens_per_s_ratio == Approx(1.5));
    CHECK(at_other.verdicts.at("tangram").mean_resident_ratio == Approx(9.0 / 8.0));
    CHECK(rep.range.at("tangram").low.tokens_per_s_ratio == Approx(1.2));
    CHECK(rep.range.at("tangram").high.tokens_per_s_ratio == Approx(1.5));
    CHECK(rep.range.at("tangram").low.mean_resident_ratio == Approx(0.9));
    CHECK(rep.range.at("tangram").high.mean_resident_ratio == Approx(9.0 / 8.0));
  }
}

TEST_CASE("a decode window reserves part of max_tokens and grows, a growth that does not fit parks",
          "[replay][issue13][issue29][decode_window]") {
  test::contended_replay fx;
  replay_options o;
  o.max_tokens = 4096;
  auto run     = [&](double kv,
                 answer_window_options answers,
                 std::int64_t* extended = nullptr,
                 std::int64_t* refused  = nullptr) {
    tangram_policy_options to;
    to.answers = answers;
    tangram_policy p(fx.plan, kv, 24, 24, to);
    recording rec(p);
    auto r = replay(fx.work, rec, fx.cost, o);
    // Admission reserved the window (or max_tokens without one), never more.
    for (auto const& [s, list] : rec.reserved)
      for (auto t : list) CHECK(t <= 4096);
    if (extended) *extended = p.extensions();
    if (refused) *refused = p.extensions_rejected();
    CHECK(p.manager().pool().used_pages() == 0);  // every session's pages returned
    CHECK(p.host_bytes_used() == 0);              // and every parked session came back
    CHECK(p.manager().stats().reclaimed_pages == 0);
    return r;
  };
  auto window = [](std::int64_t tokens, double host_ratio = default_host_pool_ratio) {
    answer_window_options a;
    a.window_tokens   = tokens;
    a.host_pool_ratio = host_ratio;
    return a;
  };
  // The default is a growing window of 256 answer tokens, parking in 2x the pool's host memory.
  CHECK(tangram_policy_options{}.answers.window_tokens == 256);
  CHECK(tangram_policy_options{}.answers.host_pool_ratio == 2.0);
  auto upfront          = run(fx.kv, window(0));
  std::int64_t extended = 0, refused = 0;
  auto windowed = run(fx.kv, window(64), &extended, &refused);
  // Answers here are 64-512 tokens: turns with more than 64 - 1 decode steps grow.
  CHECK(extended > 0);
  CHECK(upfront.preemptions == 0);
  CHECK(upfront.parks == 0);
  CHECK(windowed.generated_tokens == upfront.generated_tokens);
  CHECK(windowed.completed_requests == upfront.completed_requests);
  CHECK(windowed.rejected_sessions == 0);
  // Without the continuation headroom the pool fills with windows, so growths are refused: the
  // policy parks sessions in host memory (idle ones first, then running turns, which resume where
  // they stopped). Nothing is preempted or recomputed, every answer is generated, every parked
  // byte comes back, and the host link is charged for both directions.
  o.continuation_headroom_tokens = 0;
  auto tight                     = run(fx.kv, window(64), &extended, &refused);
  CHECK(refused > 0);
  CHECK(tight.parks > 0);
  CHECK(tight.resumes == tight.parks);
  CHECK(tight.preemptions == 0);
  CHECK(tight.idle_evictions == 0);
  CHECK(tight.recomputed_tokens == 0);
  CHECK(tight.parked_bytes > 0);
  CHECK(tight.restored_bytes == tight.parked_bytes);
  CHECK(tight.modelled_host_transfer_s ==
        Approx((tight.parked_bytes + tight.restored_bytes) / fx.gpu.host_link_bytes_per_s));
  CHECK(tight.time.host_transfer_s == tight.modelled_host_transfer_s);
  CHECK(tight.time.sum() == Approx(tight.modelled_makespan_s));
  CHECK(tight.generated_tokens == upfront.generated_tokens);
  CHECK(tight.completed_requests == upfront.completed_requests);
  CHECK(tight.rejected_sessions == 0);
  // Single-turn sessions leave no idle session to park: running turns are parked (the newest
  // first, the growing one included) and resume where they stopped, every answer complete.
  {
    auto wo     = test::contended_replay::options();
    wo.turns    = 1;
    wo.sessions = 48;
    auto single = generate_workload(wo);
    tangram_policy_options to;
    to.answers = window(64);
    tangram_policy p(fx.plan, fx.kv, 48, 48, to);
    auto r = replay(single, p, fx.cost, o);
    CHECK(r.parked_running > 0);
    CHECK(r.parked_running == r.parks);
    CHECK(r.resumes == r.parks);
    CHECK(r.preemptions == 0);
    CHECK(r.recomputed_tokens == 0);
    CHECK(r.generated_tokens == fx.output_tokens(single));
    CHECK(r.rejected_sessions == 0);
    CHECK(p.manager().stats().parked_mid_turn == r.parked_running);
    CHECK(p.manager().stats().resumed == r.parked_running);
    CHECK(p.manager().pool().used_pages() == 0);
  }
  // With no host memory nothing may be parked: the growth fails the step and the replay falls
  // back to recompute (what the parking avoids).
  auto no_host = run(fx.kv, window(64, 0.0));
  CHECK(no_host.parks == 0);
  CHECK(no_host.preemptions + no_host.idle_evictions > 0);
  CHECK(no_host.recomputed_tokens > 0);
  CHECK(no_host.generated_tokens == upfront.generated_tokens);
  // The elastic policy grows and parks the same way (its staging and shared budget included; at
  // margin 0.15 on 0.8 of the pool, short enough to park where the default 0.02 on the whole
  // pool is not, its sessions sitting out the step after each chunk for their kept counts).
  {
    auto elastic =
        make_tangram_elastic_policy(fx.plan, 0.8 * fx.kv, 24, 24, 8192, 0.15, {}, window(64));
    auto r = replay(fx.work, *elastic, fx.cost, o);
    CHECK(elastic->extensions() > 0);
    CHECK(r.parks > 0);
    CHECK(r.resumes == r.parks);
    CHECK(r.preemptions == 0);
    CHECK(r.recomputed_tokens == 0);
    CHECK(r.generated_tokens == upfront.generated_tokens);
    CHECK(r.rejected_sessions == 0);
    CHECK(elastic->manager().pool().used_pages() == 0);
  }
  // Up front (no window), the same pool never preempts: the reservation is the guarantee.
  auto guaranteed = run(fx.kv, window(0));
  CHECK(guaranteed.preemptions == 0);
  CHECK(guaranteed.parks == 0);
  CHECK(guaranteed.generated_tokens == upfront.generated_tokens);
  CHECK_THROWS_WITH(
      tangram_policy(
          fx.plan, fx.kv, 24, 24, tangram_policy_options{"tangram", 0, nullptr, window(-1)}),
      Catch::Contains("answer_window_options.window_tokens: must be in [0, 2^31 - 1], got -1"));
}

TEST_CASE(
    "with parking, a turn that does not fit parks idle sessions and admission keeps no headroom",
    "[replay][issue29][decode_window]") {
  auto plan = test::llama_plan("snapkv");
  // Pages one first turn (4096 prompt tokens, the 256-token window) reserves and then holds.
  std::int64_t turn = 0, page_bytes = 0;
  {
    tangram_policy probe(plan, 40e9, 8, 8);
    turn       = probe.manager().admission_pages(4096, 256);
    page_bytes = probe.manager().pool().page_bytes();
  }
  // A pool of three and a half such turns.
  double kv = static_cast<double>((7 * turn) / 2) * static_cast<double>(page_bytes);
  for (bool park : {true, false}) {
    INFO("park_for_turns " << park);
    tangram_policy_options o;
    o.park_for_turns = park;
    tangram_policy p(plan, kv, 8, 8, o);
    // A new session keeps the continuation headroom only when it cannot park for turns.
    std::int64_t headroom = 1 << 20;  // far more than the pool
    CHECK(p.start_turn(0, 0, 4096, 256, headroom) == park);
    if (!park) REQUIRE(p.start_turn(0, 0, 4096, 256, 0));
    for (std::int32_t s = 1; s < 3; ++s) REQUIRE(p.start_turn(s, 0, 4096, 256, 0));
    for (std::int32_t s = 0; s < 3; ++s) {
      REQUIRE(p.prefill_chunk(s, 4096));
      p.end_turn(s);  // ended in order 0, 1, 2: session 1 is the least recently used after 0
    }
    // A fourth new session does not fit and waits: new sessions never park others.
    CHECK_FALSE(p.start_turn(3, 0, 4096, 256, 0));
    CHECK(p.take_parked().empty());
    // Session 0's next turn (20480 more prompt tokens) reserves its pages at 24576 tokens less
    // those it holds: more than is free, less than is free once one idle session is parked.
    auto held = p.manager().pool().used_pages() / 3;
    auto need = p.manager().admission_pages(4096 + 20480, 256) - held;
    auto free = p.manager().pool().available_pages();
    REQUIRE(need > free);
    REQUIRE(need <= free + held);
    // A next turn that would not fit even with every idle session parked parks nobody.
    CHECK(p.manager().admission_pages(4096 + 65536, 256) - held > free + 2 * held);
    CHECK_FALSE(p.start_turn(0, 4096, 65536, 256, 0));
    CHECK(p.take_parked().empty());
    bool ok = p.start_turn(0, 4096, 20480, 256, 0);
    CHECK(ok == park);
    auto parked = p.take_parked();
    if (park) {
      CHECK(parked == std::vector<std::int32_t>{1});  // the LRU idle session, not the turn's own
      CHECK(p.host_bytes_used() > 0);
      auto traffic = p.take_host_traffic();
      CHECK(traffic.parked_bytes == static_cast<double>(p.host_bytes_used()));
      // Session 1's next turn comes back by parking session 2 (session 0 runs, in prefill).
      REQUIRE(p.prefill_chunk(0, 4096));
      CHECK(p.start_turn(1, 4096, 16, 256, 0));
      CHECK(p.take_parked() == std::vector<std::int32_t>{2});
    } else {
      CHECK(parked.empty());
      CHECK(p.host_bytes_used() == 0);
    }
    for (std::int32_t s = 0; s < 4; ++s) p.release(s);
    CHECK(p.manager().pool().used_pages() == 0);
    CHECK(p.host_bytes_used() == 0);
  }
  // Without a window nothing may be parked: the headroom is kept whatever the option says.
  tangram_policy_options upfront;
  upfront.answers.window_tokens = 0;
  tangram_policy q(plan, kv, 8, 8, upfront);
  CHECK_FALSE(q.start_turn(0, 0, 4096, 256, 1 << 20));
}

TEST_CASE("a turn given up while its session is parked releases the host memory it held",
          "[replay][issue29][decode_window]") {
  // Found by a reviewer: on 24 GB, long prompts and concurrency 2, a parked session's next turn
  // can never fit and is given up; the replay gave it up without releasing its host copy.
  auto plan = test::llama_plan("snapkv");
  gpu_spec gpu;
  gpu.memory_bytes = 24e9;
  model_spec model = model_preset("llama-3.1-8b");
  cost_model cost(model, gpu);
  workload_options wo;
  wo.kind         = workload_kind::long_context;
  wo.sessions     = 16;
  wo.turns        = 8;
  wo.think_mean_s = 0;
  wo.seed         = 6298;
  wo.arrival_rate = 20;
  auto work       = generate_workload(wo);
  replay_options o;
  o.concurrency = 2;
  o.max_tokens  = 256;
  tangram_policy_options to;
  to.answers.window_tokens = 512;
  tangram_policy p(plan, gpu.kv_budget_bytes(model), 16, 16, to);
  auto r = replay(work, p, cost, o);
  REQUIRE(r.parks > r.resumes);  // a parked session was given up
  CHECK(r.rejected_sessions > 0);
  CHECK(p.host_bytes_used() == 0);
  CHECK(p.manager().pool().used_pages() == 0);
}

TEST_CASE("the continuation headroom applies to page tables that grow, not to sliding-window rings",
          "[replay][issue29]") {
  // Layers 0 and 3 compressed, 1 a sliding window of 10 tokens, 2 uncompressed; P = 4.
  auto plan                 = test::tiny_plan(test::tiny_budgets(), 4, 2, 10);
  std::int64_t const prompt = 8, headroom = 8;  // 2 pages of prompt and 2 of headroom a table
  // Layer-wide pages (full_kv admits the uncompressed prompt): 4 layers x 2 prompt pages and
  // 3 growing layers x 2 headroom pages = 14 pages, not 16.
  auto layer_page = static_cast<double>(unified_paging_baseline::layer_geometry(plan).page_bytes());
  for (std::int64_t pages : {13, 14}) {
    unified_policy full(
        plan, unified_mode::full_kv, layer_page * static_cast<double>(pages), 4, 4, 64);
    CHECK(full.start_turn(0, 0, prompt, 4, headroom) == (pages == 14));
  }
  // Tangram with the headroom kept: its admission plus 2 headroom pages per group that is not a
  // ring.
  std::int64_t growing = 0;
  for (auto const& g : plan.grouping.groups) growing += g.rule.kind != layer_kind::sliding_window;
  REQUIRE(growing > 0);
  REQUIRE(growing < static_cast<std::int64_t>(plan.grouping.groups.size()));
  tangram_policy_options keep;
  keep.park_for_turns    = false;
  std::int64_t admission = 0;
  {
    tangram_policy probe(plan, 1e6 * static_cast<double>(plan.page_bytes()), 4, 4, keep);
    admission = probe.manager().admission_pages(prompt, 4);
  }
  for (std::int64_t extra : {-1, 0}) {
    auto pages = admission + growing * 2 + extra;
    tangram_policy p(
        plan, static_cast<double>(pages) * static_cast<double>(plan.page_bytes()), 4, 4, keep);
    CHECK(p.start_turn(0, 0, prompt, 4, headroom) == (extra == 0));
  }
}

TEST_CASE("decode skew by batch size: a step pays the skew measured at its own batch",
          "[replay][issue13][skew]") {
  skew_curve k{{1, 4, 16}, {2.0, 1.5, 1.1}};
  CHECK(k.at(1) == 2.0);
  CHECK(k.at(3) == 2.0);
  CHECK(k.at(4) == 1.5);
  CHECK(k.at(15) == 1.5);
  CHECK(k.at(16) == 1.1);
  CHECK(k.at(5000) == 1.1);
  CHECK(k.at(0) == 2.0);  // below the smallest measured batch: the smallest's
  CHECK(measured_skew_batches(1024) ==
        std::vector<std::int32_t>{1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024});
  CHECK(measured_skew_batches(48) == std::vector<std::int32_t>{1, 2, 4, 8, 16, 32, 48});
  CHECK(measured_skew_batches(1) == std::vector<std::int32_t>{1});
  CHECK(measured_skew_batches(100000).back() == 4096);
  step_charges bad;
  bad.decode_skew_by_batch = {{1, 1}, {1.2, 1.3}};
  CHECK_THROWS_WITH(bad.validate(), Catch::Contains("charges.decode_skew_by_batch.batch[1]"));
  bad.decode_skew_by_batch = {{1, 2}, {1.2, 0.5}};
  CHECK_THROWS_WITH(bad.validate(),
                    Catch::Contains("charges.decode_skew_by_batch.skew[1]: must be >= 1, got 0.5"));
  bad.decode_skew_by_batch = {{1, 2}, {1.2}};
  CHECK_THROWS_WITH(bad.validate(), Catch::Contains("2 batch sizes but 1 skews"));

  // A flat curve charges exactly what the scalar does; a curve that rises with the batch charges
  // more than its smallest entry and less than its largest.
  test::contended_replay fx;
  auto run = [&](step_charges ch) {
    replay_options o;
    o.charges = ch;
    tangram_policy p(fx.plan, fx.kv, 24, 24);
    return replay(fx.work, p, fx.cost, o);
  };
  step_charges scalar;
  scalar.decode_skew = 1.5;
  step_charges flat;
  flat.decode_skew_by_batch = {{1, 8, 64}, {1.5, 1.5, 1.5}};
  step_charges one;
  auto a = run(scalar), b = run(flat), base = run(one);
  CHECK(a.time.decode_attention_s == b.time.decode_attention_s);
  CHECK(a.modelled_makespan_s == b.modelled_makespan_s);
  CHECK(a.time.decode_attention_s == Approx(1.5 * base.time.decode_attention_s).epsilon(0.05));
  // The fixture never decodes more than 24 requests at once: a curve whose second point is at
  // 1000 charges its first entry on every step, one whose first point is at 1000... is never
  // below its first point, so it charges the first entry too; a per-step lookup is what makes
  // these differ from "always the last entry".
  step_charges low_then_high;
  low_then_high.decode_skew_by_batch = {{1, 1000}, {1.0, 2.0}};
  step_charges high_then_low;
  high_then_low.decode_skew_by_batch = {{1, 1000}, {2.0, 1.0}};
  auto lh = run(low_then_high), hl = run(high_then_low);
  CHECK(lh.time.decode_attention_s == base.time.decode_attention_s);
  CHECK(lh.modelled_makespan_s == base.modelled_makespan_s);
  CHECK(hl.time.decode_attention_s == Approx(2.0 * base.time.decode_attention_s).epsilon(0.05));
  // Steps of 4 or more decoders pay double, smaller ones not: strictly between, since the
  // fixture has steps of both kinds.
  step_charges rising;
  rising.decode_skew_by_batch = {{1, 4}, {1.0, 2.0}};
  auto r                      = run(rising);
  CHECK(r.time.decode_attention_s > base.time.decode_attention_s * 1.01);
  CHECK(r.time.decode_attention_s < 2.0 * base.time.decode_attention_s * 0.99);
}
