// SPDX-License-Identifier: Apache-2.0
// `tangram simulate --shared-prompt S`: the shared-system-prompt workload
// (eval/sim/shared_prompt.hpp) on the plan simulate built, printed as text or JSON.
#pragma once

#include <cstdint>

#include "commands.hpp"
#include "tangram/model/model_spec.hpp"
#include "tangram/plan/static_plan.hpp"

namespace tangram::cli {

/// Measures and prints the workload of R requests sharing an S-token prompt.
/// @return 0 (errors throw, as every command's).
int run_shared_prompt(model_spec const& model,
                      static_plan const& plan,
                      std::int64_t prompt_tokens,
                      std::int64_t chunk_tokens,
                      bool as_json,
                      streams io);

}  // namespace tangram::cli
