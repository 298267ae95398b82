// SPDX-License-Identifier: Apache-2.0
/**
 * @file plan/build_static_plan.hpp
 * @brief The planner: builds a `static_plan` (plan/static_plan.hpp) from a model spec, a budget
 * profile and the plan options, by clustering heads into groups (plan/clustering.hpp) and
 * splitting each layer's CTAs among its heads (plan/split_planner.hpp).
 *
 * The split map weighs each head by the tokens it will hold at decode. Under static budgets that
 * is its own rule (`p.rules`). Under elastic reservation it is not: the eviction chooses each
 * compressed group's length per request, and every member of the group then holds
 * min(group length, tokens seen) tokens (a head that wants fewer keeps next-best tokens as
 * padding), so a head's own budget understates the work of the small members of a group. The
 * split map of an elastic plan is therefore built from the *placement rules*: every compressed
 * head takes its group's rule (the rule of its largest member, `head_group::rule`), the static
 * proxy for the group's length. `p.rules` itself is unchanged (the budgets and the clustering
 * still use each head's own rule), and a static plan's map is exactly what it was. Measured on
 * elastic placements of the bundled Llama profiles, this map balances about as well as the
 * budget-share map, not better, and misses p95 <= 1.10
 * (docs/planning.md#split-map-under-elastic-placement): the group rule is a poor proxy for the
 * per-request group lengths.
 *
 * Host only; a pure function of its inputs (the same inputs give the same plan, bit for bit).
 */
#pragma once

#include <cstddef>
#include <vector>

#include "tangram/core/error.hpp"
#include "tangram/model/model_spec.hpp"
#include "tangram/plan/clustering.hpp"
#include "tangram/plan/elastic.hpp"
#include "tangram/plan/elastic_split_map.hpp"
#include "tangram/plan/head_rules.hpp"
#include "tangram/plan/split_planner.hpp"
#include "tangram/plan/static_plan.hpp"
#include "tangram/profile/budget_profile.hpp"
#include "tangram/profile/retention_samples.hpp"

namespace tangram {

/**
 * @brief The rules the split map of `p` weighs its heads by: `p.rules` under static budgets;
 * under elastic reservation every compressed head takes its group's rule (file comment).
 * Needs `p.rules` and `p.grouping` set.
 */
inline std::vector<head_rule> split_rules(static_plan const& p) {
  auto out = p.rules;
  if (p.options.reservation.mode != reservation_mode::elastic) return out;
  for (auto const& g : p.grouping.groups) {
    if (g.rule.kind != layer_kind::compressed) continue;
    for (auto m : g.members)
      out[static_cast<std::size_t>(m.layer) * static_cast<std::size_t>(p.num_kv_heads) +
          static_cast<std::size_t>(m.head)] = g.rule;
  }
  return out;
}

/**
 * @brief Builds the static plan of one rank and one pipeline stage (`options.layers`; the whole
 * model by default): rules, clustering, page geometry and split map, all over the stage's layers
 * only (the grouping scope applies within the stage: a group never spans two stages).
 * @throw invalid_argument for inconsistent inputs, naming the field and the value.
 */
inline static_plan build_static_plan(model_spec const& model,
                                     budget_profile const& profile,
                                     plan_options const& options) {
  options.validate();
  TANGRAM_EXPECTS(options.reservation.mode != reservation_mode::elastic ||
                      (profile.target_keep_ratio > 0 && profile.target_keep_ratio <= 1),
                  invalid_argument,
                  "plan_options.reservation.mode: elastic reservation (the default) needs the "
                  "profile's target_keep_ratio in (0, 1], got ",
                  profile.target_keep_ratio,
                  "; give the profile its keep ratio or choose reservation mode static");
  static_plan p;
  p.model         = model;
  p.profile       = profile;
  p.options       = options;
  p.options.reservation.margin = options.reservation.margin_or_default();  // decided
  p.rules         = head_rules_for(model, profile, options);  // checks the rank and the stage
  auto stage      = options.layers_of(model.num_layers);
  p.num_layers    = stage.size();
  p.first_layer   = stage.first;
  p.num_kv_heads  = model.num_kv_heads / options.tp_size;
  p.first_kv_head = options.tp_rank * p.num_kv_heads;
  p.grouping =
      cluster_heads(p.rules, p.num_layers, p.num_kv_heads, options.group_size, options.scope);
  p.geometry = {options.page_tokens, options.group_size, model.head_dim, model.kv_dtype};
  p.geometry.validate();
  p.splits = build_split_map(split_rules(p), p.num_layers, p.num_kv_heads, options.split);
  return p;
}

/**
 * @brief `build_static_plan` for a profile calibrated from `samples`. An elastic plan reserves
 * the margin its own heads need on the samples (`elastic_plan_margin`: at least
 * default_elastic_margin) unless `options.reservation.margin` is given, and with
 * batch_share weighting weighs its split map on elastic placements of the samples
 * (plan/elastic_split_map.hpp) instead of its groups' rules; any other plan is the same as
 * without samples.
 * @throw invalid_argument as build_static_plan, or when the samples do not match the plan's heads
 *        or have no keep ratio.
 */
inline static_plan build_static_plan(model_spec const& model,
                                     budget_profile const& profile,
                                     plan_options const& options,
                                     retention_samples const& samples) {
  bool const elastic = options.reservation.mode == reservation_mode::elastic;
  static_plan p      = build_static_plan(model, profile, options);  // checks every option first
  // The margin over the plan's own groups, stage and rank (the groups do not depend on it).
  if (elastic && !options.reservation.margin && !samples.samples.empty())
    p.options.reservation.margin = elastic_plan_margin(samples, p);
  if (elastic && options.split.weighting == split_weighting::batch_share)
    p.splits = elastic_placement_split_map(p, samples);
  return p;
}

}  // namespace tangram
