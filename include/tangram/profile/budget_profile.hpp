// SPDX-License-Identifier: Apache-2.0
/**
 * @file profile/budget_profile.hpp
 * @brief The library's own budget-profile format (`tangram-budget-profile/v1`): static per-head
 * budgets B[l][h] in (0, 1] for the profiled layers of a model, plus how they were calibrated.
 *
 * Core type; its reader and writer live in io/budget_profile.hpp.
 */
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tangram/core/error.hpp"
#include "tangram/model/model_spec.hpp"

namespace tangram {

/// @brief How per-head budgets are estimated from pilot samples.
enum class budget_estimator : std::uint8_t {
  musigma,   ///< clamp(mu + alpha * sigma, floor, 1), sigma the population standard deviation
  quantile,  ///< clamp(empirical quantile q of the head's ratios, floor, 1)
  external,  ///< budgets supplied by hand or by another tool
};

constexpr std::string_view to_string(budget_estimator e) noexcept {
  switch (e) {
    case budget_estimator::musigma: return "musigma";
    case budget_estimator::quantile: return "quantile";
    case budget_estimator::external: return "external";
  }
  return "?";
}

/// @brief Parses "musigma", "quantile" or "external".
/// @throw invalid_argument naming `field` and the value.
inline budget_estimator parse_budget_estimator(std::string_view name,
                                               std::string_view field = "estimator") {
  if (name == "musigma") return budget_estimator::musigma;
  if (name == "quantile") return budget_estimator::quantile;
  if (name == "external") return budget_estimator::external;
  TANGRAM_FAIL(invalid_argument,
               field,
               ": unknown estimator ",
               detail::quoted(name),
               " (expected musigma, quantile or external)");
}

/// @brief Calibration settings recorded in a profile (informational once budgets exist).
struct calibration_settings {
  budget_estimator estimator = budget_estimator::musigma;
  double alpha               = 2.0;   ///< safety coefficient of musigma
  double quantile            = 0.95;  ///< q of the quantile estimator
  double floor               = 0.0;   ///< lower clamp of every budget
  std::int32_t num_samples   = 0;     ///< pilot samples the budgets came from
};

/**
 * @brief Static per-head KV budgets of one model under one compressor.
 *
 * Plain value type. `budgets[li * num_kv_heads + h]` is the budget of head `h` of model layer
 * `layer_ids[li]`. Layers not listed are not compressed by this profile: the static plan takes
 * their kind (sliding window or uncompressed) from the model spec.
 */
struct budget_profile {
  std::string model;
  std::string scorer;
  std::int32_t num_model_layers = 0;
  std::int32_t num_kv_heads     = 0;
  std::vector<std::int32_t> layer_ids;
  std::int32_t sink_tokens   = 0;  ///< always-kept leading tokens
  std::int32_t window_tokens = 0;  ///< always-kept most recent tokens
  double target_keep_ratio   = 0;  ///< the compressor's global keep ratio (informational)
  calibration_settings calibration;
  std::vector<double> budgets;

  [[nodiscard]] std::size_t num_profiled_layers() const { return layer_ids.size(); }
  [[nodiscard]] std::int64_t protected_tokens() const {
    return static_cast<std::int64_t>(sink_tokens) + window_tokens;
  }
  [[nodiscard]] double budget(std::size_t li, std::size_t h) const {
    return budgets[li * static_cast<std::size_t>(num_kv_heads) + h];
  }
  /// Index of model layer `layer` in layer_ids, or -1 when that layer is not profiled.
  [[nodiscard]] std::int32_t layer_index(std::int32_t layer) const {
    for (std::size_t i = 0; i < layer_ids.size(); ++i)
      if (layer_ids[i] == layer) return static_cast<std::int32_t>(i);
    return -1;
  }

  /**
   * @brief Checks shapes and ranges (used after building a profile in code).
   * @throw invalid_argument naming the field and the value.
   */
  void validate() const {
    using detail::cat;
    TANGRAM_EXPECTS(num_model_layers >= 1 && num_model_layers <= model_limits::max_layers,
                    invalid_argument, "budget_profile.num_model_layers: must be in [1, ",
                    model_limits::max_layers, "], got ", num_model_layers);
    TANGRAM_EXPECTS(num_kv_heads >= 1 && num_kv_heads <= model_limits::max_kv_heads,
                    invalid_argument, "budget_profile.num_kv_heads: must be in [1, ",
                    model_limits::max_kv_heads, "], got ", num_kv_heads);
    TANGRAM_EXPECTS(!layer_ids.empty(), invalid_argument, "budget_profile.layer_ids: empty");
    for (std::size_t i = 0; i < layer_ids.size(); ++i) {
      TANGRAM_EXPECTS(layer_ids[i] >= 0 && layer_ids[i] < num_model_layers, invalid_argument,
                      "budget_profile.layer_ids[", i, "]: must be in [0, ", num_model_layers - 1,
                      "], got ", layer_ids[i]);
      TANGRAM_EXPECTS(i == 0 || layer_ids[i] > layer_ids[i - 1], invalid_argument,
                      "budget_profile.layer_ids[", i, "]: must be strictly increasing, got ",
                      layer_ids[i], " after ", layer_ids[i - 1]);
    }
    TANGRAM_EXPECTS(sink_tokens >= 0, invalid_argument,
                    "budget_profile.sink_tokens: must be >= 0, got ", sink_tokens);
    TANGRAM_EXPECTS(window_tokens >= 0, invalid_argument,
                    "budget_profile.window_tokens: must be >= 0, got ", window_tokens);
    std::size_t expected = layer_ids.size() * static_cast<std::size_t>(num_kv_heads);
    TANGRAM_EXPECTS(budgets.size() == expected, invalid_argument,
                    "budget_profile.budgets: expected ", expected,
                    " values (layer_ids x num_kv_heads), got ", budgets.size());
    for (std::size_t i = 0; i < budgets.size(); ++i) {
      double b = budgets[i];
      TANGRAM_EXPECTS(b > 0 && b <= 1, invalid_argument, "budget_profile.budgets[",
                      i / static_cast<std::size_t>(num_kv_heads), "][",
                      i % static_cast<std::size_t>(num_kv_heads), "]: must be in (0, 1], got ", b);
    }
  }
};

}  // namespace tangram
