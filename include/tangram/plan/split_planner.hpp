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
#include <string_view>
#include <vector>

#include "tangram/error.hpp"
#include "tangram/plan/retention.hpp"
#include "tangram/plan/split_map.hpp"

namespace tangram {

/// @brief What Phi, the weight a head's CTA share follows, measures.
enum class split_weighting : std::uint8_t {
  budget,           ///< Phi = B (the paper's Algorithm 1; uncompressed heads count 1)
  /// Phi = (sum over reference contexts n of retained_tokens(rule, n)) / (sum of n): the head's
  /// expected tokens per context token when the reference contexts are equally likely. Token
  /// weighted: long contexts, which carry most of a step's work, count in proportion.
  expected_tokens,
};

constexpr std::string_view to_string(split_weighting w) noexcept {
  return w == split_weighting::budget ? "budget" : "expected_tokens";
}

/// @throw invalid_argument naming `field` and the value.
inline split_weighting parse_split_weighting(std::string_view name, std::string_view field = "weighting") {
  if (name == "budget") return split_weighting::budget;
  if (name == "expected_tokens") return split_weighting::expected_tokens;
  TANGRAM_FAIL(invalid_argument, field, ": unknown split weighting ", detail::quoted(name),
               " (expected budget or expected_tokens)");
}

/// Log-spaced contexts 1K, 2K, ..., 128K: the default traffic a split map is balanced for.
inline std::vector<std::int64_t> default_reference_contexts() {
  std::vector<std::int64_t> out;
  for (std::int64_t n = 1024; n <= 131072; n *= 2) out.push_back(n);
  return out;
}

/// @brief Inputs of `build_split_map`.
struct split_options {
  device_limits limits;  ///< N_CTA = sm_count * ctas_per_sm
  split_weighting weighting = split_weighting::expected_tokens;
  std::vector<std::int64_t> reference_contexts = default_reference_contexts();
};

/// Phi of one head under `options`.
inline double split_weight(head_rule const& rule, split_options const& options) {
  if (options.weighting == split_weighting::budget)
    return rule.kind == layer_kind::compressed ? rule.budget : 1.0;
  // A mean of per-context ratios k(n)/n would weight a 1K context like a 128K one; below the
  // protected tokens every head keeps everything, so that mean flattens the shares toward equal
  // while the work of a batch is dominated by its long contexts.
  double kept = 0, seen = 0;
  for (auto n : options.reference_contexts) {
    kept += static_cast<double>(retained_tokens(rule, n));
    seen += static_cast<double>(n);
  }
  return kept / seen;
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
 * @brief Algorithm 1: the static split map of a model.
 * @param rules [num_layers * num_kv_heads] retention rule of every head
 * @throw invalid_argument on bad limits, or N_CTA smaller than the heads of a layer.
 */
inline split_map build_split_map(std::vector<head_rule> const& rules, std::int32_t num_layers,
                                 std::int32_t num_kv_heads, split_options const& options) {
  options.limits.validate();
  TANGRAM_EXPECTS(rules.size() == static_cast<std::size_t>(num_layers) * num_kv_heads,
                  invalid_argument, "build_split_map: expected ", num_layers * num_kv_heads,
                  " rules, got ", rules.size());
  TANGRAM_EXPECTS(!options.reference_contexts.empty(), invalid_argument,
                  "split_options.reference_contexts: empty");
  for (auto n : options.reference_contexts)
    TANGRAM_EXPECTS(n >= 1, invalid_argument, "split_options.reference_contexts: must be >= 1, got ", n);
  split_map m;
  m.num_layers   = num_layers;
  m.num_kv_heads = num_kv_heads;
  m.limits       = options.limits;
  m.cta_begin.reserve(static_cast<std::size_t>(num_layers) * (num_kv_heads + 1));
  for (std::int32_t l = 0; l < num_layers; ++l) {
    std::vector<double> phi(static_cast<std::size_t>(num_kv_heads));
    for (std::int32_t h = 0; h < num_kv_heads; ++h)
      phi[static_cast<std::size_t>(h)] = split_weight(rules[static_cast<std::size_t>(l) * num_kv_heads + h], options);
    auto seats = apportion(phi, options.limits.max_ctas());
    std::int32_t begin = 0;
    for (std::int32_t h = 0; h < num_kv_heads; ++h) {
      m.cta_begin.push_back(begin);
      begin += seats[static_cast<std::size_t>(h)];
    }
    m.cta_begin.push_back(begin);
    m.phi.insert(m.phi.end(), phi.begin(), phi.end());
  }
  return m;
}

}  // namespace tangram
