// SPDX-License-Identifier: Apache-2.0
// Memory manager benchmarks (host control plane; pools are simulated, so 100+ GB fit on a CPU):
//
// - pool_allocate_free / pool_reserve_draw: ns per page of the O(1) paths, beside malloc/free of
//   a page-sized block (ratio counter).
// - pool_staging_return/{0,1}: ns per page of giving 70% of a chunk's staging (131,072 pages
//   scattered over an 8M-page pool) back to the reservation, one release + try_extend a page (0)
//   or `release_into` (1).
// - batched_free: ns per page of returning a batch of 4096 pages to the pool (what an engine's
//   batched free of evicted tail pages costs here): `measure_batched_free_s_per_page`, the
//   measured low end of `tangram simulate`'s reclamation (eval/sim/measured_costs.hpp pins it).
// - admission/{4,1}: ns per try_admit of a Llama-3.1-8B request (footprint of 64 groups of 4, or
//   256 per-head groups + reservation + page-table segment), beside the cost of computing M(r)
//   alone.
// - decode_step/{64,256}/{4,1}: us per decode step of the batch view (decode_step + view) for 64
//   and 256 sequences x 32 layers, groups of 4 or per-head pages (page draws per step counted),
//   beside the layer-wide paging baseline's step (ratio counter).
// - memory_efficiency/<scorer>/<context>: allocated bytes / ideal bytes for Tangram, the plan's
//   prediction, and both baselines, for Llama-3.1-8B at 32K and 128K (P 16, Hp 4, global, alpha 2).
//   These are measured by running the managers (counts, not timings); ideal = the mean dynamic
//   footprint of the profile samples scaled to the context.
// - elastic_vs_static/<scorer>/<model>/hp{4,1}: every bundled sample (Llama-3.1-8B and Qwen3-4B)
//   as one request (its own context, chunks of 4096) through two managers side by side: static
//   mu + 2 sigma budgets, and elastic reservation (groups of 4 at margin 0.15, or the defaults:
//   per-head pages at default_elastic_margin). The scorer's per-head needs come from the sample
//   (exact at the last chunk; scaled by tokens seen for earlier chunks: modelled). Static heads
//   keep min(need, budget); elastic groups get the optimal placement within elastic_page_limit.
//   Counters: pages reserved at admission and held after prefill over the ideal (needs / Hp P),
//   staging, and the fraction of wanted tokens clipped. In-sample: budgets and margin come from
//   the same samples (held-out figures: `tangram calibrate --reservation elastic --compare`).
//
// Run: build/bench/bench_memory --benchmark_format=json
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "tangram/eval/baselines/unified_paging.hpp"
#include "tangram/eval/sim/elastic_policy.hpp"
#include "tangram/eval/sim/measured_costs.hpp"
#include "tangram/eval/sim/simulated_memory_resource.hpp"
#include "tangram/io/retention_samples.hpp"
#include "tangram/memory/kv_cache_manager.hpp"
#include "tangram/model/presets.hpp"
#include "tangram/plan/build_static_plan.hpp"
#include "tangram/plan/calibration.hpp"
#include "tangram/plan/clustering.hpp"
#include "tangram/plan/footprint.hpp"
#include "tangram/plan/static_plan.hpp"
#include "tangram/profile/retention_samples.hpp"

namespace {

using namespace tangram;
using clock_type = std::chrono::steady_clock;

/// Bundled profile file of a model preset.
std::string profile_file(std::string const& model) {
  return model == "qwen3-4b" ? "qwen3-4b-instruct-2507.json" : "llama-3.1-8b-instruct.json";
}

retention_samples const& samples(std::string const& scorer,
                                 std::string const& model = "llama-3.1-8b") {
  static std::map<std::string, retention_samples> cache;
  auto key = scorer + "/" + model;
  auto it  = cache.find(key);
  if (it == cache.end())
    it = cache
             .emplace(key,
                      load_retention_samples(std::string(TANGRAM_DATA_DIR) + "/profiles/" + scorer +
                                             "/" + profile_file(model)))
             .first;
  return it->second;
}

/// The static plan (mu + 2 sigma budgets, P 16, Hp `group_size` (4 unless told), global
/// grouping) of a bundled profile.
static_plan const& static_plan_of(std::string const& scorer,
                                  std::string const& model = "llama-3.1-8b",
                                  std::int32_t group_size  = 4,
                                  reservation_mode mode    = reservation_mode::static_budgets) {
  static std::map<std::string, static_plan> cache;
  auto key = scorer + "/" + model + "/" + std::to_string(group_size) + "/" +
             std::to_string(static_cast<int>(mode));
  auto it = cache.find(key);
  if (it == cache.end()) {
    plan_options o;
    o.reservation.mode = mode;  // default: Tangram's static column
    o.page_tokens      = 16;
    o.group_size       = group_size;
    o.scope            = grouping_scope::global;
    it                 = cache
             .emplace(key,
                      build_static_plan(model_preset(model), calibrate(samples(scorer, model)), o))
             .first;
  }
  return it->second;
}

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

// ----- page pool ------------------------------------------------------------------------------

/// ns per operation of a pair of bursts (allocate `burst` items, then free them) of `alloc`/`free`.
template <class Alloc, class Free>
double burst_ns_per_op(int rounds, int burst, Alloc&& alloc, Free&& free_one) {
  auto t0 = clock_type::now();
  for (int r = 0; r < rounds; ++r) {
    for (int i = 0; i < burst; ++i) alloc(i);
    for (int i = 0; i < burst; ++i) free_one(i);
  }
  return seconds_since(t0) * 1e9 / (2.0 * rounds * burst);
}

/// Bursts of 1024 pages taken from a 2^20-page pool by `take(pool, pages)` and released, for as
/// long as the benchmark runs: ns per page operation (a take or a release); sets items processed.
template <class Take>
double pool_burst_ns_per_op(benchmark::State& state, Take take) {
  simulated_memory_resource mr;
  page_pool<> pool(mr, page_layout<>(page_geometry{16, 4, 128, dtype::bf16}), 1 << 20);
  constexpr int burst = 1024;
  std::vector<page_id> pages(burst);
  std::int64_t ops = 0;
  auto t0          = clock_type::now();
  for (auto _ : state) {
    take(pool, pages);
    benchmark::DoNotOptimize(pages.data());
    for (auto p : pages) pool.release(p);
    ops += 2 * burst;
  }
  state.SetItemsProcessed(ops);
  return seconds_since(t0) * 1e9 / static_cast<double>(ops);
}

void pool_allocate_free(benchmark::State& state) {
  double ns = pool_burst_ns_per_op(state, [](page_pool<>& pool, std::vector<page_id>& pages) {
    for (auto& p : pages) p = *pool.try_allocate();
  });
  // Reference, same pattern: malloc/free of page-sized (32 KiB) host blocks.
  constexpr int burst = 1024;
  std::vector<void*> blocks(burst);
  double malloc_ns = burst_ns_per_op(
      50,
      burst,
      [&](int i) {
        benchmark::DoNotOptimize(blocks[static_cast<std::size_t>(i)] = std::malloc(32768));
      },
      [&](int i) { std::free(blocks[static_cast<std::size_t>(i)]); });
  state.counters["ns_per_page_op"]        = ns;
  state.counters["malloc_free_ns_per_op"] = malloc_ns;
  state.counters["malloc_over_pool"]      = malloc_ns / ns;
}
BENCHMARK(pool_allocate_free)->Unit(benchmark::kMicrosecond);

void pool_reserve_draw(benchmark::State& state) {
  state.counters["ns_per_page_op"] =
      pool_burst_ns_per_op(state, [](page_pool<>& pool, std::vector<page_id>& pages) {
        auto res = *pool.try_reserve(static_cast<std::int64_t>(pages.size()));
        for (auto& p : pages) p = pool.draw(res);
      });
}
BENCHMARK(pool_reserve_draw)->Unit(benchmark::kMicrosecond);

// The same burst drawn with one call (`draw(res, n, out)`, what a list's growth uses): the
// difference from pool_reserve_draw is the per-page checks the bulk call makes once.
void pool_reserve_draw_bulk(benchmark::State& state) {
  state.counters["ns_per_page_op"] =
      pool_burst_ns_per_op(state, [](page_pool<>& pool, std::vector<page_id>& pages) {
        auto n   = static_cast<std::int64_t>(pages.size());
        auto res = *pool.try_reserve(n);
        pool.draw(res, n, pages.data());
      });
}
BENCHMARK(pool_reserve_draw_bulk)->Unit(benchmark::kMicrosecond);

// A chunk's staging returned after the elastic eviction: 131,072 pages drawn (an 8K-token chunk
// of Llama-3.1-8B on per-head pages: 512 pages x 256 groups) from a pool of 8M pages whose free
// order is shuffled (pages scattered, as after hours of serving), then the last 70% given back to
// the same reservation. ns per returned page; state.range(0): 0 = one release and one
// try_extend per page (what page_flow did), 1 = `release_into` (one pass, counts prefetched).
void pool_staging_return(benchmark::State& state) {
  simulated_memory_resource mr;
  constexpr std::int64_t capacity = 1 << 23, staged = 131072, returned = staged * 7 / 10;
  page_pool<> pool(mr, page_layout<>(page_geometry{16, 1, 128, dtype::bf16}), capacity);
  {
    std::vector<page_id> all(static_cast<std::size_t>(capacity));
    for (auto& p : all) p = *pool.try_allocate();
    std::mt19937_64 rng(1);
    std::shuffle(all.begin(), all.end(), rng);
    for (auto p : all) pool.release(p);
  }
  std::vector<page_id> list(static_cast<std::size_t>(staged));
  double s          = 0;
  std::int64_t done = 0;
  for (auto _ : state) {
    auto res = *pool.try_reserve(staged);
    pool.draw(res, staged, list.data());
    page_id const* tail = list.data() + (staged - returned);
    auto t0             = clock_type::now();
    if (state.range(0) == 0) {
      for (std::int64_t k = returned - 1; k >= 0; --k)
        if (pool.release(tail[k])) (void)pool.try_extend(res, 1);
    } else {
      benchmark::DoNotOptimize(pool.release_into(res, tail, returned));
    }
    s += seconds_since(t0);
    done += returned;
    for (std::int64_t k = 0; k < staged - returned; ++k)
      pool.release(list[static_cast<std::size_t>(k)]);
    pool.release_unused(res);
  }
  state.counters["ns_per_returned_page"] = s * 1e9 / static_cast<double>(done);
}
BENCHMARK(pool_staging_return)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);

// The measured low end of reclamation (eval/sim/measured_costs.hpp): a batch of pages freed at
// once, median of 33 rounds per iteration.
void batched_free(benchmark::State& state) {
  double s = 0;
  for (auto _ : state)
    benchmark::DoNotOptimize(s = tangram::sim::measure_batched_free_s_per_page());
  state.counters["ns_per_page"]        = s * 1e9;
  state.counters["pinned_ns_per_page"] = tangram::sim::pinned_batched_free_s_per_page * 1e9;
}
BENCHMARK(batched_free)->Unit(benchmark::kMillisecond);

// ----- admission ------------------------------------------------------------------------------

/// Admission of a 32K-token request; state.range(0) = Hp (4: groups of 4, 1: per-head pages).
void admission(benchmark::State& state) {
  auto const& plan =
      static_plan_of("snapkv", "llama-3.1-8b", static_cast<std::int32_t>(state.range(0)));
  simulated_memory_resource mr;
  manager_options o;
  o.num_pages     = page_pool<>::pages_for_bytes(141'000'000'000, page_layout<>(plan.geometry));
  o.max_sequences = 256;
  kv_cache_manager m(plan, mr, o);
  const std::int64_t N = 32768, T = 512;
  std::vector<sequence_id> ids;
  ids.reserve(64);
  double admit_s = 0, footprint_s = 0;
  std::int64_t admitted = 0, footprints = 0;
  for (auto _ : state) {
    auto t0 = clock_type::now();
    for (int i = 0; i < 64; ++i) ids.push_back(*m.try_admit(N + i, T));
    admit_s += seconds_since(t0);
    admitted += 64;
    for (auto id : ids) m.free(id);
    ids.clear();
    t0 = clock_type::now();
    for (int i = 0; i < 64; ++i) benchmark::DoNotOptimize(footprint_pages(plan, N + i, T));
    footprint_s += seconds_since(t0);
    footprints += 64;
  }
  double ns                                  = admit_s * 1e9 / static_cast<double>(admitted);
  double fp_ns                               = footprint_s * 1e9 / static_cast<double>(footprints);
  state.counters["ns_per_admission"]         = ns;
  state.counters["footprint_only_ns"]        = fp_ns;
  state.counters["admission_over_footprint"] = ns / fp_ns;
  state.counters["groups"]                   = plan.num_groups();
}
BENCHMARK(admission)->Arg(4)->Arg(1)->Unit(benchmark::kMicrosecond);

// ----- prompt chunks --------------------------------------------------------------------------

/// A manager of `plan` (Llama-3.1-8B, per-head pages) that runs one 131,072-token prompt in 16
/// chunks of 8,192 at a time: prepare, the counts, commit; compressed heads keep 28% of the tokens
/// seen (elastic: within the limit; static budgets: their budgets, min'd).
struct prompt_chunk_runner {
  static constexpr std::int64_t N = 131072, C = 8192, T = 256;
  simulated_memory_resource mr;
  static_plan const& plan;
  kv_cache_manager m;
  std::vector<std::int32_t> kept;
  double s           = 0;  ///< host time of the chunks
  std::int64_t moved = 0;  ///< page ids drawn plus staged pages returned

  explicit prompt_chunk_runner(static_plan const& p)
      : plan(p), m(p, mr, options(p)), kept(p.rules.size()) {}
  static manager_options options(static_plan const& p) {
    manager_options o;
    o.num_pages        = page_pool<>::pages_for_bytes(141'000'000'000, page_layout<>(p.geometry));
    o.max_sequences    = 4;
    o.max_chunk_tokens = C;
    return o;
  }
  /// One prompt; `timed`: its time and pages count.
  void run(bool timed) {
    auto id     = *m.try_admit(N, T);
    auto before = m.stats().pages_drawn + m.stats().staging_pages_returned;
    auto t0     = clock_type::now();
    for (std::int64_t n = C; n <= N; n += C) {
      m.prepare_chunk(id, C);
      m.expected_kept(id, C, kept.data());
      auto keep = static_cast<std::int32_t>(n * 28 / 100);
      for (std::size_t h = 0; h < kept.size(); ++h)
        if (plan.rules[h].kind == layer_kind::compressed) kept[h] = std::min(kept[h], keep);
      m.commit_chunk(id, kept);
    }
    if (timed) {
      s += seconds_since(t0);
      moved += m.stats().pages_drawn + m.stats().staging_pages_returned - before;
    }
    m.free(id);
  }
};

/// Host time of a long prompt's chunks, elastic reservation against static budgets side by side
/// (issue 29 item 5 asks elastic within 3x), after one untimed prompt each (first touches):
/// `us_per_chunk` and `pages_moved_per_chunk` for the elastic plan (a group keeps its staged pages
/// between chunks: it moves what its lengths grow by, plus the last chunk's unkept staging),
/// `static_us_per_chunk`, `static_pages_moved_per_chunk` and `elastic_over_static`.
void prompt_chunk_host_time(benchmark::State& state) {
  prompt_chunk_runner elastic(
      static_plan_of("snapkv", "llama-3.1-8b", 1, reservation_mode::elastic));
  prompt_chunk_runner fixed(static_plan_of("snapkv", "llama-3.1-8b", 1));
  elastic.run(false);
  fixed.run(false);
  std::int64_t rounds = 0;
  for (auto _ : state) {
    elastic.run(true);
    fixed.run(true);
    ++rounds;
  }
  auto chunks = static_cast<double>(rounds * (prompt_chunk_runner::N / prompt_chunk_runner::C));
  state.counters["us_per_chunk"]                 = elastic.s * 1e6 / chunks;
  state.counters["static_us_per_chunk"]          = fixed.s * 1e6 / chunks;
  state.counters["elastic_over_static"]          = elastic.s / fixed.s;
  state.counters["pages_moved_per_chunk"]        = static_cast<double>(elastic.moved) / chunks;
  state.counters["static_pages_moved_per_chunk"] = static_cast<double>(fixed.moved) / chunks;
}
BENCHMARK(prompt_chunk_host_time)->Unit(benchmark::kMillisecond);

// ----- decode step ----------------------------------------------------------------------------

/// One decode step of the manager (decode_step + view) against layer-wide pages; state.range(0)
/// = batch, state.range(1) = Hp (4: groups of 4, 1: per-head pages, Hp times the page draws).
void decode_step(benchmark::State& state) {
  auto const& plan =
      static_plan_of("snapkv", "llama-3.1-8b", static_cast<std::int32_t>(state.range(1)));
  const auto batch     = static_cast<std::int32_t>(state.range(0));
  const std::int64_t N = 8192, T = 8192;
  const std::int64_t steps_cap = 8000;  // one turn's reservation bounds the steps we may run
  simulated_memory_resource mr;
  manager_options o;
  o.max_sequences  = batch;
  o.num_pages      = batch * footprint_pages(plan, N + 7 * batch, T) + 1024;
  o.index_capacity = o.num_pages + 1024;
  kv_cache_manager m(plan, mr, o);
  std::vector<sequence_id> ids;
  std::vector<std::int32_t> kept(static_cast<std::size_t>(plan.num_layers * plan.num_kv_heads));
  for (std::int32_t i = 0; i < batch; ++i) {
    auto id = *m.try_admit(N + i * 7, T);  // staggered lengths: page crossings spread over steps
    m.prepare_chunk(id, N + i * 7);
    m.expected_kept(id, N + i * 7, kept.data());
    m.commit_chunk(id, kept);
    ids.push_back(id);
  }
  m.set_batch(ids);

  // Baseline: layer-wide pages (vLLM style, one page table per layer), same batch and lengths.
  unified_paging_baseline base(plan,
                               unified_mode::compressed_reclaim,
                               mr,
                               batch * (ceil_div(N + batch * 7 + T, 16) * plan.num_layers + 1),
                               batch,
                               N + batch * 7 + T);
  std::vector<std::int32_t> bslots;
  for (std::int32_t i = 0; i < batch; ++i) {
    auto s = *base.try_admit();
    (void)base.prefill_chunk(s, N + i * 7);
    bslots.push_back(s);
  }
  const int base_steps = 2000;
  auto t0              = clock_type::now();
  for (int k = 0; k < base_steps; ++k)
    benchmark::DoNotOptimize(base.decode_step(bslots.data(), bslots.size()));
  double base_us = seconds_since(t0) * 1e6 / base_steps;

  std::int64_t steps = 0, drawn_before = m.stats().pages_drawn;
  t0 = clock_type::now();
  for (auto _ : state) {
    m.decode_step();
    auto v = m.view();
    benchmark::DoNotOptimize(v);
    if (++steps == steps_cap) state.SkipWithError("step cap reached");
  }
  double us                               = seconds_since(t0) * 1e6 / static_cast<double>(steps);
  state.counters["us_per_step"]           = us;
  state.counters["baseline_over_tangram"] = base_us / us;
  state.counters["baseline_us_per_step"]  = base_us;
  state.counters["pages_drawn_per_step"] =
      static_cast<double>(m.stats().pages_drawn - drawn_before) / static_cast<double>(steps);
  state.counters["batch"]  = batch;
  state.counters["layers"] = plan.num_layers;
}
BENCHMARK(decode_step)
    ->Args({64, 4})
    ->Args({256, 4})
    ->Args({64, 1})
    ->Args({256, 1})
    ->Iterations(4000)
    ->Unit(benchmark::kMicrosecond);

// ----- memory efficiency ----------------------------------------------------------------------

void memory_efficiency(benchmark::State& state, std::string scorer, std::int64_t context) {
  auto const& s            = samples(scorer);
  auto const& plan         = static_plan_of(scorer);
  const std::int64_t chunk = 4096;
  auto report  = evaluate_calibration(s, calibration_options{}, evaluation_options{0, 0.05});
  double waste = group_waste(plan.grouping, plan.rules);
  // Ideal: mean over samples of sum over heads of kept/context, times the context, times bytes per
  // head-token (K and V, d = 128, bf16).
  double mean_sum_ratio   = report.mean_dynamic_fraction * report.num_heads;
  double head_token_bytes = static_cast<double>(plan.model.kv_bytes_per_head_token());
  double ideal            = mean_sum_ratio * static_cast<double>(context) * head_token_bytes;

  double tangram = 0, full = 0, steady = 0, peak = 0, rule_pred = 0;
  std::int64_t reclaim_ops = 0, base_allocs = 0, tangram_reclaimed = 0, tangram_drawn = 0;
  for (auto _ : state) {
    simulated_memory_resource mr;
    manager_options o;
    o.num_pages     = footprint_pages(plan, context, 0) + 16;
    o.max_sequences = 1;
    kv_cache_manager m(plan, mr, o);
    auto id = *m.try_admit(context, 0);
    std::vector<std::int32_t> kept(static_cast<std::size_t>(plan.num_layers * plan.num_kv_heads));
    for (std::int64_t n = 0; n < context; n += chunk) {
      m.prepare_chunk(id, std::min(chunk, context - n));
      m.expected_kept(id, std::min(chunk, context - n), kept.data());
      m.commit_chunk(id, kept);
    }
    tangram           = static_cast<double>(m.pool().stats().peak_used * m.pool().page_bytes());
    tangram_reclaimed = m.stats().reclaimed_pages;
    tangram_drawn     = m.stats().pages_drawn;

    std::int64_t layer_pages = ceil_div(context, 16) * plan.num_layers + 16;
    unified_paging_baseline f(plan, unified_mode::full_kv, mr, layer_pages, 1, context);
    unified_paging_baseline r(plan, unified_mode::compressed_reclaim, mr, layer_pages, 1, context);
    auto fs = *f.try_admit(), rs = *r.try_admit();
    for (std::int64_t n = 0; n < context; n += chunk) {
      (void)f.prefill_chunk(fs, std::min(chunk, context - n));
      (void)r.prefill_chunk(rs, std::min(chunk, context - n));
    }
    full        = static_cast<double>(f.pool().stats().peak_used * f.page_bytes());
    steady      = static_cast<double>(r.pages_held(rs) * r.page_bytes());
    peak        = static_cast<double>(r.pool().stats().peak_used * r.page_bytes());
    reclaim_ops = r.stats().reclaim_ops;
    base_allocs = r.stats().pages_allocated;
  }
  // What the plan's rule predicts for the groups' token counts (protect floor included), in bytes.
  for (auto const& g : plan.grouping.groups)
    rule_pred += static_cast<double>(g.members.size()) *
                 static_cast<double>(retained_tokens(g.rule, context));
  rule_pred *= head_token_bytes;
  double predicted                              = report.reserved_over_ideal * (1 + waste);
  state.counters["ideal_GiB"]                   = ideal / (1 << 30);
  state.counters["tangram_eff"]                 = tangram / ideal;
  state.counters["plan_pred_eff"]               = predicted;
  state.counters["tangram_over_plan_pred"]      = (tangram / ideal) / predicted;
  state.counters["rule_pred_eff"]               = rule_pred / ideal;
  state.counters["tangram_over_rule_pred"]      = tangram / rule_pred;
  state.counters["reserved_over_ideal"]         = report.reserved_over_ideal;
  state.counters["group_waste"]                 = waste;
  state.counters["tangram_reclaim_ops"]         = static_cast<double>(tangram_reclaimed);
  state.counters["tangram_pages_allocated"]     = static_cast<double>(tangram_drawn);
  state.counters["full_kv_eff"]                 = full / ideal;
  state.counters["unified_reclaim_steady_eff"]  = steady / ideal;
  state.counters["unified_reclaim_peak_eff"]    = peak / ideal;
  state.counters["unified_reclaim_ops"]         = static_cast<double>(reclaim_ops);
  state.counters["unified_pages_allocated"]     = static_cast<double>(base_allocs);
  state.counters["full_kv_over_tangram"]        = full / tangram;
  state.counters["unified_steady_over_tangram"] = steady / tangram;
  state.counters["unified_peak_over_tangram"]   = peak / tangram;
}

/// One request per sample through a manager; returns {reserved, held, clipped, wanted, staging}.
struct elastic_run {
  double reserved = 0, held = 0, clipped = 0, wanted = 0, staging = 0, reclaimed = 0;
};

elastic_run run_samples(static_plan const& plan, retention_samples const& s, std::int64_t chunk) {
  elastic_run out;
  bool elastic = plan.options.reservation.mode == reservation_mode::elastic;
  // Elastic: the simulator's eviction step (sample k's needs for request k, scaled by the tokens
  // seen; the optimal group lengths within elastic_page_limit). Static: each head keeps
  // min(need, its budget's count).
  sim::elastic_eviction eviction(plan, sim::elastic_needs{s, 1.0});
  auto heads = static_cast<std::size_t>(plan.num_layers * plan.num_kv_heads);
  simulated_memory_resource mr;
  manager_options o;
  o.num_pages        = 1 << 24;
  o.max_sequences    = 1;
  o.max_chunk_tokens = chunk;
  kv_cache_manager m(plan, mr, o);
  std::vector<std::int32_t> kept(heads);
  for (std::size_t k = 0; k < s.samples.size(); ++k) {
    auto const& smp = s.samples[k];
    auto n          = smp.context_tokens;
    auto id         = *m.try_admit(n, 0);
    out.reserved += static_cast<double>(m.info(id).reserved_pages);
    out.staging += static_cast<double>(
        elastic
            ? m.admission_pages(n, 0) -
                  elastic_footprint_pages(plan, plan.options.reservation.margin_or_default(), n, 0)
            : 0);
    for (std::int64_t seen = 0; seen < n;) {
      auto c = std::min(chunk, n - seen);
      seen += c;
      m.prepare_chunk(id, c);
      m.expected_kept(id, c, kept.data());  // candidates (elastic) or the static cap
      if (elastic) {
        (void)eviction.choose(m, id, static_cast<std::int32_t>(k), c, kept);
      } else {
        for (std::size_t h = 0; h < heads; ++h)
          kept[h] = static_cast<std::int32_t>(
              std::min<std::int64_t>(ceil_div(smp.kept[h] * seen, n), kept[h]));
      }
      m.commit_chunk(id, kept);
    }
    for (std::size_t h = 0; h < heads; ++h) {
      auto want = std::min<std::int64_t>(smp.kept[h], n);
      out.wanted += static_cast<double>(want);
      out.clipped += static_cast<double>(std::max<std::int64_t>(0, want - kept[h]));
    }
    for (std::int32_t g = 0; g < m.num_groups(); ++g)
      out.held += static_cast<double>(m.group_page_count(id, g));
    m.free(id);
  }
  out.reclaimed = static_cast<double>(m.stats().reclaimed_pages);
  return out;
}

/// Static budgets against elastic reservation on every sample of a profile: groups of `hp` heads,
/// elastic at `margin` (4 / 0.15, or the defaults 1 / default_elastic_margin: per-head pages).
void elastic_vs_static(benchmark::State& state,
                       std::string scorer,
                       std::string model,
                       std::int32_t hp,
                       double margin) {
  auto const& s = samples(scorer, model);
  auto stat     = static_plan_of(scorer, model, hp);
  auto elastic  = sim::elastic_plan(stat, margin);
  elastic_run a, b;
  for (auto _ : state) {
    a = run_samples(stat, s, 4096);
    b = run_samples(elastic, s, 4096);
  }
  // Ideal pages: the scorer's needs packed Hp * P head-tokens per page, no padding.
  double cell  = static_cast<double>(stat.geometry.group_size * stat.geometry.page_tokens);
  double ideal = a.wanted / cell;
  state.counters["static_reserved_over_ideal"]   = a.reserved / ideal;
  state.counters["elastic_reserved_over_ideal"]  = (b.reserved - b.staging) / ideal;
  state.counters["elastic_staging_over_ideal"]   = b.staging / ideal;
  state.counters["static_held_over_ideal"]       = a.held / ideal;
  state.counters["elastic_held_over_ideal"]      = b.held / ideal;
  state.counters["static_clip"]                  = a.clipped / a.wanted;
  state.counters["elastic_clip"]                 = b.clipped / b.wanted;
  state.counters["elastic_over_static_reserved"] = (b.reserved - b.staging) / a.reserved;
  state.counters["reclaimed_pages"]              = a.reclaimed + b.reclaimed;
  state.counters["requests"]                     = static_cast<double>(s.samples.size());
}

void register_efficiency() {
  for (std::string scorer : {"snapkv", "ea", "keydiff", "fastkvzip"})
    for (std::int64_t ctx : {32768, 131072})
      benchmark::RegisterBenchmark(
          ("memory_efficiency/" + scorer + "/" + std::to_string(ctx / 1024) + "K").c_str(),
          [scorer, ctx](benchmark::State& st) { memory_efficiency(st, scorer, ctx); })
          ->Iterations(1)
          ->Unit(benchmark::kMillisecond);
  for (std::int32_t hp : {4, 1})
    for (std::string model : {"llama-3.1-8b", "qwen3-4b"})
      for (std::string scorer : {"snapkv", "ea", "keydiff", "fastkvzip"}) {
        double margin = hp == 1 ? default_elastic_margin : 0.15;
        benchmark::RegisterBenchmark(
            ("elastic_vs_static/" + scorer + "/" + model + "/hp" + std::to_string(hp)).c_str(),
            [scorer, model, hp, margin](benchmark::State& st) {
              elastic_vs_static(st, scorer, model, hp, margin);
            })
            ->Iterations(1)
            ->Unit(benchmark::kMillisecond);
      }
}
int const registered = (register_efficiency(), 0);

}  // namespace
