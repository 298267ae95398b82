// SPDX-License-Identifier: Apache-2.0
// The `tangram` program as a function, so tests and fuzzers drive it in-process. Bad input throws
// (tangram::invalid_argument / usage_error, or a CLI11 parse error) and `run` turns that into a
// one-line error, exit 2.
#pragma once

#include <iosfwd>
#include <string>
#include <vector>

#include "usage_error.hpp"

namespace tangram::cli {

/// Where a command writes: results to `out`, progress and diagnostics to `err`.
struct streams {
  std::ostream& out;
  std::ostream& err;
};

/// Runs `tangram <argv...>` (argv without the program name) and returns the exit code:
/// 0 success, 1 failure of the job itself, 2 bad usage or bad input.
int run(std::vector<std::string> const& argv, streams io);

}  // namespace tangram::cli
