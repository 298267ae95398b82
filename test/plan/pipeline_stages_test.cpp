// SPDX-License-Identifier: Apache-2.0
// Pipeline parallelism: plans of layer ranges (plan/pipeline_stages.hpp), their files, admission
// on every stage's manager, and the balanced partition on the bundled profiles.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "tangram/eval/sim/simulated_memory_resource.hpp"
#include "tangram/io/detail/json.hpp"
#include "tangram/io/retention_samples.hpp"
#include "tangram/io/static_plan.hpp"
#include "tangram/memory/kv_cache_manager.hpp"
#include "tangram/memory/memory_resource.hpp"
#include "tangram/memory/tensor_parallel.hpp"
#include "tangram/model/presets.hpp"
#include "tangram/plan/build_static_plan.hpp"
#include "tangram/plan/calibration.hpp"
#include "tangram/plan/footprint.hpp"
#include "tangram/plan/pipeline_stages.hpp"
#include "test_support.hpp"

using namespace tangram;
using tangram::test::bundled_profiles;
using tangram::test::data_path;
namespace json = tangram::detail::json;

namespace {

// Six layers, two KV heads, worked by hand below:
//   0 compressed (budgets 0.5, 0.25)   1 sliding window W = 8   2 compressed (1.0, 0.75)
//   3 compressed (0.2, 0.4)            4 sliding window W = 8   5 full attention, no budgets
// Protected tokens: sink 1 + window 1 = 2.
model_spec six_layer_model() {
  model_spec m;
  m.name            = "six";
  m.num_layers      = 6;
  m.num_query_heads = 4;
  m.num_kv_heads    = 2;
  m.head_dim        = 4;
  m.kv_dtype        = dtype::f32;
  m.layers.assign(6, layer_spec{});
  m.layers[1] = {layer_kind::sliding_window, 8};
  m.layers[4] = {layer_kind::sliding_window, 8};
  return m;
}

budget_profile six_layer_profile() {
  budget_profile p;
  p.model             = "six";
  p.target_keep_ratio = 0.5;
  p.num_model_layers  = 6;
  p.num_kv_heads      = 2;
  p.layer_ids         = {0, 2, 3};
  p.sink_tokens       = 1;
  p.window_tokens     = 1;
  p.budgets           = {0.5, 0.25, 1.0, 0.75, 0.2, 0.4};
  return p;
}

plan_options six_options(grouping_scope scope,
                         reservation_mode mode = reservation_mode::static_budgets) {
  plan_options o;
  o.scope            = scope;
  o.group_size       = 2;
  o.page_tokens      = 4;
  o.reservation.mode = mode;
  o.split.limits     = {4, 2};  // N_CTA = 8
  return o;
}

plan_options with_layers(plan_options o, std::int32_t first, std::int32_t last) {
  o.layers = layer_range{first, last};
  return o;
}

// The least possible heaviest stage, by trying every placement of the stage boundaries.
std::int64_t brute_bottleneck(std::vector<std::int64_t> const& w, std::int32_t stages) {
  auto L = static_cast<std::int32_t>(w.size());
  std::int64_t best = std::numeric_limits<std::int64_t>::max();
  std::function<void(std::int32_t, std::int32_t, std::int64_t)> go =
      [&](std::int32_t first, std::int32_t left, std::int64_t worst) {
        if (left == 1) {
          std::int64_t s = std::accumulate(w.begin() + first, w.end(), std::int64_t{0});
          best           = std::min(best, std::max(worst, s));
          return;
        }
        std::int64_t s = 0;
        for (std::int32_t last = first + 1; last <= L - (left - 1); ++last) {
          s += w[static_cast<std::size_t>(last - 1)];
          go(last, left - 1, std::max(worst, s));
        }
      };
  go(0, stages, 0);
  return best;
}

std::int64_t stage_weight(std::vector<std::int64_t> const& w, layer_range r) {
  return std::accumulate(w.begin() + r.first, w.begin() + r.last, std::int64_t{0});
}

std::string range_text(layer_range r) {
  return std::to_string(r.first) + ".." + std::to_string(r.last - 1);
}

}  // namespace

TEST_CASE("a stage plan holds its layers only, as local layers", "[pipeline]") {
  auto m = six_layer_model();
  auto p = six_layer_profile();
  auto s = build_static_plan(m, p, with_layers(six_options(grouping_scope::layer), 2, 5));
  CHECK(s.num_layers == 3);
  CHECK(s.first_layer == 2);
  CHECK(s.stage_layers() == layer_range{2, 5});
  CHECK(s.model.num_layers == 6);  // the whole model is kept, as with tensor parallelism
  REQUIRE(s.rules.size() == 6);
  // Local layer 0 is model layer 2 (budgets 1.0, 0.75), 1 is layer 3, 2 the sliding layer 4.
  CHECK(s.rule(0, 0).budget == 1.0);
  CHECK(s.rule(0, 1).budget == 0.75);
  CHECK(s.rule(1, 0).budget == 0.2);
  CHECK(s.rule(1, 1).budget == 0.4);
  CHECK(s.rule(2, 0).kind == layer_kind::sliding_window);
  CHECK(s.rule(2, 1).window == 8);
  CHECK(s.grouping.num_layers == 3);
  CHECK(s.num_groups() == 3);
  CHECK(s.splits.num_layers == 3);
  for (auto const& g : s.grouping.groups)
    for (auto mem : g.members) CHECK((mem.layer >= 0 && mem.layer < 3));
  // The whole model, by default and by its full range.
  auto whole = build_static_plan(m, p, six_options(grouping_scope::layer));
  CHECK(whole.first_layer == 0);
  CHECK(whole.num_layers == 6);
  CHECK_FALSE(whole.options.layers.has_value());
  auto full = build_static_plan(m, p, with_layers(six_options(grouping_scope::layer), 0, 6));
  CHECK(full.rules == whole.rules);
  CHECK(plan_difference(full, whole) == "options.layers: [0, 6) vs all");
}

TEST_CASE("per-layer scopes: a stage's groups, budgets and splits are the whole plan's layers",
          "[pipeline]") {
  auto m = six_layer_model();
  auto p = six_layer_profile();
  for (auto scope : {grouping_scope::layer, grouping_scope::adjacent}) {
    for (auto mode : {reservation_mode::static_budgets, reservation_mode::elastic}) {
      INFO(to_string(scope) << " " << to_string(mode));
      auto o      = six_options(scope, mode);
      auto whole  = build_static_plan(m, p, o);
      auto stages = build_stage_plans(m, p, o, {{0, 1}, {1, 4}, {4, 6}});
      REQUIRE(stages.size() == 3);
      std::size_t whole_group = 0;  // per-layer groups follow the layers: stage groups in order
      for (auto const& s : stages) {
        auto H = static_cast<std::size_t>(s.num_kv_heads);
        for (std::int32_t l = 0; l < s.num_layers; ++l) {
          for (std::int32_t h = 0; h < s.num_kv_heads; ++h)
            CHECK(s.rule(l, h) == whole.rule(s.first_layer + l, h));
          auto row  = static_cast<std::size_t>(l) * (H + 1);
          auto wrow = static_cast<std::size_t>(s.first_layer + l) * (H + 1);
          for (std::size_t h = 0; h <= H; ++h)
            CHECK(s.splits.cta_begin[row + h] == whole.splits.cta_begin[wrow + h]);
        }
        for (auto const& g : s.grouping.groups) {
          REQUIRE(whole_group < whole.grouping.groups.size());
          auto const& wg = whole.grouping.groups[whole_group++];
          CHECK(g.rule == wg.rule);
          REQUIRE(g.members.size() == wg.members.size());
          for (std::size_t c = 0; c < g.members.size(); ++c)
            CHECK(head_ref{g.members[c].layer + s.first_layer, g.members[c].head} ==
                  wg.members[c]);
        }
      }
      CHECK(whole_group == whole.grouping.groups.size());
      // Static footprints add up exactly, at every size (page rounding is per group).
      for (std::int64_t n : {0, 1, 2, 3, 9, 100, 1000, 12345})
        for (std::int64_t t : {0, 1, 7}) {
          std::int64_t sum = 0;
          for (auto const& s : stages) sum += footprint_pages(s, n, t);
          CHECK(sum == footprint_pages(whole, n, t));
        }
    }
  }
}

TEST_CASE("hand-worked footprints of stages under layer and global grouping", "[pipeline]") {
  auto m = six_layer_model();
  auto p = six_layer_profile();
  // n = 100, P = 4. Per layer (group rule = its largest member): layer 0 0.5 -> 50 tokens, 13
  // pages; 1 sliding -> 8 tokens, 2; 2 1.0 -> 25; 3 0.4 -> 40 tokens, 10; 4 -> 2; 5 full -> 25.
  auto layer = build_stage_plans(m, p, six_options(grouping_scope::layer), {{0, 3}, {3, 6}});
  CHECK(footprint_pages(layer[0], 100, 0) == 13 + 2 + 25);
  CHECK(footprint_pages(layer[1], 100, 0) == 10 + 2 + 25);
  CHECK(footprint_pages(build_static_plan(m, p, six_options(grouping_scope::layer)), 100, 0) ==
        77);
  // Global grouping pairs heads by budget. Whole model: {1.0, 0.75} 25 pages, {0.5, 0.4} 13,
  // {0.25, 0.2} 7, two sliding groups 2 + 2, one full group 25: 74. Each stage groups its own
  // heads: stage [0, 3) {1.0, 0.75} 25 + {0.5, 0.25} 13 + sliding 2 = 40; stage [3, 6)
  // {0.4, 0.2} 10 + sliding 2 + full 25 = 37. Grouping within a stage costs 3 pages here.
  auto whole = build_static_plan(m, p, six_options(grouping_scope::global));
  CHECK(footprint_pages(whole, 100, 0) == 74);
  auto global = build_stage_plans(m, p, six_options(grouping_scope::global), {{0, 3}, {3, 6}});
  CHECK(footprint_pages(global[0], 100, 0) == 40);
  CHECK(footprint_pages(global[1], 100, 0) == 37);
  CHECK(global[0].num_groups() == 3);
  CHECK(global[1].num_groups() == 3);
}

TEST_CASE("layer KV tokens follow groups, windows and the reservation mode", "[pipeline]") {
  auto m = six_layer_model();
  auto p = six_layer_profile();
  // Static budgets at n = 100, P = 4, Hp = 2 (one group per layer): 2 heads x pages x 4 of the
  // group's rule: 0.5 -> 50 tokens, 13 pages: 104; window 8: 2 pages: 16; 1.0: 25 pages: 200;
  // 0.4 -> 40 tokens, 10 pages: 80; 16; full: 200. Each layer's share of the footprint.
  auto w = layer_kv_tokens(m, p, six_options(grouping_scope::layer), 100);
  CHECK(w == std::vector<std::int64_t>{104, 16, 200, 80, 16, 200});
  auto whole = build_static_plan(m, p, six_options(grouping_scope::layer));
  CHECK(std::accumulate(w.begin(), w.end(), std::int64_t{0}) * m.kv_bytes_per_head_token() ==
        footprint_bytes(whole, 100, 0));
  // Global grouping is weighed as layer grouping (it mixes layers, so stages regroup anyway).
  CHECK(layer_kv_tokens(m, p, six_options(grouping_scope::global), 100) == w);
  // Elastic: every compressed head takes the scorer's share, max(2, ceil(0.5 * 100)) = 50.
  CHECK(layer_kv_tokens(m, p, six_options(grouping_scope::layer, reservation_mode::elastic), 100) ==
        std::vector<std::int64_t>{100, 16, 100, 100, 16, 200});
  // Tensor parallelism, Hp 1: rank 1 holds head 1 only, one page-rounded head per layer:
  // 25 -> 28, 8, 75 -> 76, 40, 8, 100.
  auto o       = six_options(grouping_scope::layer);
  o.group_size = 1;
  o.tp_size    = 2;
  o.tp_rank    = 1;
  CHECK(layer_kv_tokens(m, p, o, 100) == std::vector<std::int64_t>{28, 8, 76, 40, 8, 100});
  // Hp not dividing the rank's heads: each head its rule's tokens, unrounded.
  o.group_size = 2;
  CHECK(layer_kv_tokens(m, p, o, 100) == std::vector<std::int64_t>{25, 8, 75, 40, 8, 100});
  // Short contexts keep everything (n <= protect), one page per group.
  CHECK(layer_kv_tokens(m, p, six_options(grouping_scope::layer), 2) ==
        std::vector<std::int64_t>{8, 8, 8, 8, 8, 8});
  TANGRAM_REQUIRE_THROWS_WITH_ALL(layer_kv_tokens(m, p, o, -1),
                                  invalid_argument,
                                  "layer_kv_tokens.context",
                                  "got -1");
}

TEST_CASE("balanced stages minimise the heaviest stage (hand-worked and against brute force)",
          "[pipeline]") {
  std::vector<std::int64_t> w{75, 16, 175, 60, 16, 200};
  // Two stages: the cut after layer 2 gives 266 | 276, every other cut more.
  CHECK(balanced_pipeline_stages(w, 2) == std::vector<layer_range>{{0, 3}, {3, 6}});
  // Three: 91 | 235 | 216 (by layer count, 0..1 | 2..3 | 4..5 is the same here).
  CHECK(balanced_pipeline_stages(w, 3) == std::vector<layer_range>{{0, 2}, {2, 4}, {4, 6}});
  // Six: one layer each; one: everything.
  CHECK(balanced_pipeline_stages(w, 6).size() == 6);
  CHECK(balanced_pipeline_stages(w, 1) == std::vector<layer_range>{{0, 6}});
  // Zero weights still give non-empty stages.
  CHECK(balanced_pipeline_stages({0, 0, 0, 0}, 3) ==
        std::vector<layer_range>{{0, 1}, {1, 2}, {2, 4}});
  // Among the partitions with the least heaviest stage, the lightest is not starved: weights
  // 5 5 5 5 1 in two stages have bottleneck 11 either as 5 5 | 5 5 1 or 5 5 5 (15 > 11, no):
  // 10 | 11. In three: bottleneck 10 (5 5 | 5 5 | 1 or 5 | 5 5 | 5 1 ...); the mean rule
  // gives 5 5 | 5 | 5 1 (10, 5, 6), never 10, 10, 1.
  CHECK(balanced_pipeline_stages({5, 5, 5, 5, 1}, 2) ==
        std::vector<layer_range>{{0, 2}, {2, 5}});
  CHECK(balanced_pipeline_stages({5, 5, 5, 5, 1}, 3) ==
        std::vector<layer_range>{{0, 1}, {1, 3}, {3, 5}});
  // Random weights: a valid partition whose heaviest stage is the brute-force optimum.
  std::mt19937 rng(7);
  for (int trial = 0; trial < 300; ++trial) {
    auto L = static_cast<std::int32_t>(1 + rng() % 9);
    std::vector<std::int64_t> x(static_cast<std::size_t>(L));
    for (auto& v : x) v = rng() % 4 == 0 ? 0 : static_cast<std::int64_t>(rng() % 1000);
    auto N = static_cast<std::int32_t>(1 + rng() % static_cast<std::uint32_t>(L));
    auto stages = balanced_pipeline_stages(x, N);
    INFO("trial " << trial << " L " << L << " N " << N);
    REQUIRE(stages.size() == static_cast<std::size_t>(N));
    CHECK_NOTHROW(check_pipeline_stages(stages, L));
    std::int64_t worst = 0;
    for (auto r : stages) worst = std::max(worst, stage_weight(x, r));
    CHECK(worst == brute_bottleneck(x, N));
  }
}

TEST_CASE("bad partitions and ranges are refused, naming the stage and the range",
          "[pipeline][errors]") {
  TANGRAM_REQUIRE_THROWS_WITH_ALL(check_pipeline_stages({{0, 3}, {2, 6}}, 6),
                                  invalid_argument,
                                  "pipeline_stages[1]: [2, 6) overlaps",
                                  "covered up to 3");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(check_pipeline_stages({{0, 2}, {3, 6}}, 6),
                                  invalid_argument,
                                  "pipeline_stages[1]: [3, 6) leaves layers [2, 3) in no stage");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(check_pipeline_stages({{0, 2}, {2, 5}}, 6),
                                  invalid_argument,
                                  "leave layers [5, 6) in no stage");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(check_pipeline_stages({{0, 3}, {3, 3}, {3, 6}}, 6),
                                  invalid_argument,
                                  "pipeline_stages[1]: [3, 3) is empty");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(check_pipeline_stages({{0, 3}, {3, 7}}, 6),
                                  invalid_argument,
                                  "pipeline_stages[1]: [3, 7) is outside the model's 6 layers");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      check_pipeline_stages({}, 6), invalid_argument, "pipeline_stages: no stage");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(balanced_pipeline_stages({1, 2, 3}, 4),
                                  invalid_argument,
                                  "pipeline_stages: must be in [1, 3]",
                                  "got 4");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      balanced_pipeline_stages({1, 2, 3}, 0), invalid_argument, "got 0");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(balanced_pipeline_stages({1, -2, 3}, 2),
                                  invalid_argument,
                                  "layer_weights[1]: must be >= 0, got -2");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      balanced_pipeline_stages({std::numeric_limits<std::int64_t>::max(), 1}, 1),
      invalid_argument,
      "overflows");

  auto m = six_layer_model();
  auto p = six_layer_profile();
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      build_static_plan(m, p, with_layers(six_options(grouping_scope::layer), 4, 9)),
      invalid_argument,
      "plan_options.layers: [4, 9) is outside the model's 6 layers [0, 6)");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      build_static_plan(m, p, with_layers(six_options(grouping_scope::layer), -1, 2)),
      invalid_argument,
      "plan_options.layers: [-1, 2)");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      build_static_plan(m, p, with_layers(six_options(grouping_scope::layer), 3, 3)),
      invalid_argument,
      "plan_options.layers: [3, 3) is empty");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      with_layers(six_options(grouping_scope::layer), 5, 2).validate(),
      invalid_argument,
      "plan_options.layers: [5, 2) is empty (last must exceed first)");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      build_stage_plans(m, p, with_layers(six_options(grouping_scope::layer), 0, 2), {{0, 6}}),
      invalid_argument,
      "plan_options.layers: [0, 2) is set");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      build_stage_plans(m, p, six_options(grouping_scope::layer), {{0, 4}, {3, 6}}),
      invalid_argument,
      "pipeline_stages[1]: [3, 6) overlaps");
}

TEST_CASE("stage x rank: each plan holds its rank's heads of its stage's layers", "[pipeline]") {
  auto m = six_layer_model();
  auto p = six_layer_profile();
  for (std::int32_t rank = 0; rank < 2; ++rank) {
    auto o    = six_options(grouping_scope::layer);
    o.group_size = 1;  // one head per rank
    o.tp_size = 2;
    o.tp_rank = rank;
    auto whole  = build_static_plan(m, p, o);
    auto stages = build_stage_plans(m, p, o, {{0, 2}, {2, 6}});
    std::int64_t sum = 0;
    for (auto const& s : stages) {
      CHECK(s.num_kv_heads == 1);
      CHECK(s.first_kv_head == rank);
      for (std::int32_t l = 0; l < s.num_layers; ++l)
        CHECK(s.rule(l, 0) == whole.rule(s.first_layer + l, 0));
      sum += footprint_pages(s, 100, 3);
    }
    CHECK(sum == footprint_pages(whole, 100, 3));
    // Rank 1, stage [2, 6): layer 2 head 1 is budget 0.75.
    if (rank == 1) CHECK(stages[1].rule(0, 0).budget == 0.75);
  }
}

TEST_CASE("try_admit_all admits on every stage's manager or on none", "[pipeline][memory]") {
  auto m      = six_layer_model();
  auto p      = six_layer_profile();
  auto o      = six_options(grouping_scope::layer);
  auto stages = build_stage_plans(m, p, o, {{0, 3}, {3, 6}});
  auto whole  = build_static_plan(m, p, o);
  simulated_memory_resource mr;
  manager_options mo;
  mo.max_sequences = 8;
  // n = 100, t = 5 (static budgets): stage 0 reserves ceil(55/4) + 2 + ceil(105/4) = 14 + 2 + 27
  // = 43 pages, stage 1 ceil(45/4) + 2 + 27 = 12 + 2 + 27 = 41.
  mo.num_pages = 100;
  kv_cache_manager s0(stages[0], mr, mo);
  mo.num_pages = 60;
  kv_cache_manager s1(stages[1], mr, mo);
  CHECK(s0.admission_pages(100, 5) == 43);
  CHECK(s1.admission_pages(100, 5) == 41);
  CHECK(s0.admission_pages(100, 5) + s1.admission_pages(100, 5) ==
        footprint_pages(whole, 100, 5));
  std::vector<kv_cache_manager*> managers{&s0, &s1};
  auto first = try_admit_all(managers, 100, 5);
  REQUIRE(first);
  CHECK(s0.pool().stats().reserved == 43);
  CHECK(s1.pool().stats().reserved == 41);
  // Stage 0 has 57 pages left and would fit a second request; stage 1 has 19 and does not: the
  // request is admitted nowhere, stage 0's admission rolled back.
  CHECK_FALSE(try_admit_all(managers, 100, 5).has_value());
  CHECK(s0.live_sequences() == 1);
  CHECK(s0.pool().stats().reserved == 43);
  CHECK(s1.pool().stats().reserved == 41);
  // A request that fits both is admitted on both.
  auto small = try_admit_all(managers, 10, 2);
  REQUIRE(small);
  CHECK(s0.live_sequences() == 2);
  CHECK(s1.live_sequences() == 2);
  for (std::size_t k = 0; k < 2; ++k) {
    managers[k]->free((*first)[k]);
    managers[k]->free((*small)[k]);
    CHECK(managers[k]->live_sequences() == 0);
    CHECK(managers[k]->pool().stats().reserved == 0);
  }
}

TEST_CASE("stage plans round-trip through files, files without a stage are the whole model",
          "[pipeline][plan_io]") {
  auto m = six_layer_model();
  auto p = six_layer_profile();
  for (auto scope : {grouping_scope::layer, grouping_scope::global}) {
    for (auto const& s : build_stage_plans(m, p, six_options(scope), {{0, 2}, {2, 6}})) {
      auto text = to_json(s);
      CHECK(text.find("\"first_layer\"") != std::string::npos);
      auto back = parse_static_plan(text, "stage.json");
      CHECK(plan_difference(s, back).empty());
      CHECK(back.first_layer == s.first_layer);
      CHECK(back.num_layers == s.num_layers);
      REQUIRE(back.options.layers.has_value());
      CHECK(*back.options.layers == s.stage_layers());
    }
  }
  // A whole-model plan writes no stage (its file is what it was before stages) and loads as
  // the full range.
  auto whole = build_static_plan(m, p, six_options(grouping_scope::layer));
  auto text  = to_json(whole);
  CHECK(text.find("first_layer") == std::string::npos);
  CHECK(text.find("last_layer") == std::string::npos);
  auto back = parse_static_plan(text, "old.json");
  CHECK_FALSE(back.options.layers.has_value());
  CHECK(back.stage_layers() == layer_range{0, 6});
  // A real plan file of the seed corpus (written before stages) still loads as the full range.
  auto corpus = parse_static_plan(
      detail::read_file(std::string(TANGRAM_SOURCE_DIR) + "/fuzz/corpus/static_plan/llama.json"),
      "llama.json");
  CHECK(corpus.stage_layers() == layer_range{0, corpus.model.num_layers});
}

TEST_CASE("loading a stage plan checks its range, its layer count and its rules",
          "[pipeline][plan_io][errors]") {
  auto m     = six_layer_model();
  auto p     = six_layer_profile();
  auto stage = build_static_plan(m, p, with_layers(six_options(grouping_scope::layer), 2, 4));
  auto text  = to_json(stage);
  auto edit  = [&](std::function<void(json::value&)> const& f) {
    auto doc = json::parse(text, "t");
    f(doc);
    return json::dump(doc);
  };
  auto member = [](json::value& v, std::string const& key) -> json::value& {
    for (auto& mem : v.members())
      if (mem.first == key) return mem.second;
    FAIL("no member " << key);
    throw;
  };
  auto options = [&](json::value& d) -> json::value& { return member(d, "options"); };
  auto rejected = [](std::string const& t, std::vector<std::string> const& pieces) {
    bool threw = false;
    try {
      (void)parse_static_plan(t, "stage.json");
    } catch (parse_error const& e) {
      threw = true;
      std::string msg = e.what();
      INFO("message: " << msg);
      for (auto const& piece : pieces) CHECK(msg.find(piece) != std::string::npos);
    }
    CHECK(threw);
  };
  rejected(edit([&](json::value& d) { member(options(d), "last_layer") = 7; }),
           {"stage.json: options.last_layer", "got 7"});
  rejected(edit([&](json::value& d) { member(options(d), "last_layer") = 2; }),
           {"options.last_layer", "got 2"});
  rejected(edit([&](json::value& d) { member(options(d), "first_layer") = 6; }),
           {"options.first_layer", "got 6"});
  rejected(edit([&](json::value& d) {
             auto& mem = options(d).members();
             mem.erase(std::remove_if(mem.begin(),
                                      mem.end(),
                                      [](auto const& kv) { return kv.first == "last_layer"; }),
                       mem.end());
           }),
           {"options.last_layer"});
  // The same rules and groups labelled as another stage: the layer count or the rules disagree.
  rejected(edit([&](json::value& d) { member(options(d), "last_layer") = 5; }),
           {"stage.json: num_layers", "options.last_layer - first_layer"});
  rejected(edit([&](json::value& d) {
             member(options(d), "first_layer") = 0;
             member(options(d), "last_layer")  = 2;
           }),
           {"stage.json: rules[0]", "the model and the profile give"});
  // Dropping the stage makes the file claim the whole model: its 2 layers are not 6.
  rejected(edit([&](json::value& d) {
             auto& mem = options(d).members();
             mem.erase(std::remove_if(mem.begin(),
                                      mem.end(),
                                      [](auto const& kv) {
                                        return kv.first == "first_layer" ||
                                               kv.first == "last_layer";
                                      }),
                       mem.end());
           }),
           {"num_layers", "model.num_layers"});
}

TEST_CASE("bundled profiles: balanced stages balance KV memory, and add up to the whole plan",
          "[pipeline][real]") {
  for (auto const& rel : bundled_profiles()) {
    auto samples = load_retention_samples(data_path("profiles/" + rel));
    auto model   = model_preset(samples.model.c_str());
    auto prof    = calibrate(samples);
    plan_options o;
    o.group_size       = 4;  // docs/planning.md's table: Hp 4
    o.reservation.mode = reservation_mode::static_budgets;
    o.scope            = grouping_scope::layer;
    auto w             = layer_kv_tokens(model, prof, o, default_stage_balance_context);
    auto whole         = build_static_plan(model, prof, o);
    for (std::int32_t N : {2, 4, 8}) {
      INFO(rel << " stages " << N);
      auto balanced = balanced_pipeline_stages(w, N);
      std::vector<layer_range> by_count;  // layer counts differing by at most one
      for (std::int32_t k = 0; k < N; ++k)
        by_count.push_back({k * model.num_layers / N, (k + 1) * model.num_layers / N});
      std::int64_t worst_balanced = 0, worst_count = 0;
      for (auto r : balanced) worst_balanced = std::max(worst_balanced, stage_weight(w, r));
      for (auto r : by_count) worst_count = std::max(worst_count, stage_weight(w, r));
      CHECK(worst_balanced <= worst_count);  // optimal bottleneck
      auto plans = build_stage_plans(model, prof, o, balanced);
      std::int64_t sum = 0, lo = std::numeric_limits<std::int64_t>::max(), hi = 0;
      for (auto const& s : plans) {
        auto b = footprint_bytes(s, default_stage_balance_context, 0);
        sum += b;
        lo = std::min(lo, b);
        hi = std::max(hi, b);
      }
      CHECK(sum == footprint_bytes(whole, default_stage_balance_context, 0));
      std::string ranges;
      for (auto r : balanced) ranges += " " + range_text(r);
      double mean = static_cast<double>(sum) / N;
      std::int64_t even_worst = 0;
      for (auto r : by_count) {
        plan_options oe = o;
        oe.layers       = r;
        even_worst      = std::max(
            even_worst, footprint_bytes(build_static_plan(model, prof, oe), default_stage_balance_context, 0));
      }
      // The weights are each layer's exact footprint under scope layer: the balanced heaviest
      // stage is never heavier than an even split's.
      CHECK(hi <= even_worst);
      WARN(rel << " " << N << " stages:" << ranges << "  footprint max/mean "
               << static_cast<double>(hi) / mean << " max/min "
               << static_cast<double>(hi) / static_cast<double>(lo) << "  even split max/mean "
               << static_cast<double>(even_worst) / mean);
    }
  }
}

TEST_CASE("a session parked on one stage is not another stage's, even of the same shape",
          "[pipeline][memory]") {
  auto m = six_layer_model();
  auto p = six_layer_profile();
  // Layers 1 and 4 are both sliding windows of 8: the stages [1, 2) and [4, 5) have the same
  // groups, rules and geometry, but their pages hold different layers.
  auto a = build_static_plan(m, p, with_layers(six_options(grouping_scope::layer), 1, 2));
  auto b = build_static_plan(m, p, with_layers(six_options(grouping_scope::layer), 4, 5));
  CHECK(a.rules == b.rules);
  CHECK(plan_fingerprint(a) != plan_fingerprint(b));
  // A whole-model plan hashes as before stages (first layer 0 adds nothing).
  auto whole = build_static_plan(m, p, six_options(grouping_scope::layer));
  auto first = build_static_plan(m, p, with_layers(six_options(grouping_scope::layer), 0, 6));
  CHECK(plan_fingerprint(whole) == plan_fingerprint(first));
}

TEST_CASE("samples map to a stage's layers: needs are the whole plan's slice, elastic maps build",
          "[pipeline][elastic]") {
  auto s     = load_retention_samples(data_path("profiles/snapkv/llama-3.1-8b-instruct.json"));
  auto model = model_preset(s.model.c_str());
  auto prof  = calibrate(s);
  plan_options o;
  o.reservation.mode           = reservation_mode::elastic;
  o.split.weighting            = split_weighting::batch_share;
  o.split.reference_batches    = 8;  // a quick map: the shape is what is checked here
  o.split.reference_batch_size = 4;
  auto whole                   = build_static_plan(model, prof, o);
  plan_options staged          = o;
  staged.layers                = layer_range{8, 16};
  auto stage                   = build_static_plan(model, prof, staged);
  auto H                       = static_cast<std::ptrdiff_t>(whole.num_kv_heads);
  for (std::size_t k : {std::size_t{0}, std::size_t{5}}) {
    for (std::int64_t n : {1000, 20000}) {
      auto all  = sample_needs_at(whole, s, k, n);
      auto mine = sample_needs_at(stage, s, k, n);
      CHECK(mine == std::vector<std::int64_t>(all.begin() + 8 * H, all.begin() + 16 * H));
    }
  }
  // The split map weighed on elastic placements of the stage's own groups.
  auto from_samples = build_static_plan(model, prof, staged, s);
  CHECK(from_samples.splits.num_layers == 8);
  CHECK_NOTHROW(from_samples.splits.validate());
  CHECK(from_samples.splits.cta_begin != stage.splits.cta_begin);  // placements, not group rules
  auto text = to_json(from_samples);
  CHECK(plan_difference(parse_static_plan(text, "stage.json"), from_samples).empty());
}

TEST_CASE("elastic stage and rank plans reserve the margin their own heads need",
          "[pipeline][elastic]") {
  // Under elastic reservation each plan reserves the scorer's total over ITS compressed heads; a
  // stage (or rank) whose heads keep more than their share needs more than the whole model. Each
  // decides its margin from the samples over its own heads (elastic_plan_margin).
  auto s = load_retention_samples(test::data_path("profiles/snapkv/llama-3.1-8b-instruct.json"));
  auto model = model_preset(s.model);
  auto prof  = calibrate(s);
  auto t     = scorer_of(s);
  // Samples whose heads of [first, last) x [h0, h1) fit R(n) at margin m in whole pages of 16.
  auto fitting = [&](static_plan const& p, double m) {
    int fit = 0;
    for (auto const& smp : s.samples) {
      std::int64_t pages = 0, heads = 0;
      for (std::int32_t l = p.first_layer; l < p.first_layer + p.num_layers; ++l)
        for (std::int32_t h = p.first_kv_head; h < p.first_kv_head + p.num_kv_heads; ++h, ++heads)
          pages += (smp.kept[static_cast<std::size_t>(l * s.num_kv_heads + h)] + 15) / 16;
      fit += pages <= elastic_compressed_pages(t, heads, 1, 16, m, smp.context_tokens);
    }
    return fit;
  };
  auto n       = static_cast<int>(s.samples.size());
  auto stages  = build_stage_plans(model, prof, {}, {{0, 16}, {16, 32}}, &s);
  double first = stages[0].options.reservation.margin_or_default();
  CHECK(first == elastic_plan_margin(s, stages[0]));
  CHECK(stages[1].options.reservation.margin == elastic_plan_margin(s, stages[1]));
  CHECK(first > 0.1);  // the first 16 layers keep well above half the scorer's total
  CHECK(fitting(stages[0], default_elastic_margin) < n / 2);
  CHECK(fitting(stages[0], first) >= n - 2);
  CHECK(fitting(stages[1], stages[1].options.reservation.margin_or_default()) >= n - 2);
  // Tensor-parallel ranks likewise, each over its 4 KV heads.
  for (std::int32_t rank = 0; rank < 2; ++rank) {
    plan_options o;
    o.tp_size = 2;
    o.tp_rank = rank;
    auto p    = build_static_plan(model, prof, o, s);
    INFO("rank " << rank);
    CHECK(p.options.reservation.margin == elastic_plan_margin(s, p));
    CHECK(fitting(p, p.options.reservation.margin_or_default()) >= n - 2);
  }
  // A margin given is every stage's.
  plan_options fixed;
  fixed.reservation.margin = 0.05;
  for (auto const& p : build_stage_plans(model, prof, fixed, {{0, 16}, {16, 32}}, &s))
    CHECK(p.options.reservation.margin == 0.05);
}

TEST_CASE("stage x rank plans: the margin over exactly their heads, computed independently",
          "[pipeline][elastic]") {
  // mean + 2 sd over the samples of (per-head pages of 16 over the plan's layers and heads) x 16
  // / K - 1, K = heads x max(min(n, protect), ceil(0.3 n)), at least 0.02: the slice of the
  // samples each stage x rank plan holds, independently of elastic_plan_margin's head mapping.
  auto s = load_retention_samples(test::data_path("profiles/snapkv/llama-3.1-8b-instruct.json"));
  auto model   = model_preset(s.model);
  auto prof    = calibrate(s);
  auto protect = static_cast<std::int64_t>(s.sink_tokens) + s.window_tokens;
  for (std::int32_t rank = 0; rank < 2; ++rank) {
    plan_options o;
    o.tp_size = 2;
    o.tp_rank = rank;
    for (auto const& p : build_stage_plans(model, prof, o, {{0, 12}, {12, 32}}, &s)) {
      INFO("rank " << rank << " layers " << p.first_layer << ".." << p.first_layer + p.num_layers);
      std::vector<double> m;
      for (auto const& smp : s.samples) {
        std::int64_t pages = 0, heads = 0;
        for (std::int32_t l = p.first_layer; l < p.first_layer + p.num_layers; ++l)
          for (std::int32_t h = rank * 4; h < rank * 4 + 4; ++h, ++heads)
            pages += (smp.kept[static_cast<std::size_t>(l * 8 + h)] + 15) / 16;
        std::int64_t n = smp.context_tokens;
        auto kbar      = std::max<std::int64_t>(std::min(n, protect),
                                           static_cast<std::int64_t>(std::ceil(0.3 * n)));
        m.push_back(static_cast<double>(pages * 16) / static_cast<double>(heads * kbar) - 1);
      }
      double mean = std::accumulate(m.begin(), m.end(), 0.0) / static_cast<double>(m.size());
      double var  = 0;
      for (double x : m) var += (x - mean) * (x - mean);
      double sd = std::sqrt(var / static_cast<double>(m.size()));
      CHECK(p.options.reservation.margin_or_default() ==
            Approx(std::max(mean + 2 * sd, default_elastic_margin)).epsilon(1e-9));
    }
  }
}
