// SPDX-License-Identifier: Apache-2.0
/**
 * @file plan/elastic_split_map.hpp
 * @brief The split map of an elastic plan weighed on elastic placements of retention samples
 * (docs/planning.md#split-map-under-elastic-placement).
 *
 * Under elastic reservation a head's decode work is its group's length, chosen per request by the
 * placement, not its static budget. `batch_share` weighting is kept, with the requests' lengths
 * taken from placements: in reference batch m (the contexts of `reference_batch_contexts`), request
 * r is sample k (drawn uniformly by one mt19937_64 stream seeded with `placement_sample_seed`) at
 * context n; its per-head lengths are `elastic_placement_lengths(plan, sample_needs_at(plan, s, k,
 * n), n)` (needs scaled from the sample: modelled away from the sample's own context). Head h's
 * share in batch m is its tokens over its layer's tokens; Phi_h is the `share_quantile` quantile
 * of its shares over the batches, apportioned per layer as for every map.
 *
 * Without samples (a plan built from a budget profile alone) an elastic plan weighs each compressed
 * head by its group's rule (`split_rules` in build_static_plan.hpp), a poorer proxy.
 * Host only; pure (a function of its inputs); planning time, not a hot path.
 */
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

#include "tangram/core/error.hpp"
#include "tangram/plan/detail/stats.hpp"
#include "tangram/plan/elastic_placement.hpp"
#include "tangram/plan/split_planner.hpp"
#include "tangram/plan/static_plan.hpp"
#include "tangram/profile/retention_samples.hpp"

namespace tangram {

/// Seed of the sample draws of the placement reference batches: fixed, so a plan is a pure
/// function of its inputs.
inline constexpr std::uint64_t placement_sample_seed = 0x706c6163656dULL;

/**
 * @brief Phi of every head, [num_layers * num_kv_heads], from elastic placements of `samples`
 * (file comment).
 * @param plan an elastic plan with batch_share weighting; its rules, grouping, geometry, profile
 *        and options are used (not its split map)
 * @throw invalid_argument when the plan is not elastic or not batch_share, there are no samples, or
 *        the samples do not match the plan's heads.
 */
inline std::vector<double> elastic_placement_weights(static_plan const& plan,
                                                     retention_samples const& samples) {
  auto const& o = plan.options.split;
  TANGRAM_EXPECTS(plan.options.reservation.mode == reservation_mode::elastic,
                  invalid_argument,
                  "elastic_placement_weights: the plan reserves static budgets");
  TANGRAM_EXPECTS(o.weighting == split_weighting::batch_share,
                  invalid_argument,
                  "elastic_placement_weights: needs batch_share weighting, got ",
                  to_string(o.weighting));
  TANGRAM_EXPECTS(
      !samples.samples.empty(), invalid_argument, "elastic_placement_weights: no samples");
  auto contexts = reference_batch_contexts(o);
  auto B        = static_cast<std::size_t>(o.reference_batches);
  auto size     = static_cast<std::size_t>(o.reference_batch_size);
  auto H        = static_cast<std::size_t>(plan.num_kv_heads);
  auto L        = static_cast<std::size_t>(plan.num_layers);
  std::size_t F = L * H;
  std::vector<double> shares(F * B), tokens(F);  // shares[flat head * B + batch]
  std::mt19937_64 pick(placement_sample_seed);
  for (std::size_t m = 0; m < B; ++m) {
    std::fill(tokens.begin(), tokens.end(), 0.0);
    for (std::size_t r = 0; r < size; ++r) {
      auto k = std::min(samples.samples.size() - 1,
                        static_cast<std::size_t>(detail::canonical_uniform(pick) *
                                                 static_cast<double>(samples.samples.size())));
      auto n = contexts[m * size + r];
      auto len =
          elastic_placement_lengths(plan, sample_needs_at(plan, samples, k, n), n);
      for (std::size_t i = 0; i < F; ++i) tokens[i] += static_cast<double>(len[i]);
    }
    for (std::size_t l = 0; l < L; ++l) {
      double total = 0;
      for (std::size_t h = 0; h < H; ++h) total += tokens[l * H + h];
      for (std::size_t h = 0; h < H; ++h)
        shares[(l * H + h) * B + m] = total > 0 ? tokens[l * H + h] / total : 0.0;
    }
  }
  std::vector<double> phi(F), column(B);
  for (std::size_t i = 0; i < F; ++i) {
    std::copy_n(shares.begin() + static_cast<std::ptrdiff_t>(i * B), B, column.begin());
    phi[i] = detail::linear_quantile(column, o.share_quantile);
  }
  return phi;
}

/// @brief The split map of `plan` from `elastic_placement_weights(plan, samples)`.
/// @throw invalid_argument as elastic_placement_weights.
inline split_map elastic_placement_split_map(static_plan const& plan,
                                             retention_samples const& samples) {
  return split_map_from_weights(elastic_placement_weights(plan, samples),
                                plan.num_layers,
                                plan.num_kv_heads,
                                plan.options.split.limits);
}

}  // namespace tangram
