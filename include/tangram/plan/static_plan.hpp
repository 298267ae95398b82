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
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tangram/core/error.hpp"
#include "tangram/core/page_layout.hpp"
#include "tangram/core/retention.hpp"
#include "tangram/model/model_spec.hpp"
#include "tangram/plan/elastic_reservation.hpp"
#include "tangram/plan/head_grouping.hpp"
#include "tangram/plan/split_map.hpp"
#include "tangram/plan/split_options.hpp"
#include "tangram/profile/budget_profile.hpp"

namespace tangram {

/**
 * @brief A contiguous range of model layers [first, last): the layers of one pipeline stage.
 * Plain value type; `validate` checks it against a model's layer count.
 */
struct layer_range {
  std::int32_t first = 0;  ///< the stage's first model layer
  std::int32_t last  = 0;  ///< one past its last model layer

  [[nodiscard]] std::int32_t size() const noexcept { return last - first; }
  friend bool operator==(layer_range a, layer_range b) {
    return a.first == b.first && a.last == b.last;
  }
  friend bool operator!=(layer_range a, layer_range b) { return !(a == b); }

  /// "[first, last)", as messages name a range.
  [[nodiscard]] std::string describe() const { return detail::cat("[", first, ", ", last, ")"); }

  /// @throw invalid_argument naming `field` and the range when it is empty or not inside
  /// [0, model_layers).
  void validate(std::int32_t model_layers, std::string_view field = "plan_options.layers") const {
    TANGRAM_EXPECTS(first >= 0 && last <= model_layers,
                    invalid_argument,
                    field,
                    ": ",
                    describe(),
                    " is outside the model's ",
                    model_layers,
                    " layers ",
                    layer_range{0, model_layers}.describe());
    TANGRAM_EXPECTS(first < last,
                    invalid_argument,
                    field,
                    ": ",
                    describe(),
                    " is empty (last must exceed first); a pipeline stage holds at least one "
                    "layer");
  }
};

/**
 * Hp a plan pages its heads with unless told otherwise: 1, per-head pages. Each head's page list
 * holds exactly its own tokens, so elastic reservation needs no group padding (1.000x the
 * bundled samples' needs, against 1.04-1.22x for plan-time groups of 4) and decode reads exactly
 * each head's length; the price is Hp times more page-table entries and page draws per decode
 * step than groups of Hp (docs/planning.md#per-head-pages-the-default-hp-1-p-16).
 */
inline constexpr std::int32_t default_group_size = 1;

/// @brief Choices that shape a static plan.
struct plan_options {
  std::int32_t group_size  = default_group_size;  ///< Hp, heads per page
  grouping_scope scope     = grouping_scope::global;
  std::int32_t page_tokens = 16;    ///< P
  split_options split;              ///< N_CTA and how shares are weighted
  std::int32_t tp_size = 1;         ///< tensor-parallel ranks sharing the KV heads
  std::int32_t tp_rank = 0;         ///< the rank this plan is for
  reservation_options reservation;  ///< elastic (default) or static budgets
  /// Pipeline parallelism: the model layers this plan covers (one stage); nullopt: every layer.
  /// Checked against the model by `build_static_plan` (`layer_range::validate`).
  /// Last, so aggregate initialisations written before stages keep their meaning.
  std::optional<layer_range> layers;

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
    if (layers) layers->validate(model_limits::max_layers);
    split.limits.validate();
    reservation.validate();
  }

  /// The layers a plan of these options covers for a model of `model_layers` layers: `layers`, or
  /// [0, model_layers). @throw invalid_argument as `layer_range::validate`.
  [[nodiscard]] layer_range layers_of(std::int32_t model_layers) const {
    layer_range r = layers ? *layers : layer_range{0, model_layers};
    r.validate(model_layers);
    return r;
  }
};

/**
 * @brief A static plan for one tensor-parallel rank and one pipeline stage (a layer range; the
 * whole model by default). Its layers are local: local layer l is model layer `first_layer + l`,
 * as local head h is model head `first_kv_head + h`. Plain value type; build with
 * `build_static_plan` (plan/build_static_plan.hpp), save and load with io/static_plan.hpp.
 */
struct static_plan {
  model_spec model;        ///< the whole model
  budget_profile profile;  ///< budgets of the compressed layers
  plan_options options;
  std::int32_t num_layers    = 0;  ///< layers of this stage (model.num_layers without stages)
  std::int32_t num_kv_heads  = 0;  ///< KV heads per layer on this rank
  std::int32_t first_layer   = 0;  ///< model layer of local layer 0 (options.layers->first)
  std::int32_t first_kv_head = 0;  ///< model KV head of local head 0 (tp_rank * num_kv_heads)
  std::vector<head_rule> rules;    ///< [num_layers * num_kv_heads], local layers
  head_grouping grouping;
  page_geometry geometry;
  split_map splits;

  [[nodiscard]] head_rule const& rule(std::int32_t layer, std::int32_t head) const {
    return rules[static_cast<std::size_t>(layer) * static_cast<std::size_t>(num_kv_heads) +
                 static_cast<std::size_t>(head)];
  }
  /// The model layers this plan covers: [first_layer, first_layer + num_layers).
  [[nodiscard]] layer_range stage_layers() const { return {first_layer, first_layer + num_layers}; }
  [[nodiscard]] std::int64_t page_bytes() const { return geometry.page_bytes(); }
  [[nodiscard]] std::int32_t num_groups() const { return grouping.num_groups(); }
};

}  // namespace tangram
