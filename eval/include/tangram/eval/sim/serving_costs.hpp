// SPDX-License-Identifier: Apache-2.0
/**
 * @file eval/sim/serving_costs.hpp
 * @brief The costs `tangram simulate` charges beyond the roofline, with their sources, and the
 * `step_charges` (eval/sim/cost_model.hpp) each policy pays. Every value is MODELLED; the
 * uncalibrated ones carry a plausible range that `--sensitivity` sweeps.
 *
 * - reclaim_s_per_page (uncalibrated): the paper measured +10-25% prefill time for dynamic
 *   reclamation on unified pages. Per page: 0.175 (the midpoint) x the baseline's modelled prefill
 *   time / its reclaimed pages in the default run (`simulate`, mid, Llama-3.1-8B bf16, H200,
 *   chunk 8192, per-input retention: 141.8 s of prefill over 7,661,529 reclaimed pages, so
 *   0.175 x 141.8 / 7.66e6 = 3.2 us a page). Range: the paper's 10% and 25% ends scaled the same
 *   way (1.8-4.6 us).
 * - padded_reads (structural, on): a decode step reads whole pages. Unified pages are as long as
 *   the layer's longest head (every head is read up to it); Tangram's head-group pages as long as
 *   the group's longest head. Both policies pay their own padding.
 * - baseline_reads (structural, padded by default): the unified baseline may instead run a kernel
 *   that masks each head at its own length and reads only its live tokens (a FlashInfer-style
 *   ragged kernel over per-head lengths). `--sensitivity` sweeps both; Tangram (and the
 *   ablation's steps) keep paying whole pages at both points (Tangram's own kernel reads live
 *   tokens only, so this side is conservative).
 * - decode skew: policies without an ahead-of-time split. With `baseline_balance::none` the
 *   baseline's decode attention runs 1.4-1.7x slower (paper, no load balancing; 1.55 default,
 *   uncalibrated). With `baseline_balance::replan` (default) it re-plans every step like
 *   FlashInfer's plan(): skew is the better per-step greedy planner's measured imbalance (1 or 4
 *   chunks per slot; eval/split_imbalance.hpp) and it pays replan_fraction.
 *   Tangram pays its AOT split map's measured imbalance. Both are measured on log-uniform
 *   1K-128K contexts at batch sizes 1, 2, 4, ... up to the engine's max_running, and each step
 *   pays the skew of its own decode batch size; the scalar figures are the reference batch of 32.
 *   full_kv: heads are equal, 1.0.
 * - replan_fraction (uncalibrated): per-step re-planning costs 15-20% of a decode step (paper);
 *   0.175 default. Charged to the unified baseline when it balances by re-planning; Tangram's
 *   split is planned ahead of time (none).
 * - step_overhead_s (uncalibrated): fixed per engine step (kernel launches, scheduling, sampling),
 *   the same for every policy; 1 ms default, range 0.2-3 ms (CUDA-graph decode to an eager
 *   engine's Python step). To be measured with scripts/gpu_check.sh once a GPU is available.
 * - control_plane (measured, off by default): the wall time inside each step's policy calls
 *   (admission, chunk commit, decode step) added to modelled time, for a host control plane that
 *   does not overlap the GPU. Off by default because a measured time makes runs differ.
 */
#pragma once

#include <algorithm>
#include <cstdint>
#include <cmath>
#include <string>
#include <string_view>
#include <vector>

#include "tangram/error.hpp"
#include "tangram/eval/sim/cost_model.hpp"

namespace tangram::sim {

/// @brief How the unified-page baseline balances its non-uniform heads in decode.
enum class baseline_balance : std::uint8_t {
  replan,   ///< a per-step planner (FlashInfer plan()): its measured skew, pays replan_fraction
  none,     ///< no load balancing: pays the unbalanced decode skew
  perfect,  ///< a per-step planner that balances perfectly: skew 1, still pays replan_fraction
};

constexpr std::string_view to_string(baseline_balance b) noexcept {
  return b == baseline_balance::replan ? "replan" : b == baseline_balance::none ? "none" : "perfect";
}

/// The batch sizes the decode skews are measured at: 1, 2, 4, ... up to `max_running` (which is
/// included), and at most 4096 (the decode kernel's largest batch).
inline std::vector<std::int32_t> measured_skew_batches(std::int32_t max_running) {
  std::int32_t top = std::max(1, std::min(max_running, 4096));
  std::vector<std::int32_t> out;
  for (std::int32_t n = 1; n < top; n *= 2) out.push_back(n);
  out.push_back(top);
  return out;
}

/// @brief A plausible range of an uncalibrated constant (what `--sensitivity` sweeps).
struct cost_range {
  double low = 0, high = 0;
};

/// @brief The cost constants of a simulate run (file comment for each source).
struct serving_costs {
  static constexpr double paper_reclaim_mid   = 0.175;  ///< +17.5% prefill (paper: 10-25%)
  static constexpr double default_reclaim     = 3.2e-6;
  double reclaim_s_per_page                   = default_reclaim;
  bool padded_reads                           = true;
  bool baseline_masked_reads                  = false;  ///< the baseline reads live tokens only
  baseline_balance balance                    = baseline_balance::replan;
  double unbalanced_skew                      = 1.55;  ///< paper: 1.4-1.7
  double replan_fraction                      = 0.175;  ///< paper: 15-20% of a decode step
  double step_overhead_s                      = 1e-3;
  bool control_plane                          = false;  ///< add the measured policy time
  double planner_skew                         = 1.0;  ///< measured: per-step greedy planner
  double tangram_skew                         = 1.0;  ///< measured: Tangram's AOT split
  double tangram_elastic_skew                 = 1.0;  ///< measured: the elastic plan's split
  /// The same three measured at several batch sizes (empty: the scalars above at every batch).
  /// A step pays the skew of its own decode batch size (`skew_curve::at`).
  skew_curve planner_skew_by_batch, tangram_skew_by_batch, tangram_elastic_skew_by_batch;

  static constexpr cost_range reclaim_range() {
    return {default_reclaim * 0.10 / paper_reclaim_mid, default_reclaim * 0.25 / paper_reclaim_mid};
  }
  static constexpr cost_range unbalanced_skew_range() { return {1.4, 1.7}; }
  static constexpr cost_range replan_range() { return {0.15, 0.20}; }
  static constexpr cost_range step_overhead_range() { return {0.2e-3, 3e-3}; }

  /**
   * @brief What policy `name` (full_kv, unified_nonuniform, tangram, tangram_elastic, the
   * ablation's reservation_only and +head_groups, or any other: no skew, no re-planning) pays.
   * A masked kernel (`baseline_masked_reads`) is the compared baseline's alone: the ablation's
   * steps keep Tangram's reads, so its steps differ only by layout, split and reservation.
   */
  [[nodiscard]] step_charges charges_for(std::string_view name) const {
    step_charges c;
    c.reclaim_s_per_page = reclaim_s_per_page;
    c.padded_reads       = padded_reads;
    c.step_overhead_s    = step_overhead_s;
    c.control_plane      = control_plane;
    // The ablation's steps without the AOT split (eval/sim/ablation.hpp) balance decode the way
    // the baseline does.
    if (name == "unified_nonuniform") c.padded_reads = padded_reads && !baseline_masked_reads;
    if (name == "unified_nonuniform" || name == "reservation_only" || name == "+head_groups") {
      if (balance == baseline_balance::perfect) {
        c.replan_fraction = replan_fraction;  // skew stays 1
      } else if (balance == baseline_balance::replan) {
        c.decode_skew          = planner_skew;
        c.decode_skew_by_batch = planner_skew_by_batch;
        c.replan_fraction      = replan_fraction;
      } else {
        c.decode_skew = unbalanced_skew;
      }
    } else if (name == "tangram") {
      c.decode_skew          = tangram_skew;
      c.decode_skew_by_batch = tangram_skew_by_batch;
    } else if (name == "tangram_elastic") {
      c.decode_skew          = tangram_elastic_skew;
      c.decode_skew_by_batch = tangram_elastic_skew_by_batch;
    }
    return c;
  }
};

}  // namespace tangram::sim
