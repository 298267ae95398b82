// SPDX-License-Identifier: Apache-2.0
// The subcommands of the `tangram` program. Each `setup_*` declares the command's options and
// positionals on a CLI11 app (the one place they are spelled, with defaults and ranges) and
// returns the command itself, to be called once the app has parsed the arguments. Checks that
// involve several options, or the inputs, are made by the command and throw usage_error.
#pragma once

#include <functional>

#include <CLI/CLI.hpp>

#include "commands.hpp"

namespace tangram::cli {

/// A parsed command: runs it and returns the exit code.
using command_body = std::function<int(streams)>;

command_body setup_simulate(CLI::App& app);
command_body setup_calibrate(CLI::App& app);
command_body setup_plan(CLI::App& app);
command_body setup_inspect(CLI::App& app);
command_body setup_models(CLI::App& app);
command_body setup_profiles(CLI::App& app);

}  // namespace tangram::cli
