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

}  // namespace tangram::python
