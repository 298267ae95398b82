// SPDX-License-Identifier: Apache-2.0
// The split map under elastic placement: static plans keep their map, elastic plans weigh every
// compressed head by its group's rule; the lengths-based AOT loads against the rule-based ones
// and the pieces; elastic placement lengths; the imbalance of both maps on real placements.
#include <algorithm>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "tangram/eval/split_imbalance.hpp"
#include "tangram/io/retention_samples.hpp"
#include "tangram/model/presets.hpp"
#include "tangram/plan/aot_mapping.hpp"
#include "tangram/plan/build_static_plan.hpp"
#include "tangram/plan/calibration.hpp"
#include "tangram/plan/elastic_reservation.hpp"
#include "tangram/plan/split_planner.hpp"
#include "tangram/plan/static_plan.hpp"
#include "test_support.hpp"

using namespace tangram;
using tangram::test::data_path;

namespace {

retention_samples const& snapkv_llama() {
  static retention_samples s =
      load_retention_samples(data_path("profiles/snapkv/llama-3.1-8b-instruct.json"));
  return s;
}

plan_options options(split_weighting w, reservation_mode mode) {
  plan_options o;
  o.group_size         = 4;
  o.page_tokens        = 16;
  o.scope              = grouping_scope::global;
  o.split.limits       = {132, 2};
  o.split.weighting    = w;
  o.reservation.mode   = mode;
  o.reservation.margin = 0.15;
  return o;
}

static_plan plan_of(split_weighting w, reservation_mode mode) {
  auto const& s = snapkv_llama();
  return build_static_plan(model_preset(s.model), calibrate(s), options(w, mode));
}

/// Every compressed head's own rule with the largest budget of its group's members: computed
/// from p.rules and the members only (not from head_group::rule).
std::vector<head_rule> group_max_rules(static_plan const& p) {
  auto out = p.rules;
  auto H   = static_cast<std::size_t>(p.num_kv_heads);
  for (auto const& g : p.grouping.groups) {
    double most = 0;
    bool any    = false;
    for (auto m : g.members) {
      auto const& r =
          p.rules[static_cast<std::size_t>(m.layer) * H + static_cast<std::size_t>(m.head)];
      if (r.kind != layer_kind::compressed) continue;
      any  = true;
      most = std::max(most, r.budget);
    }
    if (!any) continue;
    for (auto m : g.members)
      out[static_cast<std::size_t>(m.layer) * H + static_cast<std::size_t>(m.head)].budget = most;
  }
  return out;
}

}  // namespace

TEST_CASE("a static plan's split map is still built from its own rules",
          "[split_analysis][elastic]") {
  for (auto w : {split_weighting::batch_share, split_weighting::budget}) {
    auto p   = plan_of(w, reservation_mode::static_budgets);
    auto ref = build_split_map(p.rules, p.num_layers, p.num_kv_heads, p.options.split);
    INFO(to_string(w));
    CHECK(p.splits.cta_begin == ref.cta_begin);
    CHECK(p.splits.phi == ref.phi);
  }
}

TEST_CASE("an elastic plan's split map weighs every compressed head by its group's largest budget",
          "[split_analysis][elastic]") {
  for (auto w : {split_weighting::batch_share, split_weighting::budget}) {
    INFO(to_string(w));
    auto ps = plan_of(w, reservation_mode::static_budgets);
    auto pe = plan_of(w, reservation_mode::elastic);
    // Only the map changes: the rules and the groups are those of the static plan.
    CHECK(pe.rules == ps.rules);
    REQUIRE(pe.grouping.groups.size() == ps.grouping.groups.size());
    auto placement = group_max_rules(pe);
    auto ref       = build_split_map(placement, pe.num_layers, pe.num_kv_heads, pe.options.split);
    CHECK(pe.splits.cta_begin == ref.cta_begin);
    CHECK(pe.splits.phi == ref.phi);
    // Not vacuous: the group maxima move shares on this profile.
    CHECK(pe.splits.cta_begin != ps.splits.cta_begin);
    if (w == split_weighting::budget) {
      // Phi is the budget itself: every member of a group carries the group's largest budget.
      for (std::size_t i = 0; i < placement.size(); ++i)
        CHECK(pe.splits.phi[i] == placement[i].budget);
    }
    pe.splits.validate();
  }
}

TEST_CASE("AOT loads from explicit lengths equal the rule-based loads and the pieces",
          "[split_analysis][elastic]") {
  auto p    = plan_of(split_weighting::batch_share, reservation_mode::static_budgets);
  auto view = p.splits.view();
  auto H    = p.num_kv_heads;
  auto N    = view.num_ctas;
  std::mt19937_64 rng(7);
  for (std::int32_t batch : {1, 5, 32}) {
    auto ctx = log_uniform_contexts(batch, 100, 131072, static_cast<std::uint64_t>(batch));
    std::vector<std::int64_t> dec(static_cast<std::size_t>(batch));
    for (auto& d : dec) d = static_cast<std::int64_t>(rng() % 200);
    std::vector<std::int64_t> offsets(static_cast<std::size_t>(batch) + 1),
        lengths(static_cast<std::size_t>(batch) * H);
    std::vector<cta_piece> pieces(static_cast<std::size_t>(view.partial_slots(batch)));
    for (std::int32_t l : {0, 13, 31}) {
      for (std::int32_t r = 0; r < batch; ++r)
        for (std::int32_t h = 0; h < H; ++h)
          lengths[static_cast<std::size_t>(r) * H + h] = head_tokens(
              p.rule(l, h), ctx[static_cast<std::size_t>(r)], dec[static_cast<std::size_t>(r)]);
      std::vector<std::int64_t> by_rules(static_cast<std::size_t>(N), -1), by_lengths(by_rules),
          by_pieces(static_cast<std::size_t>(N), 0);
      aot_cta_loads(
          view, l, &p.rule(l, 0), ctx.data(), dec.data(), batch, offsets.data(), by_rules.data());
      aot_cta_loads_from_lengths(view, l, lengths.data(), batch, by_lengths.data());
      auto n = map_layer_pieces(view,
                                l,
                                &p.rule(l, 0),
                                ctx.data(),
                                dec.data(),
                                batch,
                                offsets.data(),
                                pieces.data(),
                                pieces.size());
      for (std::size_t i = 0; i < n; ++i)
        by_pieces[static_cast<std::size_t>(pieces[i].cta)] += pieces[i].kv_end - pieces[i].kv_begin;
      INFO("batch " << batch << " layer " << l);
      CHECK(by_lengths == by_rules);
      CHECK(by_lengths == by_pieces);
    }
  }
  // The layer summaries agree too (decode tokens 0).
  auto ctx = log_uniform_contexts(32, 1024, 131072, 3);
  std::vector<std::int64_t> all;
  for (std::int32_t l = 0; l < p.num_layers; ++l)
    for (auto n : ctx)
      for (std::int32_t h = 0; h < H; ++h) all.push_back(head_tokens(p.rule(l, h), n, 0));
  auto a = layer_imbalance(p.rules, p.splits, ctx);
  auto b = layer_imbalance_from_lengths(p.splits, all, 32);
  CHECK(a.aot.mean == b.aot.mean);
  CHECK(a.aot.p95 == b.aot.p95);
  CHECK(a.equal_split.mean == b.equal_split.mean);
  CHECK(a.greedy.p95 == b.greedy.p95);
  CHECK(a.greedy_fine.max == b.greedy_fine.max);
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      layer_imbalance_from_lengths(p.splits, all, 31), invalid_argument, "lengths", "num_layers");
  split_evaluator no_rules(p.splits);
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      no_rules.evaluate(0, ctx.data(), 32), invalid_argument, "without rules");
}

TEST_CASE(
    "elastic placement lengths: equal within a group, within R(n), at least the protected floor",
    "[split_analysis][elastic]") {
  auto const& s = snapkv_llama();
  auto pe       = plan_of(split_weighting::batch_share, reservation_mode::elastic);
  auto H        = static_cast<std::size_t>(pe.num_kv_heads);
  auto P        = pe.geometry.page_tokens;
  auto protect  = s.protected_tokens();
  scorer_total t{pe.profile.target_keep_ratio, protect};
  for (std::size_t k : {std::size_t{0}, std::size_t{17}}) {
    for (std::int64_t n : {std::int64_t{1000}, s.samples[k].context_tokens, std::int64_t{131072}}) {
      auto needs = sample_needs_at(pe, s, k, n);
      auto len   = elastic_placement_lengths(pe, needs, n);
      INFO("sample " << k << " context " << n);
      std::int64_t pages = 0, groups = 0, kept = 0, wanted = 0;
      for (auto const& g : pe.grouping.groups) {
        if (g.rule.kind != layer_kind::compressed) continue;
        ++groups;
        auto first                = len[static_cast<std::size_t>(g.members[0].layer) * H +
                         static_cast<std::size_t>(g.members[0].head)];
        std::int64_t longest_need = 0;
        for (auto m : g.members) {
          auto i = static_cast<std::size_t>(m.layer) * H + static_cast<std::size_t>(m.head);
          CHECK(len[i] == first);
          kept += std::min(len[i], needs[i]);
          wanted += needs[i];
          longest_need = std::max(longest_need, needs[i]);
        }
        CHECK(first >= std::min(n, protect));
        CHECK(first <= n);
        // A group is never longer than its longest need's pages (or the protected floor).
        CHECK(first <= std::max(ceil_div(longest_need, P), ceil_div(std::min(n, protect), P)) * P);
        pages += ceil_div(first, P);
      }
      CHECK(pages <= elastic_compressed_pages(t, groups * pe.grouping.group_size, 4, P, 0.15, n));
      // At the sample's own context the placement keeps nearly every wanted token (margin 0.15).
      if (n == s.samples[k].context_tokens)
        CHECK(static_cast<double>(kept) >= 0.99 * static_cast<double>(wanted));
    }
  }
  auto ps = plan_of(split_weighting::batch_share, reservation_mode::static_budgets);
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      elastic_placement_lengths(ps, sample_needs_at(ps, s, 0, 1000), 1000),
      invalid_argument,
      "static budgets");
}

// Whether the elastic plan's map balances these placements better than the static plan's map is
// NOT asserted: on snapkv/llama at batch 32 it does not (bench_planning elastic_imbalance/3/0/32:
// AOT mean 1.075 against 1.071, p95 1.139 against 1.111;
// docs/planning.md#split-map-under-elastic-placement). What holds, and is checked:
// both maps' AOT launches beat the equal split on the same lengths.
TEST_CASE("on a real profile both maps beat the equal split on elastic placements",
          "[split_analysis][elastic][profiles]") {
  auto const& s = snapkv_llama();
  auto pe       = plan_of(split_weighting::batch_share, reservation_mode::elastic);
  auto ps       = plan_of(split_weighting::batch_share, reservation_mode::static_budgets);
  constexpr std::int32_t batch = 32;
  auto H                       = static_cast<std::size_t>(pe.num_kv_heads);
  for (std::uint64_t b = 1; b <= 4; ++b) {
    // Samples at their own contexts (measured needs), drawn uniformly.
    std::mt19937_64 pick(b);
    std::vector<std::vector<std::int64_t>> req;
    for (std::int32_t r = 0; r < batch; ++r) {
      auto k = static_cast<std::size_t>(pick() % s.samples.size());
      auto n = s.samples[k].context_tokens;
      req.push_back(elastic_placement_lengths(pe, sample_needs_at(pe, s, k, n), n));
    }
    std::vector<std::int64_t> all;
    for (std::size_t l = 0; l < static_cast<std::size_t>(pe.num_layers); ++l)
      for (auto const& x : req)
        all.insert(all.end(),
                   x.begin() + static_cast<std::ptrdiff_t>(l * H),
                   x.begin() + static_cast<std::ptrdiff_t>((l + 1) * H));
    auto e = layer_imbalance_from_lengths(pe.splits, all, batch);
    auto t = layer_imbalance_from_lengths(ps.splits, all, batch);
    INFO("batch " << b << ": elastic map " << e.aot.mean << " / " << e.aot.p95 << ", static map "
                  << t.aot.mean << " / " << t.aot.p95 << ", equal split " << e.equal_split.mean);
    CHECK(e.aot.count == 32);
    CHECK(e.aot.mean >= 1.0);
    CHECK(e.equal_split.mean == t.equal_split.mean);  // the baselines do not see the map
    CHECK(e.aot.mean < e.equal_split.mean);
    CHECK(t.aot.mean < t.equal_split.mean);
  }
}
