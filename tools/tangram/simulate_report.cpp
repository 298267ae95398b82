// SPDX-License-Identifier: Apache-2.0
#include "simulate_report.hpp"

#include <cmath>
#include <iomanip>
#include <sstream>

#include "plan_support.hpp"

namespace tangram::cli {

namespace json = tangram::detail::json;
using namespace tangram::sim;

json::value result_json(replay_result const& r) {
  auto o = json::value::object();
  o.set("peak_resident_sessions", r.peak_resident_sessions);
  o.set("mean_resident_sessions", r.mean_resident_sessions);
  o.set("peak_running", r.peak_running);
  o.set("kv_bytes_capacity", r.capacity_bytes);
  o.set("kv_bytes_allocated_peak", r.kv_bytes_allocated_peak);
  o.set("kv_bytes_live_peak", r.kv_bytes_live_peak);
  o.set("mean_utilisation", r.mean_utilisation);
  o.set("admission_waits", r.admission_waits);
  o.set("modelled_mean_admission_wait_s", r.mean_admission_wait_s);
  o.set("reclaim_ops", r.reclaim_ops);
  o.set("surplus_pages_released", r.released_pages);
  o.set("preemptions", r.preemptions);
  o.set("idle_evictions", r.idle_evictions);
  o.set("recomputed_tokens", r.recomputed_tokens);
  o.set("rejected_sessions", r.rejected_sessions);
  o.set("steps", r.steps);
  o.set("control_plane_us_per_step", r.control_plane_us_per_step);
  o.set("generated_tokens", r.generated_tokens);
  o.set("prefilled_tokens", r.prefilled_tokens);
  o.set("modelled_makespan_s", r.modelled_makespan_s);
  o.set("modelled_tokens_per_s", r.modelled_tokens_per_s);
  o.set("modelled_ttft_mean_s", r.modelled_ttft_mean_s);
  o.set("modelled_ttft_p95_s", r.modelled_ttft_p95_s);
  o.set("modelled_tbt_p50_s", r.modelled_tbt_p50_s);
  o.set("modelled_tbt_p95_s", r.modelled_tbt_p95_s);
  o.set("modelled_eviction_pass_s", r.modelled_eviction_pass_s);
  o.set("completed_requests", r.completed_requests);
  o.set("modelled_requests_per_s", r.modelled_requests_per_s);
  o.set("truncated_answers", r.truncated_answers);
  o.set("reserved_decode_tokens", r.reserved_decode_tokens);
  auto t = json::value::object();
  t.set("prefill_s", r.time.prefill_s);
  t.set("eviction_pass_s", r.time.eviction_pass_s);
  t.set("decode_attention_s", r.time.decode_attention_s);
  t.set("weights_s", r.time.weights_s);
  t.set("reclamation_s", r.time.reclamation_s);
  t.set("replanning_s", r.time.replanning_s);
  t.set("overhead_s", r.time.overhead_s);
  t.set("control_plane_s", r.time.control_plane_s);
  t.set("idle_s", r.time.idle_s);
  o.set("modelled_time_breakdown", std::move(t));
  return o;
}

std::string memory_svg(std::vector<replay_result> const& results, double capacity_gb, std::string const& title) {
  constexpr double W = 940, H = 420, left = 70, right = 210, top = 40, bottom = 50;
  // One colour per policy, whichever policies run (--ablation adds two).
  auto colour = [](std::string const& policy) {
    if (policy == "full_kv") return "#d62728";
    if (policy == "unified_nonuniform") return "#ff7f0e";
    if (policy == "reservation_only") return "#9467bd";
    if (policy == "+head_groups") return "#8c564b";
    if (policy == "tangram") return "#1f77b4";
    return "#2ca02c";
  };
  double t_max = 1e-9;
  for (auto const& r : results)
    if (!r.timeline.empty()) t_max = std::max(t_max, r.timeline.back().time_s);
  // Round axis steps: 1, 2 or 5 times a power of ten, five or so ticks.
  auto nice_step = [](double span) {
    double raw = span / 5, mag = std::pow(10.0, std::floor(std::log10(raw)));
    for (double m : {1.0, 2.0, 5.0, 10.0})
      if (raw <= m * mag) return m * mag;
    return 10 * mag;
  };
  double y_step = nice_step(capacity_gb * 1.05), t_step = nice_step(t_max);
  double y_max  = std::ceil(capacity_gb * 1.05 / y_step) * y_step;
  t_max         = std::ceil(t_max / t_step) * t_step;
  auto x = [&](double t) { return left + (W - left - right) * t / t_max; };
  auto y = [&](double gb) { return H - bottom - (H - top - bottom) * gb / y_max; };
  std::ostringstream s;
  s << std::fixed << std::setprecision(1);
  s << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W << "\" height=\"" << H
    << "\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  s << "<text x=\"" << left << "\" y=\"22\" font-size=\"14\">" << xml_escape(title) << "</text>\n";
  s << "<line x1=\"" << left << "\" y1=\"" << y(0) << "\" x2=\"" << W - right << "\" y2=\"" << y(0) << "\" stroke=\"black\"/>\n";
  s << "<line x1=\"" << left << "\" y1=\"" << y(0) << "\" x2=\"" << left << "\" y2=\"" << top << "\" stroke=\"black\"/>\n";
  s << std::setprecision(0);
  for (double gb = 0; gb <= y_max + 1e-9; gb += y_step)
    s << "<text x=\"" << left - 8 << "\" y=\"" << y(gb) + 4 << "\" text-anchor=\"end\">" << gb << "</text>\n";
  for (double t = 0; t <= t_max + 1e-9; t += t_step)
    s << "<text x=\"" << x(t) << "\" y=\"" << H - bottom + 18 << "\" text-anchor=\"middle\">" << t << "</text>\n";
  s << std::setprecision(1);
  s << "<line x1=\"" << left << "\" y1=\"" << y(capacity_gb) << "\" x2=\"" << W - right << "\" y2=\""
    << y(capacity_gb) << "\" stroke=\"gray\" stroke-dasharray=\"2,3\"/>\n";
  s << "<text x=\"" << W - right - 4 << "\" y=\"" << y(capacity_gb) - 5 << "\" text-anchor=\"end\" fill=\"gray\" font-size=\"10\">KV capacity</text>\n";
  s << "<text x=\"" << (left + W - right) / 2 << "\" y=\"" << H - 12 << "\" text-anchor=\"middle\">modelled time (s)</text>\n";
  s << "<text x=\"16\" y=\"" << (top + H - bottom) / 2 << "\" transform=\"rotate(-90 16 " << (top + H - bottom) / 2
    << ")\" text-anchor=\"middle\">KV memory (GB)</text>\n";
  for (std::size_t k = 0; k < results.size(); ++k) {
    auto const& r = results[k];
    for (int live = 0; live < 2; ++live) {
      s << "<polyline fill=\"none\" stroke=\"" << colour(r.policy) << "\" stroke-width=\"1.5\""
        << (live ? " stroke-dasharray=\"5,3\"" : "") << " points=\"";
      for (auto const& p : r.timeline)
        s << x(p.time_s) << "," << y((live ? p.live_bytes : p.allocated_bytes) / 1e9) << " ";
      s << "\"/>\n";
    }
    double ly = top + 20 + 36.0 * static_cast<double>(k);
    s << "<line x1=\"" << W - right + 10 << "\" y1=\"" << ly << "\" x2=\"" << W - right + 40 << "\" y2=\"" << ly
      << "\" stroke=\"" << colour(r.policy) << "\" stroke-width=\"2\"/>\n";
    s << "<text x=\"" << W - right + 46 << "\" y=\"" << ly + 4 << "\">" << r.policy << "</text>\n";
  }
  s << "<text x=\"" << W - right + 10 << "\" y=\"" << top + 20 + 36.0 * static_cast<double>(results.size())
    << "\" font-size=\"11\" fill=\"gray\">solid: allocated, dashed: live</text>\n";
  s << "</svg>\n";
  return s.str();
}

json::value costs_json(serving_costs const& c) {
  auto o = json::value::object();
  o.set("label", "modelled: constants of eval/sim/serving_costs.hpp (sources in docs/benchmarks.md)");
  o.set("reclaim_s_per_page", c.reclaim_s_per_page);
  o.set("padded_reads", c.padded_reads);
  o.set("baseline_balance", std::string(to_string(c.balance)));
  o.set("unbalanced_skew", c.unbalanced_skew);
  o.set("replan_fraction", c.replan_fraction);
  o.set("step_overhead_s", c.step_overhead_s);
  o.set("control_plane_charged", c.control_plane);
  o.set("planner_skew_measured", c.planner_skew);
  o.set("tangram_skew_measured", c.tangram_skew);
  o.set("tangram_elastic_skew_measured", c.tangram_elastic_skew);
  return o;
}

bool seconds_valued(std::string const& name) {
  return name.find("_s_per_") != std::string::npos ||
         (name.size() > 2 && name.compare(name.size() - 2, 2, "_s") == 0);
}

json::value verdict_json(verdict const& v) {
  auto o = json::value::object();
  o.set("modelled_tokens_per_s", v.tokens_per_s_ratio);
  o.set("mean_resident_sessions", v.mean_resident_ratio);
  return o;
}

}  // namespace tangram::cli
