// SPDX-License-Identifier: Apache-2.0
/**
 * @file plan/static_plan.hpp
 * @brief The static plan: everything Tangram decides once, offline, per (model, profile,
 * hardware): per-head rules, head groups, page geometry and the decode split map.
 */
#pragma once

#include <cstdint>
#include <vector>

#include "tangram/device/device_limits.hpp"
#include "tangram/error.hpp"
#include "tangram/memory/page_layout.hpp"
#include "tangram/model/model_spec.hpp"
#include "tangram/plan/clustering.hpp"
#include "tangram/plan/head_grouping.hpp"
#include "tangram/plan/retention.hpp"
#include "tangram/plan/split_map.hpp"
#include "tangram/plan/split_planner.hpp"
#include "tangram/profile/budget_profile.hpp"

namespace tangram {

/// @brief Choices that shape a static plan.
struct plan_options {
  std::int32_t group_size  = 4;   ///< Hp, heads per page
  grouping_scope scope     = grouping_scope::global;
  std::int32_t page_tokens = 16;  ///< P
  split_options split;            ///< N_CTA and how shares are weighted
  std::int32_t tp_size = 1;       ///< tensor-parallel ranks sharing the KV heads
  std::int32_t tp_rank = 0;       ///< the rank this plan is for

  /// @throw invalid_argument naming the field and the value.
  void validate() const {
    TANGRAM_EXPECTS(group_size >= 1 && group_size <= 1024, invalid_argument,
                    "plan_options.group_size: must be in [1, 1024], got ", group_size);
    TANGRAM_EXPECTS(page_tokens >= 1 && page_tokens <= 4096, invalid_argument,
                    "plan_options.page_tokens: must be in [1, 4096], got ", page_tokens);
    TANGRAM_EXPECTS(tp_size >= 1 && tp_size <= 1024, invalid_argument,
                    "plan_options.tp_size: must be in [1, 1024], got ", tp_size);
    TANGRAM_EXPECTS(tp_rank >= 0 && tp_rank < tp_size, invalid_argument,
                    "plan_options.tp_rank: must be in [0, ", tp_size - 1, "], got ", tp_rank);
    split.limits.validate();
  }
};

/**
 * @brief A static plan for one tensor-parallel rank. Plain value type; build with
 * `build_static_plan`, save and load with plan/plan_io.hpp.
 */
struct static_plan {
  model_spec model;        ///< the whole model
  budget_profile profile;  ///< budgets of the compressed layers
  plan_options options;
  std::int32_t num_layers   = 0;  ///< model.num_layers
  std::int32_t num_kv_heads = 0;  ///< KV heads per layer on this rank
  std::int32_t first_kv_head = 0; ///< model KV head of local head 0 (tp_rank * num_kv_heads)
  std::vector<head_rule> rules;   ///< [num_layers * num_kv_heads]
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

/**
 * @brief Per-head rules of a model under a profile (for the heads of one rank).
 *
 * Profiled layers are compressed with their budgets (protect = sink + window tokens); layers the
 * profile does not cover take their kind from the model: sliding_window keeps its window, and a
 * full-attention layer without budgets is kept uncompressed.
 * @throw invalid_argument when the profile does not fit the model (layer count, head count, or a
 * profiled layer that the model says is sliding-window).
 */
inline std::vector<head_rule> head_rules_for(model_spec const& model, budget_profile const& profile,
                                             std::int32_t tp_size = 1, std::int32_t tp_rank = 0) {
  model.validate();
  profile.validate();
  TANGRAM_EXPECTS(profile.num_model_layers == model.num_layers, invalid_argument,
                  "profile.num_model_layers: ", profile.num_model_layers, " does not match the model ",
                  detail::quoted(model.name), " (", model.num_layers, " layers)");
  TANGRAM_EXPECTS(profile.num_kv_heads == model.num_kv_heads, invalid_argument,
                  "profile.num_kv_heads: ", profile.num_kv_heads, " does not match the model ",
                  detail::quoted(model.name), " (", model.num_kv_heads, " KV heads)");
  TANGRAM_EXPECTS(tp_size >= 1 && model.num_kv_heads % tp_size == 0, invalid_argument,
                  "tp_size: ", tp_size, " does not divide the model's ", model.num_kv_heads, " KV heads");
  for (auto id : profile.layer_ids)
    TANGRAM_EXPECTS(model.layers[static_cast<std::size_t>(id)].kind != layer_kind::sliding_window,
                    invalid_argument, "profile.layer_ids: layer ", id, " is a sliding-window layer of ",
                    detail::quoted(model.name), "; only full-attention layers can carry budgets");
  std::int32_t local = model.num_kv_heads / tp_size;
  std::vector<head_rule> rules;
  rules.reserve(static_cast<std::size_t>(model.num_layers) * local);
  for (std::int32_t l = 0; l < model.num_layers; ++l) {
    auto const& spec = model.layers[static_cast<std::size_t>(l)];
    std::int32_t li  = profile.layer_index(l);
    for (std::int32_t h = 0; h < local; ++h) {
      head_rule r;
      if (spec.kind == layer_kind::sliding_window) {
        r.kind   = layer_kind::sliding_window;
        r.window = spec.window;
      } else if (spec.kind == layer_kind::compressed && li >= 0) {
        r.kind    = layer_kind::compressed;
        r.budget  = profile.budget(static_cast<std::size_t>(li), static_cast<std::size_t>(tp_rank * local + h));
        r.protect = profile.protected_tokens();
      } else {
        r.kind = layer_kind::uncompressed;
      }
      rules.push_back(r);
    }
  }
  return rules;
}

/**
 * @brief Builds the static plan of one rank: rules, clustering, page geometry and split map.
 * @throw invalid_argument for inconsistent inputs, naming the field and the value.
 */
inline static_plan build_static_plan(model_spec const& model, budget_profile const& profile,
                                     plan_options const& options) {
  options.validate();
  static_plan p;
  p.model         = model;
  p.profile       = profile;
  p.options       = options;
  p.num_layers    = model.num_layers;
  p.rules         = head_rules_for(model, profile, options.tp_size, options.tp_rank);
  p.num_kv_heads  = model.num_kv_heads / options.tp_size;
  p.first_kv_head = options.tp_rank * p.num_kv_heads;
  p.grouping = cluster_heads(p.rules, p.num_layers, p.num_kv_heads, options.group_size, options.scope);
  p.geometry = {options.page_tokens, options.group_size, model.head_dim, model.kv_dtype};
  p.geometry.validate();
  p.splits = build_split_map(p.rules, p.num_layers, p.num_kv_heads, options.split);
  return p;
}

}  // namespace tangram
