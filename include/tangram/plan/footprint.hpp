// SPDX-License-Identifier: Apache-2.0
/**
 * @file plan/footprint.hpp
 * @brief Exact post-compression footprint of a request, M(r), from the static plan.
 *
 * A group of a request that has seen n tokens and decoded t more holds
 * `ceil((k_group(n) + t) / P)` pages, k_group the rule of its largest member; a sliding-window
 * group holds `ceil(min(n + t, W) / P)` pages (its ring never grows beyond `ceil(W / P)`).
 * Budgets are static, so the footprint is known exactly before the request runs.
 */
#pragma once

#include <cstdint>
#include <vector>

#include "tangram/plan/retention.hpp"
#include "tangram/plan/static_plan.hpp"

namespace tangram {

/// Ring pages of a sliding-window group: ceil(W / P).
inline std::int64_t ring_pages(head_rule const& rule, std::int32_t page_tokens) {
  return ceil_div(rule.window, page_tokens);
}

/// Pages one group needs after `context` tokens of history and `decode` uncompressed tokens.
inline std::int64_t group_pages(head_rule const& group_rule, std::int64_t context, std::int64_t decode,
                                std::int32_t page_tokens) {
  if (group_rule.kind == layer_kind::sliding_window) {
    std::int64_t n = context + decode;
    return ceil_div(n < group_rule.window ? n : group_rule.window, page_tokens);
  }
  return ceil_div(retained_tokens(group_rule, context) + decode, page_tokens);
}

/// Pages a request needs in every group: `out[g]` for group g.
inline void footprint_pages(static_plan const& plan, std::int64_t context, std::int64_t decode,
                            std::vector<std::int64_t>& out) {
  out.resize(plan.grouping.groups.size());
  for (std::size_t g = 0; g < out.size(); ++g)
    out[g] = group_pages(plan.grouping.groups[g].rule, context, decode, plan.geometry.page_tokens);
}

/// Total pages of a request: sum over groups.
inline std::int64_t footprint_pages(static_plan const& plan, std::int64_t context, std::int64_t decode) {
  std::int64_t total = 0;
  for (auto const& g : plan.grouping.groups)
    total += group_pages(g.rule, context, decode, plan.geometry.page_tokens);
  return total;
}

/// M(r) in bytes: footprint pages times page bytes.
inline std::int64_t footprint_bytes(static_plan const& plan, std::int64_t context, std::int64_t decode) {
  return footprint_pages(plan, context, decode) * plan.page_bytes();
}

}  // namespace tangram
