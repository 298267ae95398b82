// SPDX-License-Identifier: Apache-2.0
// Planning on models with sliding-window layers (Gemma-3-12B, GPT-OSS-20B) and with four KV heads
// per layer (Qwen2.5-7B), from the DERIVED samples of data/derived (real measurements re-mapped
// onto those shapes; see data/derived/README.md).
#include <algorithm>
#include <numeric>

#include "tangram/eval/split_imbalance.hpp"
#include "tangram/io/detail/file_io.hpp"
#include "tangram/io/retention_samples.hpp"
#include "tangram/io/static_plan.hpp"
#include "tangram/model/presets.hpp"
#include "tangram/plan/build_static_plan.hpp"
#include "tangram/plan/calibration.hpp"
#include "tangram/plan/footprint.hpp"
#include "test_support.hpp"

using namespace tangram;
using tangram::test::data_path;

namespace {

retention_samples derived(char const* name) {
  return load_retention_samples(data_path(std::string("derived/") + name));
}

// Pages of a request, computed member by member from the brief's formulas (independently of
// footprint.hpp): per group, ceil((max over members of k(n) + t) / P); a sliding-window group
// holds ceil(min(n + t, W) / P).
std::int64_t brute_pages(static_plan const& p, std::int64_t n, std::int64_t t) {
  std::int64_t pages = 0;
  std::int64_t P     = p.options.page_tokens;
  for (auto const& g : p.grouping.groups) {
    std::int64_t longest = 0;
    for (auto m : g.members) {
      auto const& r = p.rule(m.layer, m.head);
      std::int64_t k;
      if (r.kind == layer_kind::sliding_window)
        k = std::min<std::int64_t>(n + t, r.window);
      else if (r.kind == layer_kind::uncompressed)
        k = n + t;
      else if (n <= r.protect)
        k = n + t;
      else
        k = std::min(
                n,
                std::max(r.protect,
                         static_cast<std::int64_t>(std::ceil(r.budget * static_cast<double>(n))))) +
            t;
      longest = std::max(longest, k);
    }
    pages += (longest + P - 1) / P;
  }
  return pages;
}

}  // namespace

TEST_CASE("derived sample files are labelled as derived", "[hybrid]") {
  for (char const* f : {"gemma-3-12b-it.derived.json",
                        "gpt-oss-20b.derived.json",
                        "qwen2.5-7b-instruct.derived.json"}) {
    auto text = detail::read_file(data_path(std::string("derived/") + f));
    CHECK(text.find("DERIVED, NOT MEASURED") != std::string::npos);
    CHECK(text.find("\"derived_from\":\"data/profiles/") != std::string::npos);
  }
}

TEST_CASE("Gemma-3-12B: budgets on the 8 full layers, sliding-window rings elsewhere", "[hybrid]") {
  auto s = derived("gemma-3-12b-it.derived.json");
  CHECK(s.hybrid_sliding_window);
  auto prof  = calibrate(s);
  auto model = *find_model_preset(s.model);
  REQUIRE(model.name == "Gemma-3-12B");
  // Both reservations: the groups, sliding shares and footprint do not depend on the mode. Groups
  // of 4 and per-head pages (Hp 1, the default).
  for (std::int32_t hp : {4, 1})
    for (auto mode : {reservation_mode::static_budgets, reservation_mode::elastic}) {
      for (auto scope : {grouping_scope::adjacent, grouping_scope::layer, grouping_scope::global}) {
        INFO(to_string(scope) << " " << to_string(mode) << " Hp " << hp);
        plan_options o;
        o.group_size       = hp;
        o.scope            = scope;
        o.reservation.mode = mode;
        auto plan          = build_static_plan(model, prof, o);
        REQUIRE_NOTHROW(plan.grouping.validate());
        REQUIRE_NOTHROW(plan.splits.validate());
        std::int32_t compressed_groups = 0, sliding_groups = 0;
        for (auto const& g : plan.grouping.groups) {
          compressed_groups += g.rule.kind == layer_kind::compressed;
          sliding_groups += g.rule.kind == layer_kind::sliding_window;
          for (auto m : g.members) CHECK(plan.rule(m.layer, m.head).kind == g.rule.kind);
        }
        CHECK(compressed_groups == 8 * 8 / hp);
        CHECK(sliding_groups == 40 * 8 / hp);
        for (std::int32_t l = 0; l < 48; ++l) {
          bool full = l % 6 == 5;
          CHECK(plan.rule(l, 0).kind ==
                (full ? layer_kind::compressed : layer_kind::sliding_window));
          if (!full) {
            CHECK(plan.rule(l, 7).window == 1024);
            // Identical heads get identical CTA shares: 264 / 8.
            for (std::int32_t h = 0; h < 8; ++h) CHECK(plan.splits.view().share(l, h) == 33);
          }
        }
        CHECK(plan.page_bytes() == hp * 2 * 16 * 256 * 2);
        // Footprint: the sliding rings are bounded, the compressed groups follow the budgets.
        for (std::int64_t n : {100, 1000, 5000, 20000, 131072})
          for (std::int64_t t : {0, 1, 500})
            CHECK(footprint_pages(plan, n, t) == brute_pages(plan, n, t));
        // Past the window the 320 / Hp sliding groups hold a constant ring of 1024 / 16 pages each.
        std::vector<std::int64_t> per_group;
        for (std::int64_t n : {2000, 131072}) {
          footprint_pages(plan, n, 0, per_group);
          std::int64_t sliding_pages = 0;
          for (std::size_t g = 0; g < per_group.size(); ++g)
            if (plan.grouping.groups[g].rule.kind == layer_kind::sliding_window)
              sliding_pages += per_group[g];
          CHECK(sliding_pages == 320 / hp * 64);
        }
        auto imb = layer_imbalance(plan.rules, plan.splits, reference_batch{}.contexts());
        CHECK(imb.aot.count == 48);
        CHECK(imb.aot.mean >= 1.0);
        auto q = parse_static_plan(to_json(plan), "gemma");
        CHECK(plan_difference(plan, q).empty());
      }
    }
  // Clustering across the full layers beats clustering within each layer.
  plan_options lay, glob;
  lay.group_size = glob.group_size = 4;
  lay.scope                        = grouping_scope::layer;
  CHECK(group_waste(build_static_plan(model, prof, glob).grouping,
                    build_static_plan(model, prof, glob).rules) <
        group_waste(build_static_plan(model, prof, lay).grouping,
                    build_static_plan(model, prof, lay).rules));
  // The samples do not fit a dense model of another shape.
  TANGRAM_REQUIRE_THROWS_WITH_ALL(build_static_plan(model_preset("llama-3.1-8b"), prof, {}),
                                  invalid_argument,
                                  "profile.num_model_layers: 48",
                                  "Llama-3.1-8B");
}

TEST_CASE("GPT-OSS-20B: alternating sliding (128) and compressed layers, tensor parallel",
          "[hybrid]") {
  auto s     = derived("gpt-oss-20b.derived.json");
  auto prof  = calibrate(s);
  auto model = *find_model_preset(s.model);
  REQUIRE(model.name == "GPT-OSS-20B");
  CHECK(model.attention_sinks);
  for (std::int32_t tp : {1, 2, 4}) {
    for (std::int32_t rank = 0; rank < tp; ++rank) {
      INFO("tp " << tp << " rank " << rank);
      plan_options o;
      o.tp_size    = tp;
      o.tp_rank    = rank;
      o.group_size = 2;
      o.scope      = grouping_scope::layer;
      auto plan    = build_static_plan(model, prof, o);
      CHECK(plan.num_kv_heads == 8 / tp);
      REQUIRE_NOTHROW(plan.grouping.validate());
      CHECK(plan.num_groups() == 24 * (8 / tp) / 2);
      for (std::int32_t l = 0; l < 24; ++l) {
        auto const& r = plan.rule(l, 0);
        CHECK(r.kind == (l % 2 == 0 ? layer_kind::sliding_window : layer_kind::compressed));
        if (l % 2 == 1)
          CHECK(r.budget == prof.budget(static_cast<std::size_t>(l / 2),
                                        static_cast<std::size_t>(rank * (8 / tp))));
      }
      for (std::int64_t n : {50, 128, 4000, 60000})
        CHECK(footprint_pages(plan, n, 3) == brute_pages(plan, n, 3));
    }
  }
}

TEST_CASE("Qwen2.5-7B: four KV heads per layer", "[hybrid]") {
  auto s     = derived("qwen2.5-7b-instruct.derived.json");
  auto prof  = calibrate(s);
  auto model = *find_model_preset(s.model);
  REQUIRE(model.name == "Qwen2.5-7B");
  REQUIRE(model.num_kv_heads == 4);
  auto waste = [&](std::int32_t hp, grouping_scope scope, std::int32_t tp = 1) {
    plan_options o;
    o.group_size = hp;
    o.scope      = scope;
    o.tp_size    = tp;
    auto plan    = build_static_plan(model, prof, o);
    REQUIRE_NOTHROW(plan.grouping.validate());
    return group_waste(plan.grouping, plan.rules);
  };
  // Hp = 4 = heads per layer: within a layer there is nothing to choose.
  CHECK(waste(4, grouping_scope::adjacent) == Approx(waste(4, grouping_scope::layer)));
  CHECK(waste(4, grouping_scope::global) < waste(4, grouping_scope::layer));
  CHECK(waste(2, grouping_scope::layer) <= waste(2, grouping_scope::adjacent));
  // Hp = 8 spans layers: only global grouping can do it (112 heads, 14 groups).
  CHECK(waste(8, grouping_scope::global) >= 0);
  plan_options o8;
  o8.group_size = 8;
  o8.scope      = grouping_scope::layer;
  TANGRAM_REQUIRE_THROWS_WITH_ALL(build_static_plan(model, prof, o8),
                                  invalid_argument,
                                  "Hp = 8",
                                  "4 compressed heads of layer 0");
  // Two ranks of two heads each: Hp 4 only across layers.
  CHECK(waste(4, grouping_scope::global, 2) >= 0);
  plan_options tp3;
  tp3.tp_size = 3;
  TANGRAM_REQUIRE_THROWS_WITH_ALL(build_static_plan(model, prof, tp3),
                                  invalid_argument,
                                  "tp_size: 3",
                                  "does not divide",
                                  "4 KV heads");
  // Few CTAs: every head still needs one.
  plan_options tiny;
  tiny.split.limits = {3, 1};
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      build_static_plan(model, prof, tiny), invalid_argument, "N_CTA = 3", "4 heads");
  tiny.split.limits = {4, 1};
  auto plan         = build_static_plan(model, prof, tiny);
  for (std::int32_t l = 0; l < 28; ++l)
    for (std::int32_t h = 0; h < 4; ++h) CHECK(plan.splits.view().share(l, h) == 1);
  auto imb = layer_imbalance(plan.rules, plan.splits, log_uniform_contexts(16, 1024, 131072, 3));
  CHECK(imb.aot.count == 28);
}
