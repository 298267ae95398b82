// SPDX-License-Identifier: Apache-2.0
// Regression tests for issue 11 at the plan-file and command level: plans the writer could produce
// but the reader refused (6), the reference-context cap of docs/formats.md (8), names printed raw
// to the terminal (7).
#include <filesystem>
#include <random>
#include <sstream>

#include "cli_support.hpp"
#include "commands.hpp"
#include "tangram/io/budget_profile.hpp"
#include "tangram/io/detail/file_io.hpp"
#include "tangram/io/detail/json.hpp"
#include "tangram/io/static_plan.hpp"
#include "tangram/model/presets.hpp"
#include "tangram/plan/build_static_plan.hpp"
#include "tangram/plan/calibration.hpp"
#include "test_support.hpp"

using namespace tangram;
namespace fs   = std::filesystem;
namespace json = tangram::detail::json;

using tangram::test::run;

namespace {


std::string fresh_dir(std::string const& name) {
  auto dir = fs::path(TANGRAM_BINARY_DIR) / "test-tmp" / "io_plan_defects" / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

/// A model of `L` compressed layers x `H` KV heads, and a profile with seeded budgets for it.
model_spec synthetic_model(std::int32_t L, std::int32_t H, std::string name = "synthetic") {
  model_spec m;
  m.name            = std::move(name);
  m.num_layers      = L;
  m.num_kv_heads    = H;
  m.num_query_heads = H;
  m.head_dim        = 128;
  m.layers.assign(static_cast<std::size_t>(L), layer_spec{});
  return m;
}

budget_profile synthetic_profile(model_spec const& m, std::uint64_t seed) {
  budget_profile p;
  p.model            = m.name;
  p.scorer           = "synthetic";
  p.num_model_layers = m.num_layers;
  p.num_kv_heads     = m.num_kv_heads;
  for (std::int32_t l = 0; l < m.num_layers; ++l) p.layer_ids.push_back(l);
  p.sink_tokens   = 4;
  p.window_tokens = 64;
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(1e-6, 1.0);  // full-width doubles
  p.budgets.resize(static_cast<std::size_t>(m.num_layers) * m.num_kv_heads);
  for (auto& b : p.budgets) b = u(rng);
  return p;
}

/// No terminal control byte (C0, DEL, raw or encoded C1).
bool terminal_safe(std::string const& s) {
  for (std::size_t i = 0; i < s.size(); ++i) {
    auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 && c != '\n') return false;
    if (c == 0x7f ||
        (c >= 0x80 && c <= 0x9f && (i == 0 || static_cast<unsigned char>(s[i - 1]) < 0xc0)))
      return false;
    if (c == 0xc2 && i + 1 < s.size() && static_cast<unsigned char>(s[i + 1]) <= 0x9f) return false;
  }
  return true;
}

}  // namespace

// ---- defect 6: caps agree between writer and reader, checked before the work ------------------

TEST_CASE("plan_json_bound is an upper bound of the written plan", "[regression][plan_io]") {
  struct shape {
    std::int32_t L, H, Hp, tp;
    grouping_scope scope;
  };
  for (auto s : {shape{3, 8, 1, 1, grouping_scope::global},
                 shape{12, 16, 4, 2, grouping_scope::layer},
                 shape{40, 32, 8, 4, grouping_scope::adjacent},
                 shape{2, 64, 64, 1, grouping_scope::global}}) {
    INFO("L " << s.L << " H " << s.H << " Hp " << s.Hp << " tp " << s.tp);
    // A long name full of characters the writer must escape (6 bytes each).
    auto model   = synthetic_model(s.L, s.H, std::string(200, '\x01'));
    auto profile = synthetic_profile(model, 7);
    plan_options o;
    o.reservation.mode         = reservation_mode::static_budgets;  // no keep ratio to be elastic
    o.group_size               = s.Hp;
    o.scope                    = s.scope;
    o.tp_size                  = s.tp;
    o.tp_rank                  = s.tp - 1;
    o.split.limits.sm_count    = 65536;  // the widest CTA boundaries
    o.split.limits.ctas_per_sm = 64;
    o.split.weighting          = split_weighting::budget;
    auto text                  = to_json(build_static_plan(model, profile, o));
    auto bound                 = plan_json_bound(model, profile, o);
    CHECK(text.size() <= bound);
    CHECK(bound < 2 * text.size() + 8192);  // and not absurdly loose
  }
}

TEST_CASE("plan --out refuses up front a plan that could exceed the plan file limit",
          "[regression][plan_io][cli]") {
  auto dir     = fresh_dir("too_big");
  auto model   = synthetic_model(1024, 512);
  auto profile = synthetic_profile(model, 1);
  detail::write_file(dir + "/model.json", to_json(model));
  save_budget_profile(profile, dir + "/profile.json");
  plan_options o;
  REQUIRE(plan_json_bound(model, profile, o) > plan_file_limits::max_bytes);
  auto r = run(
      {"plan", dir + "/profile.json", "--model", dir + "/model.json", "--out", dir + "/plan.json"});
  INFO(r.err);
  CHECK(r.code == 2);
  CHECK(r.out.empty());
  CHECK(r.err.find("plan file limit of 67108864 bytes") != std::string::npos);
  CHECK(r.err.find("--tp-size") != std::string::npos);
  CHECK(r.err.find("invalid JSON") == std::string::npos);
  CHECK_FALSE(fs::exists(dir + "/plan.json"));
  CHECK_THROWS_AS(check_plan_file_size(model, profile, o), tangram::invalid_argument);
  // The same model split over enough ranks fits and is planned.
  o.tp_size = 4;
  CHECK_NOTHROW(check_plan_file_size(model, profile, o));
}

TEST_CASE("a plan text over the limit is refused naming the limit, not as invalid JSON",
          "[regression][plan_io]") {
  std::string big = "{\"format\": \"tangram-static-plan/v1\", \"pad\": \"" +
                    std::string(plan_file_limits::max_bytes, 'x') + "\"}";
  TANGRAM_REQUIRE_THROWS_WITH_ALL(parse_static_plan(big, "plan.json"),
                                  tangram::parse_error,
                                  "plan.json",
                                  "larger than the limit of 67108864 bytes");
  try {
    (void)parse_static_plan(big, "plan.json");
  } catch (tangram::parse_error const& e) {
    CHECK(std::string(e.what()).find("invalid JSON") == std::string::npos);
  }
  auto dir = fresh_dir("big_file");
  detail::write_file(dir + "/plan.json", big);
  TANGRAM_REQUIRE_THROWS_WITH_ALL(load_static_plan(dir + "/plan.json"),
                                  tangram::invalid_argument,
                                  "plan.json",
                                  "larger than the limit of 67108864 bytes");
}

// ---- defect 8: the reference-context cap of docs/formats.md is enforced ------------------------

TEST_CASE("reference contexts above 2^24 are refused by the CLI, the reader and the writer",
          "[regression][plan_io][cli]") {
  auto r = run({"plan", "snapkv/llama-3.1-8b-instruct", "--reference-contexts", "1024,16777217"});
  INFO(r.err);
  CHECK(r.code == 2);
  CHECK(r.err.find("--reference-contexts") != std::string::npos);
  CHECK(r.err.find("16777216") != std::string::npos);
  CHECK(r.err.find("16777217") != std::string::npos);
  CHECK(run({"plan", "snapkv/llama-3.1-8b-instruct", "--reference-contexts", "16777216"}).code ==
        0);

  auto model   = synthetic_model(2, 4);
  auto profile = synthetic_profile(model, 3);
  plan_options o;
  o.reservation.mode         = reservation_mode::static_budgets;  // no keep ratio to be elastic
  o.split.reference_contexts = {1024, (std::int64_t{1} << 24) + 1};
  // The planner refuses it too (split_options::validate), not only the file layer.
  TANGRAM_REQUIRE_THROWS_WITH_ALL(build_static_plan(model, profile, o),
                                  tangram::invalid_argument,
                                  "split_options.reference_contexts",
                                  "16777216",
                                  "got 16777217");
  o.split.reference_contexts            = {1024, 2048};
  auto plan                             = build_static_plan(model, profile, o);
  plan.options.split.reference_contexts = {1024, (std::int64_t{1} << 24) + 1};
  TANGRAM_REQUIRE_THROWS_WITH_ALL(to_json(plan),
                                  tangram::invalid_argument,
                                  "static_plan.options: split_options.reference_contexts",
                                  "16777216",
                                  "16777217");
  plan.options.split.reference_contexts = {1024, std::int64_t{1} << 24};
  auto text                             = to_json(plan);
  auto at                               = text.find("16777216");
  REQUIRE(at != std::string::npos);
  text.replace(at, 8, "16777217");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(parse_static_plan(text, "plan.json"),
                                  tangram::parse_error,
                                  "plan.json: options.reference_contexts[1]",
                                  "16777216",
                                  "got 16777217");
}

// ---- defect 7: names reach the terminal escaped ------------------------------------------------

TEST_CASE("plan and inspect print hostile model names and paths escaped", "[regression][cli]") {
  auto dir         = fresh_dir("names");
  std::string evil = "evil\x1b]0;pwned\x07\x1b[2J\xff";
  auto model       = model_preset("llama-3.1-8b");
  model.name       = evil;
  auto model_path  = dir + "/model.json";
  auto plan_path   = dir + "/plan\x1b[31m.json";
  detail::write_file(model_path, to_json(model));
  for (bool as_json : {false, true}) {
    std::vector<std::string> argv = {
        "plan", "snapkv/llama-3.1-8b-instruct", "--model", model_path, "--out", plan_path};
    if (as_json) argv.push_back("--json");
    auto r = run(argv);
    INFO(r.err);
    REQUIRE(r.code == 0);
    CHECK(terminal_safe(r.out));
    CHECK(r.out.find(as_json ? "evil\\u001b]0;pwned" : "evil\\x1b]0;pwned") != std::string::npos);
    auto i = run(as_json ? std::vector<std::string>{"inspect", plan_path, "--json"}
                         : std::vector<std::string>{"inspect", plan_path});
    INFO(i.err);
    REQUIRE(i.code == 0);
    CHECK(terminal_safe(i.out));
    if (as_json) {
      auto v = json::parse(i.out, "stdout");
      CHECK(v.find("model")->string() == "evil\x1b]0;pwned\x07\x1b[2J\xef\xbf\xbd");
    }
  }
  // Errors about such a file: its path, and what the reader found in it.
  detail::write_file(dir + "/bad\x1b[5m.json", "{\"format\": \"x\x1b[1m\"}");
  for (auto const& cmd : {"plan", "inspect"}) {
    auto e = run({cmd, dir + "/bad\x1b[5m.json"});
    INFO(e.err);
    CHECK(e.code == 2);
    CHECK(terminal_safe(e.err));
    CHECK(e.err.find("bad\\x1b[5m.json") != std::string::npos);
  }
  detail::write_file(dir + "/broken\x1b[5m.json", "{\"format\": ");
  auto e = run({"inspect", dir + "/broken\x1b[5m.json"});
  CHECK(e.code == 2);
  CHECK(terminal_safe(e.err));
}
