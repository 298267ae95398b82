// SPDX-License-Identifier: Apache-2.0
// TEMPORARY during development: commands whose implementation lands in its own file.
#include "commands.hpp"

namespace tangram::cli {
int cmd_simulate(args&, streams) { throw usage_error("simulate: not built yet"); }
}  // namespace tangram::cli
