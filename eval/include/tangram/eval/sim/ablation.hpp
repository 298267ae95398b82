// SPDX-License-Identifier: Apache-2.0
/**
 * @file eval/sim/ablation.hpp
 * @brief The paper's incremental study as simulate policies (`tangram simulate --ablation`):
 *
 * 1. `reservation_only`: Tangram's exact reservation (M(r) at admission, never preempts) on one
 *    unified page per layer, as wide as all its KV heads and as long as its longest head: the
 *    same manager over a plan whose only group per layer is the whole layer.
 * 2. `+head_groups`: the same reservation on head-group pages (the plan's clustering), without
 *    the ahead-of-time split: its decode is balanced the way the unified baseline's is (per-step
 *    re-planning, or the unbalanced skew with `--baseline-balance none`).
 * 3. `+aot_split`: plus the ahead-of-time split map = `tangram` (on the per-step balanced map
 *    unless `--decode-split aot`, which gives the AOT map alone).
 * 4. `+elastic`: plus elastic reservation = `tangram_elastic`.
 *
 * By construction, 1 and 2 reserve the same tokens per head; 2's pages are never longer than
 * 1's (a group's longest head is at most its layer's), so 2 never holds more KV bytes than 1.
 * 2 and 3 hold the same memory and differ only in what decode pays.
 */
#pragma once

#include <string>

#include "tangram/plan/static_plan.hpp"

namespace tangram::sim {

inline constexpr char const* reservation_only_name = "reservation_only";
inline constexpr char const* head_groups_name      = "+head_groups";

/// The plan options of `reservation_only`: one group per layer of all its `kv_heads` heads.
inline plan_options reservation_only_options(plan_options po, std::int32_t kv_heads) {
  po.group_size = kv_heads;
  po.scope      = grouping_scope::layer;
  return po;
}

}  // namespace tangram::sim
