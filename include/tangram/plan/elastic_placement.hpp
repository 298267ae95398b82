// SPDX-License-Identifier: Apache-2.0
/**
 * @file plan/elastic_placement.hpp
 * @brief Elastic placements of retention samples at plan time: what each head of a sampled
 * request wants at a given context (`sample_needs_at`, modelled by scaling the sample's kept
 * counts) and the per-head lengths the elastic placement gives it (`elastic_placement_lengths`:
 * optimal group-length selection, in the threshold-search form of core/elastic_lengths.hpp,
 * within R(n)). The split
 * map of an elastic plan is weighed on them (plan/elastic_split_map.hpp); the evaluation code
 * measures imbalance on them. Host only; pure functions.
 */
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "tangram/core/detail/checked_math.hpp"
#include "tangram/core/elastic_lengths.hpp"
#include "tangram/core/error.hpp"
#include "tangram/core/retention.hpp"
#include "tangram/plan/aot_mapping.hpp"
#include "tangram/plan/elastic_reservation.hpp"
#include "tangram/plan/static_plan.hpp"
#include "tangram/profile/retention_samples.hpp"

namespace tangram {

/**
 * @brief What each head of a request wants after `context` tokens, modelled from retention
 * sample `k` as the simulator's elastic eviction does (eval/sim/elastic_policy.hpp):
 * need = clamp(ceil(kept_k[h] * context / context_k), 0, context) for the profiled layers
 * (scaled in proportion to the context: exact at context = context_k), retained_tokens(rule,
 * context) for the others. [num_layers * num_kv_heads], flat heads; with tensor parallelism the
 * sample's heads of this rank ([first_kv_head, first_kv_head + num_kv_heads)), with pipeline
 * stages the sample's layers of this stage ([first_layer, first_layer + num_layers)).
 * @throw invalid_argument when the samples do not match the plan (KV heads, layers), k is out of
 *        range or context < 0.
 */
inline std::vector<std::int64_t> sample_needs_at(static_plan const& plan,
                                                 retention_samples const& s,
                                                 std::size_t k,
                                                 std::int64_t context) {
  TANGRAM_EXPECTS(s.num_kv_heads == plan.num_kv_heads * plan.options.tp_size &&
                      k < s.samples.size(),
                  invalid_argument,
                  "sample_needs_at: sample ",
                  k,
                  " of ",
                  s.samples.size(),
                  " with ",
                  s.num_kv_heads,
                  " KV heads per layer; the plan has ",
                  plan.num_kv_heads,
                  " on each of ",
                  plan.options.tp_size,
                  " ranks");
  TANGRAM_EXPECTS(s.num_model_layers == plan.model.num_layers,
                  invalid_argument,
                  "sample_needs_at: samples.num_model_layers ",
                  s.num_model_layers,
                  " does not match the plan's model of ",
                  plan.model.num_layers,
                  " layers (samples of another model)");
  for (auto layer : s.layer_ids)
    TANGRAM_EXPECTS(layer >= 0 && layer < s.num_model_layers,
                    invalid_argument,
                    "sample_needs_at: samples.layer_ids holds layer ",
                    layer,
                    ", outside [0, ",
                    s.num_model_layers,
                    ")");
  TANGRAM_EXPECTS(
      context >= 0, invalid_argument, "sample_needs_at: context must be >= 0, got ", context);
  auto const& smp = s.samples[k];
  auto H          = static_cast<std::size_t>(plan.num_kv_heads);
  auto HS         = static_cast<std::size_t>(s.num_kv_heads);
  auto first      = static_cast<std::size_t>(plan.first_kv_head);
  TANGRAM_EXPECTS(smp.context_tokens > 0 && smp.kept.size() == s.layer_ids.size() * HS,
                  invalid_argument,
                  "sample_needs_at: sample ",
                  k,
                  " needs context_tokens > 0 and ",
                  s.layer_ids.size() * HS,
                  " kept counts");
  std::vector<std::int64_t> needs(plan.rules.size());
  for (std::size_t i = 0; i < needs.size(); ++i) needs[i] = retained_tokens(plan.rules[i], context);
  for (std::size_t li = 0; li < s.layer_ids.size(); ++li) {
    // Model layer -> the plan's local layer; layers of other pipeline stages are not the plan's.
    auto layer = s.layer_ids[li] - plan.first_layer;
    if (layer < 0 || layer >= plan.num_layers) continue;
    for (std::size_t h = 0; h < H; ++h)
      needs[static_cast<std::size_t>(layer) * H + h] =
          ceil_div(detail::mul_or_throw(smp.kept[li * HS + first + h],
                                        context,
                                        "sample_needs_at: kept * context"),
                   smp.context_tokens);
  }
  for (auto& n : needs) n = std::clamp<std::int64_t>(n, 0, context);
  return needs;
}

/**
 * @brief Per-head lengths of one request under the elastic placement of `plan`
 * (docs/memory.md#elastic-reservation): the compressed groups' lengths are
 * `reference::select_group_lengths` of `needs` within R(context) pages
 * (`elastic_compressed_pages` at the plan's scorer, Hp, P and reservation margin; candidates =
 * context, no decode tokens), every member of a group holding min(group length, context); other
 * heads hold head_tokens(rule, context, 0). [num_layers * num_kv_heads], flat heads.
 * @param needs [num_layers * num_kv_heads] wanted tokens per head (e.g. `sample_needs_at`)
 * @throw invalid_argument when the plan is not elastic, has no keep ratio, or needs has the
 *        wrong size or a value outside [0, context].
 */
inline std::vector<std::int64_t> elastic_placement_lengths(static_plan const& plan,
                                                           std::vector<std::int64_t> const& needs,
                                                           std::int64_t context) {
  TANGRAM_EXPECTS(plan.options.reservation.mode == reservation_mode::elastic,
                  invalid_argument,
                  "elastic_placement_lengths: the plan reserves static budgets");
  TANGRAM_EXPECTS(needs.size() == plan.rules.size(),
                  invalid_argument,
                  "elastic_placement_lengths: expected ",
                  plan.rules.size(),
                  " needs, got ",
                  needs.size());
  auto H = static_cast<std::size_t>(plan.num_kv_heads);
  std::vector<std::int64_t> lengths(plan.rules.size());
  for (std::size_t i = 0; i < lengths.size(); ++i)
    lengths[i] = head_tokens(plan.rules[i], context, 0);
  std::vector<std::int32_t> heads;  // compressed groups' heads, Hp per group in order
  for (auto const& g : plan.grouping.groups) {
    if (g.rule.kind != layer_kind::compressed) continue;
    for (auto m : g.members)
      heads.push_back(static_cast<std::int32_t>(static_cast<std::size_t>(m.layer) * H +
                                                static_cast<std::size_t>(m.head)));
  }
  if (heads.empty()) return lengths;
  std::vector<std::int64_t> wanted(heads.size());  // grouped: group g at [g * Hp, (g + 1) * Hp)
  for (std::size_t i = 0; i < heads.size(); ++i) {
    wanted[i] = needs[static_cast<std::size_t>(heads[i])];
    TANGRAM_EXPECTS(wanted[i] >= 0 && wanted[i] <= context,
                    invalid_argument,
                    "elastic_placement_lengths: needs[",
                    heads[i],
                    "] must be in [0, context = ",
                    context,
                    "], got ",
                    wanted[i]);
  }
  auto const& geo = plan.geometry;
  scorer_total t{plan.profile.target_keep_ratio,
                 plan.profile.protected_tokens(),
                 plan.options.reservation.basis};
  auto groups  = static_cast<std::int64_t>(heads.size()) / geo.group_size;
  auto budget  = elastic_compressed_pages(t,
                                         static_cast<std::int64_t>(heads.size()),
                                         geo.group_size,
                                         geo.page_tokens,
                                         plan.options.reservation.margin_or_default(),
                                         context);
  auto lo      = ceil_div(std::min(context, t.protect), geo.page_tokens);
  auto floors  = detail::mul_or_throw(lo, groups, "elastic_placement_lengths: protected floors");
  TANGRAM_EXPECTS(floors <= budget,
                  logic_error,
                  "elastic_placement_lengths: the protected floors exceed R(n) = ",
                  budget);
  // The threshold search gives the optimal greedy's lengths (reference::select_group_lengths,
  // equal on every input: test/plan/elastic_test.cpp) without its per-page heap.
  std::vector<std::int64_t> pages(static_cast<std::size_t>(groups));
  elastic::select_lengths(wanted.data(),
                          static_cast<std::int32_t>(groups),
                          geo.group_size,
                          geo.page_tokens,
                          lo,
                          budget - floors,
                          pages.data());
  auto hp = static_cast<std::size_t>(geo.group_size);
  for (std::size_t i = 0; i < heads.size(); ++i)
    lengths[static_cast<std::size_t>(heads[i])] =
        std::min(pages[i / hp] * geo.page_tokens, context);
  return lengths;
}

}  // namespace tangram
