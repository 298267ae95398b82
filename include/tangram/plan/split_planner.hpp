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
#include <utility>
#include <vector>

#include "tangram/core/error.hpp"
#include "tangram/core/retention.hpp"
#include "tangram/plan/detail/stats.hpp"
#include "tangram/plan/split_map.hpp"
#include "tangram/plan/split_minimax.hpp"
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
    auto i =
        static_cast<std::size_t>(detail::canonical_uniform(rng) * static_cast<double>(refs.size()));
    n = refs[std::min(i, refs.size() - 1)];
  }
  return out;
}

/**
 * @brief Each head's share of one layer's tokens in every reference batch, [num_heads *
 * reference_batches]: shares[h * B + m] = sum_r retained_tokens(h, n_r) /
 * sum_h' sum_r retained_tokens(h', n_r) over batch m's contexts n_r (0 when the batch holds no
 * tokens). Host only; planning time.
 * @param batch_contexts `reference_batch_contexts(options)`
 * @throw invalid_argument when batch_contexts has the wrong size.
 */
inline std::vector<double> batch_shares(head_rule const* rules,
                                        std::int32_t num_heads,
                                        split_options const& options,
                                        std::vector<std::int64_t> const& batch_contexts) {
  auto H    = static_cast<std::size_t>(num_heads);
  auto B    = static_cast<std::size_t>(options.reference_batches);
  auto size = static_cast<std::size_t>(options.reference_batch_size);
  TANGRAM_EXPECTS(batch_contexts.size() == B * size,
                  invalid_argument,
                  "split_weights: batch_contexts has ",
                  batch_contexts.size(),
                  " contexts, expected ",
                  B,
                  " x ",
                  size);
  std::vector<double> shares(H * B), tokens(H);  // shares[h * B + m]
  for (std::size_t m = 0; m < B; ++m) {
    std::fill(tokens.begin(), tokens.end(), 0.0);
    for (std::size_t r = 0; r < size; ++r) {
      std::int64_t n = batch_contexts[m * size + r];
      for (std::size_t h = 0; h < H; ++h)
        tokens[h] += static_cast<double>(retained_tokens(rules[h], n));
    }
    double total = std::accumulate(tokens.begin(), tokens.end(), 0.0);
    for (std::size_t h = 0; h < H; ++h) shares[h * B + m] = total > 0 ? tokens[h] / total : 0.0;
  }
  return shares;
}

/// Phi of `count` heads from their shares ([count * B], head-major): each head's `quantile`
/// quantile (linear, NumPy default) of its shares over the B batches.
inline std::vector<double> share_quantiles(std::vector<double> const& shares,
                                           std::size_t count,
                                           std::size_t B,
                                           double quantile) {
  std::vector<double> phi(count), column(B);
  for (std::size_t h = 0; h < count; ++h) {
    std::copy_n(shares.begin() + static_cast<std::ptrdiff_t>(h * B), B, column.begin());
    phi[h] = detail::linear_quantile(column, quantile);
  }
  return phi;
}

/**
 * @brief Phi of every head of one layer under `options` (host only; planning time).
 *
 * batch_share and batch_minimax: Phi_h is the `share_quantile` quantile (linear, NumPy default) of
 * head h's `batch_shares` over the reference batches. budget: Phi_h = B_h (1 for heads that are
 * not compressed).
 * @param rules          the layer's `num_heads` head rules
 * @param batch_contexts `reference_batch_contexts(options)` (ignored by budget)
 * @throw invalid_argument when given batch_contexts of the wrong size.
 */
inline std::vector<double> split_weights(head_rule const* rules,
                                         std::int32_t num_heads,
                                         split_options const& options,
                                         std::vector<std::int64_t> const& batch_contexts) {
  auto H = static_cast<std::size_t>(num_heads);
  if (options.weighting == split_weighting::budget) {
    std::vector<double> phi(H);
    for (std::size_t h = 0; h < H; ++h)
      phi[h] = rules[h].kind == layer_kind::compressed ? rules[h].budget : 1.0;
    return phi;
  }
  return share_quantiles(batch_shares(rules, num_heads, options, batch_contexts),
                         H,
                         static_cast<std::size_t>(options.reference_batches),
                         options.share_quantile);
}

/**
 * @brief Apportions `total` seats to weights, at least one each, proportionally otherwise
 * (largest remainder; ties to the lower index, so the result is deterministic).
 * @throw invalid_argument when total < weights.size() or a weight is negative or not finite.
 */
inline std::vector<std::int32_t> apportion(std::vector<double> const& weights, std::int32_t total) {
  auto n = static_cast<std::int32_t>(weights.size());
  TANGRAM_EXPECTS(n >= 1, invalid_argument, "apportion: no weights");
  TANGRAM_EXPECTS(total >= n,
                  invalid_argument,
                  "N_CTA = ",
                  total,
                  " is smaller than the ",
                  n,
                  " heads of a layer; every head needs at least one CTA");
  for (std::size_t i = 0; i < weights.size(); ++i)
    TANGRAM_EXPECTS(std::isfinite(weights[i]) && weights[i] >= 0,
                    invalid_argument,
                    "apportion: weight ",
                    i,
                    " is ",
                    weights[i]);
  if (std::accumulate(weights.begin(), weights.end(), 0.0) <= 0)
    return apportion(std::vector<double>(weights.size(), 1.0), total);  // no work anywhere: even
  std::vector<std::int32_t> seats(weights.size(), 0);
  std::vector<char> pinned(weights.size(), 0);
  // Heads whose proportional quota is below one are pinned to one seat; the rest share what is
  // left. Repeat until no remaining quota falls below one.
  while (true) {
    std::int32_t left  = total;
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
    std::stable_sort(remainders.begin(), remainders.end(), [](auto const& a, auto const& b) {
      return a.first > b.first;
    });
    for (std::int32_t k = 0; k < left - given; ++k)
      seats[remainders[static_cast<std::size_t>(k)].second] += 1;
    return seats;
  }
}

/**
 * @brief The split map whose layer l gives head h seats[l * H + h] CTAs, recording `phi`.
 * @pre seats and phi hold num_layers x num_kv_heads entries; each layer's seats are >= 1 and sum
 *      to N_CTA (as `apportion` and `apportion_minimax` return them).
 */
inline split_map split_map_from_seats(std::vector<std::int32_t> const& seats,
                                      std::vector<double> phi,
                                      std::int32_t num_layers,
                                      std::int32_t num_kv_heads,
                                      device_limits const& limits) {
  auto H = static_cast<std::size_t>(num_kv_heads);
  split_map m;
  m.num_layers   = num_layers;
  m.num_kv_heads = num_kv_heads;
  m.limits       = limits;
  m.phi          = std::move(phi);
  m.cta_begin.reserve(static_cast<std::size_t>(num_layers) * (H + 1));
  for (std::size_t l = 0; l < static_cast<std::size_t>(num_layers); ++l) {
    std::int32_t begin = 0;
    for (std::size_t h = 0; h < H; ++h) {
      m.cta_begin.push_back(begin);
      begin += seats[l * H + h];
    }
    m.cta_begin.push_back(begin);
  }
  m.validate();
  return m;
}

/**
 * @brief The split map that apportions each layer's N_CTA CTAs to its heads by `phi`
 * (`apportion`: at least one each, largest remainder). Shared by the budget and batch_share
 * weightings.
 * @param phi [num_layers * num_kv_heads] weights, >= 0 and finite
 * @throw invalid_argument when phi has the wrong size or a bad weight, or N_CTA is smaller than
 *        the heads of a layer.
 */
inline split_map split_map_from_weights(std::vector<double> const& phi,
                                        std::int32_t num_layers,
                                        std::int32_t num_kv_heads,
                                        device_limits const& limits) {
  TANGRAM_EXPECTS(num_layers >= 1 && num_kv_heads >= 1,
                  invalid_argument,
                  "split_map_from_weights: num_layers and num_kv_heads must be >= 1, got ",
                  num_layers,
                  " and ",
                  num_kv_heads);
  auto H = static_cast<std::size_t>(num_kv_heads);
  TANGRAM_EXPECTS(phi.size() == static_cast<std::size_t>(num_layers) * H,
                  invalid_argument,
                  "split_map_from_weights: expected ",
                  static_cast<std::size_t>(num_layers) * H,
                  " weights, got ",
                  phi.size());
  std::vector<std::int32_t> seats;
  seats.reserve(phi.size());
  for (std::size_t l = 0; l < static_cast<std::size_t>(num_layers); ++l) {
    std::vector<double> layer(phi.begin() + static_cast<std::ptrdiff_t>(l * H),
                              phi.begin() + static_cast<std::ptrdiff_t>((l + 1) * H));
    auto s = apportion(layer, limits.max_ctas());
    seats.insert(seats.end(), s.begin(), s.end());
  }
  return split_map_from_seats(seats, phi, num_layers, num_kv_heads, limits);
}

/**
 * @brief The split map of batch_minimax: each layer's CTAs by `apportion_minimax` on its heads'
 * shares (started also from seats in proportion to their mean shares), Phi their
 * `share_quantile` quantiles.
 * @param shares [num_layers * num_kv_heads * B]: shares[(l * H + h) * B + m] (head-major within
 *        a layer, as `batch_shares` lays out one layer)
 * @throw invalid_argument as apportion_minimax.
 */
inline split_map split_map_from_shares(std::vector<double> const& shares,
                                       std::size_t B,
                                       std::int32_t num_layers,
                                       std::int32_t num_kv_heads,
                                       split_options const& options) {
  auto H = static_cast<std::size_t>(num_kv_heads);
  auto L = static_cast<std::size_t>(num_layers);
  TANGRAM_EXPECTS(shares.size() == L * H * B,
                  invalid_argument,
                  "split_map_from_shares: expected ",
                  L * H * B,
                  " shares, got ",
                  shares.size());
  std::vector<std::int32_t> seats;
  seats.reserve(L * H);
  for (std::size_t l = 0; l < L; ++l) {
    std::vector<double> layer(shares.begin() + static_cast<std::ptrdiff_t>(l * H * B),
                              shares.begin() + static_cast<std::ptrdiff_t>((l + 1) * H * B));
    std::vector<double> mean(H, 0.0);  // the proportional start: seats by mean share
    for (std::size_t h = 0; h < H; ++h) mean[h] = detail::mean_of(&layer[h * B], B);
    auto s = apportion_minimax(
        layer, H, B, options.limits.max_ctas(), apportion(mean, options.limits.max_ctas()));
    seats.insert(seats.end(), s.begin(), s.end());
  }
  return split_map_from_seats(seats,
                              share_quantiles(shares, L * H, B, options.share_quantile),
                              num_layers,
                              num_kv_heads,
                              options.limits);
}

/**
 * @brief Algorithm 1: the static split map of a model.
 * @param rules [num_layers * num_kv_heads] retention rule of every head
 * @throw invalid_argument on bad limits, or N_CTA smaller than the heads of a layer.
 */
inline split_map build_split_map(std::vector<head_rule> const& rules,
                                 std::int32_t num_layers,
                                 std::int32_t num_kv_heads,
                                 split_options const& options) {
  options.validate();
  TANGRAM_EXPECTS(num_layers >= 1 && num_kv_heads >= 1,
                  invalid_argument,
                  "build_split_map: num_layers and num_kv_heads must be >= 1, got ",
                  num_layers,
                  " and ",
                  num_kv_heads);
  TANGRAM_EXPECTS(rules.size() == static_cast<std::size_t>(num_layers) * num_kv_heads,
                  invalid_argument,
                  "build_split_map: expected ",
                  num_layers * num_kv_heads,
                  " rules, got ",
                  rules.size());
  std::vector<std::int64_t> batch_contexts;
  if (uses_reference_batches(options.weighting)) batch_contexts = reference_batch_contexts(options);
  std::vector<double> phi;
  phi.reserve(rules.size());
  if (options.weighting == split_weighting::batch_minimax) {
    std::vector<double> shares;
    for (std::int32_t l = 0; l < num_layers; ++l) {
      auto layer = batch_shares(&rules[static_cast<std::size_t>(l) * num_kv_heads],
                                num_kv_heads,
                                options,
                                batch_contexts);
      shares.insert(shares.end(), layer.begin(), layer.end());
    }
    return split_map_from_shares(shares,
                                 static_cast<std::size_t>(options.reference_batches),
                                 num_layers,
                                 num_kv_heads,
                                 options);
  }
  for (std::int32_t l = 0; l < num_layers; ++l) {
    auto layer_phi = split_weights(
        &rules[static_cast<std::size_t>(l) * num_kv_heads], num_kv_heads, options, batch_contexts);
    phi.insert(phi.end(), layer_phi.begin(), layer_phi.end());
  }
  return split_map_from_weights(phi, num_layers, num_kv_heads, options.limits);
}

}  // namespace tangram
