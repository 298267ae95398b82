// SPDX-License-Identifier: Apache-2.0
// The split map under elastic placement: static plans keep their map, elastic plans weigh every
// compressed head by its group's rule; the lengths-based AOT loads against the rule-based ones
// and the pieces; elastic placement lengths; the imbalance of both maps on real placements.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
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
#include "tangram/plan/elastic_placement.hpp"
#include "tangram/plan/elastic_reservation.hpp"
#include "tangram/plan/elastic_selection.hpp"
#include "tangram/plan/elastic_split_map.hpp"
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

namespace {

/// One compressed layer of 4 KV heads; one sample at context 100 whose heads keep 40, 20, 30, 20
/// tokens (keep ratio 0.25, nothing protected).
retention_samples four_head_samples() {
  retention_samples s;
  s.model             = "four-heads";
  s.scorer            = "hand";
  s.target_keep_ratio = 0.25;
  s.num_model_layers  = 1;
  s.layer_ids         = {0};
  s.num_kv_heads      = 4;
  s.samples           = {{100, {40, 20, 30, 20}}};
  return s;
}

model_spec four_head_model() {
  model_spec m;
  m.name            = "four-heads";
  m.num_layers      = 1;
  m.num_kv_heads    = 4;
  m.num_query_heads = 4;
  m.head_dim        = 128;
  m.layers.assign(1, layer_spec{});
  return m;
}

plan_options four_head_options(reservation_mode mode) {
  plan_options o;
  o.group_size                 = 2;
  o.page_tokens                = 1;
  o.scope                      = grouping_scope::global;
  o.split.limits               = {10, 2};  // N_CTA 20
  o.split.weighting            = split_weighting::batch_share;
  o.split.reference_contexts   = {100};
  o.split.reference_batches    = 8;
  o.split.reference_batch_size = 2;
  o.reservation.mode           = mode;
  o.reservation.margin         = 0;
  return o;
}

}  // namespace

// Worked by hand. Groups by budget: {h0: 40, h2: 30} and {h1: 20, h3: 20}. R(100) at margin 0 =
// 0.25 * 100 * 4 heads / (Hp 2 x P 1) = 50 pages. Every page of either group below its second
// member's need adds 2 wanted tokens: 30 pages for {h0, h2}, 20 for {h1, h3}, 50 in all, so the
// placement gives lengths 30, 20, 30, 20: shares 0.3, 0.2, 0.3, 0.2 of the layer in every batch,
// 6, 4, 6, 4 of 20 CTAs. The groups' rules (largest member budget 0.4 and 0.2) would weigh
// 1/3, 1/6: 7, 3, 7, 3 CTAs.
TEST_CASE("elastic plan from samples: split shares are the placements' shares (hand-worked)",
          "[split_analysis][elastic]") {
  auto s     = four_head_samples();
  auto model = four_head_model();
  auto prof  = calibrate(s);
  auto o     = four_head_options(reservation_mode::elastic);
  auto p     = build_static_plan(model, prof, o, s);
  for (auto const& g : p.grouping.groups) {
    std::vector<std::int32_t> heads;
    for (auto m : g.members) heads.push_back(m.head);
    std::sort(heads.begin(), heads.end());
    CHECK((heads == std::vector<std::int32_t>{0, 2} || heads == std::vector<std::int32_t>{1, 3}));
  }
  REQUIRE(p.splits.phi.size() == 4);
  CHECK(p.splits.phi[0] == Approx(0.3));
  CHECK(p.splits.phi[1] == Approx(0.2));
  CHECK(p.splits.phi[2] == Approx(0.3));
  CHECK(p.splits.phi[3] == Approx(0.2));
  CHECK(p.splits.cta_begin == std::vector<std::int32_t>{0, 6, 10, 16, 20});
  CHECK(elastic_placement_lengths(p, sample_needs_at(p, s, 0, 100), 100) ==
        std::vector<std::int64_t>{30, 20, 30, 20});

  // Without samples the groups' rules weigh the heads.
  auto rules_only = build_static_plan(model, prof, o);
  CHECK(rules_only.splits.cta_begin == std::vector<std::int32_t>{0, 7, 10, 17, 20});
  // Samples change nothing for static budgets or budget weighting.
  auto st = four_head_options(reservation_mode::static_budgets);
  CHECK(build_static_plan(model, prof, st, s).splits.cta_begin ==
        build_static_plan(model, prof, st).splits.cta_begin);
  o.split.weighting = split_weighting::budget;
  CHECK(build_static_plan(model, prof, o, s).splits.cta_begin ==
        build_static_plan(model, prof, o).splits.cta_begin);

  // Samples of another head count are refused, naming both counts.
  auto wrong         = s;
  wrong.num_kv_heads = 8;
  wrong.samples[0].kept.assign(8, 10);
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      build_static_plan(model, prof, four_head_options(reservation_mode::elastic), wrong),
      invalid_argument,
      "8 KV heads",
      "the plan has 4");
  auto none    = s;
  none.samples = {};
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      elastic_placement_weights(p, none), invalid_argument, "no samples");
}

TEST_CASE("placement lengths equal the reference greedy's on a real profile",
          "[split_analysis][elastic][profiles]") {
  auto const& s = snapkv_llama();
  auto pe       = plan_of(split_weighting::batch_share, reservation_mode::elastic);
  auto H        = static_cast<std::size_t>(pe.num_kv_heads);
  scorer_total t{pe.profile.target_keep_ratio, s.protected_tokens()};
  for (std::size_t k : {std::size_t{3}, std::size_t{11}}) {
    for (std::int64_t n : {std::int64_t{2048}, std::int64_t{40000}, std::int64_t{131072}}) {
      auto needs = sample_needs_at(pe, s, k, n);
      std::vector<std::int64_t> wanted;
      std::vector<std::int32_t> members;
      std::vector<std::size_t> heads;
      for (auto const& g : pe.grouping.groups) {
        if (g.rule.kind != layer_kind::compressed) continue;
        for (auto m : g.members) {
          heads.push_back(static_cast<std::size_t>(m.layer) * H + static_cast<std::size_t>(m.head));
          members.push_back(static_cast<std::int32_t>(wanted.size()));
          wanted.push_back(needs[heads.back()]);
        }
      }
      reference::elastic_selection_input in;
      in.needs       = &wanted;
      in.members     = &members;
      in.group_size  = 4;
      in.page_tokens = 16;
      in.candidates  = n;
      in.protect     = t.protect;
      in.budget_pages =
          elastic_compressed_pages(t, static_cast<std::int64_t>(wanted.size()), 4, 16, 0.15, n);
      auto sel = reference::select_group_lengths(in);
      REQUIRE(sel.fits);
      auto len = elastic_placement_lengths(pe, needs, n);
      INFO("sample " << k << " context " << n);
      for (std::size_t i = 0; i < heads.size(); ++i)
        CHECK(len[heads[i]] == std::min<std::int64_t>(sel.group_pages[i / 4] * 16, n));
    }
  }
}

// Held out: the plans are built from the even samples, the batches drawn from the odd ones, at
// contexts log-uniform 1K..128K (needs scaled: modelled). Shares from placements balance these
// launches better than shares from the groups' rules (bench_planning elastic_imbalance has the
// full table; docs/planning.md).
TEST_CASE("held out: placement shares balance elastic launches better than group rules",
          "[split_analysis][elastic][profiles]") {
  auto const& s          = snapkv_llama();
  retention_samples even = s, odd = s;
  even.samples.clear();
  odd.samples.clear();
  for (std::size_t k = 0; k < s.samples.size(); ++k)
    (k % 2 == 0 ? even : odd).samples.push_back(s.samples[k]);
  auto model        = model_preset(s.model);
  auto prof         = calibrate(even);
  auto o            = options(split_weighting::batch_share, reservation_mode::elastic);
  auto from_samples = build_static_plan(model, prof, o, even);
  auto from_rules   = build_static_plan(model, prof, o);
  double placed = 0, ruled = 0;
  for (std::uint64_t b = 1; b <= 4; ++b) {
    auto ctx = log_uniform_contexts(32, 1024, 131072, b);
    auto a   = elastic_layer_imbalance(from_samples, odd, ctx, b);
    auto r   = elastic_layer_imbalance(from_rules, odd, ctx, b);
    INFO("batch " << b << ": placement shares " << a.aot.mean << " / " << a.aot.p95
                  << ", rule shares " << r.aot.mean << " / " << r.aot.p95);
    CHECK(a.aot.mean >= 1.0);
    CHECK(a.equal_split.mean == r.equal_split.mean);  // same lengths: the same draws
    placed += a.aot.mean;
    ruled += r.aot.mean;
  }
  INFO("mean over 4 batches: placement shares " << placed / 4 << ", rule shares " << ruled / 4);
  CHECK(placed < ruled);
}

// Regression: the sample drawn for each request was the k-th uniform of the same mt19937_64
// stream (same seed) that drew the k-th context, so every context above the range's geometric
// middle went to the upper half of the samples: `tangram simulate` measured the decode skew on
// long contexts of a few prompts only (elastic skew 1.084 at its reference batch on snapkv/llama
// mid, 1.045 with independent draws).
TEST_CASE("sampled lengths draw each request's sample independently of its context",
          "[split_analysis][elastic]") {
  static_plan p;
  p.num_layers   = 1;
  p.num_kv_heads = 1;
  retention_samples two;
  two.samples.resize(2);
  constexpr std::int32_t batch = 2000;
  auto ctx = log_uniform_contexts(batch, 1024, 131072, 1);  // the reference batch's seed
  auto got = detail::sampled_lengths(p, two, ctx, 1, [](std::size_t k, std::int64_t) {
    return std::vector<std::int64_t>{static_cast<std::int64_t>(k)};
  });
  REQUIRE(got.size() == static_cast<std::size_t>(batch));
  // Sample 1 among the contexts above sqrt(1024 x 131072) = 11585 and among those below: about
  // half of each (one stream for both gave 100% and 0%).
  std::int32_t long_n = 0, long_1 = 0, short_n = 0, short_1 = 0;
  for (std::size_t r = 0; r < ctx.size(); ++r) {
    bool is_long = ctx[r] > 11585;
    (is_long ? long_n : short_n) += 1;
    (is_long ? long_1 : short_1) += got[r] == 1 ? 1 : 0;
  }
  INFO("sample 1 on " << long_1 << " of " << long_n << " long and " << short_1 << " of " << short_n
                      << " short contexts");
  REQUIRE(long_n > 800);
  REQUIRE(short_n > 800);
  CHECK(std::abs(long_1 - long_n / 2) < long_n / 10);
  CHECK(std::abs(short_1 - short_n / 2) < short_n / 10);
}
