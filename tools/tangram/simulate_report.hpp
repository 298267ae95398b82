// SPDX-License-Identifier: Apache-2.0
// `tangram simulate`'s report pieces: the JSON of one policy's replay, of the cost constants and
// of a verdict, and the memory-over-time SVG.
#pragma once

#include <iosfwd>
#include <string>
#include <vector>

#include "tangram/eval/sim/rate_sweep.hpp"
#include "tangram/eval/sim/replay.hpp"
#include "tangram/eval/sim/sensitivity.hpp"
#include "tangram/eval/sim/serving_costs.hpp"
#include "tangram/io/detail/json.hpp"

namespace tangram::cli {

/// One policy's figures (the field names `--json` has always used, then the new ones).
tangram::detail::json::value result_json(sim::replay_result const& r);
/// The charged costs' constants (eval/sim/serving_costs.hpp).
tangram::detail::json::value costs_json(sim::serving_costs const& c);
/// A verdict: throughput and mean-resident ratios.
tangram::detail::json::value verdict_json(sim::verdict const& v);
/// A resident-while-bound ratio (`verdict::bound_resident_ratio`): null when undefined (0).
tangram::detail::json::value bound_ratio_json(double ratio);
/// The batch sizes of a skew curve, "1 2 4 ... 1024" (empty curve: "-").
std::string skew_curve_text(sim::skew_curve const& k);
/// The skews of a curve, one per batch size, three decimals each, space-separated.
std::string skew_curve_values(sim::skew_curve const& k);
/// A constant measured in seconds ("..._s", "..._s_per_page"): printed in us.
bool seconds_valued(std::string const& name);
/// Memory over time per policy: allocated (solid) and live (dashed) GB; modelled time axis.
std::string memory_svg(std::vector<sim::replay_result> const& results,
                       double capacity_gb,
                       std::string const& title);

/// One stacked segment of a policy's time breakdown.
struct time_segment {
  std::string name;
  double seconds = 0;
  char const* colour = "";
};
/// The breakdown's segments in drawing order (they sum to `t.sum()`, the makespan; measured
/// control-plane time, when charged, is drawn with the step overhead).
std::vector<time_segment> time_segments(sim::time_breakdown const& t);
/// Stacked bars of the modelled time breakdown, one per policy.
std::string time_breakdown_svg(std::vector<sim::replay_result> const& results, std::string const& title);
/// One panel of the serving figure: a value per policy (and its p95, for latencies).
struct serving_panel {
  std::string name;
  std::vector<double> values;  ///< per policy, in the results' order (p50 for latencies)
  std::vector<double> p95;     ///< per policy for latencies; empty otherwise
};
/// The serving figure's panels: tokens/s, requests/s, mean resident sessions, TTFT p50 / p95 (s)
/// and time between tokens p50 / p95 (ms), each per policy.
std::vector<serving_panel> serving_panels(std::vector<sim::replay_result> const& results);
/// Bars of the serving figures per policy, one panel (own scale) per figure.
std::string serving_svg(std::vector<sim::replay_result> const& results, std::string const& title);
/// TTFT p50 (solid) and p95 (dashed) per policy against the arrival rate.
std::string ttft_rate_svg(std::vector<sim::rate_point> const& sweep, std::string const& title);
/// `path` with `suffix` before its extension: plot_path("m.svg", "-time") == "m-time.svg".
std::string plot_path(std::string const& path, std::string const& suffix);
/// The sweep's figures per rate and policy (`--json`'s "rate_sweep").
tangram::detail::json::value sweep_json(std::vector<sim::rate_point> const& sweep);
/// The sweep as a table.
void print_sweep(std::ostream& o, std::vector<sim::rate_point> const& sweep);

}  // namespace tangram::cli
