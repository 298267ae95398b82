// SPDX-License-Identifier: Apache-2.0
// The error of bad command-line usage. A separate type so that checks made after parsing (and in
// helpers far from the parser) still end in exit code 2, like CLI11's own parse errors.
#pragma once

#include "tangram/core/error.hpp"

namespace tangram::cli {

/// Bad command-line usage (exit code 2).
struct usage_error : tangram::invalid_argument {
  using tangram::invalid_argument::invalid_argument;
};

}  // namespace tangram::cli
