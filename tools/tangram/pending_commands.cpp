// SPDX-License-Identifier: Apache-2.0
// TEMPORARY during development: commands whose implementation lands in its own file.
#include "commands.hpp"

namespace tangram::cli {
int cmd_calibrate(args&, streams) { throw usage_error("calibrate: not built yet"); }
int cmd_plan(args&, streams) { throw usage_error("plan: not built yet"); }
int cmd_inspect(args&, streams) { throw usage_error("inspect: not built yet"); }
int cmd_simulate(args&, streams) { throw usage_error("simulate: not built yet"); }
}  // namespace tangram::cli
