// SPDX-License-Identifier: Apache-2.0
// Options that several commands share (calibration, head-group geometry, the GPU's SM count),
// declared in one place so that their ranges, defaults and help text cannot drift apart.
#pragma once

#include <optional>
#include <string>

#include <CLI/CLI.hpp>

#include "tangram/plan/calibration.hpp"
#include "tangram/plan/static_plan.hpp"

namespace tangram::cli {

/// Calibration options read from the command line, and whether any was given explicitly.
struct calibration_args {
  calibration_options options;
  std::optional<std::string> given;  ///< the first calibration option given, e.g. "--alpha"
  CLI::Option* estimator = nullptr;
  CLI::Option* alpha     = nullptr;
  CLI::Option* quantile  = nullptr;
  CLI::Option* floor     = nullptr;
};

/// Declares --estimator, --alpha, --quantile and --floor, read into `cal.options`.
void add_calibration_options(CLI::App& app, calibration_args& cal);

/// After parsing: sets `cal.given`, and refuses --alpha with the quantile estimator or --quantile
/// with musigma (the other estimator's setting would be silently ignored).
/// @throw usage_error
void check_calibration_args(calibration_args& cal);

/// --group-size (Hp), read into `target`.
CLI::Option* add_group_size(CLI::App& app, std::int32_t& target);
/// --page-tokens (P), read into `target`.
CLI::Option* add_page_tokens(CLI::App& app, std::int32_t& target);
/// --scope, the head-grouping scope.
CLI::Option* add_scope(CLI::App& app, grouping_scope& target);
/// --sms, the SMs of the GPU the split map is planned for.
CLI::Option* add_sms(CLI::App& app, std::int32_t& target);

}  // namespace tangram::cli
