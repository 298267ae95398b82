// SPDX-License-Identifier: Apache-2.0
/**
 * @file plan/split_options.hpp
 * @brief What a split map is balanced for: the device's CTA count, the weighting of a head's CTA
 * share and the reference traffic. Plain values, part of a static plan; `build_split_map`
 * (plan/split_planner.hpp) consumes them.
 */
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "tangram/core/detail/enum_names.hpp"
#include "tangram/core/device_limits.hpp"
#include "tangram/core/error.hpp"

namespace tangram {

/// @brief What Phi, the weight a head's CTA share follows, measures.
enum class split_weighting : std::uint8_t {
  budget,  ///< Phi = B (the paper's Algorithm 1; uncompressed heads count 1)
  /// Phi = a high quantile (`share_quantile`) of the head's share of its layer's tokens over
  /// reference batches of the expected traffic. A head's share moves with a batch's mix of short
  /// and long contexts (below its protected floor a small-budget head keeps every token); sizing
  /// each head for a bad batch rather than the average one keeps the fullest CTA near the mean.
  batch_share,
};

constexpr std::string_view to_string(split_weighting w) noexcept {
  return w == split_weighting::budget ? "budget" : "batch_share";
}

/// Every split weighting, in the order a refusal lists them.
inline constexpr split_weighting all_split_weightings[] = {split_weighting::budget,
                                                           split_weighting::batch_share};

/// The weighting that `to_string` spells `name`, if any.
inline std::optional<split_weighting> split_weighting_named(std::string_view name) noexcept {
  return detail::enum_named(name, all_split_weightings);
}

/// @throw invalid_argument naming `field` and the value.
inline split_weighting parse_split_weighting(std::string_view name,
                                             std::string_view field = "weighting") {
  return detail::parse_enum(name, all_split_weightings, field, "split weighting");
}

/// 64 log-spaced contexts from 1K to 128K, round(1024 x 128^(i / 63)): the default traffic a split
/// map is balanced for (every request of a reference batch draws one of them uniformly).
inline std::vector<std::int64_t> default_reference_contexts() {
  std::vector<std::int64_t> out;
  for (int i = 0; i < 64; ++i)
    out.push_back(std::llround(1024.0 * std::pow(128.0, static_cast<double>(i) / 63.0)));
  return out;
}

/// @brief Bounds on the reference traffic, so that a plan option read from a file cannot make
/// planning run for hours.
struct split_limits {
  static constexpr std::int32_t max_reference_contexts = 1024;
  /// Largest value in `reference_contexts` (tokens).
  static constexpr std::int64_t max_reference_context = std::int64_t{1} << 24;
  static constexpr std::int32_t max_batch_size        = 4096;
  static constexpr std::int32_t max_batches           = 65536;
  /// reference_batches x reference_batch_size: requests simulated per layer.
  static constexpr std::int64_t max_reference_requests = std::int64_t{1} << 18;
};

/// @brief Inputs of `build_split_map`.
struct split_options {
  device_limits limits;  ///< N_CTA = sm_count * ctas_per_sm
  split_weighting weighting = split_weighting::batch_share;
  /// batch_share: the contexts the requests of a reference batch draw from (uniformly; repeat a
  /// value to weight it). Ignored by `budget`.
  std::vector<std::int64_t> reference_contexts = default_reference_contexts();
  std::int32_t reference_batch_size            = 16;  ///< batch_share: requests per reference batch
  std::int32_t reference_batches               = 256;  ///< batch_share: reference batches per layer
  double share_quantile = 0.95;  ///< batch_share: quantile of a head's shares taken as Phi

  /// @throw invalid_argument naming the field and the value.
  void validate() const {
    limits.validate();
    TANGRAM_EXPECTS(
        !reference_contexts.empty(), invalid_argument, "split_options.reference_contexts: empty");
    TANGRAM_EXPECTS(
        reference_contexts.size() <= static_cast<std::size_t>(split_limits::max_reference_contexts),
        invalid_argument,
        "split_options.reference_contexts: at most ",
        split_limits::max_reference_contexts,
        " values, got ",
        reference_contexts.size());
    for (auto n : reference_contexts)
      TANGRAM_EXPECTS(n >= 1 && n <= split_limits::max_reference_context,
                      invalid_argument,
                      "split_options.reference_contexts: must be in [1, ",
                      split_limits::max_reference_context,
                      "], got ",
                      n);
    TANGRAM_EXPECTS(
        reference_batch_size >= 1 && reference_batch_size <= split_limits::max_batch_size,
        invalid_argument,
        "split_options.reference_batch_size: must be in [1, ",
        split_limits::max_batch_size,
        "], got ",
        reference_batch_size);
    TANGRAM_EXPECTS(reference_batches >= 1 && reference_batches <= split_limits::max_batches,
                    invalid_argument,
                    "split_options.reference_batches: must be in [1, ",
                    split_limits::max_batches,
                    "], got ",
                    reference_batches);
    TANGRAM_EXPECTS(std::int64_t{reference_batches} * reference_batch_size <=
                        split_limits::max_reference_requests,
                    invalid_argument,
                    "split_options.reference_batches x reference_batch_size: at most ",
                    split_limits::max_reference_requests,
                    ", got ",
                    reference_batches,
                    " x ",
                    reference_batch_size);
    TANGRAM_EXPECTS(share_quantile >= 0 && share_quantile <= 1,
                    invalid_argument,
                    "split_options.share_quantile: must be in [0, 1], got ",
                    share_quantile);
  }
};

}  // namespace tangram
