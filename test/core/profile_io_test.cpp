// SPDX-License-Identifier: Apache-2.0
#include <cstdio>
#include <fstream>

#include "tangram/io/budget_profile.hpp"
#include "tangram/io/detail/file_io.hpp"
#include "tangram/io/retention_samples.hpp"
#include "tangram/profile/budget_profile.hpp"
#include "tangram/profile/retention_samples.hpp"
#include "test_support.hpp"

using namespace tangram;
using tangram::test::bundled_profiles;
using tangram::test::data_path;

TEST_CASE("every bundled retention profile loads with the documented shape", "[profile]") {
  for (auto const& rel : bundled_profiles()) {
    INFO(rel);
    auto s = load_retention_samples(data_path("profiles/" + rel));
    bool llama = rel.find("llama") != std::string::npos;
    CHECK(s.num_model_layers == (llama ? 32 : 36));
    CHECK(s.layer_ids.size() == static_cast<std::size_t>(s.num_model_layers));
    CHECK(s.num_kv_heads == 8);
    CHECK(s.samples.size() == 28);
    CHECK(s.sink_tokens == 32);
    CHECK(s.window_tokens == 4096);
    CHECK(s.target_keep_ratio == 0.3);
    CHECK_FALSE(s.hybrid_sliding_window);
    for (std::size_t i = 0; i < s.samples.size(); ++i) {
      auto const& smp = s.samples[i];
      CHECK(smp.context_tokens >= 14000);
      CHECK(smp.context_tokens <= 27000);
      for (auto k : smp.kept) {
        CHECK(k >= s.protected_tokens());  // every head keeps at least sink + window
        CHECK(k <= smp.context_tokens);
      }
    }
  }
  // A value read by hand from data/profiles/snapkv/llama-3.1-8b-instruct.json.
  auto s = load_retention_samples(data_path("profiles/snapkv/llama-3.1-8b-instruct.json"));
  CHECK(s.samples[0].context_tokens == 18055);
  CHECK(s.samples[0].kept[3] == 14640);
  CHECK(s.ratio(0, 0, 3) == Approx(14640.0 / 18055.0));
}

namespace {

// A small valid retention-samples document: 3 model layers, layers 0 and 2 profiled, 2 heads.
std::string tiny_samples() {
  return R"({
  "format": "retention-samples/v1",
  "model": "tiny", "scorer": "snapkv", "target_keep_ratio": 0.3,
  "sink_tokens": 4, "window_tokens": 16,
  "num_model_layers": 3, "layer_ids": [0, 2], "num_kv_heads": 2,
  "hybrid_sliding_window": false,
  "samples": [
    {"context_tokens": 100, "kept_tokens": [[30, 40], [20, 100]]},
    {"context_tokens": 200, "kept_tokens": [[50, 90], [25, 180]]}
  ]
})";
}

std::string replace(std::string text, std::string const& from, std::string const& to) {
  auto pos = text.find(from);
  REQUIRE(pos != std::string::npos);
  return text.replace(pos, from.size(), to);
}

}  // namespace

TEST_CASE("a small retention-samples document parses exactly", "[profile]") {
  auto s = parse_retention_samples(tiny_samples(), "tiny.json");
  CHECK(s.layer_ids == std::vector<std::int32_t>{0, 2});
  CHECK(s.protected_tokens() == 20);
  CHECK(s.samples[1].kept == std::vector<std::int64_t>{50, 90, 25, 180});
  CHECK(s.ratio(1, 1, 1) == 0.9);
}

TEST_CASE("malformed retention samples give errors naming field and value", "[profile][errors]") {
  auto const t = tiny_samples();
  auto check = [](std::string const& text, std::vector<std::string> pieces) {
    bool threw = false;
    try {
      (void)parse_retention_samples(text, "s.json");
    } catch (parse_error const& e) {
      threw = true;
      std::string msg = e.what();
      INFO(msg);
      for (auto const& p : pieces) CHECK(msg.find(p) != std::string::npos);
    }
    CHECK(threw);
  };
  check(replace(t, "retention-samples/v1", "retention-samples/v2"), {"s.json: format", "\"retention-samples/v2\""});
  check(replace(t, "\"num_kv_heads\": 2,", ""), {"num_kv_heads: missing required field"});
  check(replace(t, "[[30, 40], [20, 100]]", "[[30, 40]]"), {"samples[0].kept_tokens", "expected 2 elements", "got 1"});
  check(replace(t, "[[30, 40], [20, 100]]", "[[30, 40, 7], [20, 100]]"), {"samples[0].kept_tokens[0]", "expected 2", "got 3"});
  check(replace(t, "[50, 90]", "[50, 290]"), {"samples[1].kept_tokens[0][1]", "context_tokens (200)", "got 290"});
  check(replace(t, "[50, 90]", "[-5, 90]"), {"samples[1].kept_tokens[0][0]", "got -5"});
  check(replace(t, "[50, 90]", "[NaN, 90]"), {"samples[1].kept_tokens[0][0]", "expected an integer", "nan"});
  check(replace(t, "[50, 90]", "[50.5, 90]"), {"samples[1].kept_tokens[0][0]", "expected an integer", "50.5"});
  check(replace(t, "\"layer_ids\": [0, 2]", "\"layer_ids\": [0, 3]"), {"layer_ids[1]", "[0, 2]", "got 3"});
  check(replace(t, "\"layer_ids\": [0, 2]", "\"layer_ids\": [2, 0]"), {"layer_ids[1]", "strictly increasing"});
  check(replace(t, "\"layer_ids\": [0, 2]", "\"layer_ids\": []"), {"layer_ids", "expected 1 to 3 elements, got 0"});
  check(replace(t, "\"context_tokens\": 100", "\"context_tokens\": 0"), {"samples[0].context_tokens", "got 0"});
  check(replace(t, "\"sink_tokens\": 4", "\"sink_tokens\": -4"), {"sink_tokens", "got -4"});
  check(replace(t, "\"target_keep_ratio\": 0.3", "\"target_keep_ratio\": 1.5"), {"target_keep_ratio", "got 1.5"});
  check(replace(t, "\"num_model_layers\": 3", "\"num_model_layers\": \"3\""), {"num_model_layers", "expected an integer, got \"3\""});
  check(replace(t, "\"samples\": [", "\"samples\": {\"x\": ["), {"invalid JSON"});
  check("[1,2]", {"document: expected an object"});
  check(replace(t, "\"samples\": [\n    {\"context_tokens\": 100, \"kept_tokens\": [[30, 40], [20, 100]]},\n    {\"context_tokens\": 200, \"kept_tokens\": [[50, 90], [25, 180]]}\n  ]", "\"samples\": []"),
        {"samples", "expected 1 to 100000 elements, got 0"});
}

TEST_CASE("missing files are reported with their path", "[profile][errors]") {
  TANGRAM_REQUIRE_THROWS_WITH_ALL(load_retention_samples("/nonexistent/x.json"), invalid_argument,
                                  "cannot open \"/nonexistent/x.json\"");
}

namespace {
budget_profile tiny_profile() {
  budget_profile p;
  p.model            = "tiny";
  p.scorer           = "snapkv";
  p.num_model_layers = 3;
  p.num_kv_heads     = 2;
  p.layer_ids        = {0, 2};
  p.sink_tokens      = 4;
  p.window_tokens    = 16;
  p.target_keep_ratio       = 0.3;
  p.calibration.estimator   = budget_estimator::quantile;
  p.calibration.quantile    = 0.9;
  p.calibration.num_samples = 2;
  p.budgets = {0.25, 0.5, 1.0 / 3.0, 1.0};
  return p;
}
}  // namespace

TEST_CASE("budget profiles round-trip exactly through JSON and files", "[profile]") {
  auto p = tiny_profile();
  REQUIRE_NOTHROW(p.validate());
  auto back = parse_budget_profile(to_json(p), "rt");
  CHECK(back.budgets == p.budgets);  // bit-exact doubles
  CHECK(back.layer_ids == p.layer_ids);
  CHECK(back.calibration.estimator == budget_estimator::quantile);
  CHECK(back.calibration.quantile == 0.9);
  CHECK(back.layer_index(2) == 1);
  CHECK(back.layer_index(1) == -1);
  std::string path = std::string(TANGRAM_BINARY_DIR) + "/profile_roundtrip_test.json";
  save_budget_profile(p, path);
  CHECK(load_budget_profile(path).budgets == p.budgets);
  std::remove(path.c_str());
}

TEST_CASE("malformed budget profiles give errors naming field and value", "[profile][errors]") {
  std::string t = to_json(tiny_profile());
  auto check = [](std::string const& text, std::vector<std::string> pieces) {
    bool threw = false;
    try {
      (void)parse_budget_profile(text, "p.json");
    } catch (parse_error const& e) {
      threw = true;
      std::string msg = e.what();
      INFO(msg);
      for (auto const& piece : pieces) CHECK(msg.find(piece) != std::string::npos);
    }
    CHECK(threw);
  };
  check(replace(t, "tangram-budget-profile/v1", "tangram-budget-profile/v9"), {"format", "\"tangram-budget-profile/v9\""});
  check(replace(t, "[0.25, 0.5]", "[0, 0.5]"), {"budgets[0][0]", "(0, 1]", "got 0"});
  check(replace(t, "[0.25, 0.5]", "[0.25, 1.5]"), {"budgets[0][1]", "got 1.5"});
  check(replace(t, "[0.25, 0.5]", "[0.25, NaN]"), {"budgets[0][1]", "NaN"});
  check(replace(t, "[0.25, 0.5]", "[0.25]"), {"budgets[0]", "expected 2 elements", "got 1"});
  check(replace(t, "\"estimator\": \"quantile\"", "\"estimator\": \"magic\""), {"calibration.estimator", "\"magic\""});
  check(replace(t, "\"layer_ids\": [0, 2]", "\"layer_ids\": [0, 5]"), {"layer_ids[1]", "got 5"});
  auto bad = tiny_profile();
  bad.budgets[3] = -0.5;
  TANGRAM_REQUIRE_THROWS_WITH_ALL(bad.validate(), invalid_argument, "budgets[1][1]", "got -0.5");
  bad = tiny_profile();
  bad.budgets.pop_back();
  TANGRAM_REQUIRE_THROWS_WITH_ALL(bad.validate(), invalid_argument, "expected 4 values", "got 3");
}
