// SPDX-License-Identifier: Apache-2.0
/**
 * @file eval/sim/measured_costs.hpp
 * @brief The cost constants `tangram simulate` takes from measurements, each with its source, and
 * the paper's figures beside them (eval/sim/serving_costs.hpp prices each policy with them;
 * docs/benchmarks.md#the-verdict lists them). No constant here is derived from a simulate result.
 *
 * - Reclamation, low end (measured in-process on this project's page pool): returning a batch of
 *   pages to `page_pool` (what an engine's batched or lazy free of an evicted chunk's tail does)
 *   costs `measure_batched_free_s_per_page()`; `pinned_batched_free_s_per_page` is its figure
 *   from `bench_memory --benchmark_filter=batched_free` (2026-12-03, 2-core x86-64 VM, g++ 12,
 *   Release, median of 3 repetitions; the machine shared with other builds): 1.1 ns a page.
 *   test/sim/verdict_costs_test.cpp re-measures it (finite, within orders of magnitude; no timing
 *   threshold), and `simulate --verdict` re-measures and prints it beside the pinned figure.
 * - Reclamation, high end (paper): +10-25% of prefill time for dynamic reclamation on unified
 *   pages; charged as that fraction of the prefill time of every chunk that reclaims pages
 *   (midpoint 0.175), never as a per-page constant fitted to a run.
 * - Re-planning (measured by others, cited): host time of one FlashInfer decode `plan()` call,
 *   flashinfer-ai/flashinfer pull request 5043 (2026-09-09; RTX 4090, Ryzen 9 5950X host, torch
 *   2.14, KV length 512-4096, page size 16, 8 KV heads, head dim 128, median of 6 runs): 76 us at
 *   batch 64, 87 us at 256, 112 us at 1024 with that change (173, 461 and 1,605 us before it).
 *   `planner_host_s(n)` interpolates the "after" figures linearly in the batch (n the planned
 *   sequences; 76 us below 64, the last slope above 1024). Paper: 15-20% of a decode step.
 * - Decode skew without balancing (paper): 1.4-1.7x.
 * - Host link (for offloaded KV): eval/sim/gpu_presets.hpp (`host_link_bytes_per_s`).
 */
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <utility>
#include <vector>

#include "tangram/core/error.hpp"
#include "tangram/core/page_layout.hpp"
#include "tangram/eval/sim/simulated_memory_resource.hpp"
#include "tangram/memory/memory_resource.hpp"
#include "tangram/memory/page_pool.hpp"

namespace tangram::sim {

/// @brief The paper's figures (as summarised in /work/shared/design/brief.md): midpoints and
/// ranges.
struct paper_costs {
  static constexpr double reclaim_prefill_fraction = 0.175;  ///< +10-25% prefill time
  static constexpr double reclaim_prefill_low      = 0.10;
  static constexpr double reclaim_prefill_high     = 0.25;
  static constexpr double replan_fraction          = 0.175;  ///< 15-20% of a decode step
  static constexpr double replan_low               = 0.15;
  static constexpr double replan_high              = 0.20;
  static constexpr double unbalanced_skew          = 1.55;  ///< 1.4-1.7x without balancing
  static constexpr double unbalanced_skew_low      = 1.4;
  static constexpr double unbalanced_skew_high     = 1.7;
};

/// Seconds per page of a batched free on `page_pool`, as `bench_memory` measured it (file comment).
inline constexpr double pinned_batched_free_s_per_page = 1.1e-9;

/**
 * @brief Measures, in this process, the time per page of returning `batch` pages to a
 * `page_pool` in one batch (each page allocated before the clock starts): the median over
 * `rounds` rounds. What an engine's batched free of evicted tail pages costs on this pool.
 * @throw invalid_argument when batch or rounds is < 1 or batch exceeds the pool's page ids.
 */
inline double measure_batched_free_s_per_page(std::int64_t batch = 4096, std::int32_t rounds = 33) {
  TANGRAM_EXPECTS(batch >= 1 && batch <= page_pool<>::max_pages,
                  invalid_argument,
                  "measure_batched_free.batch: must be in [1, ",
                  page_pool<>::max_pages,
                  "], got ",
                  batch);
  TANGRAM_EXPECTS(
      rounds >= 1, invalid_argument, "measure_batched_free.rounds: must be >= 1, got ", rounds);
  simulated_memory_resource mr;
  page_pool<> pool(mr, page_layout<>(page_geometry{16, 1, 128, dtype::bf16}), batch);
  std::vector<page_id> pages(static_cast<std::size_t>(batch));
  std::vector<double> per_page(static_cast<std::size_t>(rounds));
  using clock = std::chrono::steady_clock;
  for (auto& r : per_page) {
    for (auto& p : pages) p = *pool.try_allocate();
    auto t0 = clock::now();
    for (auto p : pages) pool.release(p);
    r = std::chrono::duration<double>(clock::now() - t0).count() / static_cast<double>(batch);
  }
  std::nth_element(per_page.begin(), per_page.begin() + rounds / 2, per_page.end());
  return per_page[static_cast<std::size_t>(rounds / 2)];
}

/// @brief The per-step balanced split map's launch (kernels/balanced_split.hpp) by decode batch:
/// (batch, seconds), measured on an H200 (2026-12-04, bench/gpu/decode.cu `BM_balance_splits/B`:
/// one launch over one layer of 8 KV heads, CUDA events, L2 flushed before each launch; nvcc 13.0,
/// sm_90). Each warp's requests are a chain of dependent loads, so the time grows with the batch.
inline constexpr std::array<std::pair<std::int64_t, double>, 2> split_balance_launch_s{
    {{32, 11.7e-6}, {1024, 39.9e-6}}};

/// `table`'s seconds at batch `n`: linear between its points, the first point's below it and the
/// last slope beyond it. `table` ascends in the batch.
template <std::size_t N>
double interpolate_by_batch(std::array<std::pair<std::int64_t, double>, N> const& table,
                            std::int64_t n) {
  static_assert(N >= 2, "interpolate_by_batch: two points at least");
  if (n <= table.front().first) return table.front().second;
  std::size_t i = 1;
  while (i + 1 < N && n > table[i].first) ++i;
  auto [n0, s0] = table[i - 1];
  auto [n1, s1] = table[i];
  return s0 + (s1 - s0) * static_cast<double>(n - n0) / static_cast<double>(n1 - n0);
}

/// Device time of one balance_decode_splits launch for a decode batch of `n` (measured, above).
inline double split_balance_s(std::int64_t n) {
  return interpolate_by_batch(split_balance_launch_s, n);
}

/// @brief FlashInfer's decode `plan()` host time by batch (file comment): (batch, seconds).
inline constexpr std::array<std::pair<std::int64_t, double>, 3> flashinfer_plan_host_s{
    {{64, 76e-6}, {256, 87e-6}, {1024, 112e-6}}};

/// Host time of one per-step decode plan over `n` sequences (file comment), seconds.
inline double planner_host_s(std::int64_t n) {
  return interpolate_by_batch(flashinfer_plan_host_s, n);
}

}  // namespace tangram::sim
