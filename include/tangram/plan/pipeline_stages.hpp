// SPDX-License-Identifier: Apache-2.0
/**
 * @file plan/pipeline_stages.hpp
 * @brief Pipeline parallelism: the plans of pipeline stages, each a contiguous layer range
 * [first, last) of the model, beside the per-rank plans of tensor parallelism.
 *
 * A stage's plan (`plan_options::layers`, built by `build_static_plan`) holds the stage's layers
 * only, as local layers 0..last-first-1: its rules, head groups, footprint and split map are those
 * of a model made of those layers, so a manager built over it sees `num_layers` = the stage's
 * layers. It keeps the whole model spec and profile and records its range (`first_layer`,
 * `options.layers`), so an engine checks that it loaded the plan of its stage.
 *
 * Grouping is per stage: the grouping scope applies within the stage's layers, since a group's
 * pages live on one device and cannot span stages. With scope `layer` or `adjacent` a stage's
 * groups, budgets and split map are exactly the whole plan's for those layers and the stages'
 * footprints add up to the whole plan's; with scope `global` each stage clusters its own heads
 * (the whole model's global groups mix layers of different stages), which may take a few more
 * pages in total than one global grouping of the whole model. An elastic plan's split map from
 * samples is weighed on the stage's own placements.
 *
 * Partitions: explicit ranges (`check_pipeline_stages`: they must cover the model's layers in
 * order, each non-empty, without overlap or gap), or N stages balanced by KV memory
 * (`balanced_pipeline_stages` over `layer_kv_tokens`: per-head budgets and sliding-window layers
 * make layers differ), not by layer count. Each stage may be combined with a tensor-parallel rank
 * (`plan_options::tp_size`, `tp_rank`): the plan of (stage, rank) holds that rank's heads of the
 * stage's layers. Admission across stages is `try_admit_all` (memory/tensor_parallel.hpp) over the
 * stages' managers: on every stage or on none.
 *
 * Host only; pure functions.
 */
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "tangram/core/detail/checked_math.hpp"
#include "tangram/core/error.hpp"
#include "tangram/core/retention.hpp"
#include "tangram/model/model_spec.hpp"
#include "tangram/plan/build_static_plan.hpp"
#include "tangram/plan/clustering.hpp"
#include "tangram/plan/elastic_reservation.hpp"
#include "tangram/plan/footprint.hpp"
#include "tangram/plan/head_rules.hpp"
#include "tangram/plan/static_plan.hpp"
#include "tangram/profile/budget_profile.hpp"
#include "tangram/profile/retention_samples.hpp"

namespace tangram {

/// Context (tokens) at which `tangram plan --pipeline-stages` balances stages unless told
/// otherwise: long enough that the per-head budgets, not the protected tokens, set the memory.
inline constexpr std::int64_t default_stage_balance_context = 32768;

/**
 * @brief The KV memory each model layer reserves for a request of `context` tokens, in
 * head-token slots (bytes / `model.kv_bytes_per_head_token()`), over the heads of rank
 * (options.tp_size, options.tp_rank): the weights `balanced_pipeline_stages` balances.
 * [model.num_layers]; `options.layers` is ignored (the weights are the whole model's).
 *
 * The layer's heads are grouped as the plan would group them within the layer (scope `layer` or
 * `adjacent`; `global`, which groups across layers, is taken as `layer`). Static budgets: every
 * group Hp x its pages x P (`group_pages` of its rule), exactly a stage's footprint under the
 * per-layer scopes. Elastic reservation: a compressed group Hp x the scorer's per-head share
 * (`scorer_total::per_head`: the elastic total does not follow the budgets), the other groups
 * their pages. When Hp does not divide the layer's heads, each head counts its rule's tokens.
 * @throw invalid_argument as `head_rules_for`, for context outside [0, max_footprint_tokens], or
 *        (elastic) for a profile without a keep ratio.
 */
inline std::vector<std::int64_t> layer_kv_tokens(model_spec const& model,
                                                 budget_profile const& profile,
                                                 plan_options const& options,
                                                 std::int64_t context) {
  TANGRAM_EXPECTS(context >= 0 && context <= max_footprint_tokens,
                  invalid_argument,
                  "layer_kv_tokens.context: must be in [0, ",
                  max_footprint_tokens,
                  "], got ",
                  context);
  options.validate();
  auto rules                    = head_rules_for(model, profile, options.tp_size, options.tp_rank);
  bool elastic                  = options.reservation.mode == reservation_mode::elastic;
  std::int64_t per_head_elastic = 0;
  if (elastic) {
    scorer_total t{
        profile.target_keep_ratio, profile.protected_tokens(), options.reservation.basis};
    try {
      per_head_elastic = t.per_head(context);
    } catch (invalid_argument const& e) {
      TANGRAM_FAIL(invalid_argument,
                   "plan_options.reservation.mode: elastic reservation needs the profile's keep "
                   "ratio: ",
                   e.what());
    }
  }
  std::int32_t const P  = options.page_tokens;
  std::int64_t const Hp = options.group_size;
  // Slots of `heads` heads that share one rule's pages (a group, or a single head).
  auto slots = [&](head_rule const& r, std::int64_t heads) {
    std::int64_t per = elastic && r.kind == layer_kind::compressed
                           ? per_head_elastic
                           : detail::mul_or_throw(group_pages(r, context, 0, P),
                                                  std::int64_t{P},
                                                  "layer_kv_tokens: pages x page_tokens");
    return detail::mul_or_throw(per, heads, "layer_kv_tokens: heads x tokens");
  };
  auto within = options.scope == grouping_scope::global ? grouping_scope::layer : options.scope;
  auto H      = static_cast<std::int32_t>(model.num_kv_heads / options.tp_size);
  std::vector<std::int64_t> out(static_cast<std::size_t>(model.num_layers), 0);
  for (std::size_t l = 0; l < out.size(); ++l) {
    auto first = rules.begin() + static_cast<std::ptrdiff_t>(l) * H;
    std::vector<head_rule> layer(first, first + H);
    std::int64_t w = 0;
    if (H % Hp == 0) {
      for (auto const& g : cluster_heads(layer, 1, H, options.group_size, within).groups)
        w = detail::add_or_throw(w, slots(g.rule, Hp), "layer_kv_tokens: tokens of a layer");
    } else {
      for (auto const& r : layer)
        w = detail::add_or_throw(w,
                                 elastic && r.kind == layer_kind::compressed
                                     ? per_head_elastic
                                     : retained_tokens(r, context),
                                 "layer_kv_tokens: tokens of a layer");
    }
    out[l] = w;
  }
  return out;
}

/**
 * @brief Checks a pipeline partition: `stages` in order cover the model's `model_layers` layers
 * exactly once, each stage non-empty, without overlap or gap.
 * @throw invalid_argument naming the stage (`pipeline_stages[i]`) and its range.
 */
inline void check_pipeline_stages(std::vector<layer_range> const& stages,
                                  std::int32_t model_layers) {
  using detail::cat;
  TANGRAM_EXPECTS(!stages.empty(),
                  invalid_argument,
                  "pipeline_stages: no stage; give at least one layer range");
  TANGRAM_EXPECTS(stages.size() <= static_cast<std::size_t>(std::max(model_layers, 1)),
                  invalid_argument,
                  "pipeline_stages: ",
                  stages.size(),
                  " stages for a model of ",
                  model_layers,
                  " layers; every stage needs at least one layer");
  std::int32_t next = 0;  // the first layer no stage has covered yet
  for (std::size_t i = 0; i < stages.size(); ++i) {
    auto const& s     = stages[i];
    std::string field = cat("pipeline_stages[", i, "]");
    s.validate(model_layers, field);
    TANGRAM_EXPECTS(s.first >= next,
                    invalid_argument,
                    field,
                    ": ",
                    s.describe(),
                    " overlaps the layers before it (covered up to ",
                    next,
                    "); stages are contiguous, in order, each layer in one stage");
    TANGRAM_EXPECTS(s.first == next,
                    invalid_argument,
                    field,
                    ": ",
                    s.describe(),
                    " leaves layers ",
                    layer_range{next, s.first}.describe(),
                    " in no stage");
    next = s.last;
  }
  TANGRAM_EXPECTS(next == model_layers,
                  invalid_argument,
                  "pipeline_stages: the stages end at layer ",
                  next,
                  " and leave layers ",
                  layer_range{next, model_layers}.describe(),
                  " in no stage");
}

/**
 * @brief `stages` contiguous non-empty layer ranges covering all `layer_weights.size()` layers
 * whose largest total weight is the least possible (the balanced linear partition). Exact:
 * binary search on the bottleneck over integer weights; then, stage by stage, the end (among
 * those that keep the bottleneck) whose weight is closest to the mean of what is left, so the
 * lightest stage is not needlessly light. O(L^2) at most (L <= 1024).
 * @param layer_weights one weight >= 0 per layer (e.g. `layer_kv_tokens`; all ones balances
 *        layer counts)
 * @throw invalid_argument for stages outside [1, layers], a negative weight, or a sum that
 *        overflows.
 */
inline std::vector<layer_range> balanced_pipeline_stages(
    std::vector<std::int64_t> const& layer_weights, std::int32_t stages) {
  auto L = static_cast<std::int64_t>(layer_weights.size());
  TANGRAM_EXPECTS(L >= 1 && L <= model_limits::max_layers,
                  invalid_argument,
                  "balanced_pipeline_stages.layer_weights: need 1 to ",
                  model_limits::max_layers,
                  " layers, got ",
                  L);
  TANGRAM_EXPECTS(stages >= 1 && stages <= L,
                  invalid_argument,
                  "pipeline_stages: must be in [1, ",
                  L,
                  "] (one layer per stage at least) for a model of ",
                  L,
                  " layers, got ",
                  stages);
  std::int64_t total = 0, heaviest = 0;
  for (std::size_t l = 0; l < layer_weights.size(); ++l) {
    TANGRAM_EXPECTS(layer_weights[l] >= 0,
                    invalid_argument,
                    "balanced_pipeline_stages.layer_weights[",
                    l,
                    "]: must be >= 0, got ",
                    layer_weights[l]);
    total    = detail::add_or_throw(total, layer_weights[l], "balanced_pipeline_stages: weights");
    heaviest = std::max(heaviest, layer_weights[l]);
  }
  // Fewest stages, each of weight <= cap, that cover layers [from, L) greedily.
  auto stages_needed = [&](std::int64_t from, std::int64_t cap) {
    std::int64_t count = 1, sum = 0;
    for (auto l = from; l < L; ++l) {
      auto w = layer_weights[static_cast<std::size_t>(l)];
      if (sum + w > cap) {  // sum, w <= cap <= total: no overflow
        ++count;
        sum = 0;
      }
      sum += w;
    }
    return count;
  };
  std::int64_t lo = heaviest, hi = total;  // stages_needed(0, total) == 1 <= stages
  while (lo < hi) {
    std::int64_t mid = lo + (hi - lo) / 2;
    if (stages_needed(0, mid) <= stages)
      hi = mid;
    else
      lo = mid + 1;
  }
  // Every stage <= the optimal cap `lo`. Among the ends that keep the rest feasible (at least one
  // layer per later stage, and few enough stages under the cap), each stage takes the one whose
  // weight is closest to the rest's mean: the lightest stage is not left with the remainder.
  std::vector<layer_range> out;
  out.reserve(static_cast<std::size_t>(stages));
  std::int64_t first = 0, left = total;
  for (std::int32_t s = 0; s < stages; ++s) {
    std::int64_t later = stages - s - 1;
    if (later == 0) {
      out.push_back({static_cast<std::int32_t>(first), static_cast<std::int32_t>(L)});
      break;
    }
    double target     = static_cast<double>(left) / static_cast<double>(later + 1);
    std::int64_t best = -1, best_sum = 0, sum = 0;
    double best_gap = 0;
    for (auto end = first + 1; end <= L - later; ++end) {
      sum += layer_weights[static_cast<std::size_t>(end - 1)];
      if (sum > lo) break;
      if (stages_needed(end, lo) > later) continue;
      double gap = std::abs(static_cast<double>(sum) - target);
      if (best < 0 || gap < best_gap) {
        best     = end;
        best_sum = sum;
        best_gap = gap;
      }
    }
    // Some end is feasible: the greedy end under `lo` is (stages_needed(0, lo) <= stages).
    TANGRAM_EXPECTS(
        best > first, logic_error, "balanced_pipeline_stages: no feasible end for stage ", s);
    out.push_back({static_cast<std::int32_t>(first), static_cast<std::int32_t>(best)});
    first = best;
    left -= best_sum;
  }
  return out;
}

/**
 * @brief The plans of the pipeline stages `stages` (checked by `check_pipeline_stages`): plan i is
 * `build_static_plan` with `options.layers = stages[i]` (and with `samples` when given, as that
 * overload). Everything is checked before any plan is built.
 * @throw invalid_argument as check_pipeline_stages or build_static_plan, or naming
 *        `plan_options.layers` when the options already name a stage.
 */
inline std::vector<static_plan> build_stage_plans(model_spec const& model,
                                                  budget_profile const& profile,
                                                  plan_options const& options,
                                                  std::vector<layer_range> const& stages,
                                                  retention_samples const* samples = nullptr) {
  TANGRAM_EXPECTS(!options.layers,
                  invalid_argument,
                  "plan_options.layers: [",
                  options.layers ? options.layers->first : 0,
                  ", ",
                  options.layers ? options.layers->last : 0,
                  ") is set; build_stage_plans takes every stage's layers from `stages`");
  model.validate();
  check_pipeline_stages(stages, model.num_layers);
  std::vector<static_plan> out;
  out.reserve(stages.size());
  for (auto const& s : stages) {
    plan_options o = options;
    o.layers       = s;
    out.push_back(samples ? build_static_plan(model, profile, o, *samples)
                          : build_static_plan(model, profile, o));
  }
  return out;
}

}  // namespace tangram
