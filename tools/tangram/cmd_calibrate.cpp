// SPDX-License-Identifier: Apache-2.0
// `tangram calibrate SAMPLES.json`: static per-head budgets from retention samples, with the
// figures that say how good they are (docs/planning.md#calibration).
#include <cmath>
#include <iomanip>
#include <memory>
#include <optional>
#include <ostream>

#include "option_values.hpp"
#include "output_path.hpp"
#include "plan_support.hpp"
#include "subcommands.hpp"
#include "tangram/io/budget_profile.hpp"
#include "tangram/io/detail/json.hpp"
#include "tangram/plan/calibration.hpp"
#include "tangram/plan/elastic.hpp"

namespace tangram::cli {

namespace {

namespace json = tangram::detail::json;
using tangram::detail::cat;

json::value number_or_null(double v) {
  return std::isfinite(v) ? json::value(v) : json::value(nullptr);
}

json::value numbers_json(std::vector<double> const& values) {
  auto a = json::value::array();
  for (double x : values) a.push_back(x);
  return a;
}

/// The fields both reports open with; `reservation` (elastic) is given only when not null.
json::value report_json(char const* reservation,
                        std::string const& source,
                        retention_samples const& samples,
                        std::int64_t num_samples) {
  auto v = json::value::object();
  v.set("command", "calibrate");
  if (reservation) v.set("reservation", reservation);
  v.set("input", source);
  v.set("model", samples.model);
  v.set("scorer", samples.scorer);
  v.set("num_samples", num_samples);
  return v;
}

/// Ends either report's JSON: the profile written (or null), then the document on one line.
int print_report_json(json::value& v, std::optional<std::string> const& out, streams io) {
  v.set("out", out ? json::value(*out) : json::value(nullptr));
  io.out << json::dump(v, -1) << "\n";
  return 0;
}

std::string setting_of(calibration_options const& o) {
  return o.estimator == budget_estimator::musigma ? cat("alpha ", o.alpha) : cat("q ", o.quantile);
}

/// The held-out rows both text reports print, by their `row(label, value)`; `per_fold` lists the
/// folds' figures.
template <class Row, class Report>
void heldout_rows(Row const& row,
                  Report const& rep,
                  evaluation_options const& ev,
                  std::string const& per_fold) {
  row("clipped tokens, held out",
      cat(percent(rep.heldout_clip_fraction, 3),
          "  (",
          ev.folds,
          (ev.group_by_context ? " folds by context length: " : " folds: "),
          per_fold,
          ")"));
  row("reserved / mean dynamic, held out", fixed(rep.heldout_reserved_over_ideal, 3));
}

struct calibrate_args {
  std::optional<std::string> input;
  // Elastic by default, as plans reserve (plan_options, `tangram plan`); --out writes the budget
  // profile in either mode (the budgets every plan groups its heads by).
  std::string reservation = "elastic";
  calibration_args cal;
  evaluation_options ev;
  elastic_options eo;
  std::vector<CLI::Option const*> elastic_only;  // refused with --reservation static
  CLI::Option const* margin_alpha       = nullptr;
  CLI::Option const* band               = nullptr;  // a static figure: refused with elastic
  bool calibrate_margin                 = false;  // elastic: mean + alpha sd instead of the default
  double clip_target                    = 0.005;  // elastic: the suggested margin's held-out goal
  CLI::Option const* clip_target_option = nullptr;
  std::optional<std::string> out;
  bool json    = false;
  bool compare = false;
};

std::string const missing_samples =
    "missing SAMPLES.json (a retention-samples/v1 file or a bundled name, see `tangram profiles`)";

/// --folds against the samples, before any work: k folds of single samples need k samples.
void check_folds(evaluation_options const& ev,
                 retention_samples const& samples,
                 std::string const& source) {
  if (ev.folds > 0 && !ev.group_by_context &&
      static_cast<std::size_t>(ev.folds) > samples.samples.size())
    throw usage_error(cat("--folds: ",
                          ev.folds,
                          " folds need at least ",
                          ev.folds,
                          " samples; ",
                          tangram::detail::printable(source),
                          " has ",
                          samples.samples.size()));
}

/// `--reservation elastic`: the elastic report (plan/elastic.hpp), with the margin sweep, and with
/// `--compare` the static alpha curve on the same folds.
int elastic_calibrate(calibrate_args const& a, streams io) {
  auto const& cal    = a.cal;
  auto const& ev     = a.ev;
  auto eo            = a.eo;
  bool const as_json = a.json;
  bool const compare = a.compare;
  if (eo.margin && a.margin_alpha->count() > 0)
    throw usage_error("--margin-alpha: calibrates the margin; not with a fixed --margin");
  if (eo.margin && a.calibrate_margin)
    throw usage_error("--calibrate-margin: calibrates the margin; not with a fixed --margin");
  // Unless asked for the bare calibrated rule or a fixed margin, report the margin plans reserve
  // by default (`elastic_plan_margin`: mean + 2 sd, at least the default), so these figures are
  // what `tangram plan` gives; held out, each training fold's plans' margin.
  bool const plans_default = !eo.margin && !a.calibrate_margin && a.margin_alpha->count() == 0;
  if (plans_default) eo.margin_floor = default_elastic_margin;
  if (a.band->count() > 0)
    throw usage_error(
        "--band: a figure of the static report; give --reservation static (calibrate reports "
        "elastic reservation by default, as plans reserve)");
  if (cal.given && !a.out)
    throw usage_error(cat(*cal.given,
                          ": shapes the budget profile --out writes; give --out PROFILE.json, or "
                          "--reservation static for the static report"));
  if (!a.input) throw usage_error(missing_samples);
  if (ev.folds == 1)
    throw usage_error("--folds: must be 0 (no held-out evaluation) or at least 2, got 1");
  if (ev.folds == 0 && a.clip_target_option->count() > 0)
    throw usage_error(
        "--clip-target: the suggested margin is measured held out; not with --folds 0");
  if (a.out) check_output_path("--out", *a.out);
  auto in      = read_input(*a.input);
  auto samples = read_samples(in);
  check_folds(ev, samples, in.source);
  auto heads = samples.layer_ids.size() * static_cast<std::size_t>(samples.num_kv_heads);
  if (heads % static_cast<std::size_t>(eo.group_size) != 0)
    throw usage_error(cat("--group-size: ",
                          eo.group_size,
                          " does not divide the ",
                          heads,
                          " profiled heads of ",
                          in.source));
  auto rep = evaluate_elastic(samples,
                              eo,
                              ev,
                              ev.folds > 0 ? elastic_margin_grid() : std::vector<double>{},
                              ev.folds > 0 ? std::optional<double>(a.clip_target) : std::nullopt);
  std::vector<std::pair<double, calibration_report>> static_rows;
  if (compare && ev.folds > 0)
    for (auto const& o : estimator_grid(cal.options.floor))
      if (o.estimator == budget_estimator::musigma)
        static_rows.emplace_back(o.alpha, evaluate_calibration(samples, o, ev));
  if (a.out) save_budget_profile(calibrate(samples, cal.options), *a.out);

  if (as_json) {
    auto v = report_json("elastic", in.source, samples, rep.num_samples);
    v.set("num_heads", rep.num_heads);
    v.set("target_keep_ratio", samples.target_keep_ratio);
    v.set("sink_tokens", samples.sink_tokens);
    v.set("window_tokens", samples.window_tokens);
    v.set("keep_ratio_basis", to_string(rep.basis));
    v.set("group_size", rep.group_size);
    v.set("page_tokens", rep.page_tokens);
    v.set("folds", ev.folds);
    v.set("group_by_context", ev.group_by_context);
    v.set("margin", rep.margin);
    v.set("margin_calibrated", rep.margin_calibrated);
    v.set("margin_alpha",
          rep.margin_calibrated ? json::value(eo.margin_alpha) : json::value(nullptr));
    v.set("margin_floor",
          rep.margin_calibrated ? json::value(eo.margin_floor) : json::value(nullptr));
    v.set("margin_rule",
          plans_default           ? "plans_default"
          : rep.margin_calibrated ? "calibrated"
                                  : "fixed");
    v.set("total_error_mean", rep.total_error_mean);
    v.set("total_error_max", rep.total_error_max);
    v.set("mean_dynamic_fraction", rep.mean_dynamic_fraction);
    v.set("reserved_over_ideal", rep.reserved_over_ideal);
    v.set("insample_clip_fraction", rep.insample_clip_fraction);
    v.set("group_padding", rep.group_padding);
    v.set("per_request_padding", rep.per_request_padding);
    v.set("fold_margins", numbers_json(rep.fold_margins));
    v.set("fold_clip_fractions", numbers_json(rep.fold_clip_fractions));
    v.set("heldout_clip_fraction", number_or_null(rep.heldout_clip_fraction));
    v.set("heldout_reserved_over_ideal", number_or_null(rep.heldout_reserved_over_ideal));
    v.set("heldout_group_padding", number_or_null(rep.heldout_group_padding));
    v.set("heldout_per_request_clip_fraction",
          number_or_null(rep.heldout_per_request_clip_fraction));
    auto sweep = json::value::array();
    for (auto const& p : rep.sweep) {
      auto r = json::value::object();
      r.set("margin", p.margin);
      r.set("heldout_reserved_over_ideal", p.heldout_reserved_over_ideal);
      r.set("heldout_clip_fraction", p.heldout_clip_fraction);
      r.set("heldout_per_request_clip_fraction", p.heldout_per_request_clip_fraction);
      sweep.push_back(std::move(r));
    }
    v.set("sweep", std::move(sweep));
    v.set("clip_target", number_or_null(rep.clip_target));
    if (rep.suggested) {
      auto r = json::value::object();
      r.set("margin", rep.suggested->margin);
      r.set("heldout_reserved_over_ideal", rep.suggested->heldout_reserved_over_ideal);
      r.set("heldout_clip_fraction", rep.suggested->heldout_clip_fraction);
      v.set("suggested_margin", std::move(r));
    } else {
      v.set("suggested_margin", nullptr);
    }
    if (compare) {
      auto arr = json::value::array();
      for (auto const& [alpha, cr] : static_rows) {
        auto r = json::value::object();
        r.set("estimator", "musigma");
        r.set("alpha", alpha);
        r.set("heldout_reserved_over_ideal", number_or_null(cr.heldout_reserved_over_ideal));
        r.set("heldout_clip_fraction", number_or_null(cr.heldout_clip_fraction));
        arr.push_back(std::move(r));
      }
      v.set("static_comparison", std::move(arr));
    }
    return print_report_json(v, a.out, io);
  }

  auto& s = io.out;
  s << "calibrate " << tangram::detail::printable(in.source) << " (elastic reservation)\n"
    << "  model " << tangram::detail::printable(samples.model) << ", scorer "
    << tangram::detail::printable(samples.scorer) << ", " << rep.num_samples << " samples, "
    << rep.num_heads << " profiled heads, keep ratio " << samples.target_keep_ratio << " ("
    << to_string(rep.basis) << "), protected " << samples.sink_tokens << " sink + "
    << samples.window_tokens << " window\n"
    << "  Hp " << rep.group_size << ", P " << rep.page_tokens << ", margin " << fixed(rep.margin, 4)
    << (plans_default           ? cat(" (the plans' default: mean + ",
                            eo.margin_alpha,
                            " sd, at least ",
                            default_elastic_margin,
                            "; --calibrate-margin for mean + 2 sd alone)")
        : rep.margin_calibrated ? cat(" (calibrated: mean + ", eo.margin_alpha, " sd)")
                                : std::string(" (fixed)"))
    << "\n\n";
  auto row = [&](char const* label, std::string const& value) {
    s << "  " << std::left << std::setw(44) << label << value << "\n";
  };
  row("scorer total error, mean / max |.|",
      cat(percent(rep.total_error_mean, 3), " / ", percent(rep.total_error_max, 3)));
  row("reserved / mean dynamic (pages)", fixed(rep.reserved_over_ideal, 3));
  row("clipped tokens, in sample", percent(rep.insample_clip_fraction, 3));
  row("group padding: plan groups / per request",
      cat(percent(rep.group_padding, 2), " / ", percent(rep.per_request_padding, 2)));
  if (ev.folds > 0) {
    std::string per_fold;
    for (std::size_t f = 0; f < rep.fold_clip_fractions.size(); ++f)
      per_fold += (f ? ", " : "") + percent(rep.fold_clip_fractions[f], 3) + " at margin " +
                  fixed(rep.fold_margins[f], 3);
    heldout_rows(row, rep, ev, per_fold);
    row("clipped, held out, per-request groups", percent(rep.heldout_per_request_clip_fraction, 3));
    s << "\n  margin sweep (held out):\n  " << std::left << std::setw(10) << "margin" << std::right
      << std::setw(16) << "reserved/ideal" << std::setw(16) << "clip" << std::setw(26)
      << "clip, per-request groups\n";
    for (auto const& p : rep.sweep)
      s << "  " << std::left << std::setw(10) << fixed(p.margin, 2) << std::right << std::setw(16)
        << fixed(p.heldout_reserved_over_ideal, 3) << std::setw(16)
        << percent(p.heldout_clip_fraction, 3) << std::setw(25)
        << percent(p.heldout_per_request_clip_fraction, 3) << "\n";
    s << "\n";
    s << "  suggested margin (smallest with held-out clip <= " << percent(rep.clip_target, 3)
      << "): ";
    if (rep.suggested)
      s << fixed(rep.suggested->margin, 3) << ", reserved / ideal "
        << fixed(rep.suggested->heldout_reserved_over_ideal, 3) << ", clip "
        << percent(rep.suggested->heldout_clip_fraction, 3)
        << " (chosen on these folds: optimistic)\n";
    else
      s << "none up to " << max_elastic_margin << "\n";
    if (compare) {
      s << "\n  static musigma on the same folds (tokens, no page rounding):\n  " << std::left
        << std::setw(10) << "alpha" << std::right << std::setw(16) << "reserved/ideal"
        << std::setw(16) << "clip\n";
      for (auto const& [alpha, cr] : static_rows)
        s << "  " << std::left << std::setw(10) << fixed(alpha, 1) << std::right << std::setw(16)
          << fixed(cr.heldout_reserved_over_ideal, 3) << std::setw(15)
          << percent(cr.heldout_clip_fraction, 3) << "\n";
    }
  }
  if (a.out) s << "\nwrote " << tangram::detail::printable(*a.out) << "\n";
  return 0;
}

int calibrate_command(calibrate_args& a, streams io) {
  check_calibration_args(a.cal);
  if (a.reservation == "elastic") return elastic_calibrate(a, io);
  for (auto const* opt : a.elastic_only)
    if (opt->count() > 0)
      throw usage_error(cat(opt->get_name(), ": applies to --reservation elastic only"));
  auto const& cal    = a.cal;
  auto const& ev     = a.ev;
  auto const& out    = a.out;
  bool const as_json = a.json;
  bool const compare = a.compare;
  if (!a.input) throw usage_error(missing_samples);
  if (ev.folds == 1)
    throw usage_error("--folds: must be 0 (no held-out evaluation) or at least 2, got 1");
  if (out) check_output_path("--out", *out);

  auto in      = read_input(*a.input);
  auto samples = read_samples(in);
  check_folds(ev, samples, in.source);
  auto profile = calibrate(samples, cal.options);
  auto rep     = evaluate_calibration(samples, cal.options, ev);
  std::vector<std::pair<calibration_options, calibration_report>> rows;
  if (compare)
    for (auto const& o : estimator_grid(cal.options.floor))
      rows.emplace_back(o, evaluate_calibration(samples, o, ev));
  if (out) save_budget_profile(profile, *out);

  auto const& o = cal.options;
  if (as_json) {
    auto v = report_json(nullptr, in.source, samples, rep.num_samples);
    v.set("num_layers", static_cast<std::int64_t>(samples.layer_ids.size()));
    v.set("num_kv_heads", samples.num_kv_heads);
    v.set("sink_tokens", samples.sink_tokens);
    v.set("window_tokens", samples.window_tokens);
    v.set("estimator", to_string(o.estimator));
    v.set("alpha", o.alpha);
    v.set("quantile", o.quantile);
    v.set("floor", o.floor);
    v.set("folds", ev.folds);
    v.set("band", ev.band);
    v.set("group_by_context", ev.group_by_context);
    v.set("budget_min", rep.min_budget);
    v.set("budget_mean", rep.mean_budget);
    v.set("budget_max", rep.max_budget);
    v.set("heads_at_floor", rep.heads_at_floor);
    v.set("heads_at_one", rep.heads_at_one);
    v.set("mean_dynamic_fraction", rep.mean_dynamic_fraction);
    v.set("reserved_over_ideal", rep.reserved_over_ideal);
    v.set("insample_clip_fraction", rep.insample_clip_fraction);
    v.set("heldout_clip_fraction", number_or_null(rep.heldout_clip_fraction));
    v.set("fold_clip_fractions", numbers_json(rep.fold_clip_fractions));
    v.set("heldout_reserved_over_ideal", number_or_null(rep.heldout_reserved_over_ideal));
    v.set("rank_spearman_mean", rep.rank_spearman_mean);
    v.set("rank_spearman_min", rep.rank_spearman_min);
    v.set("narrow_band_share", rep.narrow_band_share);
    v.set("mean_spread", rep.mean_spread);
    if (compare) {
      auto arr = json::value::array();
      for (auto const& [co, cr] : rows) {
        auto r = json::value::object();
        r.set("estimator", to_string(co.estimator));
        if (co.estimator == budget_estimator::musigma)
          r.set("alpha", co.alpha);
        else
          r.set("quantile", co.quantile);
        r.set("reserved_over_ideal", cr.reserved_over_ideal);
        r.set("heldout_clip_fraction", number_or_null(cr.heldout_clip_fraction));
        r.set("heldout_reserved_over_ideal", number_or_null(cr.heldout_reserved_over_ideal));
        arr.push_back(std::move(r));
      }
      v.set("comparison", std::move(arr));
    }
    return print_report_json(v, out, io);
  }

  auto& s = io.out;
  s << "calibrate " << tangram::detail::printable(in.source) << "\n"
    << "  model " << tangram::detail::printable(samples.model) << ", scorer "
    << tangram::detail::printable(samples.scorer) << ", " << rep.num_samples << " samples, "
    << samples.layer_ids.size() << " profiled layers x " << samples.num_kv_heads << " KV heads\n"
    << "  protected tokens: " << samples.sink_tokens << " sink + " << samples.window_tokens
    << " window\n"
    << "  estimator " << to_string(o.estimator) << ", " << setting_of(o) << ", floor " << o.floor
    << "\n\n";
  auto row = [&](char const* label, std::string const& value) {
    s << "  " << std::left << std::setw(34) << label << value << "\n";
  };
  row("budgets min / mean / max",
      cat(fixed(rep.min_budget, 3),
          " / ",
          fixed(rep.mean_budget, 3),
          " / ",
          fixed(rep.max_budget, 3),
          "  (",
          rep.heads_at_floor,
          " at floor, ",
          rep.heads_at_one,
          " at 1)"));
  row("mean dynamic kept fraction", fixed(rep.mean_dynamic_fraction, 3));
  row("reserved / mean dynamic", fixed(rep.reserved_over_ideal, 3));
  row("clipped tokens, in sample", percent(rep.insample_clip_fraction, 3));
  if (ev.folds > 0) {
    std::string per_fold;
    for (double c : rep.fold_clip_fractions)
      per_fold += (per_fold.empty() ? "" : ", ") + percent(c, 3);
    heldout_rows(row, rep, ev, per_fold);
  }
  row("rank stability (Spearman)",
      cat("mean ", fixed(rep.rank_spearman_mean, 3), ", min ", fixed(rep.rank_spearman_min, 3)));
  row(cat("heads with spread <= ", ev.band).c_str(),
      cat(percent(rep.narrow_band_share, 1),
          "  (mean spread max-min ",
          fixed(rep.mean_spread, 3),
          ")"));
  if (compare) {
    s << "\n  estimator comparison (same samples, " << ev.folds << "-fold held out"
      << (ev.group_by_context ? ", folds by context length" : "") << "):\n"
      << "  " << std::left << std::setw(10) << "estimator" << std::setw(12) << "setting"
      << std::right << std::setw(16) << "reserved/ideal" << std::setw(16) << "held-out clip"
      << std::setw(26) << "held-out reserved/ideal\n";
    for (auto const& [co, cr] : rows)
      s << "  " << std::left << std::setw(10) << to_string(co.estimator) << std::setw(12)
        << setting_of(co) << std::right << std::setw(16) << fixed(cr.reserved_over_ideal, 3)
        << std::setw(16) << (ev.folds > 0 ? percent(cr.heldout_clip_fraction, 3) : std::string("-"))
        << std::setw(25)
        << (ev.folds > 0 ? fixed(cr.heldout_reserved_over_ideal, 3) : std::string("-")) << "\n";
  }
  if (out) s << "\nwrote " << tangram::detail::printable(*out) << "\n";
  return 0;
}

}  // namespace

command_body setup_calibrate(CLI::App& app) {
  auto a   = std::make_shared<calibrate_args>();
  auto& ev = a->ev;
  auto& eo = a->eo;
  add_text(app,
           "SAMPLES.json",
           a->input,
           "",
           "Retention samples (retention-samples/v1), a file or a bundled name");
  add_choice(
      app,
      "--reservation",
      [a](std::string const& v) { a->reservation = v; },
      a->reservation,
      {"static", "elastic"},
      "elastic (the default, as plans reserve): the scorer's total per request plus a margin, "
      "placed per group at eviction; static: one budget per head reserved as is. Either way "
      "--out writes the budget profile (the budgets every plan groups its heads by)");
  add_calibration_options(app, a->cal);
  add_integer(
      app, "--folds", ev.folds, 0, 100000, "k of the held-out evaluation (0: none; 1 is refused)");
  a->band = add_number(app,
                       "--band",
                       ev.band,
                       {0, 1},
                       "Spread (max - min kept fraction) under which a head counts as narrow");
  app.add_flag("--group-by-context",
               ev.group_by_context,
               "Folds by distinct context length instead of sample index");
  app.add_flag("--compare", a->compare, "Also evaluate the grid of estimators on the same folds");
  add_text(app,
           "--out",
           a->out,
           "PROFILE.json",
           "Write the budget profile (--estimator, --alpha, --quantile, --floor shape it)");
  a->elastic_only = {
      add_group_size(app, eo.group_size)->description("elastic: Hp, KV heads that share a page"),
      add_page_tokens(app, eo.page_tokens)->description("elastic: P, tokens per page"),
      add_number(app,
                 "--margin",
                 eo.margin,
                 {0, max_elastic_margin},
                 cat("elastic: a fixed margin (default: the plans' rule, mean + 2 sd of the "
                     "samples' required margins and at least ",
                     default_elastic_margin,
                     ")")),
  };
  a->elastic_only.push_back(app.add_flag(
      "--calibrate-margin",
      a->calibrate_margin,
      "elastic: calibrate the margin as mean + alpha x sd of the samples' required margins, "
      "without the plans' floor"));
  a->clip_target_option = add_number(app,
                                     "--clip-target",
                                     a->clip_target,
                                     {0, 1},
                                     "elastic: held-out clipping the suggested margin must meet");
  a->elastic_only.push_back(a->clip_target_option);
  a->margin_alpha = add_number(app,
                               "--margin-alpha",
                               eo.margin_alpha,
                               {0, 1000},
                               "elastic: calibrated margin = mean + alpha x sd (implies "
                               "--calibrate-margin)");
  a->elastic_only.push_back(a->margin_alpha);
  app.add_flag("--json", a->json, "One JSON document instead of the text report");
  return [a](streams io) { return calibrate_command(*a, io); };
}

}  // namespace tangram::cli
