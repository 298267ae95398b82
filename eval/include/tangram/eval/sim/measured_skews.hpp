// SPDX-License-Identifier: Apache-2.0
/**
 * @file eval/sim/measured_skews.hpp
 * @brief The decode skews `tangram simulate` charges (eval/sim/serving_costs.hpp), measured by the
 * split evaluators of eval/split_imbalance.hpp: on the reference batch (32 requests, contexts
 * log-uniform in 1K-128K, seed 1; the printed figure) and on one batch of each size a step may
 * decode (`measured_skew_batches`, the same contexts' distribution and seed), each policy on its
 * own per-input lengths: Tangram's static plan on its budgets, the elastic plan on its placements
 * of the samples (both on the split map Tangram runs, `tangram_split`), the dynamic baselines'
 * per-step planner on each input's own retention
 * (`own_layer_imbalance`; layer-wide pages read to the layer's longest head unless masked).
 */
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "tangram/eval/sim/cost_model.hpp"
#include "tangram/eval/sim/serving_costs.hpp"
#include "tangram/eval/split_imbalance.hpp"
#include "tangram/plan/static_plan.hpp"
#include "tangram/profile/retention_samples.hpp"

namespace tangram::sim {

/// @brief One policy's measured skew: at the reference batch and by decode batch size.
struct measured_skew {
  double reference = 1.0;
  skew_curve by_batch;
};

/// Contexts of a batch of `n` requests drawn as the reference batch draws its 32.
inline std::vector<std::int64_t> skew_batch_contexts(std::int32_t n) {
  reference_batch rb;
  rb.requests = n;
  return rb.contexts();
}

/// `skew_at(contexts)` (a skew >= 1 of one batch) on the reference batch and at each of `batches`.
template <class SkewAt>
measured_skew measure_skew(std::vector<std::int32_t> const& batches, SkewAt&& skew_at) {
  measured_skew out;
  out.reference = std::max(1.0, skew_at(reference_batch{}.contexts()));
  for (auto n : batches) {
    out.by_batch.batch.push_back(n);
    out.by_batch.skew.push_back(std::max(1.0, skew_at(skew_batch_contexts(n))));
  }
  return out;
}

/// The per-step planner's skew of one batch: the better greedy planner (1 or 4 chunks a slot).
inline double planner_skew_of(batch_imbalance const& imb) {
  return std::max(1.0, std::min(imb.greedy.mean, imb.greedy_fine.mean));
}

/// The dynamic baselines' per-step planner skew of one batch: on each input's own retention from
/// `samples` (`own_layer_imbalance`, every head read to its layer's longest when
/// `padded_to_layer`), or, without samples, on the plan's budget rules.
inline double planner_skew_at(static_plan const& plan,
                              retention_samples const* samples,
                              std::vector<std::int64_t> const& contexts,
                              bool padded_to_layer) {
  return planner_skew_of(samples ? own_layer_imbalance(plan, *samples, contexts, 1, padded_to_layer)
                                 : layer_imbalance(plan.rules, plan.splits, contexts));
}

/// Tangram's skew of one batch on the split map `split` runs: the plan's AOT map, the map
/// balanced per step on the device (kernels/balanced_split.hpp), or the layer stream.
inline double tangram_skew_of(batch_imbalance const& imb, tangram_split split) {
  return split == tangram_split::balanced ? imb.balanced.mean
         : split == tangram_split::stream ? imb.stream.mean
                                          : imb.aot.mean;
}

/// Tangram's static plan's skew of one batch: every head holding its budget (`layer_imbalance`).
inline double static_skew_at(static_plan const& plan,
                             std::vector<std::int64_t> const& contexts,
                             tangram_split split) {
  return tangram_skew_of(layer_imbalance(plan.rules, plan.splits, contexts), split);
}

/// Tangram elastic's skew of one batch: the elastic plan `ep`'s split map on its placements of
/// `samples` (`elastic_layer_imbalance`), or, without samples, on its rules.
inline double elastic_skew_at(static_plan const& ep,
                              retention_samples const* samples,
                              std::vector<std::int64_t> const& contexts,
                              tangram_split split) {
  return tangram_skew_of(samples ? elastic_layer_imbalance(ep, *samples, contexts, 1)
                                 : layer_imbalance(ep.rules, ep.splits, contexts),
                         split);
}

}  // namespace tangram::sim
