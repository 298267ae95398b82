// SPDX-License-Identifier: Apache-2.0
// `tangram plan --pipeline-stages N` and `--layers A:B,...`, driven in-process: stage files,
// their names and content, the stage table, and one-line usage errors naming the option.
#include <algorithm>
#include <filesystem>
#include <sstream>

#include "cli_support.hpp"
#include "commands.hpp"
#include "tangram/io/detail/json.hpp"
#include "tangram/io/retention_samples.hpp"
#include "tangram/io/static_plan.hpp"
#include "tangram/model/presets.hpp"
#include "tangram/plan/calibration.hpp"
#include "tangram/plan/elastic.hpp"
#include "tangram/plan/pipeline_stages.hpp"
#include "test_support.hpp"

using namespace tangram;
using tangram::test::data_path;
using tangram::test::run_cli;
namespace json = tangram::detail::json;

namespace {

std::string tmp(std::string const& name) {
  return tangram::test::cli_tmp_path("cli_pipeline", name);
}

void expect_error(std::vector<std::string> const& argv, std::vector<std::string> const& pieces) {
  tangram::test::check_refused(argv, pieces, 2, true);
}

}  // namespace

TEST_CASE("plan --pipeline-stages writes one balanced plan per stage", "[cli][pipeline]") {
  auto out = tmp("llama.json");
  for (int k = 0; k < 4; ++k)
    std::filesystem::remove(tmp("llama.stage" + std::to_string(k) + "-of-4.json"));
  auto r = run_cli({"plan",
                    "snapkv/llama-3.1-8b-instruct",
                    "--pipeline-stages",
                    "4",
                    "--reservation",
                    "static",
                    "--scope",
                    "layer",
                    "--weighting",
                    "budget",
                    "--out",
                    out});
  INFO("stderr: " << r.err);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("pipeline: 4 stages, balanced by KV memory") != std::string::npos);
  CHECK(r.out.find("wrote 4 stage plans") != std::string::npos);
  CHECK_FALSE(std::filesystem::exists(out));  // only the stage files
  // The library's partition of the same profile and options, and the same plans.
  auto s     = load_retention_samples(data_path("profiles/snapkv/llama-3.1-8b-instruct.json"));
  auto model = model_preset("llama-3.1-8b");
  auto prof  = calibrate(s);
  plan_options o;
  o.reservation.mode = reservation_mode::static_budgets;
  o.scope            = grouping_scope::layer;
  o.split.weighting  = split_weighting::budget;
  auto ranges =
      balanced_pipeline_stages(layer_kv_tokens(model, prof, o, default_stage_balance_context), 4);
  auto expected = build_stage_plans(model, prof, o, ranges);
  for (std::size_t k = 0; k < 4; ++k) {
    auto path = tmp("llama.stage" + std::to_string(k) + "-of-4.json");
    INFO(path);
    REQUIRE(std::filesystem::exists(path));
    auto p = load_static_plan(path);
    CHECK(p.stage_layers() == ranges[k]);
    CHECK(plan_difference(p, expected[k]).empty());
    CHECK(r.out.find(path) != std::string::npos);
  }
}

TEST_CASE("plan --pipeline-stages --json: the stage table, balanced and even", "[cli][pipeline]") {
  auto r = run_cli({"plan",
                    "ea/qwen3-4b-instruct-2507",
                    "--pipeline-stages",
                    "3",
                    "--reservation",
                    "static",
                    "--weighting",
                    "budget",
                    "--stage-context",
                    "16384",
                    "--json"});
  INFO("stderr: " << r.err);
  REQUIRE(r.code == 0);
  auto v = json::parse(r.out, "stdout");
  CHECK(v.find("partition")->string() == "balanced_kv_memory");
  CHECK(v.find("stage_context")->number() == 16384);
  auto const& stages = v.find("stages")->elements();
  REQUIRE(stages.size() == 3);
  double first = 0;
  for (std::size_t k = 0; k < 3; ++k) {
    CHECK(stages[k].find("first_layer")->number() == first);
    first = stages[k].find("last_layer")->number();
    CHECK(stages[k].find("out")->is_null());
  }
  CHECK(first == 36);
  // Balanced on the KV tokens: never worse than an even split by layer count.
  CHECK(v.find("kv_tokens_max_over_min")->number() >= 1.0);
  CHECK(v.find("footprint_max_over_min")->number() >= 1.0);
}

TEST_CASE("plan --pipeline-stages, elastic: every stage shows and writes its own margin",
          "[cli][pipeline][elastic]") {
  auto out = tmp("llama-elastic.json");
  auto r   = run_cli(
      {"plan", "snapkv/llama-3.1-8b-instruct", "--layers", "0:16,16:32", "--out", out, "--json"});
  INFO("stderr: " << r.err);
  REQUIRE(r.code == 0);
  auto v = json::parse(r.out, "stdout");
  CHECK(v.find("margin_from_samples")->boolean());
  auto const& stages = v.find("stages")->elements();
  REQUIRE(stages.size() == 2);
  auto s = load_retention_samples(data_path("profiles/snapkv/llama-3.1-8b-instruct.json"));
  for (std::size_t k = 0; k < 2; ++k) {
    auto p = load_static_plan(stages[k].find("out")->string());
    INFO("stage " << k);
    CHECK(stages[k].find("margin")->number() == p.options.reservation.margin);
    CHECK(p.options.reservation.margin == elastic_plan_margin(s, p));
  }
  CHECK(stages[0].find("margin")->number() > 0.1);  // layers 0-15 keep more than their share
  auto fixed = json::parse(run_cli({"plan",
                                    "snapkv/llama-3.1-8b-instruct",
                                    "--layers",
                                    "0:16,16:32",
                                    "--margin",
                                    "0.05",
                                    "--json"})
                               .out,
                           "stdout");
  CHECK_FALSE(fixed.find("margin_from_samples")->boolean());
  for (auto const& st : fixed.find("stages")->elements())
    CHECK(st.find("margin")->number() == 0.05);
}

TEST_CASE("plan --layers: one range plans one stage, several write one plan each",
          "[cli][pipeline]") {
  auto out = tmp("stage.json");
  std::filesystem::remove(out);
  auto r = run_cli({"plan",
                    "keydiff/llama-3.1-8b-instruct",
                    "--layers",
                    "8:16",
                    "--reservation",
                    "static",
                    "--weighting",
                    "budget",
                    "--out",
                    out});
  INFO("stderr: " << r.err);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("pipeline stage: layers 8..15 (8 of 32") != std::string::npos);
  auto p = load_static_plan(out);
  CHECK(p.stage_layers() == layer_range{8, 16});
  CHECK(p.num_layers == 8);
  // inspect shows the stage and model layer numbers.
  auto i = run_cli({"inspect", out});
  REQUIRE(i.code == 0);
  CHECK(i.out.find("pipeline stage: layers 8..15 of 32") != std::string::npos);
  CHECK(i.out.find("layer  15") != std::string::npos);
  CHECK(i.out.find("layer   0 ") == std::string::npos);

  auto many = tmp("three");
  auto m    = run_cli({"plan",
                       "keydiff/llama-3.1-8b-instruct",
                       "--layers",
                       "0:10,10:21,21:32",
                       "--reservation",
                       "static",
                       "--weighting",
                       "budget",
                       "--out",
                       many});
  INFO("stderr: " << m.err);
  REQUIRE(m.code == 0);
  CHECK(m.out.find("layer ranges as given") != std::string::npos);
  CHECK(load_static_plan(tmp("three.stage1-of-3.json")).stage_layers() == layer_range{10, 21});
  CHECK(load_static_plan(tmp("three.stage2-of-3.json")).stage_layers() == layer_range{21, 32});
}

TEST_CASE("plan: bad stage options are one-line errors naming the option and the value",
          "[cli][pipeline][errors]") {
  std::string in = "snapkv/llama-3.1-8b-instruct";
  expect_error({"plan", in, "--pipeline-stages", "40"},
               {"--pipeline-stages: must be in [1, 32]", "\"Llama-3.1-8B\"", "got 40"});
  expect_error({"plan", in, "--pipeline-stages", "0"}, {"--pipeline-stages", "0"});
  expect_error({"plan", in, "--layers", "4:40"},
               {"--layers: [4, 40) is outside the model's 32 layers"});
  expect_error({"plan", in, "--layers", "5:5"}, {"--layers: [5, 5) is empty"});
  expect_error({"plan", in, "--layers", "7"}, {"--layers", "expected FIRST:LAST", "\"7\""});
  expect_error({"plan", in, "--layers", "0:x"}, {"--layers", "expected an integer", "\"x\""});
  expect_error({"plan", in, "--layers", "0:10,8:32"},
               {"--layers: pipeline_stages[1]: [8, 32) overlaps"});
  expect_error({"plan", in, "--layers", "0:10,12:32"},
               {"--layers: pipeline_stages[1]: [12, 32) leaves layers [10, 12) in no stage"});
  expect_error({"plan", in, "--layers", "0:10,10:30"},
               {"--layers: pipeline_stages", "leave layers [30, 32) in no stage"});
  expect_error({"plan", in, "--layers", "0:16", "--pipeline-stages", "2"},
               {"--layers: cannot be combined with --pipeline-stages"});
  expect_error({"plan", in, "--stage-context", "1000"},
               {"--stage-context: applies to --pipeline-stages", "several --layers ranges"});
  // --help lists the options.
  auto h = run_cli({"plan", "--help"});
  CHECK(h.code == 0);
  CHECK(h.out.find("--pipeline-stages") != std::string::npos);
  CHECK(h.out.find("--layers") != std::string::npos);
  CHECK(h.out.find("--stage-context") != std::string::npos);
}
