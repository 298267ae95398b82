// SPDX-License-Identifier: Apache-2.0
/**
 * @file plan/split_planner.hpp
 * @brief Builds the static Workload Split Map (the paper's Algorithm 1): per layer, N_CTA CTAs
 * shared among the KV heads in proportion to their expected work Phi, at least one each.
 */
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <optional>
#include <random>
#include <string_view>
#include <vector>

#include "tangram/core/error.hpp"
#include "tangram/core/retention.hpp"
#include "tangram/plan/detail/stats.hpp"
#include "tangram/plan/split_map.hpp"
#include "tangram/plan/split_options.hpp"

namespace tangram {

/// Seed of the reference batches: fixed, so a plan is a pure function of its inputs.
inline constexpr std::uint64_t reference_batch_seed = 0x7a6e6772616dULL;

/**
 * @brief The contexts of the batch_share reference batches: `reference_batches` batches of
 * `reference_batch_size` requests, batch-major, each drawn uniformly from `reference_contexts` by
 * one mt19937_64 stream seeded with `reference_batch_seed`. Drawn once per split map, so every
 * layer is weighed on the same batches (equal layers get equal shares).
 */
inline std::vector<std::int64_t> reference_batch_contexts(split_options const& options) {
  auto const& refs = options.reference_contexts;
  std::vector<std::int64_t> out(static_cast<std::size_t>(options.reference_batches) *
                                static_cast<std::size_t>(options.reference_batch_size));
  std::mt19937_64 rng(reference_batch_seed);
  for (auto& n : out) {
    auto i = static_cast<std::size_t>(detail::canonical_uniform(rng) * static_cast<double>(refs.size()));
    n      = refs[std::min(i, refs.size() - 1)];
  }
  return out;
}

/**
 * @brief Phi of every head of one layer under `options` (host only; planning time).
 *
 * batch_share: head h's share in reference batch m is
 * sum_r retained_tokens(h, n_r) / sum_h' sum_r retained_tokens(h', n_r) over the batch's contexts
 * n_r; Phi_h is the `share_quantile` quantile (linear, NumPy default) of its shares over the
 * batches. budget: Phi_h = B_h (1 for heads that are not compressed).
 * @param rules          the layer's `num_heads` head rules
 * @param batch_contexts `reference_batch_contexts(options)` (batch_share; ignored by budget)
 * @throw invalid_argument when batch_share is given batch_contexts of the wrong size.
 */
inline std::vector<double> split_weights(head_rule const* rules, std::int32_t num_heads,
                                         split_options const& options,
                                         std::vector<std::int64_t> const& batch_contexts) {
  auto H = static_cast<std::size_t>(num_heads);
  std::vector<double> phi(H);
  if (options.weighting == split_weighting::budget) {
    for (std::size_t h = 0; h < H; ++h)
      phi[h] = rules[h].kind == layer_kind::compressed ? rules[h].budget : 1.0;
    return phi;
  }
  auto B    = static_cast<std::size_t>(options.reference_batches);
  auto size = static_cast<std::size_t>(options.reference_batch_size);
  TANGRAM_EXPECTS(batch_contexts.size() == B * size, invalid_argument,
                  "split_weights: batch_contexts has ", batch_contexts.size(), " contexts, expected ",
                  B, " x ", size);
  std::vector<double> shares(H * B), tokens(H);  // shares[h * B + m]
  for (std::size_t m = 0; m < B; ++m) {
    std::fill(tokens.begin(), tokens.end(), 0.0);
    for (std::size_t r = 0; r < size; ++r) {
      std::int64_t n = batch_contexts[m * size + r];
      for (std::size_t h = 0; h < H; ++h) tokens[h] += static_cast<double>(retained_tokens(rules[h], n));
    }
    double total = std::accumulate(tokens.begin(), tokens.end(), 0.0);
    for (std::size_t h = 0; h < H; ++h) shares[h * B + m] = total > 0 ? tokens[h] / total : 0.0;
  }
  std::vector<double> column(B);
  for (std::size_t h = 0; h < H; ++h) {
    std::copy_n(shares.begin() + static_cast<std::ptrdiff_t>(h * B), B, column.begin());
    phi[h] = detail::linear_quantile(column, options.share_quantile);
  }
  return phi;
}

/**
 * @brief Apportions `total` seats to weights, at least one each, proportionally otherwise
 * (largest remainder; ties to the lower index, so the result is deterministic).
 * @throw invalid_argument when total < weights.size() or a weight is negative or not finite.
 */
inline std::vector<std::int32_t> apportion(std::vector<double> const& weights, std::int32_t total) {
  auto n = static_cast<std::int32_t>(weights.size());
  TANGRAM_EXPECTS(n >= 1, invalid_argument, "apportion: no weights");
  TANGRAM_EXPECTS(total >= n, invalid_argument, "N_CTA = ", total, " is smaller than the ", n,
                  " heads of a layer; every head needs at least one CTA");
  for (std::size_t i = 0; i < weights.size(); ++i)
    TANGRAM_EXPECTS(std::isfinite(weights[i]) && weights[i] >= 0, invalid_argument,
                    "apportion: weight ", i, " is ", weights[i]);
  if (std::accumulate(weights.begin(), weights.end(), 0.0) <= 0)
    return apportion(std::vector<double>(weights.size(), 1.0), total);  // no work anywhere: even
  std::vector<std::int32_t> seats(weights.size(), 0);
  std::vector<char> pinned(weights.size(), 0);
  // Heads whose proportional quota is below one are pinned to one seat; the rest share what is
  // left. Repeat until no remaining quota falls below one.
  while (true) {
    std::int32_t left = total;
    double weight_left = 0;
    for (std::size_t i = 0; i < weights.size(); ++i) {
      if (pinned[i])
        left -= 1;
      else
        weight_left += weights[i];
    }
    bool pinned_more = false;
    for (std::size_t i = 0; i < weights.size(); ++i) {
      if (pinned[i]) continue;
      double quota = weight_left > 0 ? left * weights[i] / weight_left : 0.0;
      if (quota < 1.0) {
        pinned[i]   = 1;
        pinned_more = true;
      }
    }
    if (pinned_more) continue;
    std::vector<std::pair<double, std::size_t>> remainders;
    std::int32_t given = 0;
    for (std::size_t i = 0; i < weights.size(); ++i) {
      if (pinned[i]) {
        seats[i] = 1;
        continue;
      }
      double quota = left * weights[i] / weight_left;
      seats[i]     = static_cast<std::int32_t>(std::floor(quota));
      given += seats[i];
      remainders.emplace_back(quota - std::floor(quota), i);
    }
    std::stable_sort(remainders.begin(), remainders.end(),
                     [](auto const& a, auto const& b) { return a.first > b.first; });
    for (std::int32_t k = 0; k < left - given; ++k) seats[remainders[static_cast<std::size_t>(k)].second] += 1;
    return seats;
  }
}

/**
 * @brief The split map that apportions each layer's N_CTA CTAs to its heads by `phi`
 * (`apportion`: at least one each, largest remainder). Shared by every weighting.
 * @param phi [num_layers * num_kv_heads] weights, >= 0 and finite
 * @throw invalid_argument when phi has the wrong size or a bad weight, or N_CTA is smaller than
 *        the heads of a layer.
 */
inline split_map split_map_from_weights(std::vector<double> const& phi, std::int32_t num_layers,
                                        std::int32_t num_kv_heads, device_limits const& limits) {
  TANGRAM_EXPECTS(num_layers >= 1 && num_kv_heads >= 1, invalid_argument,
                  "split_map_from_weights: num_layers and num_kv_heads must be >= 1, got ",
                  num_layers, " and ", num_kv_heads);
  auto H = static_cast<std::size_t>(num_kv_heads);
  TANGRAM_EXPECTS(phi.size() == static_cast<std::size_t>(num_layers) * H, invalid_argument,
                  "split_map_from_weights: expected ", static_cast<std::size_t>(num_layers) * H,
                  " weights, got ", phi.size());
  split_map m;
  m.num_layers   = num_layers;
  m.num_kv_heads = num_kv_heads;
  m.limits       = limits;
  m.phi          = phi;
  m.cta_begin.reserve(static_cast<std::size_t>(num_layers) * (H + 1));
  for (std::size_t l = 0; l < static_cast<std::size_t>(num_layers); ++l) {
    std::vector<double> layer(phi.begin() + static_cast<std::ptrdiff_t>(l * H),
                              phi.begin() + static_cast<std::ptrdiff_t>((l + 1) * H));
    auto seats         = apportion(layer, limits.max_ctas());
    std::int32_t begin = 0;
    for (std::size_t h = 0; h < H; ++h) {
      m.cta_begin.push_back(begin);
      begin += seats[h];
    }
    m.cta_begin.push_back(begin);
  }
  return m;
}

/**
 * @brief Algorithm 1: the static split map of a model.
 * @param rules [num_layers * num_kv_heads] retention rule of every head
 * @throw invalid_argument on bad limits, or N_CTA smaller than the heads of a layer.
 */
inline split_map build_split_map(std::vector<head_rule> const& rules, std::int32_t num_layers,
                                 std::int32_t num_kv_heads, split_options const& options) {
  options.validate();
  TANGRAM_EXPECTS(num_layers >= 1 && num_kv_heads >= 1, invalid_argument,
                  "build_split_map: num_layers and num_kv_heads must be >= 1, got ", num_layers,
                  " and ", num_kv_heads);
  TANGRAM_EXPECTS(rules.size() == static_cast<std::size_t>(num_layers) * num_kv_heads,
                  invalid_argument, "build_split_map: expected ", num_layers * num_kv_heads,
                  " rules, got ", rules.size());
  std::vector<std::int64_t> batch_contexts;
  if (options.weighting == split_weighting::batch_share) batch_contexts = reference_batch_contexts(options);
  std::vector<double> phi;
  phi.reserve(rules.size());
  for (std::int32_t l = 0; l < num_layers; ++l) {
    auto layer_phi = split_weights(&rules[static_cast<std::size_t>(l) * num_kv_heads], num_kv_heads,
                                   options, batch_contexts);
    phi.insert(phi.end(), layer_phi.begin(), layer_phi.end());
  }
  return split_map_from_weights(phi, num_layers, num_kv_heads, options.limits);
}

}  // namespace tangram
