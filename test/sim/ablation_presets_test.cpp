// SPDX-License-Identifier: Apache-2.0
// simulate (issue 13): the ablation policies (eval/sim/ablation.hpp), the --gpu presets
// (eval/sim/gpu_presets.hpp) and time between tokens in the output.
#include <algorithm>
#include <sstream>

#include "../memory/memory_fixtures.hpp"
#include "cli_support.hpp"
#include "commands.hpp"
#include "contended_replay.hpp"
#include "tangram/eval/sim/ablation.hpp"
#include "tangram/eval/sim/gpu_presets.hpp"
#include "tangram/eval/sim/policies.hpp"
#include "tangram/eval/sim/replay.hpp"
#include "tangram/eval/sim/serving_costs.hpp"
#include "tangram/io/detail/json.hpp"
#include "tangram/memory/kv_cache_manager.hpp"
#include "test_support.hpp"

using namespace tangram;
using namespace tangram::sim;

using tangram::test::run;
using tangram::test::run_json;

namespace {


static_plan layer_wide_plan(static_plan const& plan) {
  return test::real_plan(model_preset("llama-3.1-8b"),
                         "profiles/snapkv/llama-3.1-8b-instruct.json",
                         plan.geometry.page_tokens,
                         plan.num_kv_heads,
                         grouping_scope::layer);
}

}  // namespace

TEST_CASE("ablation: head-group pages never reserve more KV than layer-wide pages",
          "[ablation]") {
  auto groups = test::llama_plan("snapkv");  // Hp = 4, global grouping
  auto layer  = layer_wide_plan(groups);
  REQUIRE(layer.num_kv_heads == groups.num_kv_heads);
  simulated_memory_resource r1, r2;
  manager_options o;
  o.num_pages     = 1 << 20;
  o.max_sequences = 4;
  kv_cache_manager hg(groups, r1, o);
  kv_cache_manager lw(layer, r2, o);
  // Same reservation (the same per-head budgets), pages as long as the group's or the layer's
  // longest head: a group's longest head is never longer than its layer's.
  for (std::int64_t prompt : {1, 100, 4000, 32000, 120000})
    for (std::int64_t max_new : {1, 512, 4096}) {
      INFO(prompt << " + " << max_new);
      double hg_bytes = static_cast<double>(hg.admission_pages(prompt, max_new)) *
                        static_cast<double>(groups.page_bytes());
      double lw_bytes = static_cast<double>(lw.admission_pages(prompt, max_new)) *
                        static_cast<double>(layer.page_bytes());
      CHECK(hg_bytes <= lw_bytes);
    }
}

TEST_CASE("ablation: +head_groups holds exactly tangram's memory and pays the baseline's balancing",
          "[ablation]") {
  test::contended_replay fx;
  serving_costs costs;
  costs.control_plane = false;  // measured: runs compared step for step must leave it out
  costs.planner_skew  = 1.2;
  costs.tangram_skew  = 1.05;
  auto rep            = [&](tangram_policy& p) {
    replay_options o;
    o.charges = costs.charges_for(p.name());
    return replay(fx.work, p, fx.cost, o);
  };
  tangram_policy_options named;
  named.name = head_groups_name;
  tangram_policy groups(fx.plan, fx.kv, 24, 24, named);
  tangram_policy aot(fx.plan, fx.kv, 24, 24);
  // Charged alike, the two are the same policy step for step.
  {
    tangram_policy same(fx.plan, fx.kv, 24, 24, named);
    replay_options o;
    o.charges = costs.charges_for("tangram");
    auto x    = replay(fx.work, same, fx.cost, o);
    auto y    = rep(aot);
    CHECK(x.kv_bytes_allocated_peak == y.kv_bytes_allocated_peak);
    CHECK(x.mean_resident_sessions == y.mean_resident_sessions);
    CHECK(x.modelled_makespan_s == y.modelled_makespan_s);
  }
  tangram_policy aot2(fx.plan, fx.kv, 24, 24);
  auto a = rep(groups);
  auto b = rep(aot2);
  CHECK(a.policy == "+head_groups");
  CHECK(a.generated_tokens == b.generated_tokens);
  CHECK(a.time.replanning_s > 0);
  CHECK(b.time.replanning_s == 0);
  CHECK(a.modelled_makespan_s > b.modelled_makespan_s);  // same work, dearer decode

  // reservation_only on layer-wide pages never holds more sessions than head-group pages.
  tangram_policy_options lw_named;
  lw_named.name = reservation_only_name;
  auto lw_plan  = layer_wide_plan(fx.plan);
  tangram_policy layer(lw_plan, fx.kv, 24, 24, lw_named);
  auto c = rep(layer);
  CHECK(c.generated_tokens == fx.outputs);
  CHECK(c.mean_resident_sessions <= a.mean_resident_sessions + 1e-9);
  CHECK(costs.charges_for(reservation_only_name) == costs.charges_for("unified_nonuniform"));
}

TEST_CASE("simulate's GPU presets (--gpu) carry the vendor figures and vLLM v1's default limits", "[simulate][cli][gpu]") {
  auto a100 = find_gpu_preset("a100");
  REQUIRE(a100);
  CHECK(a100->gpu.hbm_bytes_per_s == Approx(2.039e12));
  CHECK(a100->gpu.peak_flops == Approx(312e12));
  CHECK(a100->max_num_batched_tokens == 2048);
  CHECK(a100->max_num_seqs == 256);
  CHECK(find_gpu_preset("h100")->gpu.hbm_bytes_per_s == Approx(3.35e12));
  CHECK(find_gpu_preset("b200")->gpu.peak_flops == Approx(2250e12));
  CHECK_FALSE(find_gpu_preset("x100"));

  auto a100_run = run_json(
      {"simulate", "--sessions", "4", "--turns", "1", "--quiet", "--json", "--gpu", "a100"});
  auto root = a100_run.root();
  auto c = root["cost_model"];
  CHECK(c["gpu"].as_string() == "A100 80GB SXM");
  CHECK(c["hbm_bytes_per_s"].as_double(0, 1e15) == Approx(2.039e12));
  CHECK(c["peak_flops"].as_double(0, 1e18) == Approx(312e12));
  CHECK(c["gpu_memory_bytes"].as_double(0, 1e15) == Approx(80e9));
  CHECK(c["step_token_budget"].as_int(0, 1 << 30) == 2048);
  CHECK(c["max_running"].as_int(0, 1 << 30) == 256);
  CHECK(c["sms"].as_int(0, 1 << 30) == 108);  // the split map is planned for the A100's SMs
  auto tangram = root["policies"]["tangram"];
  CHECK(tangram["modelled_tbt_p50_s"].as_double(0, 1e6) > 0);
  CHECK(tangram["modelled_tbt_p95_s"].as_double(0, 1e6) >= tangram["modelled_tbt_p50_s"].as_double(0, 1e6));

  // Each figure given on its own wins over the preset.
  auto h100_run = run_json({"simulate",
                            "--sessions",
                            "4",
                            "--turns",
                            "1",
                            "--quiet",
                            "--json",
                            "--gpu",
                            "h100",
                            "--step-tokens",
                            "4096",
                            "--hbm-tbps",
                            "3",
                            "--sms",
                            "114"});
  auto c2       = h100_run.root();
  CHECK(c2["cost_model"]["gpu"].as_string() == "H100 80GB SXM");
  CHECK(c2["cost_model"]["hbm_bytes_per_s"].as_double(0, 1e15) == Approx(3e12));
  CHECK(c2["cost_model"]["step_token_budget"].as_int(0, 1 << 30) == 4096);
  CHECK(c2["cost_model"]["max_running"].as_int(0, 1 << 30) == 1024);
  CHECK(c2["cost_model"]["sms"].as_int(0, 1 << 30) == 114);

  auto r = run({"simulate", "--gpu", "x100"});
  CHECK(r.code == 2);
  CHECK(r.err.find("--gpu: expected one of h200, h100, b200, a100") != std::string::npos);
  CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
}

TEST_CASE("simulate --ablation adds reservation_only and +head_groups, --help lists every option",
          "[simulate][cli][ablation]") {
  auto r =
      run_json({"simulate", "--sessions", "6", "--turns", "2", "--quiet", "--json", "--ablation"});
  auto root = r.root();
  for (char const* p : {"full_kv", "unified_nonuniform", "reservation_only", "+head_groups", "tangram",
                        "tangram_elastic"}) {
    INFO(p);
    CHECK(root["policies"][p]["generated_tokens"].as_int(0, 1 << 30) > 0);
  }
  auto h = run({"simulate", "--help"});
  for (char const* opt : {"--gpu", "--gpu-mem", "--hbm-tbps", "--peak-tflops", "--ablation", "--max-tokens",
                          "--max-context", "--step-tokens", "--max-running", "--chunk", "--sensitivity"}) {
    INFO(opt);
    CHECK(h.out.find(opt) != std::string::npos);
  }
}

TEST_CASE("a context-length range replaces the workload class's", "[workload][simulate][cli]") {
  workload_options wo;
  wo.sessions   = 200;
  wo.turns      = 1;
  wo.context_lo = 5000;
  wo.context_hi = 6000;
  auto w        = generate_workload(wo);
  CHECK(w.name == "mid (contexts 5000-6000)");
  for (auto const& s : w.sessions) {
    CHECK(s.turns[0].prompt_tokens >= 4999);  // exp(log(x)) may round down by one
    CHECK(s.turns[0].prompt_tokens <= 6000);
  }
  wo.context_lo = 7000;
  CHECK_THROWS_WITH(generate_workload(wo), Catch::Contains("workload.context_range"));

  auto r = run({"simulate", "--sessions", "4", "--turns", "1", "--quiet", "--json", "--context-range",
                "5000,6000"});
  INFO(r.err);
  CHECK(r.code == 0);
  CHECK(r.out.find("contexts 5000-6000") != std::string::npos);
  for (auto const& [argv, piece] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"simulate", "--context-range", "9000,3000"}, "--context-range: must be LO,HI"},
           {{"simulate", "--context-range", "5000"}, "--context-range: must be LO,HI"},
           {{"simulate", "--context-range", "1,200000"}, "--context-range: must be LO,HI"},
           {{"simulate", "--context-range", "0,5"}, "--context-range"}}) {
    auto e = run(argv);
    INFO(piece);
    CHECK(e.code == 2);
    CHECK(e.err.find(piece) != std::string::npos);
    CHECK(std::count(e.err.begin(), e.err.end(), '\n') == 1);
  }
}
