// SPDX-License-Identifier: Apache-2.0
// Static planning costs and decode load balance, side by side in one run (docs/planning.md):
//
//   calibrate/<profile>          budgets from 28 samples (what `tangram calibrate` does once)
//   evaluate/<profile>           the calibration report (2-fold held-out, Spearman, band)
//   cluster/<scope>              clustering of the 256 heads of Llama-3.1-8B, Hp 4
//   step_mapping/<batch>         per-step host cost of one decode step over all 32 layers:
//                                AOT mapping vs per-step greedy and equal-split planners
//                                (counters: *_ns_per_request and greedy_over_aot)
//   imbalance/<w>/<c>/<batch>    max/mean CTA tokens of the four planners on all 8 real profiles,
//                                8 batches each (contexts log-uniform 1K..128K, seeds 1..8),
//                                every layer; w: 0 batch_share, 1 budget; N_CTA = 132 x c
//   invariant_imbalance/<K>/<batch>
//                                batch-invariant decode (decode_params::invariant_pieces = K):
//                                max/mean CTA tokens, and its busiest CTA over the split map's
//                                (the critical-path cost, modelled from tokens), on the imbalance
//                                batches (8 profiles x 8 seeds x every layer, N_CTA 264)
//   elastic_imbalance/<s>/<c>/<batch>
//                                the same measure on ELASTIC placements of the 4 Llama-3.1-8B
//                                profiles (s: ea, fastkvzip, keydiff, snapkv): each request is a
//                                sample whose per-head lengths are its group lengths
//                                (select_group_lengths within R(n), margin 0.15); c: 0 every
//                                request at its sample's own context (measured), 1 at a context
//                                drawn log-uniform 1K..128K, kept counts scaled (modelled).
//                                AOT map of the elastic plan (placement-rule shares) and of the
//                                static plan (budget shares) on the same lengths, equal split,
//                                greedy; batch_share, Hp 4, P 16, global, N_CTA 264; 16 batches
//                                per size, every layer. Also: aot_static_on_budgets (the static
//                                map with every head at its budget, the non-elastic figure) and
//                                the elastic plan built from the samples (placement shares)
//
// Run: build/bench/bench_planning --benchmark_format=json
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "tangram/eval/split_imbalance.hpp"
#include "tangram/io/retention_samples.hpp"
#include "tangram/model/presets.hpp"
#include "tangram/plan/aot_mapping.hpp"
#include "tangram/plan/build_static_plan.hpp"
#include "tangram/plan/calibration.hpp"
#include "tangram/plan/clustering.hpp"
#include "tangram/plan/elastic_reservation.hpp"
#include "tangram/plan/static_plan.hpp"

namespace {

using namespace tangram;

char const* const profile_names[] = {"ea/llama-3.1-8b-instruct",
                                     "ea/qwen3-4b-instruct-2507",
                                     "fastkvzip/llama-3.1-8b-instruct",
                                     "fastkvzip/qwen3-4b-instruct-2507",
                                     "keydiff/llama-3.1-8b-instruct",
                                     "keydiff/qwen3-4b-instruct-2507",
                                     "snapkv/llama-3.1-8b-instruct",
                                     "snapkv/qwen3-4b-instruct-2507"};
constexpr int num_profiles        = 8;

// Loaded once per process (benchmark program state, not library state).
retention_samples const& samples(int i) {
  static std::vector<std::unique_ptr<retention_samples>> cache(num_profiles);
  auto& slot = cache[static_cast<std::size_t>(i)];
  if (!slot)
    slot = std::make_unique<retention_samples>(load_retention_samples(
        std::string(TANGRAM_DATA_DIR) + "/profiles/" + profile_names[i] + ".json"));
  return *slot;
}

static_plan const& plan_for(int profile, split_weighting w, int ctas_per_sm) {
  static std::map<std::tuple<int, int, int>, std::unique_ptr<static_plan>> cache;
  auto& slot = cache[{profile, static_cast<int>(w), ctas_per_sm}];
  if (!slot) {
    auto const& s = samples(profile);
    plan_options o;
    o.split.limits     = {132, ctas_per_sm};
    o.split.weighting  = w;
    o.reservation.mode = reservation_mode::static_budgets;  // maps weighed on the budgets
    slot = std::make_unique<static_plan>(build_static_plan(model_preset(s.model), calibrate(s), o));
  }
  return *slot;
}

void calibrate_profile(benchmark::State& state) {
  auto const& s = samples(static_cast<int>(state.range(0)));
  state.SetLabel(profile_names[state.range(0)]);
  for (auto _ : state) {
    auto p = calibrate(s);
    benchmark::DoNotOptimize(p.budgets.data());
  }
}
BENCHMARK(calibrate_profile)
    ->Name("calibrate")
    ->DenseRange(0, num_profiles - 1)
    ->Unit(benchmark::kMicrosecond);

void evaluate_profile(benchmark::State& state) {
  auto const& s = samples(static_cast<int>(state.range(0)));
  state.SetLabel(profile_names[state.range(0)]);
  for (auto _ : state) {
    auto r = evaluate_calibration(s);
    benchmark::DoNotOptimize(r.reserved_over_ideal);
  }
}
BENCHMARK(evaluate_profile)
    ->Name("evaluate")
    ->DenseRange(0, num_profiles - 1)
    ->Unit(benchmark::kMicrosecond);

void cluster(benchmark::State& state) {
  auto scope       = static_cast<grouping_scope>(state.range(0));
  auto const& plan = plan_for(6, split_weighting::batch_share, 2);  // snapkv/llama
  state.SetLabel(std::string(to_string(scope)));
  for (auto _ : state) {
    auto g = cluster_heads(plan.rules, plan.num_layers, plan.num_kv_heads, 4, scope);
    benchmark::DoNotOptimize(g.groups.data());
  }
  double waste = group_waste(
      cluster_heads(plan.rules, plan.num_layers, plan.num_kv_heads, 4, scope), plan.rules);
  state.counters["group_waste"] = waste;
}
BENCHMARK(cluster)->DenseRange(0, 2)->Unit(benchmark::kMicrosecond);

// One decode step over every layer, timed section by section: the AOT per-head stream offsets
// (the O(batch) arithmetic a kernel needs), the full AOT mapping (every CTA's pieces, into
// preallocated buffers), and the per-step planners (head lengths + plan).
void step_mapping(benchmark::State& state) {
  auto batch       = static_cast<std::int32_t>(state.range(0));
  auto const& plan = plan_for(6, split_weighting::batch_share, 2);
  auto view        = plan.splits.view();
  auto H           = plan.num_kv_heads;
  auto N           = view.num_ctas;
  auto ctx         = log_uniform_contexts(batch, 1024, 131072, 1);
  std::vector<std::int64_t> dec(static_cast<std::size_t>(batch), 7),
      offsets(static_cast<std::size_t>(batch) + 1), lengths(static_cast<std::size_t>(batch) * H),
      loads(static_cast<std::size_t>(N));
  std::vector<cta_piece> pieces(static_cast<std::size_t>(view.partial_slots(batch)));
  greedy_split_planner greedy(128, 1), fine(128, 4);
  using clock      = std::chrono::steady_clock;
  double t_offsets = 0, t_aot = 0, t_greedy = 0, t_fine = 0, t_equal = 0;
  std::size_t total_pieces = 0;
  auto lengths_of          = [&](std::int32_t l) {
    for (std::int32_t r = 0; r < batch; ++r)
      for (std::int32_t h = 0; h < H; ++h)
        lengths[static_cast<std::size_t>(r) * H + h] = head_tokens(
            plan.rule(l, h), ctx[static_cast<std::size_t>(r)], dec[static_cast<std::size_t>(r)]);
  };
  std::vector<std::int64_t> all_offsets(static_cast<std::size_t>(plan.num_layers) * H *
                                        (batch + 1));
  for (auto _ : state) {
    auto tb = clock::now();
    for (std::int32_t l = 0; l < plan.num_layers; ++l)
      for (std::int32_t h = 0; h < H; ++h)
        head_stream_offsets(
            plan.rule(l, h),
            ctx.data(),
            dec.data(),
            batch,
            all_offsets.data() + (static_cast<std::size_t>(l) * H + h) * (batch + 1));
    benchmark::DoNotOptimize(all_offsets.data());
    auto t0 = clock::now();
    for (std::int32_t l = 0; l < plan.num_layers; ++l)
      total_pieces += map_layer_pieces(view,
                                       l,
                                       &plan.rule(l, 0),
                                       ctx.data(),
                                       dec.data(),
                                       batch,
                                       offsets.data(),
                                       pieces.data(),
                                       pieces.size());
    auto t1 = clock::now();
    for (std::int32_t l = 0; l < plan.num_layers; ++l) {
      lengths_of(l);
      greedy.plan(lengths.data(), batch, H, N, loads.data());
    }
    auto t2 = clock::now();
    for (std::int32_t l = 0; l < plan.num_layers; ++l) {
      lengths_of(l);
      fine.plan(lengths.data(), batch, H, N, loads.data());
    }
    auto t3 = clock::now();
    for (std::int32_t l = 0; l < plan.num_layers; ++l) {
      lengths_of(l);
      auto p = plan_equal_split(lengths.data(), batch, H, N);
      benchmark::DoNotOptimize(p.chunk_tokens);
    }
    auto t4 = clock::now();
    benchmark::DoNotOptimize(pieces.data());
    benchmark::DoNotOptimize(loads.data());
    t_offsets += std::chrono::duration<double>(t0 - tb).count();
    t_aot += std::chrono::duration<double>(t1 - t0).count();
    t_greedy += std::chrono::duration<double>(t2 - t1).count();
    t_fine += std::chrono::duration<double>(t3 - t2).count();
    t_equal += std::chrono::duration<double>(t4 - t3).count();
  }
  double per = 1e9 / static_cast<double>(state.iterations()) / batch;
  state.counters["aot_offsets_ns_per_request"] = t_offsets * per;
  state.counters["aot_ns_per_request"]         = t_aot * per;
  state.counters["greedy_ns_per_request"]      = t_greedy * per;
  state.counters["greedy4_ns_per_request"]     = t_fine * per;
  state.counters["equal_split_ns_per_request"] = t_equal * per;
  state.counters["greedy_over_aot"]            = t_greedy / t_aot;
  state.counters["pieces_per_layer"] =
      static_cast<double>(total_pieces) / static_cast<double>(state.iterations()) / plan.num_layers;
  state.SetLabel("Llama-3.1-8B snapkv, 32 layers, N_CTA 264");
}
BENCHMARK(step_mapping)->RangeMultiplier(2)->Range(1, 256)->Unit(benchmark::kMicrosecond);

// Counters NAME_mean and NAME_p95 of an imbalance sample.
void put_summary(benchmark::State& state, char const* name, std::vector<double> const& v) {
  auto s                                      = summarize_imbalance(v);
  state.counters[std::string(name) + "_mean"] = s.mean;
  state.counters[std::string(name) + "_p95"]  = s.p95;
}

// Imbalance of the four planners, pooled over the 8 real profiles, 8 batches, every layer.
void imbalance(benchmark::State& state) {
  auto w     = state.range(0) == 0 ? split_weighting::batch_share : split_weighting::budget;
  auto c     = static_cast<int>(state.range(1));
  auto batch = static_cast<std::int32_t>(state.range(2));
  std::vector<split_evaluator> evaluators;  // plans built outside the timed loop
  for (int p = 0; p < num_profiles; ++p) {
    auto const& plan = plan_for(p, w, c);
    evaluators.emplace_back(plan.rules, plan.splits);
  }
  std::vector<double> a, e, g, f;
  for (auto _ : state) {
    a.clear();
    e.clear();
    g.clear();
    f.clear();
    for (auto& ev : evaluators) {
      for (std::uint64_t seed = 1; seed <= 8; ++seed) {
        auto ctx = log_uniform_contexts(batch, 1024, 131072, seed);
        for (std::int32_t l = 0; l < ev.num_layers(); ++l) {
          auto r = ev.evaluate(l, ctx.data(), batch);
          a.push_back(r.aot);
          e.push_back(r.equal_split);
          g.push_back(r.greedy);
          f.push_back(r.greedy_fine);
        }
      }
    }
  }
  put_summary(state, "aot", a);
  put_summary(state, "equal_split", e);
  put_summary(state, "greedy", g);
  put_summary(state, "greedy4", f);
  state.counters["launches"] = static_cast<double>(a.size());
  state.SetLabel(std::string(to_string(w)) + ", N_CTA " + std::to_string(132 * c));
}
BENCHMARK(imbalance)
    ->ArgsProduct({{0, 1}, {1, 2, 4}, {1, 2, 4, 8, 16, 32, 64, 128, 256}})
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);

// Batch-invariant decode against the split map's pieces on the same launches (see the file
// comment): the loads of both come from the same per-head lengths and split map.
void invariant_imbalance(benchmark::State& state) {
  const auto K     = static_cast<std::int32_t>(state.range(0));
  const auto batch = static_cast<std::int32_t>(state.range(1));
  std::vector<double> aot, inv, ratio;
  for (auto _ : state) {
    aot.clear();
    inv.clear();
    ratio.clear();
    for (int p = 0; p < num_profiles; ++p) {
      auto const& plan = plan_for(p, split_weighting::batch_share, 2);
      const auto view  = plan.splits.view();
      const auto H     = plan.num_kv_heads;
      std::vector<std::int64_t> lengths(static_cast<std::size_t>(batch) * H);
      std::vector<std::int64_t> a(static_cast<std::size_t>(view.num_ctas)), b(a.size());
      for (std::uint64_t seed = 1; seed <= 8; ++seed) {
        auto ctx = log_uniform_contexts(batch, 1024, 131072, seed);
        for (std::int32_t l = 0; l < plan.num_layers; ++l) {
          for (std::int32_t r = 0; r < batch; ++r)
            for (std::int32_t h = 0; h < H; ++h)
              lengths[static_cast<std::size_t>(r) * H + h] =
                  head_tokens(plan.rule(l, h), ctx[static_cast<std::size_t>(r)], 0);
          aot_cta_loads_from_lengths(view, l, lengths.data(), batch, a.data());
          invariant_cta_loads_from_lengths(view, l, lengths.data(), batch, K, b.data());
          aot.push_back(load_imbalance(a.data(), view.num_ctas));
          inv.push_back(load_imbalance(b.data(), view.num_ctas));
          ratio.push_back(static_cast<double>(*std::max_element(b.begin(), b.end())) /
                          static_cast<double>(*std::max_element(a.begin(), a.end())));
        }
      }
    }
  }
  put_summary(state, "aot", aot);
  put_summary(state, "invariant", inv);
  put_summary(state, "busiest_cta_ratio", ratio);
  state.counters["launches"] = static_cast<double>(aot.size());
  state.SetLabel("K " + std::to_string(K) + ", N_CTA 264, modelled from tokens");
}
BENCHMARK(invariant_imbalance)
    ->ArgsProduct({{8, 16, 32, 64}, {1, 4, 16, 64, 256}})
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);

// Imbalance on elastic placements (see the file comment). Per request: sample k drawn uniformly,
// context its own (c = 0) or log-uniform 1K..128K (c = 1, kept counts scaled: modelled); needs
// `sample_needs_at`, lengths `elastic_placement_lengths` of the elastic plan (same groups as the
// static plan: the grouping does not depend on the reservation mode).
char const* const elastic_scorers[] = {"ea", "fastkvzip", "keydiff", "snapkv"};

void elastic_imbalance(benchmark::State& state) {
  auto scorer   = static_cast<int>(state.range(0));
  bool scaled   = state.range(1) == 1;
  auto batch    = static_cast<std::int32_t>(state.range(2));
  auto const& s = samples(scorer == 0   ? 0
                          : scorer == 1 ? 2
                          : scorer == 2 ? 4
                                        : 6);  // the llama profiles
  auto prof     = calibrate(s);
  plan_options o;
  o.group_size         = 4;
  o.page_tokens        = 16;
  o.scope              = grouping_scope::global;
  o.split.limits       = {132, 2};
  o.split.weighting    = split_weighting::batch_share;
  o.reservation.mode   = reservation_mode::static_budgets;
  auto model           = model_preset(s.model);
  static_plan stat     = build_static_plan(model, prof, o);
  o.reservation.mode   = reservation_mode::elastic;
  o.reservation.margin = 0.15;
  static_plan elas     = build_static_plan(model, prof, o);
  auto L = elas.num_layers, H = elas.num_kv_heads;
  constexpr std::uint64_t batches = 16;
  // The elastic plan as `tangram plan --reservation elastic` builds it from the samples: split
  // shares from elastic placements of the samples at the reference contexts (in-sample here: the
  // batches below draw from the same samples; test/plan/elastic_split_test.cpp checks held out).
  static_plan placed = build_static_plan(model, prof, o, s);
  split_evaluator on_elastic(elas.splits), on_static(stat.splits), budgets(stat.rules, stat.splits),
      on_placed(placed.splits);
  std::vector<double> ae, as, eq, gr, g4, ab, ao;
  std::vector<std::int64_t> layer_lengths(static_cast<std::size_t>(batch) * H),
      req(static_cast<std::size_t>(batch) * elas.rules.size());  // [r][flat head]
  for (auto _ : state) {
    for (auto* v : {&ae, &as, &eq, &gr, &g4, &ab, &ao}) v->clear();
    for (std::uint64_t b = 1; b <= batches; ++b) {
      std::mt19937_64 pick(0x5eed0000ULL + b);
      auto ctx = log_uniform_contexts(batch, 1024, 131072, b);
      for (std::int32_t r = 0; r < batch; ++r) {
        auto k  = std::min(s.samples.size() - 1,
                          static_cast<std::size_t>(detail::canonical_uniform(pick) *
                                                   static_cast<double>(s.samples.size())));
        auto& n = ctx[static_cast<std::size_t>(r)];
        if (!scaled) n = s.samples[k].context_tokens;
        auto len = elastic_placement_lengths(elas, sample_needs_at(elas, s, k, n), n);
        std::copy(
            len.begin(), len.end(), req.begin() + static_cast<std::ptrdiff_t>(r * len.size()));
      }
      for (std::int32_t l = 0; l < L; ++l) {
        for (std::int32_t r = 0; r < batch; ++r)
          for (std::int32_t h = 0; h < H; ++h)
            layer_lengths[static_cast<std::size_t>(r) * H + h] =
                req[static_cast<std::size_t>(r) * elas.rules.size() +
                    static_cast<std::size_t>(l) * H + h];
        auto e = on_elastic.evaluate_lengths(l, layer_lengths.data(), batch);
        ae.push_back(e.aot);
        eq.push_back(e.equal_split);
        gr.push_back(e.greedy);
        g4.push_back(e.greedy_fine);
        as.push_back(on_static.evaluate_lengths(l, layer_lengths.data(), batch).aot);
        ao.push_back(on_placed.evaluate_lengths(l, layer_lengths.data(), batch).aot);
        ab.push_back(budgets.evaluate(l, ctx.data(), batch).aot);
      }
    }
  }
  put_summary(
      state, "aot_elastic_map", ae);  // elastic plan's map (placement-rule shares), elastic lengths
  put_summary(
      state, "aot_static_map", as);  // static plan's map (budget shares), the same elastic lengths
  put_summary(state, "equal_split", eq);
  put_summary(state, "greedy", gr);
  put_summary(state, "greedy4", g4);
  put_summary(state,
              "aot_static_on_budgets",
              ab);  // reference: static map, every head at its static budget
  put_summary(
      state, "aot_placement_map", ao);  // elastic plan from samples: placement shares (in-sample)
  state.counters["launches"] = static_cast<double>(ae.size());
  state.SetLabel(std::string(elastic_scorers[scorer]) + "/llama-3.1-8b, " +
                 (scaled ? "contexts log-uniform 1K..128K (modelled)" : "own contexts") +
                 ", N_CTA 264");
}
BENCHMARK(elastic_imbalance)
    ->ArgsProduct({{0, 1, 2, 3}, {0, 1}, {8, 32, 128}})
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);

}  // namespace
