// SPDX-License-Identifier: Apache-2.0
/**
 * @file plan/head_rules.hpp
 * @brief The retention rule of every KV head of one rank, from a model spec and a budget profile:
 * the first step of planning, and what a plan file's rules are checked against.
 */
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "tangram/core/error.hpp"
#include "tangram/core/retention.hpp"
#include "tangram/model/model_spec.hpp"
#include "tangram/plan/static_plan.hpp"
#include "tangram/profile/budget_profile.hpp"

namespace tangram {

/**
 * @brief Per-head rules of a model under a profile (for the heads of one rank).
 *
 * Profiled layers are compressed with their budgets (protect = sink + window tokens); layers the
 * profile does not cover take their kind from the model: sliding_window keeps its window, and a
 * full-attention layer without budgets is kept uncompressed.
 * @throw invalid_argument when the profile does not fit the model (layer count, head count, or a
 * profiled layer that the model says is sliding-window), or the rank is not one of tp_size (it
 * used to read past the profile's budgets).
 */
inline std::vector<head_rule> head_rules_for(model_spec const& model,
                                             budget_profile const& profile,
                                             std::int32_t tp_size = 1,
                                             std::int32_t tp_rank = 0) {
  model.validate();
  profile.validate();
  auto require_model_value =
      [&](char const* field, std::int32_t got, std::int32_t want, char const* unit) {
        TANGRAM_EXPECTS(got == want,
                        invalid_argument,
                        field,
                        ": ",
                        got,
                        " does not match the model ",
                        detail::quoted(model.name),
                        " (",
                        want,
                        " ",
                        unit,
                        ")");
      };
  require_model_value(
      "profile.num_model_layers", profile.num_model_layers, model.num_layers, "layers");
  require_model_value("profile.num_kv_heads", profile.num_kv_heads, model.num_kv_heads, "KV heads");
  TANGRAM_EXPECTS(tp_size >= 1 && model.num_kv_heads % tp_size == 0,
                  invalid_argument,
                  "tp_size: ",
                  tp_size,
                  " does not divide the model's ",
                  model.num_kv_heads,
                  " KV heads");
  TANGRAM_EXPECTS(tp_rank >= 0 && tp_rank < tp_size,
                  invalid_argument,
                  "tp_rank: must be in [0, ",
                  tp_size - 1,
                  "] for tp_size ",
                  tp_size,
                  ", got ",
                  tp_rank);
  for (auto id : profile.layer_ids)
    TANGRAM_EXPECTS(model.layers[static_cast<std::size_t>(id)].kind != layer_kind::sliding_window,
                    invalid_argument,
                    "profile.layer_ids: layer ",
                    id,
                    " is a sliding-window layer of ",
                    detail::quoted(model.name),
                    "; only full-attention layers can carry budgets");
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
        r.budget  = profile.budget(static_cast<std::size_t>(li),
                                  static_cast<std::size_t>(tp_rank * local + h));
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
 * @brief The rules of the heads a plan of `options` covers: the heads of rank
 * (options.tp_size, options.tp_rank) on the layers of its pipeline stage (`options.layers`, all
 * layers by default), [stage layers * local heads]; local layer 0 is the stage's first layer.
 * @throw invalid_argument as the rank's `head_rules_for`, or naming `plan_options.layers` when
 * the stage is empty or not inside the model's layers.
 */
inline std::vector<head_rule> head_rules_for(model_spec const& model,
                                             budget_profile const& profile,
                                             plan_options const& options) {
  auto all   = head_rules_for(model, profile, options.tp_size, options.tp_rank);
  auto range = options.layers_of(model.num_layers);
  auto local = static_cast<std::ptrdiff_t>(model.num_kv_heads / options.tp_size);
  return {all.begin() + range.first * local, all.begin() + range.last * local};
}

}  // namespace tangram
