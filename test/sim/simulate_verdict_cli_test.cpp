// SPDX-License-Identifier: Apache-2.0
// `tangram simulate --verdict` (issue 30): the folds it replays on unseen prompts, its JSON shape
// (one row per workload, baseline and cost setting), and the options it refuses before any work.
#include <algorithm>
#include <cmath>
#include <set>
#include <tuple>

#include "cli_support.hpp"
#include "commands.hpp"
#include "tangram/eval/sim/out_of_sample.hpp"
#include "tangram/io/budget_profile.hpp"
#include "tangram/io/detail/json.hpp"
#include "tangram/io/retention_samples.hpp"
#include "tangram/model/presets.hpp"
#include "tangram/plan/build_static_plan.hpp"
#include "tangram/plan/calibration.hpp"
#include "tangram/plan/elastic.hpp"
#include "test_support.hpp"

using namespace tangram;

namespace {

retention_samples snapkv_samples() {
  return load_retention_samples(test::data_path("profiles/snapkv/llama-3.1-8b-instruct.json"));
}

/// A small short-workload simulate run with `extra` options: its JSON's serving costs, and
/// tangram_elastic's measured control-plane time.
std::pair<tangram::detail::json::value, double> short_run(std::vector<std::string> extra) {
  namespace json = tangram::detail::json;
  auto r         = test::run_cli(test::with_args(
      {"simulate", "--sessions", "4", "--turns", "1", "--workload", "short", "--quiet", "--json"},
      extra));
  INFO(r.err);
  REQUIRE(r.code == 0);
  auto doc = json::parse(r.out, "stdout");
  double control =
      json::node(
          doc,
          "stdout")["policies"]["tangram_elastic"]["modelled_time_breakdown"]["control_plane_s"]
          .as_double(0, 1e6);
  return {std::move(doc), control};
}

}  // namespace

TEST_CASE("out-of-sample folds: every prompt replayed once, never calibrated on in its own fold",
          "[verdict][issue30]") {
  auto s     = snapkv_samples();
  auto folds = sim::prompt_folds(s);
  REQUIRE(folds.size() == 2);
  std::multiset<std::size_t> replayed;
  for (auto const& f : folds) {
    CHECK(f.calibration.samples.size() + f.replay.samples.size() == s.samples.size());
    CHECK(f.calibration.samples.size() == f.calibration_ids.size());
    std::set<std::int64_t> seen;
    for (auto k : f.calibration_ids) seen.insert(s.samples[k].context_tokens);
    for (std::size_t i = 0; i < f.replay_ids.size(); ++i) {
      auto k = f.replay_ids[i];
      replayed.insert(k);
      CHECK(seen.count(s.samples[k].context_tokens) == 0);  // a prompt is on one side only
      CHECK(f.replay.samples[i].kept == s.samples[k].kept);
    }
    CHECK_FALSE(f.calibration.samples.empty());
    CHECK_FALSE(f.replay.samples.empty());
  }
  for (std::size_t k = 0; k < s.samples.size(); ++k) CHECK(replayed.count(k) == 1);
  // One distinct prompt cannot be split in two.
  auto one = sim::sample_subset(s, {0});
  CHECK_THROWS_WITH(sim::prompt_folds(one),
                    Catch::Contains("folds: 2 folds need at least 2 distinct context lengths"));
}

TEST_CASE(
    "simulate --verdict: one row per workload, baseline and cost setting, out of sample, control "
    "plane charged",
    "[simulate][cli][verdict][issue30]") {
  namespace json = tangram::detail::json;
  // Small sessions and batches: the shape and the bookkeeping, not the figures.
  auto r = test::run_cli({"simulate",
                          "--verdict",
                          "--json",
                          "--quiet",
                          "--sessions",
                          "4",
                          "--turns",
                          "1",
                          "--max-running",
                          "16"});
  INFO(r.err);
  REQUIRE(r.code == 0);
  CHECK(r.err.empty());  // --quiet
  auto doc = json::parse(r.out, "stdout");
  json::node root(doc, "stdout");
  auto v = root["verdict"];
  CHECK(v["calibration"].as_string() == "out_of_sample");
  CHECK(v["control_plane_charged"].as_bool());
  auto rows = v["rows"];
  REQUIRE(rows.size() == 3 * 4 * 2);
  std::set<std::tuple<std::string, std::string, std::string>> seen;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    auto row = rows[i];
    seen.emplace(
        row["workload"].as_string(), row["baseline"].as_string(), row["costs"].as_string());
    CHECK(row["policy"].as_string() == "tangram_elastic");
    double t = row["tokens_per_s_ratio"].as_double(1e-6, 1e6),
           m = row["mean_resident_ratio"].as_double(1e-6, 1e6);
    REQUIRE(row["folds"].size() == 2);
    // The row is the mean of its two folds.
    CHECK(t == Approx((row["folds"][0]["tokens_per_s_ratio"].as_double(0, 1e6) +
                       row["folds"][1]["tokens_per_s_ratio"].as_double(0, 1e6)) /
                      2));
    CHECK(m > 0);
    // Resident while memory binds: null where memory never binds a side, else the mean of the
    // folds that have it.
    double sum  = 0;
    int defined = 0;
    for (std::size_t f = 0; f < 2; ++f)
      if (auto b = row["folds"][f]["bound_resident_ratio"]; b.type() != json::kind::null) {
        sum += b.as_double(1e-6, 1e6);
        ++defined;
      }
    if (defined == 0)
      CHECK(row["bound_resident_ratio"].type() == json::kind::null);
    else
      CHECK(row["bound_resident_ratio"].as_double(1e-6, 1e6) == Approx(sum / defined));
  }
  for (char const* w : {"short", "mid", "long"})
    for (char const* b : {"full_kv", "full_kv_offload", "unified_nonuniform", "per_head_dynamic"})
      for (char const* c : {"paper", "competent"}) CHECK(seen.count({w, b, c}) == 1);
  // Each setting's constants and their sources are reported beside the rows.
  CHECK(v["costs"]["paper"]["reclaim_prefill_fraction"].as_double(0, 1) == Approx(0.175));
  CHECK(v["costs"]["competent"]["replan"].as_string() == "overlapped");
  CHECK(v["sources"]["replan_competent_source"].as_string().find("flashinfer") !=
        std::string::npos);
  CHECK(v["sources"]["reclaim_measured_now_s_per_page"].as_double(1e-12, 1e-5) > 0);
  // The folds replay every sample once.
  std::multiset<std::int64_t> ids;
  for (std::size_t f = 0; f < v["folds"].size(); ++f)
    for (std::size_t i = 0; i < v["folds"][f]["replay_sample_indices"].size(); ++i)
      ids.insert(v["folds"][f]["replay_sample_indices"][i].as_int(0, 1000));
  CHECK(ids.size() == 28);
  CHECK(std::adjacent_find(ids.begin(), ids.end()) == ids.end());
  // Tangram's clipping on unseen prompts is reported.
  CHECK(v["results"]["mid"]["folds"][0]["tangram_elastic"]["modelled_wanted_clipped_fraction"]
            .as_double(0, 1) >= 0);
}

TEST_CASE("simulate --verdict: Tangram's margin comes from each fold's calibration half",
          "[simulate][cli][verdict]") {
  namespace json = tangram::detail::json;
  // The derived GPT-OSS-20B samples need more than the default margin, differently per half.
  auto path = test::data_path("derived/gpt-oss-20b.derived.json");
  auto r    = test::run_cli({"simulate",
                             "--verdict",
                             "--json",
                             "--quiet",
                             "--profile",
                             path,
                             "--sessions",
                             "2",
                             "--turns",
                             "1",
                             "--max-running",
                             "8"});
  INFO(r.err);
  REQUIRE(r.code == 0);
  auto doc = json::parse(r.out, "stdout");
  json::node root(doc, "stdout");
  auto folds = root["verdict"]["folds"];
  REQUIRE(folds.size() == 2);
  auto s = load_retention_samples(path);
  std::vector<double> margins;
  for (std::size_t f = 0; f < 2; ++f) {
    std::set<std::int64_t> replayed;
    for (std::size_t i = 0; i < folds[f]["replay_sample_indices"].size(); ++i)
      replayed.insert(folds[f]["replay_sample_indices"][i].as_int(0, 1000));
    retention_samples calibration = s, replay = s;
    calibration.samples.clear();
    replay.samples.clear();
    for (std::size_t k = 0; k < s.samples.size(); ++k)
      (replayed.count(static_cast<std::int64_t>(k)) ? replay : calibration)
          .samples.push_back(s.samples[k]);
    double m = folds[f]["margin"].as_double(0, 10);
    // Per-head pages: any grouping of the model's heads gives the same required margins.
    auto plan = build_static_plan(model_preset(s.model), calibrate(calibration), {});
    CHECK(m == elastic_plan_margin(calibration, plan));
    CHECK(m != elastic_plan_margin(replay, plan));  // never the prompts it is judged on
    CHECK(m > default_elastic_margin);
    margins.push_back(m);
  }
  CHECK(margins[0] != margins[1]);
}

TEST_CASE("simulate --verdict refuses a single run's options and a budget profile, naming them",
          "[simulate][cli][verdict][issue30][errors]") {
  struct refused {
    std::vector<std::string> argv;
    std::string piece;
  };
  auto profile = test::cli_tmp_path("verdict", "budgets.json");
  save_budget_profile(calibrate(snapkv_samples()), profile);
  for (auto const& c : std::vector<refused>{
           {{"--workload", "mid"}, "--workload: applies to a single simulate run"},
           {{"--costs", "competent"}, "--costs: applies to a single simulate run"},
           {{"--sensitivity"}, "--sensitivity: applies to a single simulate run"},
           {{"--context-range", "1000,2000"}, "--context-range: applies to a single simulate run"},
           {{"--reclaim-us-per-page", "1"},
            "--reclaim-us-per-page: applies to a single simulate run"},
           {{"--profile", profile}, "is a budget profile"},
       }) {
    std::vector<std::string> argv{"simulate", "--verdict", "--quiet"};
    argv.insert(argv.end(), c.argv.begin(), c.argv.end());
    test::check_refused(argv, {c.piece});
  }
  auto r = test::run_cli({"simulate", "--offload-host-gb", "10"});
  CHECK(r.code == 2);
  CHECK(r.err.find("--offload-host-gb: applies to --verdict") != std::string::npos);
}

TEST_CASE(
    "simulate charges the measured control plane by default, --no-control-plane leaves it out",
    "[simulate][cli][issue30]") {
  auto control = [](std::vector<std::string> extra) {
    auto [doc, seconds] = short_run(extra);
    tangram::detail::json::node root(doc, "stdout");
    CHECK(root["cost_model"]["serving_costs"]["control_plane_charged"].as_bool() == extra.empty());
    return seconds;
  };
  CHECK(control({}) > 0);
  CHECK(control({"--no-control-plane"}) == 0);
}

TEST_CASE(
    "simulate --costs competent starts from the competent preset, explicit options override it",
    "[simulate][cli][issue30]") {
  auto costs = [](std::vector<std::string> extra) {
    extra.push_back("--no-control-plane");
    auto doc = short_run(extra).first;
    tangram::detail::json::node root(doc, "stdout");
    auto c = root["cost_model"]["serving_costs"];
    return std::make_tuple(c["baseline_balance"].as_string(),
                           c["replan"].as_string(),
                           c["baseline_reads"].as_string(),
                           c["reclaim_s_per_page"].as_double(0, 1),
                           c["reclaim_prefill_fraction"].as_double(0, 10));
  };
  CHECK(costs({}) ==
        std::make_tuple(
            std::string("replan"), std::string("fraction"), std::string("padded"), 0.0, 0.175));
  CHECK(costs({"--costs", "competent"}) ==
        std::make_tuple(
            std::string("perfect"), std::string("overlapped"), std::string("masked"), 1.1e-9, 0.0));
  CHECK(costs({"--costs",
               "competent",
               "--baseline-balance",
               "none",
               "--replan",
               "planner",
               "--baseline-reads",
               "padded",
               "--reclaim-prefill-fraction",
               "0.1"}) ==
        std::make_tuple(
            std::string("none"), std::string("planner"), std::string("padded"), 1.1e-9, 0.1));
}
