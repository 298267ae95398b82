// SPDX-License-Identifier: Apache-2.0
/**
 * @file eval/sim/sensitivity.hpp
 * @brief The verdict of `tangram simulate` (tangram and tangram_elastic against the unified-page
 * baseline: ratio of modelled throughput and of mean resident sessions) and its sensitivity to
 * the uncalibrated costs of eval/sim/serving_costs.hpp: each constant is set to the low, then the
 * high end of its plausible range, one at a time, and the verdict recomputed.
 *
 * `max_tokens_variation` adds the engine's max_tokens (every policy replayed at each end, and at
 * the rest of the context, vLLM's default);
 * `admission_variation` the baseline's admission rule (chunk as vLLM v1, or whole prompt).
 *
 * Only the policies whose charges change are replayed again (a policy with no reclaim operations
 * ignores the reclaim constant), so a sweep costs a few replays, not four per point.
 */
#pragma once

#include <algorithm>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "tangram/eval/sim/replay.hpp"
#include "tangram/eval/sim/serving_costs.hpp"

namespace tangram::sim {

/// @brief One policy against the baseline.
struct verdict {
  double tokens_per_s_ratio = 0;    ///< modelled tokens/s, policy / baseline
  double mean_resident_ratio = 0;   ///< time-weighted resident sessions, policy / baseline
  /// Resident sessions while each one's memory binds (`mean_resident_sessions_memory_bound`),
  /// policy / baseline; 0 when either never binds (undefined: reported as null or "-").
  double bound_resident_ratio = 0;
};

inline verdict verdict_of(replay_result const& policy, replay_result const& baseline) {
  auto ratio = [](double a, double b) { return b > 0 ? a / b : 0.0; };
  return {ratio(policy.modelled_tokens_per_s, baseline.modelled_tokens_per_s),
          ratio(policy.mean_resident_sessions, baseline.mean_resident_sessions),
          ratio(policy.mean_resident_sessions_memory_bound,
                baseline.mean_resident_sessions_memory_bound)};
}

/// @brief One uncalibrated constant at one end of its range.
struct cost_variation {
  std::string constant;  ///< e.g. "reclaim_s_per_page"
  std::string end;       ///< "low" or "high"
  double value = 0;
  serving_costs costs;   ///< the defaults with this one constant changed
};

/// The name of the baseline's read mode in a sensitivity point (`cost_variation::end`).
inline char const* baseline_reads_name(bool masked) { return masked ? "masked" : "padded"; }

/// The variations a sweep runs, each at both ends of its range: reclamation (low end: a batched
/// free on this project's pool, measured, per page, `reclaim_s_per_page`; high end: the paper's 25%
/// of the reclaiming chunks' prefill, `reclaim_prefill_fraction`); the baseline balancing by
/// re-planning (replan_fraction, the paper's form) and without balancing (unbalanced_skew),
/// whichever the default is; a perfectly balancing per-step planner (`baseline_balance`
/// `perfect`, one point, unless that is the run's own); the per-step overhead; the baseline's
/// kernel reading whole pages (`padded`, value 1) or masking each head at its length (`masked`,
/// value 0).
inline std::vector<cost_variation> uncalibrated_variations(serving_costs const& base) {
  std::vector<cost_variation> out;
  auto add = [&](std::string name, cost_range r, double serving_costs::*field) {
    for (auto [end, v] : {std::pair<char const*, double>{"low", r.low}, {"high", r.high}}) {
      cost_variation c{name, end, v, base};
      c.costs.*field = v;
      out.push_back(std::move(c));
    }
  };
  {
    cost_variation low{"reclaim_s_per_page", "low", pinned_batched_free_s_per_page, base};
    low.costs.reclaim_s_per_page       = pinned_batched_free_s_per_page;
    low.costs.reclaim_prefill_fraction = 0;
    out.push_back(std::move(low));
    cost_variation high{
        "reclaim_prefill_fraction", "high", paper_costs::reclaim_prefill_high, base};
    high.costs.reclaim_s_per_page       = 0;
    high.costs.reclaim_prefill_fraction = paper_costs::reclaim_prefill_high;
    out.push_back(std::move(high));
  }
  // How the baseline balances decode is itself uncertain: the other way is swept too.
  add("replan_fraction", serving_costs::replan_range(), &serving_costs::replan_fraction);
  add("unbalanced_skew", serving_costs::unbalanced_skew_range(), &serving_costs::unbalanced_skew);
  for (auto& c : out) {
    if (c.constant == "replan_fraction") {
      c.costs.balance = baseline_balance::replan;
      c.costs.replan  = replan_mode::fraction;
    }
    if (c.constant == "unbalanced_skew") c.costs.balance = baseline_balance::none;
  }
  // A per-step planner that balances perfectly (skew 1 at every batch; it still pays
  // re-planning): the measured greedy planners are one way to plan, not the best one.
  if (base.balance != baseline_balance::perfect) {
    cost_variation c{"baseline_balance", "perfect", 1.0, base};
    c.costs.balance = baseline_balance::perfect;
    out.push_back(std::move(c));
  }
  add("step_overhead_s", serving_costs::step_overhead_range(), &serving_costs::step_overhead_s);
  for (bool masked : {false, true}) {
    cost_variation c{"baseline_reads", baseline_reads_name(masked), masked ? 0.0 : 1.0, base};
    c.costs.baseline_masked_reads = masked;
    out.push_back(std::move(c));
  }
  return out;
}

/// @brief The engine's `max_tokens` (what every turn reserves at admission; not measured), swept
/// after the charges: at each end every policy, the baseline included, is replayed with it.
struct max_tokens_variation {
  std::int64_t low  = 512;   ///< a short-answer engine setting
  std::int64_t high = 8192;  ///< a long-answer (reasoning) engine setting
  /// The rest of the context (the model's context limit; each turn's reservation is capped by
  /// what its context leaves): vLLM's default when a request sets no max_tokens. 0: not swept.
  std::int64_t context = 0;
  /// Replays one policy with the default charges and this max_tokens.
  std::function<replay_result(std::string const&, std::int64_t)> rerun;
};

/// @brief The baseline's admission rule (`--baseline-admission`: a turn admitted when its first
/// scheduled chunk fits, as vLLM v1, or only when its whole uncompressed prompt does), swept after
/// max_tokens: the baseline under each rule. The compared policies have no such rule (Tangram
/// admits by its reservation), so their default results serve at both points, and the default
/// rule's point is the default run: one replay in all.
struct admission_variation {
  bool default_chunk = true;  ///< the default run's rule: chunk (true) or whole (false)
  /// Replays the baseline with the default charges under chunk (true) or whole (false) admission.
  std::function<replay_result(bool chunk)> rerun_baseline;
};

/// The name of a rule in a sensitivity point (`cost_variation::end`).
inline char const* admission_rule_name(bool chunk) { return chunk ? "chunk" : "whole"; }

/// @brief The verdict at one variation.
struct sensitivity_point {
  cost_variation variation;
  std::map<std::string, verdict> verdicts;  ///< by policy (the compared ones)
};

/// @brief The verdict's range over the sweep, per compared policy.
struct verdict_range {
  verdict low, high;
};

/// @brief A sweep and its summary.
struct sensitivity_report {
  std::vector<sensitivity_point> points;
  std::map<std::string, verdict_range> range;  ///< includes the default verdict
  std::int32_t replays = 0;                    ///< replays the sweep ran
};

/**
 * @brief Runs the sweep. `rerun(policy, charges)` replays one policy with other charges;
 * `defaults` holds the default run's results by policy name (the baseline and each of
 * `compared`), `costs` the default constants.
 */
inline sensitivity_report sweep_sensitivity(
    serving_costs const& costs,
    std::map<std::string, replay_result> const& defaults,
    std::string const& baseline,
    std::vector<std::string> const& compared,
    std::function<replay_result(std::string const&, step_charges const&)> const& rerun,
    max_tokens_variation const* max_tokens = nullptr,
    admission_variation const* admission = nullptr) {
  sensitivity_report rep;
  auto same = [&](std::string const& name, step_charges a, step_charges b) {
    if (defaults.at(name).reclaim_ops == 0) {
      a.reclaim_s_per_page       = b.reclaim_s_per_page;
      a.reclaim_prefill_fraction = b.reclaim_prefill_fraction;
    }
    return a == b;
  };
  auto note = [&](std::string const& name, verdict v) {
    auto it = rep.range.find(name);
    if (it == rep.range.end()) {
      rep.range[name] = {v, v};
      return;
    }
    auto& r                   = it->second;
    r.low.tokens_per_s_ratio  = std::min(r.low.tokens_per_s_ratio, v.tokens_per_s_ratio);
    r.high.tokens_per_s_ratio = std::max(r.high.tokens_per_s_ratio, v.tokens_per_s_ratio);
    r.low.mean_resident_ratio = std::min(r.low.mean_resident_ratio, v.mean_resident_ratio);
    r.high.mean_resident_ratio = std::max(r.high.mean_resident_ratio, v.mean_resident_ratio);
  };
  for (auto const& name : compared)
    note(name, verdict_of(defaults.at(name), defaults.at(baseline)));
  for (auto const& var : uncalibrated_variations(costs)) {
    std::map<std::string, replay_result> now;
    auto result = [&](std::string const& name) -> replay_result const& {
      auto it = now.find(name);
      if (it != now.end()) return it->second;
      auto ch = var.costs.charges_for(name);
      if (same(name, ch, costs.charges_for(name))) return defaults.at(name);
      rep.replays += 1;
      return now.emplace(name, rerun(name, ch)).first->second;
    };
    sensitivity_point p{var, {}};
    for (auto const& name : compared) {
      auto v = verdict_of(result(name), result(baseline));
      p.verdicts[name] = v;
      note(name, v);
    }
    rep.points.push_back(std::move(p));
  }
  if (max_tokens && max_tokens->rerun) {
    std::vector<std::pair<char const*, std::int64_t>> ends{{"low", max_tokens->low}, {"high", max_tokens->high}};
    if (max_tokens->context > 0) ends.emplace_back("context", max_tokens->context);
    for (auto [end, v] : ends) {
      sensitivity_point p{cost_variation{"max_tokens", end, static_cast<double>(v), costs}, {}};
      rep.replays += 1;
      auto base = max_tokens->rerun(baseline, v);
      for (auto const& name : compared) {
        rep.replays += 1;
        auto v_ = verdict_of(max_tokens->rerun(name, v), base);
        p.verdicts[name] = v_;
        note(name, v_);
      }
      rep.points.push_back(std::move(p));
    }
  }
  if (admission && admission->rerun_baseline) {
    // value: 1 for chunk admission, 0 for whole (end names the rule).
    for (bool chunk : {true, false}) {
      sensitivity_point p{cost_variation{"baseline_admission", admission_rule_name(chunk), chunk ? 1.0 : 0.0, costs}, {}};
      std::optional<replay_result> other;
      if (chunk != admission->default_chunk) {
        rep.replays += 1;
        other = admission->rerun_baseline(chunk);
      }
      auto const& base = other ? *other : defaults.at(baseline);
      for (auto const& name : compared) {
        auto v = verdict_of(defaults.at(name), base);
        p.verdicts[name] = v;
        note(name, v);
      }
      rep.points.push_back(std::move(p));
    }
  }
  return rep;
}

}  // namespace tangram::sim
