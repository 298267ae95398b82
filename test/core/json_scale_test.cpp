// SPDX-License-Identifier: Apache-2.0
// Issue 31, defect 2: the JSON reader checked each object member's name against every earlier one
// (20k keys 2.9 s, 80k 70 s, a 64 MiB file days), in every reader. Now one sort per object
// (json::first_repeated_name): checked against brute force, by the comparisons it makes (no
// timing), and end to end on objects of a few hundred thousand members in each file reader.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "tangram/io/budget_profile.hpp"
#include "tangram/io/detail/json.hpp"
#include "tangram/io/model_spec.hpp"
#include "tangram/io/retention_samples.hpp"
#include "tangram/io/static_plan.hpp"
#include "tangram/model/presets.hpp"
#include "tangram/plan/build_static_plan.hpp"
#include "tangram/plan/calibration.hpp"
#include "test_support.hpp"

using namespace tangram;
namespace json = tangram::detail::json;

namespace {

/// The first name equal to an earlier one, by comparing every pair: the definition.
std::optional<std::size_t> brute_first_repeat(std::vector<std::string> const& names) {
  for (std::size_t i = 0; i < names.size(); ++i)
    for (std::size_t j = 0; j < i; ++j)
      if (names[i] == names[j]) return i;
  return std::nullopt;
}

/// `text` (a JSON object) with `count` more members "pad<i>": 0 inserted after its opening brace.
std::string with_members(std::string const& text, std::size_t count, char const* prefix = "pad") {
  std::string extra;
  for (std::size_t i = 0; i < count; ++i) extra += detail::cat("\"", prefix, i, "\": 0, ");
  auto brace = text.find('{');
  REQUIRE(brace != std::string::npos);
  return text.substr(0, brace + 1) + extra + text.substr(brace + 1);
}

}  // namespace

TEST_CASE("first_repeated_name finds the first repeated name, as comparing every pair does",
          "[json][regression]") {
  std::mt19937 rng(2031);
  int with_repeat = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    std::size_t n = rng() % 40;
    int alphabet  = 1 + static_cast<int>(rng() % 60);
    std::vector<std::string> names(n);
    for (auto& s : names) s = std::string(1 + rng() % 2, static_cast<char>('a' + rng() % alphabet));
    auto got = json::first_repeated_name(
        names.size(), [&](std::size_t k) -> std::string const& { return names[k]; });
    auto want = brute_first_repeat(names);
    INFO("trial " << trial << " n " << n);
    REQUIRE(got == want);
    with_repeat += want.has_value();
  }
  CHECK(with_repeat > 1000);
  CHECK(with_repeat < 2900);
}

TEST_CASE("first_repeated_name makes O(n log n) comparisons on any names", "[json][regression]") {
  // The work done, not the time taken: a scan of the earlier names per member makes n (n - 1) / 2
  // comparisons (5e9 at n = 1e5).
  for (int shape = 0; shape < 3; ++shape) {
    std::size_t const n = 100000;
    std::vector<std::string> names(n);
    for (std::size_t i = 0; i < n; ++i)
      names[i] = shape == 0   ? detail::cat("key", i)              // distinct, in order
                 : shape == 1 ? detail::cat("key", (n - i) % 977)  // many repeats
                              : std::string("same");               // one name
    std::int64_t comparisons = 0;
    auto less                = [&](std::string const& a, std::string const& b) {
      ++comparisons;
      return a < b;
    };
    auto got = json::first_repeated_name(
        n, [&](std::size_t k) -> std::string const& { return names[k]; }, less);
    INFO("shape " << shape << " comparisons " << comparisons);
    CHECK(got == (shape == 0 ? std::nullopt : std::optional<std::size_t>(shape == 1 ? 977 : 1)));
    CHECK(static_cast<double>(comparisons) <= 6.0 * n * std::log2(static_cast<double>(n)));
  }
}

TEST_CASE("objects of hundreds of thousands of members parse in every reader",
          "[json][regression]") {
  // Each would take minutes with the quadratic check; linear-ish, a fraction of a second.
  std::size_t const many = 300000;
  auto doc               = json::parse(with_members("{\"last\": 1}", many), "big.json");
  CHECK(doc.members().size() == many + 1);
  // A repeated name is still found, at its own position (the last member repeats pad7).
  auto dup = with_members("{\"pad7\": 1}", many);
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      json::parse(dup, "dup.json"), parse_error, "dup.json:1:", "duplicate member \"pad7\"");
  auto col = detail::cat("dup.json:1:", dup.rfind("\"pad7\"") + 1, ": invalid JSON");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(json::parse(dup, "dup.json"), parse_error, col);

  // The file readers, each on an object of many members (unknown members are ignored).
  auto samples_text =
      detail::read_file(test::data_path("profiles/snapkv/llama-3.1-8b-instruct.json"));
  auto s = parse_retention_samples(with_members(samples_text, many), "samples.json");
  CHECK(s.samples.size() == 28);
  auto profile = calibrate(s);
  auto p       = parse_budget_profile(with_members(to_json(profile), many), "profile.json");
  CHECK(p.budgets == profile.budgets);
  auto model = model_preset("llama-3.1-8b");
  auto m =
      parse_model_spec(with_members(json::dump(detail::model_to_json(model)), many), "model.json");
  CHECK(m.num_layers == model.num_layers);
  plan_options o;
  o.split.reference_batches = 8;
  auto plan                 = build_static_plan(model, profile, o);
  auto back                 = parse_static_plan(with_members(to_json(plan), many), "plan.json");
  CHECK(plan_difference(plan, back).empty());
}
