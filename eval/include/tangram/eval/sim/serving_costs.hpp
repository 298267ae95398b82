// SPDX-License-Identifier: Apache-2.0
/**
 * @file eval/sim/serving_costs.hpp
 * @brief The costs `tangram simulate` charges beyond the roofline, with their sources, and the
 * `step_charges` (eval/sim/cost_model.hpp) each policy pays. Every value is MODELLED; the
 * measured and cited constants and the paper's figures are in eval/sim/measured_costs.hpp. Two
 * settings (`cost_setting`): `paper` (the paper's constants) and `competent` (what a competent
 * engine pays: measured low ends, overlapped planning, perfect balance, masked reads).
 *
 * - reclamation: the paper's +10-25% of prefill time, charged as `reclaim_prefill_fraction` of the
 *   prefill time of every chunk that reclaims pages (paper: 0.175), plus `reclaim_s_per_page` per
 *   reclaimed page (competent: a batched free on this project's page pool, measured, ~1 ns). No
 *   constant is fitted to a simulate run (the earlier 3.2 us a page was 0.175 x the baseline's own
 *   modelled prefill over its own reclaimed pages: the result it then explained).
 * - padded_reads (structural, on): a decode step reads whole pages. Unified pages are as long as
 *   the layer's longest head (every head is read up to it); Tangram's head-group pages as long as
 *   the group's longest head; per-head pages as long as their head. Every policy pays its own.
 * - baseline_reads (structural): the dynamic baselines may run a kernel that masks each head at
 *   its own length and reads only its live tokens (competent); Tangram (and the ablation's steps)
 *   keep paying whole group pages (its own kernel reads live tokens only: conservative).
 * - decode skew: policies without an ahead-of-time split. `baseline_balance::none`: 1.4-1.7x
 *   (paper, 1.55). `replan` (paper setting): a per-step planner whose skew is the better greedy
 *   planner's measured imbalance (eval/split_imbalance.hpp) on each baseline's OWN per-input
 *   lengths from the samples (layer-wide pages: every head read to its layer's longest unless
 *   masked; per-head pages: each head's own), at batch sizes 1, 2, 4, ... max_running; each step
 *   pays the skew of its own decode batch size. `perfect` (competent): skew 1. Tangram pays its
 *   split map's measured imbalance on its own lengths: by default the map balanced per step on the
 *   device (`tangram_split::balanced`, kernels/balanced_split.hpp), which also pays one launch per
 *   decoding step (`split_balance_s`, measured on an H200 by decode batch);
 *   `tangram_split::aot` the plan's ahead-of-time map alone.
 *   full_kv: heads are equal, 1.0.
 * - re-planning (policies that balance per step): `replan_mode::fraction`: 15-20% of a decode
 *   step (paper, 0.175); `planner`: the host time of FlashInfer's decode plan() for the step's
 *   planned sequences (cited measurement, eval/sim/measured_costs.hpp), serialised with the step;
 *   `overlapped` (competent): the same, hidden behind the previous step, so only what exceeds it
 *   is charged. Per-head lengths are planned as one sequence per (request, KV head).
 * - step_overhead_s (uncalibrated): fixed per engine step (kernel launches, scheduling, sampling),
 *   the same for every policy; 1 ms default, range 0.2-3 ms. To be measured on a GPU.
 * - control_plane (measured, charged by default): the wall time inside each step's policy calls
 *   (admission, chunk commit, decode step) added to modelled time, for a host control plane that
 *   does not overlap the GPU. A measured time makes runs differ: `--no-control-plane` leaves it
 *   out for deterministic runs.
 */
#pragma once

#include <algorithm>
#include <cstdint>
#include <cmath>
#include <string>
#include <string_view>
#include <vector>

#include "tangram/core/error.hpp"
#include "tangram/eval/sim/cost_model.hpp"
#include "tangram/eval/sim/measured_costs.hpp"

namespace tangram::sim {

/// @brief How the dynamic baselines balance their non-uniform heads in decode.
enum class baseline_balance : std::uint8_t {
  replan,   ///< a per-step planner (FlashInfer plan()): its measured skew, pays re-planning
  none,     ///< no load balancing: pays the unbalanced decode skew
  perfect,  ///< a per-step planner that balances perfectly: skew 1, still pays re-planning
};

constexpr std::string_view to_string(baseline_balance b) noexcept {
  return b == baseline_balance::replan ? "replan" : b == baseline_balance::none ? "none" : "perfect";
}

/// @brief The decode split map Tangram's policies run (file comment).
enum class tangram_split : std::uint8_t {
  balanced,  ///< balanced per step on the device (balance_decode_splits): pays one launch a step
  aot,       ///< the plan's ahead-of-time map alone
  /// the layer stream (layer_stream_split): CTAs cut the layer's tokens across heads; nothing
  /// planned or launched per step
  stream,
};

constexpr std::string_view to_string(tangram_split s) noexcept {
  return s == tangram_split::balanced ? "balanced" : s == tangram_split::aot ? "aot" : "stream";
}

/// @brief The two cost settings of the verdict (file comment).
enum class cost_setting : std::uint8_t { paper, competent };

constexpr std::string_view to_string(cost_setting c) noexcept {
  return c == cost_setting::paper ? "paper" : "competent";
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

/// The name of the dynamic per-head baseline (eval/sim/per_head_policy.hpp).
inline constexpr char const* per_head_dynamic_name = "per_head_dynamic";

/// @brief The cost constants of a simulate run (file comment for each source).
struct serving_costs {
  double reclaim_s_per_page = 0;  ///< per reclaimed page (measured low end)
  double reclaim_prefill_fraction =
      paper_costs::reclaim_prefill_fraction;  ///< of reclaiming chunks
  bool padded_reads            = true;
  bool baseline_masked_reads   = false;  ///< the dynamic baselines read live tokens only
  baseline_balance balance     = baseline_balance::replan;
  double unbalanced_skew       = paper_costs::unbalanced_skew;
  replan_mode replan           = replan_mode::fraction;
  double replan_fraction       = paper_costs::replan_fraction;  ///< replan_mode::fraction
  double step_overhead_s       = 1e-3;
  bool control_plane           = true;  ///< add the measured policy time
  double planner_skew          = 1.0;   ///< measured: per-step planner, unified pages
  double per_head_planner_skew = 1.0;   ///< measured: per-step planner, per-head pages
  double tangram_skew          = 1.0;   ///< measured: Tangram's split (`split`)
  double tangram_elastic_skew  = 1.0;   ///< measured: the elastic plan's split (`split`)
  /// Tangram's decode split map; the caller measures the two Tangram skews on it. Balanced, each
  /// decoding step pays the launch measured at its batch (`split_balance_s`).
  tangram_split split = tangram_split::balanced;
  /// The same four measured at several batch sizes (empty: the scalars above at every batch).
  /// A step pays the skew of its own decode batch size (`skew_curve::at`).
  skew_curve planner_skew_by_batch, per_head_planner_skew_by_batch, tangram_skew_by_batch,
      tangram_elastic_skew_by_batch;
  /// KV heads per layer: a per-step planner over per-head lengths plans one sequence per
  /// (request, KV head) (replan_mode::planner and overlapped).
  std::int32_t kv_heads = 1;

  /// The constants of `setting` (file comment); the measured skews are left at 1 for the caller.
  static serving_costs preset(cost_setting setting) {
    serving_costs c;
    if (setting == cost_setting::competent) {
      c.reclaim_s_per_page       = pinned_batched_free_s_per_page;
      c.reclaim_prefill_fraction = 0;
      c.replan                   = replan_mode::overlapped;
      c.balance                  = baseline_balance::perfect;
      c.baseline_masked_reads    = true;
    }
    return c;
  }

  static constexpr cost_range unbalanced_skew_range() {
    return {paper_costs::unbalanced_skew_low, paper_costs::unbalanced_skew_high};
  }
  static constexpr cost_range replan_range() {
    return {paper_costs::replan_low, paper_costs::replan_high};
  }
  static constexpr cost_range step_overhead_range() { return {0.2e-3, 3e-3}; }

  /**
   * @brief What policy `name` (full_kv, unified_nonuniform, per_head_dynamic, tangram,
   * tangram_elastic, the ablation's reservation_only and +head_groups, or any other: no skew, no
   * re-planning) pays. A masked kernel (`baseline_masked_reads`) is the compared dynamic
   * baselines' alone: the ablation's steps keep Tangram's reads, so its steps differ only by
   * layout, split and reservation.
   */
  [[nodiscard]] step_charges charges_for(std::string_view name) const {
    step_charges c;
    c.reclaim_s_per_page       = reclaim_s_per_page;
    c.reclaim_prefill_fraction = reclaim_prefill_fraction;
    c.padded_reads             = padded_reads;
    c.step_overhead_s          = step_overhead_s;
    c.control_plane            = control_plane;
    bool const per_head        = name == per_head_dynamic_name;
    if (name == "unified_nonuniform" || per_head)
      c.padded_reads = padded_reads && !baseline_masked_reads;
    // The ablation's steps without the AOT split (eval/sim/ablation.hpp) balance decode the way
    // the baseline does.
    if (name == "unified_nonuniform" || per_head || name == "reservation_only" ||
        name == "+head_groups") {
      if (balance != baseline_balance::none) {
        c.replan                       = replan;
        c.replan_fraction              = replan_fraction;
        c.replan_sequences_per_request = kv_heads;
      }
      if (balance == baseline_balance::replan) {
        c.decode_skew          = per_head ? per_head_planner_skew : planner_skew;
        c.decode_skew_by_batch = per_head ? per_head_planner_skew_by_batch : planner_skew_by_batch;
      } else if (balance == baseline_balance::none) {
        c.decode_skew = unbalanced_skew;
      }
    } else if (name == "tangram" || name == "tangram_elastic") {
      bool const elastic     = name == "tangram_elastic";
      c.decode_skew          = elastic ? tangram_elastic_skew : tangram_skew;
      c.decode_skew_by_batch = elastic ? tangram_elastic_skew_by_batch : tangram_skew_by_batch;
      c.balanced_split       = split == tangram_split::balanced;
    }
    return c;
  }
};

}  // namespace tangram::sim
