// SPDX-License-Identifier: Apache-2.0
/**
 * @file plan/build_static_plan.hpp
 * @brief The planner: builds a `static_plan` (plan/static_plan.hpp) from a model spec, a budget
 * profile and the plan options, by clustering heads into groups (plan/clustering.hpp) and
 * splitting each layer's CTAs among its heads (plan/split_planner.hpp).
 *
 * Host only; a pure function of its inputs (the same inputs give the same plan, bit for bit).
 */
#pragma once

#include "tangram/error.hpp"
#include "tangram/model/model_spec.hpp"
#include "tangram/plan/clustering.hpp"
#include "tangram/plan/head_rules.hpp"
#include "tangram/plan/split_planner.hpp"
#include "tangram/plan/static_plan.hpp"
#include "tangram/profile/budget_profile.hpp"

namespace tangram {

/**
 * @brief Builds the static plan of one rank: rules, clustering, page geometry and split map.
 * @throw invalid_argument for inconsistent inputs, naming the field and the value.
 */
inline static_plan build_static_plan(model_spec const& model,
                                     budget_profile const& profile,
                                     plan_options const& options) {
  options.validate();
  TANGRAM_EXPECTS(options.reservation.mode != reservation_mode::elastic ||
                      (profile.target_keep_ratio > 0 && profile.target_keep_ratio <= 1),
                  invalid_argument,
                  "plan_options.reservation.mode: elastic reservation needs the profile's "
                  "target_keep_ratio in (0, 1], got ",
                  profile.target_keep_ratio);
  static_plan p;
  p.model         = model;
  p.profile       = profile;
  p.options       = options;
  p.num_layers    = model.num_layers;
  p.rules         = head_rules_for(model, profile, options.tp_size, options.tp_rank);
  p.num_kv_heads  = model.num_kv_heads / options.tp_size;
  p.first_kv_head = options.tp_rank * p.num_kv_heads;
  p.grouping =
      cluster_heads(p.rules, p.num_layers, p.num_kv_heads, options.group_size, options.scope);
  p.geometry = {options.page_tokens, options.group_size, model.head_dim, model.kv_dtype};
  p.geometry.validate();
  p.splits = build_split_map(p.rules, p.num_layers, p.num_kv_heads, options.split);
  return p;
}

}  // namespace tangram
