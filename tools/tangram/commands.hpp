// SPDX-License-Identifier: Apache-2.0
// The subcommands of the `tangram` program. Each returns the process exit code; bad input throws
// (tangram::invalid_argument / usage_error) and `run` turns that into a one-line error, exit 2.
#pragma once

#include <iosfwd>
#include <string>
#include <vector>

#include "args.hpp"

namespace tangram::cli {

/// Where a command writes: results to `out`, progress and diagnostics to `err`.
struct streams {
  std::ostream& out;
  std::ostream& err;
};

int cmd_calibrate(args& a, streams io);
int cmd_plan(args& a, streams io);
int cmd_inspect(args& a, streams io);
int cmd_simulate(args& a, streams io);
int cmd_models(args& a, streams io);
int cmd_profiles(args& a, streams io);

/// Runs `tangram <argv...>` (argv without the program name) and returns the exit code:
/// 0 success, 1 failure of the job itself, 2 bad usage or bad input.
int run(std::vector<std::string> const& argv, streams io);

}  // namespace tangram::cli
