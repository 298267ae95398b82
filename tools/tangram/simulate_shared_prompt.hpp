// SPDX-License-Identifier: Apache-2.0
// `tangram simulate --shared-prompt S`: the shared-system-prompt workload
// (eval/sim/shared_prompt.hpp) on the plan simulate built, printed as text or JSON.
#pragma once

#include <cstdint>
#include <string>

#include "commands.hpp"
#include "tangram/model/model_spec.hpp"
#include "tangram/plan/static_plan.hpp"

namespace tangram::cli {

/// The configured GPU's KV budget (--gpu-mem x --usable less the weights), which bounds S.
struct kv_budget {
  double bytes = 0;
  std::string text;  ///< how it was obtained, for the refusal: "141 GB x 0.9 - 16.06 GB of weights"
};

/// Measures and prints the workload of R requests sharing an S-token prompt.
/// @return 0 (errors throw, as every command's).
/// @throw usage_error naming --shared-prompt and S, before any work, when the measurement's pool
///        (`sim::shared_prompt_pool_pages`) does not fit `budget`; it names the largest S that
///        fits.
int run_shared_prompt(model_spec const& model,
                      static_plan const& plan,
                      std::int64_t prompt_tokens,
                      std::int64_t chunk_tokens,
                      kv_budget const& budget,
                      bool as_json,
                      streams io);

}  // namespace tangram::cli
