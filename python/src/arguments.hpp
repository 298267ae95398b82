// SPDX-License-Identifier: Apache-2.0
// Argument checks shared by the CPU reference bindings and the CUDA launchers.
#pragma once

#include <cstdint>
#include <string>

#include "tangram/detail/str.hpp"
#include "tangram/error.hpp"
#include "tangram/kernels/eviction.hpp"
#include "tangram/plan/static_plan.hpp"

namespace tangram::python {

/// The layer index, checked before anything is indexed with it.
inline void expect_layer(static_plan const& plan, std::int32_t layer) {
  TANGRAM_EXPECTS(layer >= 0 && layer < plan.num_layers, invalid_argument,
                  "layer: must be in [0, ", plan.num_layers, "), got ", layer);
}

/// The eviction score source named `name` (supplied, snapkv, key_norm).
inline score_source source_named(std::string const& name) {
  for (auto s : {score_source::supplied, score_source::snapkv, score_source::key_norm})
    if (to_string(s) == name) return s;
  TANGRAM_FAIL(invalid_argument, "source: unknown score source ", detail::quoted(name),
               " (expected supplied, snapkv or key_norm)");
}

/// Stage keys belong to elastic plans only: they must be given exactly when the plan reserves
/// elastically (`next` names the request-wide call that follows the staging).
inline void expect_stage_keys_rule(static_plan const& plan, bool given, char const* next) {
  bool elastic = plan.options.reservation.mode == reservation_mode::elastic;
  TANGRAM_EXPECTS(elastic == given, invalid_argument, "stage_keys: ",
                  elastic ? "the plan reserves elastically: pass stage_keys (uint32 [batch, layers * "
                            "KV heads, max_candidates]), then "
                          : "only for a plan with elastic reservation (this one is static)",
                  elastic ? next : "");
}

/// The request-wide elastic step (`who`) needs an elastic plan.
inline void expect_elastic_plan(static_plan const& plan, char const* who) {
  TANGRAM_EXPECTS(plan.options.reservation.mode == reservation_mode::elastic, invalid_argument,
                  who, ": the plan reserves static budgets (the per-layer eviction already "
                  "selected)");
}

}  // namespace tangram::python
