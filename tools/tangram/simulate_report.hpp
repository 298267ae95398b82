// SPDX-License-Identifier: Apache-2.0
// `tangram simulate`'s report pieces: the JSON of one policy's replay, of the cost constants and
// of a verdict, and the memory-over-time SVG.
#pragma once

#include <string>
#include <vector>

#include "tangram/detail/json.hpp"
#include "tangram/eval/sim/replay.hpp"
#include "tangram/eval/sim/sensitivity.hpp"
#include "tangram/eval/sim/serving_costs.hpp"

namespace tangram::cli {

/// One policy's figures (the field names `--json` has always used, then the new ones).
tangram::detail::json::value result_json(sim::replay_result const& r);
/// The charged costs' constants (eval/sim/serving_costs.hpp).
tangram::detail::json::value costs_json(sim::serving_costs const& c);
/// A verdict: throughput and mean-resident ratios.
tangram::detail::json::value verdict_json(sim::verdict const& v);
/// A constant measured in seconds ("..._s", "..._s_per_page"): printed in us.
bool seconds_valued(std::string const& name);
/// Memory over time per policy: allocated (solid) and live (dashed) GB; modelled time axis.
std::string memory_svg(std::vector<sim::replay_result> const& results,
                       double capacity_gb,
                       std::string const& title);

}  // namespace tangram::cli
