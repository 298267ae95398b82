// SPDX-License-Identifier: Apache-2.0
/**
 * @file eval/sim/rate_sweep.hpp
 * @brief Arrival-rate sweeps (TTFT vs rate, as the paper's figure): the same sessions replayed at
 * each arrival rate for every policy. Evaluation code: not installed.
 *
 * The sessions are generated once with Poisson arrivals at 1 session/s; the workload at rate R
 * divides every arrival time by R (a Poisson process of rate 1, time-scaled, is one of rate R), so
 * every rate replays the same sessions, turns, prompts, answers and think times, and at a given
 * rate every policy replays the same workload object.
 */
#pragma once

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "tangram/core/detail/str.hpp"
#include "tangram/core/error.hpp"
#include "tangram/eval/sim/replay.hpp"
#include "tangram/eval/sim/workload.hpp"

namespace tangram::sim {

/// Most rates one sweep takes (each is a full run of every policy).
inline constexpr std::size_t max_sweep_rates = 64;

/**
 * @brief `unit` (arrivals of a rate-1 process, sessions/s) with every arrival time divided by
 * `rate`: the same sessions arriving at `rate` sessions/s. Turns are unchanged.
 * @throw invalid_argument naming the rate when it is not finite and > 0.
 */
inline workload at_arrival_rate(workload const& unit, double rate) {
  TANGRAM_EXPECTS(std::isfinite(rate) && rate > 0, invalid_argument,
                  "rate sweep: an arrival rate must be > 0 sessions/s, got ", rate);
  workload w = unit;
  for (auto& s : w.sessions) s.arrival_s = unit.sessions.empty() ? 0 : s.arrival_s / rate;
  w.name = unit.name + " at " + detail::cat(rate) + " sessions/s";
  return w;
}

/// @brief One rate of a sweep: the workload replayed and each policy's result, in run order.
struct rate_point {
  double rate = 0;
  double last_arrival_s = 0;  ///< the last session's arrival (modelled seconds)
  std::vector<replay_result> results;
};

/**
 * @brief Replays `unit` at each of `rates` (sessions/s, each > 0, at most `max_sweep_rates`):
 * `run_all(w)` runs every policy on the workload `w` and returns their results in order.
 * @throw invalid_argument naming a bad rate or too many.
 */
template <class RunAll>
std::vector<rate_point> sweep_arrival_rates(workload const& unit, std::vector<double> const& rates,
                                            RunAll&& run_all) {
  TANGRAM_EXPECTS(!rates.empty() && rates.size() <= max_sweep_rates, invalid_argument,
                  "rate sweep: give 1 to ", max_sweep_rates, " rates, got ", rates.size());
  for (double r : rates) (void)at_arrival_rate(workload{}, r);  // every rate checked up front
  std::vector<rate_point> points;
  for (double r : rates) {
    workload w = at_arrival_rate(unit, r);
    rate_point p;
    p.rate = r;
    for (auto const& s : w.sessions) p.last_arrival_s = std::max(p.last_arrival_s, s.arrival_s);
    p.results = run_all(static_cast<workload const&>(w));
    points.push_back(std::move(p));
  }
  return points;
}

}  // namespace tangram::sim
