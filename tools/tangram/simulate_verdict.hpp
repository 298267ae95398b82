// SPDX-License-Identifier: Apache-2.0
// `tangram simulate --verdict` (issue 30): Tangram's default policy against every baseline on the
// short, mid and long workloads under the two cost settings, replayed on unseen prompts.
#pragma once

#include <functional>
#include <optional>

#include "commands.hpp"
#include "plan_support.hpp"
#include "tangram/eval/sim/cost_model.hpp"
#include "tangram/eval/sim/replay.hpp"
#include "tangram/eval/sim/serving_costs.hpp"
#include "tangram/eval/sim/workload.hpp"
#include "tangram/memory/answer_window.hpp"
#include "tangram/model/model_spec.hpp"
#include "tangram/plan/static_plan.hpp"

namespace tangram::cli {

/// What `simulate` resolved before the verdict runs (the GPU preset and its overrides, the
/// model, the samples, the plan, engine and workload options).
struct verdict_inputs {
  model_spec model;
  budget_source src;  ///< must hold retention samples (the folds are drawn from them)
  sim::cost_model cost;
  double kv_bytes = 0;
  plan_options po;             ///< Tangram's plan options (static budgets; elastic re-planned)
  sim::workload_options wo;    ///< the generator's options; `kind` is set per workload
  sim::replay_options ro;      ///< engine limits, max_tokens; charges are set per policy
  std::optional<double> keep;  ///< --keep: budgets and retention rescaled to this keep ratio
  std::optional<double>
      margin;  ///< --margin; none: each fold's plan default (its calibration half)
  answer_window_options answers;         ///< Tangram's answer window (--decode-window)
  bool park_for_turns           = true;  ///< --continuation-room park (tangram_policy_options)
  bool control_plane            = true;
  sim::tangram_split split      = sim::tangram_split::balanced;  ///< Tangram's decode split map
  double offload_capacity_bytes = 0;                             ///< host memory of full_kv_offload
  bool json = false, quiet = false;
};

/// Budgets calibrated on one fold's samples (calibration options and --keep applied).
using fold_calibration = std::function<budget_profile(retention_samples const&)>;

/// Runs the verdict and prints its table (or JSON). @throw usage_error when the input has no
/// retention samples or too few distinct prompts for two folds.
int simulate_verdict(verdict_inputs const& in, fold_calibration const& calibrate_on, streams io);

}  // namespace tangram::cli
