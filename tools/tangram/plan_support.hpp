// SPDX-License-Identifier: Apache-2.0
// Helpers shared by `tangram calibrate`, `tangram plan` and `tangram inspect`: reading samples or
// profiles, choosing the model, number formatting.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "common_options.hpp"
#include "inputs.hpp"
#include "tangram/core/error.hpp"
#include "tangram/model/model_spec.hpp"
#include "tangram/plan/calibration.hpp"
#include "tangram/plan/static_plan.hpp"
#include "tangram/profile/budget_profile.hpp"
#include "tangram/profile/retention_samples.hpp"
#include "usage_error.hpp"

namespace tangram::cli {

/// The budgets a plan starts from: a profile, calibrated from samples when the input held samples.
struct budget_source {
  std::string source;  ///< the input's path or "bundled:<name>"
  std::optional<retention_samples> samples;
  budget_profile profile;
};

/// Reads retention samples (calibrated with `cal`) or a budget profile (then no calibration option
/// may be given). Any other format is an error naming the input and its format.
budget_source read_samples_or_profile(std::string const& name_or_path, calibration_args const& cal);

/// Reads retention samples; another format is an error naming the input and its format.
retention_samples read_samples(input_text const& in);

/// The model: `--model` (a model-spec JSON file if such a file exists, else a preset name), or
/// the preset matching `model_name` (from the samples or the profile).
/// @throw usage_error asking for --model when no preset matches.
model_spec resolve_model(std::optional<std::string> const& option, std::string const& model_name);

/// Throws the planner's refusal `e` of a plan option in the program's words (as
/// build_plan_for_cli: the message names --tp-size, --group-size, --layers, ... instead of the
/// library's field); rethrows the exception being handled when it names no option. Call it
/// only from the handler that caught `e`.
[[noreturn]] void throw_plan_option_error(tangram::invalid_argument const& e);

/// build_static_plan, with the planner's refusals of plan options in the program's words: the
/// message names the command-line option (--tp-size, --group-size, --page-tokens, --sms and
/// --ctas-per-sm) instead of the library's field. With `samples` (the profile was calibrated
/// from them), an elastic plan's split map is weighed on their placements.
/// @throw usage_error for bad options.
static_plan build_plan_for_cli(model_spec const& model,
                               budget_profile const& profile,
                               plan_options const& options,
                               retention_samples const* samples = nullptr);

/// Whether an elastic plan of `o` built from `src` decides its margin from the samples (no
/// `--margin` given; `elastic_plan_margin`).
bool margin_from_samples(plan_options const& o, budget_source const& src);

/// What the reports say of a margin decided from the samples (elastic_plan_margin's rule).
inline constexpr char const* margin_from_samples_note =
    "from the samples: mean + 2 sd of their required margins, at least 0.02";

/// Fixed-point text: fixed(1.23456, 3) == "1.235".
std::string fixed(double v, int decimals);
/// Text escaped for XML content and attributes (& < > "); control characters are dropped and
/// bytes that are not valid UTF-8 become U+FFFD.
std::string xml_escape(std::string_view text);
/// Percent text: percent(0.00293, 3) == "0.293%".
std::string percent(double fraction, int decimals);

}  // namespace tangram::cli
