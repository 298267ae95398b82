// SPDX-License-Identifier: Apache-2.0
/**
 * @file plan/static_plan.hpp
 * @brief The static plan: everything Tangram decides once, offline, per (model, profile,
 * hardware): per-head rules, head groups, page geometry and the decode split map.
 *
 * Core type: this header holds the plan's values only. `build_static_plan`
 * (plan/build_static_plan.hpp) computes one; io/static_plan.hpp saves and loads it.
 */
#pragma once

#include <cstdint>
#include <vector>

#include "tangram/error.hpp"
#include "tangram/memory/page_layout.hpp"
#include "tangram/model/model_spec.hpp"
#include "tangram/plan/elastic_reservation.hpp"
#include "tangram/plan/head_grouping.hpp"
#include "tangram/plan/retention.hpp"
#include "tangram/plan/split_map.hpp"
#include "tangram/plan/split_options.hpp"
#include "tangram/profile/budget_profile.hpp"

namespace tangram {

/// @brief Choices that shape a static plan.
struct plan_options {
  std::int32_t group_size  = 4;  ///< Hp, heads per page
  grouping_scope scope     = grouping_scope::global;
  std::int32_t page_tokens = 16;    ///< P
  split_options split;              ///< N_CTA and how shares are weighted
  std::int32_t tp_size = 1;         ///< tensor-parallel ranks sharing the KV heads
  std::int32_t tp_rank = 0;         ///< the rank this plan is for
  reservation_options reservation;  ///< elastic (default) or static budgets

  /// @throw invalid_argument naming the field and the value.
  void validate() const {
    TANGRAM_EXPECTS(group_size >= 1 && group_size <= 1024,
                    invalid_argument,
                    "plan_options.group_size: must be in [1, 1024], got ",
                    group_size);
    TANGRAM_EXPECTS(page_tokens >= 1 && page_tokens <= 4096,
                    invalid_argument,
                    "plan_options.page_tokens: must be in [1, 4096], got ",
                    page_tokens);
    TANGRAM_EXPECTS(tp_size >= 1 && tp_size <= 1024,
                    invalid_argument,
                    "plan_options.tp_size: must be in [1, 1024], got ",
                    tp_size);
    TANGRAM_EXPECTS(tp_rank >= 0 && tp_rank < tp_size,
                    invalid_argument,
                    "plan_options.tp_rank: must be in [0, ",
                    tp_size - 1,
                    "], got ",
                    tp_rank);
    split.limits.validate();
    reservation.validate();
  }
};

/**
 * @brief A static plan for one tensor-parallel rank. Plain value type; build with
 * `build_static_plan` (plan/build_static_plan.hpp), save and load with io/static_plan.hpp.
 */
struct static_plan {
  model_spec model;        ///< the whole model
  budget_profile profile;  ///< budgets of the compressed layers
  plan_options options;
  std::int32_t num_layers    = 0;  ///< model.num_layers
  std::int32_t num_kv_heads  = 0;  ///< KV heads per layer on this rank
  std::int32_t first_kv_head = 0;  ///< model KV head of local head 0 (tp_rank * num_kv_heads)
  std::vector<head_rule> rules;    ///< [num_layers * num_kv_heads]
  head_grouping grouping;
  page_geometry geometry;
  split_map splits;

  [[nodiscard]] head_rule const& rule(std::int32_t layer, std::int32_t head) const {
    return rules[static_cast<std::size_t>(layer) * static_cast<std::size_t>(num_kv_heads) +
                 static_cast<std::size_t>(head)];
  }
  [[nodiscard]] std::int64_t page_bytes() const { return geometry.page_bytes(); }
  [[nodiscard]] std::int32_t num_groups() const { return grouping.num_groups(); }
};

}  // namespace tangram
