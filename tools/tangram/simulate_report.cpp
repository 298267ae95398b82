// SPDX-License-Identifier: Apache-2.0
#include "simulate_report.hpp"

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <optional>
#include <ostream>
#include <sstream>

#include "plan_support.hpp"

namespace tangram::cli {

namespace json = tangram::detail::json;
using namespace tangram::sim;

json::value result_json(replay_result const& r) {
  auto o = json::value::object();
  o.set("peak_resident_sessions", r.peak_resident_sessions);
  o.set("mean_resident_sessions", r.mean_resident_sessions);
  o.set("mean_resident_sessions_memory_bound", r.mean_resident_sessions_memory_bound);
  o.set("memory_bound_s", r.memory_bound_s);
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
  o.set("counts_wait_steps", r.counts_wait_steps);
  o.set("idle_evictions", r.idle_evictions);
  o.set("recomputed_tokens", r.recomputed_tokens);
  o.set("reloaded_tokens", r.reloaded_tokens);
  o.set("host_offload_peak_bytes", r.host_offload_peak_bytes);
  o.set("parks", r.parks);
  o.set("parked_running", r.parked_running);
  o.set("resumes", r.resumes);
  o.set("parked_bytes", r.parked_bytes);
  o.set("restored_bytes", r.restored_bytes);
  o.set("modelled_host_transfer_s", r.modelled_host_transfer_s);
  o.set("mean_staging_bytes", r.mean_staging_bytes);
  o.set("mean_allocated_bytes", r.mean_allocated_bytes);
  o.set("mean_held_bytes", r.mean_held_bytes);
  o.set("mean_live_bytes", r.mean_live_bytes);
  o.set("rejected_sessions", r.rejected_sessions);
  o.set("modelled_wanted_clipped_fraction",
        r.wanted_clipped_fraction ? json::value(*r.wanted_clipped_fraction) : json::value(nullptr));
  o.set("steps", r.steps);
  o.set("control_plane_us_per_step", r.control_plane_us_per_step);
  auto cp = json::value::object();
  cp.set("admission_s", r.control_plane.admission_s);
  cp.set("prefill_chunks_s", r.control_plane.prefill_chunks_s);
  cp.set("decode_s", r.control_plane.decode_s);
  cp.set("end_turn_s", r.control_plane.end_turn_s);
  cp.set("release_s", r.control_plane.release_s);
  cp.set("park_idle_s", r.control_plane.park_idle_s);
  cp.set("evict_cached_s", r.control_plane.evict_cached_s);
  o.set("control_plane_by_call", std::move(cp));
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
  o.set("modelled_ttft_p50_s", r.modelled_ttft_p50_s);
  o.set("prefix_blocks_evicted", r.prefix_blocks_evicted);
  o.set("compressed_keep_ratio", r.compressed_keep_ratio);
  o.set("stored_keep_ratio", r.stored_keep_ratio);
  auto t = json::value::object();
  t.set("prefill_s", r.time.prefill_s);
  t.set("eviction_pass_s", r.time.eviction_pass_s);
  t.set("decode_attention_s", r.time.decode_attention_s);
  t.set("weights_s", r.time.weights_s);
  t.set("reclamation_s", r.time.reclamation_s);
  t.set("replanning_s", r.time.replanning_s);
  t.set("overhead_s", r.time.overhead_s);
  t.set("decode_launch_s", r.time.decode_launch_s);
  t.set("control_plane_s", r.time.control_plane_s);
  t.set("reload_stall_s", r.time.reload_stall_s);
  t.set("host_transfer_s", r.time.host_transfer_s);
  t.set("idle_s", r.time.idle_s);
  o.set("modelled_time_breakdown", std::move(t));
  return o;
}

namespace {

// One colour per policy, whichever policies run (--ablation adds two).
char const* policy_colour(std::string const& policy) {
  if (policy == "full_kv") return "#d62728";
  if (policy == "unified_nonuniform") return "#ff7f0e";
  if (policy == "reservation_only") return "#9467bd";
  if (policy == "+head_groups") return "#8c564b";
  if (policy == "tangram") return "#1f77b4";
  if (policy == "per_head_dynamic") return "#e377c2";
  if (policy == "full_kv_offload") return "#7f7f7f";
  return "#2ca02c";
}

// Round axis steps: 1, 2 or 5 times a power of ten, five or so ticks.
double nice_step(double span) {
  if (!(span > 0)) return 1;
  double raw = span / 5, mag = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (raw <= m * mag) return m * mag;
  return 10 * mag;
}

void svg_open(std::ostringstream& s, double W, double H, double left, std::string const& title) {
  s << std::fixed << std::setprecision(1);
  s << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W << "\" height=\"" << H
    << "\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  s << "<text x=\"" << left << "\" y=\"22\" font-size=\"14\">" << xml_escape(title) << "</text>\n";
}

// A tick label: integers plainly, else up to three significant decimals.
std::string tick(double v) {
  std::ostringstream t;
  if (std::fabs(v - std::round(v)) < 1e-9) {
    t << static_cast<long long>(std::llround(v));
  } else {
    t << std::setprecision(3) << v;
  }
  return t.str();
}

// A figure's canvas and plot area: W x H with margins; data coordinates map into the area.
struct svg_frame {
  double W, H, left, right, top, bottom;
  [[nodiscard]] double x(double v, double max) const { return left + (W - left - right) * v / max; }
  [[nodiscard]] double y(double v, double max) const { return H - bottom - (H - top - bottom) * v / max; }
};

// An axis from 0 to `max` with a tick label every `step`.
struct svg_axis {
  double max, step;
};

// The two axes and their tick labels: y on the left, x (when given) below. `whole` prints the
// labels, and their positions, with no decimals (the memory figure); else positions at 0.1 and
// labels by tick().
void svg_axes(std::ostringstream& s, svg_frame const& f, svg_axis y, std::optional<svg_axis> x, bool whole = false) {
  s << "<line x1=\"" << f.left << "\" y1=\"" << f.y(0, y.max) << "\" x2=\"" << f.W - f.right << "\" y2=\""
    << f.y(0, y.max) << "\" stroke=\"black\"/>\n";
  s << "<line x1=\"" << f.left << "\" y1=\"" << f.y(0, y.max) << "\" x2=\"" << f.left << "\" y2=\"" << f.top
    << "\" stroke=\"black\"/>\n";
  auto label = [&](double v) { return whole ? fixed(v, 0) : tick(v); };
  if (whole) s << std::setprecision(0);
  for (double v = 0; v <= y.max + 1e-9; v += y.step)
    s << "<text x=\"" << f.left - 8 << "\" y=\"" << f.y(v, y.max) + 4 << "\" text-anchor=\"end\">" << label(v)
      << "</text>\n";
  if (x)
    for (double v = 0; v <= x->max + 1e-9; v += x->step)
      s << "<text x=\"" << f.x(v, x->max) << "\" y=\"" << f.H - f.bottom + 18 << "\" text-anchor=\"middle\">"
        << label(v) << "</text>\n";
  s << std::setprecision(1);
}

// The axes' titles: x below the plot area (none when empty), y rotated on the left.
void svg_axis_titles(std::ostringstream& s, svg_frame const& f, std::string const& x_title, std::string const& y_title) {
  if (!x_title.empty())
    s << "<text x=\"" << (f.left + f.W - f.right) / 2 << "\" y=\"" << f.H - 12 << "\" text-anchor=\"middle\">"
      << x_title << "</text>\n";
  s << "<text x=\"16\" y=\"" << (f.top + f.H - f.bottom) / 2 << "\" transform=\"rotate(-90 16 "
    << (f.top + f.H - f.bottom) / 2 << ")\" text-anchor=\"middle\">" << y_title << "</text>\n";
}

// The legend's row `k`: policy's colour as a line, then its name.
void svg_legend_row(std::ostringstream& s, svg_frame const& f, std::size_t k, std::string const& policy) {
  double ly = f.top + 20 + 36.0 * static_cast<double>(k);
  s << "<line x1=\"" << f.W - f.right + 10 << "\" y1=\"" << ly << "\" x2=\"" << f.W - f.right + 40 << "\" y2=\"" << ly
    << "\" stroke=\"" << policy_colour(policy) << "\" stroke-width=\"2\"/>\n";
  s << "<text x=\"" << f.W - f.right + 46 << "\" y=\"" << ly + 4 << "\">" << xml_escape(policy) << "</text>\n";
}

// The gray note under a legend of `rows` rows (what solid and dashed mean).
void svg_legend_note(std::ostringstream& s, svg_frame const& f, std::size_t rows, std::string const& note) {
  s << "<text x=\"" << f.W - f.right + 10 << "\" y=\"" << f.top + 20 + 36.0 * static_cast<double>(rows)
    << "\" font-size=\"11\" fill=\"gray\">" << note << "</text>\n";
}

}  // namespace

std::string memory_svg(std::vector<replay_result> const& results, double capacity_gb, std::string const& title) {
  constexpr svg_frame f{940, 420, 70, 210, 40, 50};
  double t_max = 1e-9;
  for (auto const& r : results)
    if (!r.timeline.empty()) t_max = std::max(t_max, r.timeline.back().time_s);
  double y_step = nice_step(capacity_gb * 1.05), t_step = nice_step(t_max);
  double y_max  = std::ceil(capacity_gb * 1.05 / y_step) * y_step;
  t_max         = std::ceil(t_max / t_step) * t_step;
  auto x = [&](double t) { return f.x(t, t_max); };
  auto y = [&](double gb) { return f.y(gb, y_max); };
  std::ostringstream s;
  svg_open(s, f.W, f.H, f.left, title);
  svg_axes(s, f, {y_max, y_step}, svg_axis{t_max, t_step}, true);
  s << "<line x1=\"" << f.left << "\" y1=\"" << y(capacity_gb) << "\" x2=\"" << f.W - f.right << "\" y2=\""
    << y(capacity_gb) << "\" stroke=\"gray\" stroke-dasharray=\"2,3\"/>\n";
  s << "<text x=\"" << f.W - f.right - 4 << "\" y=\"" << y(capacity_gb) - 5
    << "\" text-anchor=\"end\" fill=\"gray\" font-size=\"10\">KV capacity</text>\n";
  svg_axis_titles(s, f, "modelled time (s)", "KV memory (GB)");
  for (std::size_t k = 0; k < results.size(); ++k) {
    auto const& r = results[k];
    for (int live = 0; live < 2; ++live) {
      s << "<polyline fill=\"none\" stroke=\"" << policy_colour(r.policy) << "\" stroke-width=\"1.5\""
        << (live ? " stroke-dasharray=\"5,3\"" : "") << " points=\"";
      for (auto const& p : r.timeline)
        s << x(p.time_s) << "," << y((live ? p.live_bytes : p.allocated_bytes) / 1e9) << " ";
      s << "\"/>\n";
    }
    svg_legend_row(s, f, k, r.policy);
  }
  svg_legend_note(s, f, results.size(), "solid: allocated, dashed: live");
  s << "</svg>\n";
  return s.str();
}

std::vector<time_segment> time_segments(time_breakdown const& t) {
  return {{"prefill", t.prefill_s, "#1f77b4"},
          {"eviction pass", t.eviction_pass_s, "#aec7e8"},
          {"decode attention", t.decode_attention_s, "#ff7f0e"},
          {"decode weights", t.weights_s, "#ffbb78"},
          {"reclamation", t.reclamation_s, "#d62728"},
          {"re-planning", t.replanning_s, "#9467bd"},
          {"step overhead", t.overhead_s + t.decode_launch_s + t.control_plane_s, "#8c564b"},
          {"host reload", t.reload_stall_s, "#17becf"},
          {"host transfer", t.host_transfer_s, "#17becf"},
          {"idle", t.idle_s, "#dddddd"}};
}

std::string time_breakdown_svg(std::vector<replay_result> const& results, std::string const& title) {
  constexpr svg_frame f{940, 420, 70, 210, 40, 70};
  auto const [W, H, left, right, top, bottom] = f;
  double t_max = 1e-9;
  for (auto const& r : results) t_max = std::max(t_max, r.time.sum());
  double step = nice_step(t_max);
  double y_max = std::ceil(t_max / step) * step;
  auto y = [&](double sec) { return f.y(sec, y_max); };
  std::ostringstream s;
  svg_open(s, W, H, left, title);
  svg_axes(s, f, {y_max, step}, std::nullopt);
  svg_axis_titles(s, f, "", "modelled makespan (s)");
  double slot = (W - left - right) / static_cast<double>(std::max<std::size_t>(1, results.size()));
  for (std::size_t k = 0; k < results.size(); ++k) {
    auto const& r = results[k];
    double x0 = left + slot * (static_cast<double>(k) + 0.2), w = slot * 0.6, acc = 0;
    for (auto const& seg : time_segments(r.time)) {
      if (seg.seconds <= 0) continue;
      s << "<rect x=\"" << x0 << "\" y=\"" << y(acc + seg.seconds) << "\" width=\"" << w << "\" height=\""
        << y(acc) - y(acc + seg.seconds) << "\" fill=\"" << seg.colour << "\"><title>" << xml_escape(r.policy) << ": "
        << seg.name << " " << fixed(seg.seconds, 2) << " s</title></rect>\n";
      acc += seg.seconds;
    }
    s << "<text x=\"" << x0 + w / 2 << "\" y=\"" << H - bottom + 18 << "\" text-anchor=\"middle\" font-size=\"11\">"
      << xml_escape(r.policy) << "</text>\n";
    s << "<text x=\"" << x0 + w / 2 << "\" y=\"" << y(acc) - 4 << "\" text-anchor=\"middle\" font-size=\"10\">"
      << fixed(acc, 1) << "</text>\n";
  }
  auto segs = time_segments(time_breakdown{});
  for (std::size_t i = 0; i < segs.size(); ++i) {
    double ly = top + 10 + 22.0 * static_cast<double>(i);
    s << "<rect x=\"" << W - right + 10 << "\" y=\"" << ly - 8 << "\" width=\"14\" height=\"12\" fill=\""
      << segs[i].colour << "\"/>\n";
    s << "<text x=\"" << W - right + 30 << "\" y=\"" << ly + 2 << "\">" << segs[i].name << "</text>\n";
  }
  s << "<text x=\"" << (left + W - right) / 2 << "\" y=\"" << H - 12
    << "\" text-anchor=\"middle\" font-size=\"11\" fill=\"gray\">modelled: roofline plus charged costs; each bar sums "
       "to the policy's makespan</text>\n";
  s << "</svg>\n";
  return s.str();
}

std::vector<serving_panel> serving_panels(std::vector<replay_result> const& results) {
  std::vector<serving_panel> panels = {{"tokens/s", {}, {}},
                                       {"requests/s", {}, {}},
                                       {"mean resident sessions", {}, {}},
                                       {"TTFT p50 / p95 (s)", {}, {}},
                                       {"TBT p50 / p95 (ms)", {}, {}}};
  for (auto const& r : results) {
    panels[0].values.push_back(r.modelled_tokens_per_s);
    panels[1].values.push_back(r.modelled_requests_per_s);
    panels[2].values.push_back(r.mean_resident_sessions);
    panels[3].values.push_back(r.modelled_ttft_p50_s);
    panels[3].p95.push_back(r.modelled_ttft_p95_s);
    panels[4].values.push_back(r.modelled_tbt_p50_s * 1e3);
    panels[4].p95.push_back(r.modelled_tbt_p95_s * 1e3);
  }
  return panels;
}

std::string serving_svg(std::vector<replay_result> const& results, std::string const& title) {
  constexpr double W = 1100, H = 420, left = 40, right = 170, top = 60, bottom = 50, gap = 30;
  auto panels     = serving_panels(results);
  double panel_w  = (W - left - right - gap * static_cast<double>(panels.size() - 1)) / static_cast<double>(panels.size());
  double n        = static_cast<double>(std::max<std::size_t>(1, results.size()));
  std::ostringstream s;
  svg_open(s, W, H, left, title);
  for (std::size_t p = 0; p < panels.size(); ++p) {
    auto const& panel = panels[p];
    double x0 = left + (panel_w + gap) * static_cast<double>(p);
    double v_max = 1e-12;
    for (double v : panel.values) v_max = std::max(v_max, v);
    for (double v : panel.p95) v_max = std::max(v_max, v);
    v_max *= 1.15;  // room for the value labels
    auto y = [&](double v) { return H - bottom - (H - top - bottom) * v / v_max; };
    s << "<text x=\"" << x0 + panel_w / 2 << "\" y=\"" << top - 14 << "\" text-anchor=\"middle\">" << panel.name
      << "</text>\n";
    s << "<line x1=\"" << x0 << "\" y1=\"" << y(0) << "\" x2=\"" << x0 + panel_w << "\" y2=\"" << y(0)
      << "\" stroke=\"black\"/>\n";
    double slot = panel_w / n;
    for (std::size_t k = 0; k < panel.values.size(); ++k) {
      bool two   = k < panel.p95.size();
      double w   = slot * (two ? 0.38 : 0.7);
      double bx  = x0 + slot * static_cast<double>(k) + slot * 0.15;
      auto bar = [&](double v, double x, bool light) {
        s << "<rect x=\"" << x << "\" y=\"" << y(v) << "\" width=\"" << w << "\" height=\"" << y(0) - y(v)
          << "\" fill=\"" << policy_colour(results[k].policy) << "\"" << (light ? " fill-opacity=\"0.45\"" : "")
          << "><title>" << xml_escape(results[k].policy) << ": " << tick(v) << "</title></rect>\n";
        s << "<text x=\"" << x + w / 2 << "\" y=\"" << y(v) - 3 << "\" text-anchor=\"middle\" font-size=\"9\">"
          << (v >= 100 ? fixed(v, 0) : v >= 10 ? fixed(v, 1) : fixed(v, 2)) << "</text>\n";
      };
      bar(panel.values[k], bx, false);
      if (two) bar(panel.p95[k], bx + w, true);
    }
  }
  for (std::size_t k = 0; k < results.size(); ++k) {
    double ly = top + 20 + 30.0 * static_cast<double>(k);
    s << "<rect x=\"" << W - right + 14 << "\" y=\"" << ly - 8 << "\" width=\"14\" height=\"12\" fill=\""
      << policy_colour(results[k].policy) << "\"/>\n";
    s << "<text x=\"" << W - right + 34 << "\" y=\"" << ly + 2 << "\">" << xml_escape(results[k].policy) << "</text>\n";
  }
  s << "<text x=\"" << W - right + 14 << "\" y=\"" << top + 20 + 30.0 * n
    << "\" font-size=\"11\" fill=\"gray\">pairs: p50, then p95 (light)</text>\n";
  s << "<text x=\"" << (left + W - right) / 2 << "\" y=\"" << H - 12
    << "\" text-anchor=\"middle\" font-size=\"11\" fill=\"gray\">modelled: roofline plus charged costs; each "
       "panel has its own scale, from 0</text>\n";
  s << "</svg>\n";
  return s.str();
}

std::string ttft_rate_svg(std::vector<rate_point> const& sweep, std::string const& title) {
  constexpr svg_frame f{940, 420, 70, 210, 40, 50};
  double r_max = 1e-9, v_max = 1e-9;
  for (auto const& p : sweep) {
    r_max = std::max(r_max, p.rate);
    for (auto const& r : p.results) v_max = std::max(v_max, r.modelled_ttft_p95_s);
  }
  double r_step = nice_step(r_max), v_step = nice_step(v_max);
  r_max = std::ceil(r_max / r_step) * r_step;
  v_max = std::ceil(v_max / v_step) * v_step;
  auto x = [&](double r) { return f.x(r, r_max); };
  auto y = [&](double v) { return f.y(v, v_max); };
  std::ostringstream s;
  svg_open(s, f.W, f.H, f.left, title);
  svg_axes(s, f, {v_max, v_step}, svg_axis{r_max, r_step});
  svg_axis_titles(s, f, "arrival rate (sessions/s)", "modelled TTFT (s)");
  std::vector<std::string> policies;
  if (!sweep.empty())
    for (auto const& r : sweep.front().results) policies.push_back(r.policy);
  for (std::size_t k = 0; k < policies.size(); ++k) {
    for (int p95 = 0; p95 < 2; ++p95) {
      s << "<polyline fill=\"none\" stroke=\"" << policy_colour(policies[k]) << "\" stroke-width=\"1.5\""
        << (p95 ? " stroke-dasharray=\"5,3\"" : "") << " points=\"";
      for (auto const& p : sweep)
        if (k < p.results.size())
          s << x(p.rate) << "," << y(p95 ? p.results[k].modelled_ttft_p95_s : p.results[k].modelled_ttft_p50_s)
            << " ";
      s << "\"/>\n";
      for (auto const& p : sweep)
        if (k < p.results.size())
          s << "<circle cx=\"" << x(p.rate) << "\" cy=\""
            << y(p95 ? p.results[k].modelled_ttft_p95_s : p.results[k].modelled_ttft_p50_s) << "\" r=\"2.5\" fill=\""
            << policy_colour(policies[k]) << "\"/>\n";
    }
    svg_legend_row(s, f, k, policies[k]);
  }
  svg_legend_note(s, f, policies.size(), "solid: p50, dashed: p95");
  s << "</svg>\n";
  return s.str();
}

std::string plot_path(std::string const& path, std::string const& suffix) {
  auto slash = path.find_last_of('/');
  auto dot   = path.find_last_of('.');
  if (dot == std::string::npos || (slash != std::string::npos && dot < slash) ||
      dot == (slash == std::string::npos ? 0 : slash + 1))
    return path + suffix;
  return path.substr(0, dot) + suffix + path.substr(dot);
}

json::value sweep_json(std::vector<rate_point> const& sweep) {
  auto o = json::value::object();
  o.set("label",
        "modelled: the same sessions (generated once with Poisson arrivals at 1 session/s, arrival times "
        "divided by the rate) replayed for every policy at each rate");
  auto pts = json::value::array();
  for (auto const& p : sweep) {
    auto pj = json::value::object();
    pj.set("arrival_rate", p.rate);
    pj.set("last_arrival_s", p.last_arrival_s);
    auto pol = json::value::object();
    for (auto const& r : p.results) {
      // A subset of result_json's fields, read from it.
      auto all = result_json(r);
      auto rj  = json::value::object();
      for (char const* key : {"modelled_ttft_p50_s",
                              "modelled_ttft_p95_s",
                              "modelled_ttft_mean_s",
                              "modelled_tbt_p95_s",
                              "modelled_tokens_per_s",
                              "modelled_requests_per_s",
                              "mean_resident_sessions",
                              "peak_resident_sessions",
                              "modelled_makespan_s",
                              "generated_tokens",
                              "completed_requests",
                              "preemptions"})
        rj.set(key, *all.find(key));
      pol.set(r.policy, std::move(rj));
    }
    pj.set("policies", std::move(pol));
    pts.push_back(std::move(pj));
  }
  o.set("points", std::move(pts));
  return o;
}

void print_sweep(std::ostream& o, std::vector<rate_point> const& sweep) {
  if (sweep.empty()) return;
  o << "\n  Arrival-rate sweep (--rate-sweep; modelled; the same sessions at every rate, arrivals of a Poisson\n"
    << "  process at 1 session/s divided by the rate):\n";
  o << "  " << std::right << std::setw(8) << "rate/s" << "  " << std::left << std::setw(20) << "policy" << std::right
    << std::setw(10) << "TTFT p50" << std::setw(10) << "TTFT p95" << std::setw(12) << "TBT p95 ms" << std::setw(10)
    << "tok/s" << std::setw(10) << "req/s" << std::setw(14) << "resident mean" << "\n";
  for (auto const& p : sweep)
    for (auto const& r : p.results)
      o << "  " << std::right << std::setw(8) << tick(p.rate) << "  " << std::left << std::setw(20) << r.policy
        << std::right << std::setw(10) << fixed(r.modelled_ttft_p50_s, 2) << std::setw(10)
        << fixed(r.modelled_ttft_p95_s, 2) << std::setw(12) << fixed(r.modelled_tbt_p95_s * 1e3, 1) << std::setw(10)
        << fixed(r.modelled_tokens_per_s, 0) << std::setw(10) << fixed(r.modelled_requests_per_s, 3) << std::setw(14)
        << fixed(r.mean_resident_sessions, 1) << "\n";
}

std::string skew_curve_text(skew_curve const& k) {
  if (k.empty()) return "-";
  std::string out;
  for (std::size_t i = 0; i < k.batch.size(); ++i) out += (i ? " " : "") + std::to_string(k.batch[i]);
  return out;
}

std::string skew_curve_values(skew_curve const& k) {
  if (k.empty()) return "-";
  std::string out;
  for (std::size_t i = 0; i < k.skew.size(); ++i) out += (i ? " " : "") + fixed(k.skew[i], 3);
  return out;
}

json::value costs_json(serving_costs const& c) {
  auto o = json::value::object();
  o.set("label", "modelled: constants of eval/sim/serving_costs.hpp (sources in docs/benchmarks.md)");
  o.set("reclaim_s_per_page", c.reclaim_s_per_page);
  o.set("reclaim_prefill_fraction", c.reclaim_prefill_fraction);
  o.set("padded_reads", c.padded_reads);
  o.set("baseline_reads", c.padded_reads && !c.baseline_masked_reads ? "padded" : "masked");
  o.set("baseline_balance", std::string(to_string(c.balance)));
  o.set("unbalanced_skew", c.unbalanced_skew);
  o.set("replan", std::string(to_string(c.replan)));
  o.set("replan_fraction", c.replan_fraction);
  o.set("step_overhead_s", c.step_overhead_s);
  o.set("control_plane_charged", c.control_plane);
  o.set("tangram_decode_split", std::string(to_string(c.split)));
  // The balancing launch's measured seconds by decode batch ([[batch, s], ...]; empty: aot).
  auto balance = json::value::array();
  if (c.split == tangram_split::balanced)
    for (auto const& [n, s] : split_balance_launch_s) {
      auto pt = json::value::array();
      pt.push_back(static_cast<std::int64_t>(n));
      pt.push_back(s);
      balance.push_back(std::move(pt));
    }
  o.set("split_balance_s_by_batch", std::move(balance));
  o.set("planner_skew_measured", c.planner_skew);
  o.set("per_head_planner_skew_measured", c.per_head_planner_skew);
  o.set("tangram_skew_measured", c.tangram_skew);
  o.set("tangram_elastic_skew_measured", c.tangram_elastic_skew);
  // The skews by decode batch size the steps were charged: [[batch, skew], ...] per policy.
  auto curves = json::value::object();
  auto curve  = [](skew_curve const& k) {
    auto a = json::value::array();
    for (std::size_t i = 0; i < k.batch.size(); ++i) {
      auto pt = json::value::array();
      pt.push_back(static_cast<std::int64_t>(k.batch[i]));
      pt.push_back(k.skew[i]);
      a.push_back(std::move(pt));
    }
    return a;
  };
  curves.set("planner", curve(c.planner_skew_by_batch));
  curves.set("per_head_planner", curve(c.per_head_planner_skew_by_batch));
  curves.set("tangram", curve(c.tangram_skew_by_batch));
  curves.set("tangram_elastic", curve(c.tangram_elastic_skew_by_batch));
  o.set("skew_by_decode_batch", std::move(curves));
  return o;
}

bool seconds_valued(std::string const& name) {
  return name.find("_s_per_") != std::string::npos ||
         (name.size() > 2 && name.compare(name.size() - 2, 2, "_s") == 0);
}

json::value bound_ratio_json(double ratio) {
  return ratio > 0 ? json::value(ratio) : json::value(nullptr);
}

json::value verdict_json(verdict const& v) {
  auto o = json::value::object();
  o.set("modelled_tokens_per_s", v.tokens_per_s_ratio);
  o.set("mean_resident_sessions", v.mean_resident_ratio);
  o.set("mean_resident_sessions_memory_bound", bound_ratio_json(v.bound_resident_ratio));
  return o;
}

}  // namespace tangram::cli
