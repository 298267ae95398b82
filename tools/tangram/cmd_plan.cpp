// SPDX-License-Identifier: Apache-2.0
// `tangram plan SAMPLES_OR_PROFILE.json`: the static plan of one (model, profile, hardware, rank):
// rules, head groups, page geometry and split map, with its group waste and the split imbalance
// on a reference batch (docs/planning.md).
#include <algorithm>
#include <iomanip>
#include <memory>
#include <optional>
#include <ostream>

#include "option_values.hpp"
#include "output_path.hpp"
#include "plan_support.hpp"
#include "subcommands.hpp"
#include "tangram/core/detail/checked_math.hpp"
#include "tangram/eval/split_imbalance.hpp"
#include "tangram/io/detail/file_io.hpp"
#include "tangram/io/detail/json.hpp"
#include "tangram/io/static_plan.hpp"
#include "tangram/plan/build_static_plan.hpp"
#include "tangram/plan/clustering.hpp"
#include "tangram/plan/footprint.hpp"
#include "tangram/plan/pipeline_stages.hpp"
#include "tangram/plan/static_plan.hpp"

namespace tangram::cli {

namespace {

namespace json = tangram::detail::json;
using tangram::detail::cat;
using tangram::detail::printable;

constexpr grouping_scope all_scopes[] = {
    grouping_scope::adjacent, grouping_scope::layer, grouping_scope::global};

std::string describe_layers(model_spec const& m) {
  std::string s = cat(m.num_layers, " layers (");
  bool first    = true;
  for (auto k : {layer_kind::compressed, layer_kind::sliding_window, layer_kind::uncompressed}) {
    auto n = m.count(k);
    if (n == 0) continue;
    s += cat(first ? "" : ", ", n, " ", to_string(k));
    first = false;
  }
  return s + ")";
}

/// The report's first lines: the input, then the model with this rank's KV heads (unended).
void print_heading(std::ostream& s,
                   std::string const& source,
                   model_spec const& model,
                   plan_options const& o) {
  s << "plan " << printable(source) << "\n"
    << "  model " << printable(model.name) << ": " << describe_layers(model) << ", "
    << model.num_kv_heads << " KV heads";
  auto const local = model.num_kv_heads / o.tp_size;  // build_static_plan's first_kv_head
  if (o.tp_size > 1)
    s << " (rank " << o.tp_rank << " of " << o.tp_size << ": heads " << o.tp_rank * local << ".."
      << (o.tp_rank + 1) * local - 1 << ")";
}

struct plan_args {
  std::optional<std::string> input;
  calibration_args cal;
  plan_options plan;
  std::optional<std::string> model;
  std::optional<std::string> out;
  bool json           = false;
  CLI::Option* margin = nullptr;
  std::vector<CLI::Option*> batch_share_only;                 // refused with --weighting budget
  std::vector<std::pair<std::int64_t, std::int64_t>> layers;  // --layers FIRST:LAST,...
  std::int32_t pipeline_stages   = 0;                         // --pipeline-stages; 0: none
  std::int64_t stage_context     = default_stage_balance_context;
  CLI::Option* layers_opt        = nullptr;
  CLI::Option* stages_opt        = nullptr;
  CLI::Option* stage_context_opt = nullptr;
};

/// The file of stage k of n beside `out`: "plan.json" -> "plan.stage0-of-4.json".
std::string stage_path(std::string const& out, std::size_t k, std::size_t n) {
  std::string base = out;
  if (base.size() > 5 && base.compare(base.size() - 5, 5, ".json") == 0)
    base.resize(base.size() - 5);
  return cat(base, ".stage", k, "-of-", n, ".json");
}

/// Bytes a stage reserves for one request of `context` tokens under its reservation mode (the
/// footprint of footprint.hpp; elastic: the scorer's total with the margin, no staging).
std::int64_t stage_footprint_bytes(static_plan const& p, std::int64_t context) {
  auto const& r = p.options.reservation;
  auto pages    = r.mode == reservation_mode::elastic
                      ? elastic_footprint_pages(p, r.margin_or_default(), context, 0, r.basis)
                      : footprint_pages(p, context, 0);
  return tangram::detail::mul_or_throw(pages, p.page_bytes(), "stage footprint bytes");
}

std::string layer_text(layer_range r) {
  return cat(r.first, "..", r.last - 1);
}

double max_over_min(std::vector<std::int64_t> const& v) {
  auto [lo, hi] = std::minmax_element(v.begin(), v.end());
  return *lo > 0 ? static_cast<double>(*hi) / static_cast<double>(*lo) : 0.0;
}

/// Refuses, before any work, a --stage-context at which a stage's footprint could overflow 64-bit
/// byte counts: at most one group per head, every group holding every token, so at most
/// layers x heads x ceil(context / P) pages.
void check_stage_context(model_spec const& model, plan_options const& o, std::int64_t context) {
  page_geometry geo{o.page_tokens, o.group_size, model.head_dim, model.kv_dtype};
  auto heads = std::int64_t{model.num_layers} * (model.num_kv_heads / o.tp_size);
  auto pages = tangram::detail::mul_checked(heads, ceil_div(context, o.page_tokens));
  if (!pages || !tangram::detail::mul_checked(*pages, geo.page_bytes()))
    throw usage_error(cat("--stage-context: ",
                          context,
                          " tokens: a stage's footprint (up to ",
                          heads,
                          " heads x ceil(",
                          context,
                          " / ",
                          o.page_tokens,
                          ") pages x ",
                          geo.page_bytes(),
                          " bytes) overflows 64-bit byte counts; give a shorter context"));
}

/// `--pipeline-stages N` or `--layers` with several ranges: one plan per stage, a stage table.
int stages_command(plan_args& a,
                   streams io,
                   budget_source const& src,
                   model_spec const& model,
                   std::vector<layer_range> const& ranges,
                   bool balanced) {
  auto const& o = a.plan;
  std::vector<std::int64_t> weights;
  try {
    weights = layer_kv_tokens(model, src.profile, o, a.stage_context);
  } catch (tangram::invalid_argument const& e) {
    throw_plan_option_error(e);
  }
  auto weight_of = [&](layer_range r) {
    std::int64_t w = 0;
    for (auto l = r.first; l < r.last; ++l)
      w = tangram::detail::add_or_throw(w, weights[static_cast<std::size_t>(l)], "stage weight");
    return w;
  };
  struct stage_row {
    layer_range layers;
    std::int64_t kv_tokens = 0, footprint = 0;
    std::int32_t groups = 0;
    std::string out;
    double margin = 0;  // elastic: the stage's own (from the samples over its heads, or given)
  };
  // Checked before any plan is built: every stage's file fits the plan file limit (and
  // --stage-context was checked by plan_command).
  for (auto const& r : ranges) {
    plan_options ok = o;
    ok.layers       = r;
    if (a.out) {
      try {
        check_plan_file_size(model, src.profile, ok);
      } catch (tangram::invalid_argument const& e) {
        throw usage_error(cat("--out: ", e.what(), " (--tp-size, --group-size)"));
      }
    }
  }
  // All stage files or none: each is prepared beside its target, and put in place only once every
  // stage is planned and written (a failure leaves no stage file behind).
  tangram::detail::file_batch files;
  std::vector<stage_row> rows;
  std::vector<std::int64_t> footprints, tokens;
  for (std::size_t k = 0; k < ranges.size(); ++k) {
    plan_options ok  = o;
    ok.layers        = ranges[k];
    std::string path = a.out ? stage_path(*a.out, k, ranges.size()) : std::string();
    auto plan = build_plan_for_cli(model, src.profile, ok, src.samples ? &*src.samples : nullptr);
    std::int64_t footprint = 0;
    try {
      footprint = stage_footprint_bytes(plan, a.stage_context);
    } catch (tangram::invalid_argument const& e) {
      throw usage_error(cat("--stage-context: ", a.stage_context, " tokens: ", e.what()));
    }
    if (a.out) files.add(path, to_json(plan));
    rows.push_back({ranges[k],
                    weight_of(ranges[k]),
                    footprint,
                    plan.num_groups(),
                    path,
                    plan.options.reservation.margin_or_default()});
    footprints.push_back(rows.back().footprint);
    tokens.push_back(rows.back().kv_tokens);
  }
  files.commit();
  // What an even split by layer count would give, for comparison.
  std::vector<std::int64_t> even_tokens;
  auto n = static_cast<std::int32_t>(ranges.size());
  for (std::int32_t k = 0; k < n; ++k)
    even_tokens.push_back(weight_of({k * model.num_layers / n, (k + 1) * model.num_layers / n}));
  bool const elastic = o.reservation.mode == reservation_mode::elastic;
  char const* mode   = elastic ? "elastic" : "static";

  if (a.json) {
    auto v = json::value::object();
    v.set("command", "plan");
    v.set("input", src.source);
    v.set("model", model.name);
    v.set("num_layers", model.num_layers);
    v.set("tp_size", o.tp_size);
    v.set("tp_rank", o.tp_rank);
    v.set("partition", balanced ? "balanced_kv_memory" : "explicit");
    v.set("stage_context", a.stage_context);
    v.set("reservation", mode);
    v.set("margin_from_samples", margin_from_samples(o, src));
    auto list = json::value::array();
    for (std::size_t k = 0; k < rows.size(); ++k) {
      auto r = json::value::object();
      r.set("stage", static_cast<std::int64_t>(k));
      r.set("first_layer", rows[k].layers.first);
      r.set("last_layer", rows[k].layers.last);
      r.set("kv_tokens", rows[k].kv_tokens);
      r.set("footprint_bytes", rows[k].footprint);
      r.set("num_groups", rows[k].groups);
      r.set("margin", elastic ? json::value(rows[k].margin) : json::value(nullptr));
      r.set("out", a.out ? json::value(rows[k].out) : json::value(nullptr));
      list.push_back(std::move(r));
    }
    v.set("stages", std::move(list));
    v.set("footprint_max_over_min", max_over_min(footprints));
    v.set("kv_tokens_max_over_min", max_over_min(tokens));
    v.set("even_split_kv_tokens_max_over_min", max_over_min(even_tokens));
    io.out << json::dump(v, -1) << "\n";
    return 0;
  }
  auto& s = io.out;
  print_heading(s, src.source, model, o);
  s << "\n"
    << "  pipeline: " << ranges.size() << " stages, "
    << (balanced ? "balanced by KV memory" : "layer ranges as given")
    << "; memory of one request of " << a.stage_context << " tokens (" << mode << " reservation)\n"
    << "    " << std::left << std::setw(7) << "stage" << std::setw(10) << "layers" << std::right
    << std::setw(14) << "KV tokens" << std::setw(16) << "footprint MiB" << std::setw(8) << "groups"
    << (elastic ? "   margin" : "") << (a.out ? "  file" : "") << "\n";
  for (std::size_t k = 0; k < rows.size(); ++k) {
    s << "    " << std::left << std::setw(7) << k << std::setw(10) << layer_text(rows[k].layers)
      << std::right << std::setw(14) << rows[k].kv_tokens << std::setw(16)
      << fixed(static_cast<double>(rows[k].footprint) / (1 << 20), 1) << std::setw(8)
      << rows[k].groups;
    if (elastic) s << std::setw(9) << fixed(rows[k].margin, 4);
    if (a.out) s << "  " << printable(rows[k].out);
    s << "\n";
  }
  s << "  heaviest / lightest stage: footprint " << fixed(max_over_min(footprints), 3)
    << "x, KV tokens " << fixed(max_over_min(tokens), 3)
    << "x (an even split by layer count: " << fixed(max_over_min(even_tokens), 3) << "x)\n";
  if (margin_from_samples(o, src))
    s << "  margins: each stage's own over its heads, " << margin_from_samples_note << "\n";
  if (a.out) s << "\nwrote " << rows.size() << " stage plans\n";
  return 0;
}

int plan_command(plan_args& a, streams io) {
  check_calibration_args(a.cal);
  auto const& cal     = a.cal;
  auto const& o       = a.plan;
  auto const& model_o = a.model;
  auto const& out     = a.out;
  bool const as_json  = a.json;
  if (!a.input)
    throw usage_error(
        "missing SAMPLES_OR_PROFILE.json (retention samples, a budget profile or a bundled name)");
  if (o.tp_rank >= o.tp_size)
    throw usage_error(cat("--tp-rank: must be in [0, ",
                          o.tp_size - 1,
                          "] for --tp-size ",
                          o.tp_size,
                          ", got ",
                          o.tp_rank));

  if (a.layers_opt->count() > 0 && a.stages_opt->count() > 0)
    throw usage_error(
        "--layers: cannot be combined with --pipeline-stages (give the ranges or the count)");
  if (a.stage_context_opt->count() > 0 && a.stages_opt->count() == 0 && a.layers.size() < 2)
    throw usage_error(
        "--stage-context: applies to --pipeline-stages (or several --layers ranges) only");
  if (o.reservation.mode != reservation_mode::elastic && a.margin->count() > 0)
    throw usage_error("--margin: applies to --reservation elastic only");
  if (o.split.weighting != split_weighting::batch_share)
    for (auto* opt : a.batch_share_only)
      if (opt->count() > 0)
        throw usage_error(cat(opt->get_name(), ": applies to --weighting batch_share only"));
  if (out) check_output_path("--out", *out);
  auto src   = read_samples_or_profile(*a.input, cal);
  auto model = resolve_model(model_o, src.profile.model);
  if (a.pipeline_stages > 0 || a.layers.size() > 1) {
    std::vector<layer_range> ranges;
    bool balanced = a.pipeline_stages > 0;
    if (balanced) {
      if (a.pipeline_stages > model.num_layers)
        throw usage_error(cat("--pipeline-stages: must be in [1, ",
                              model.num_layers,
                              "] (at least one layer per stage) for the ",
                              model.num_layers,
                              " layers of ",
                              tangram::detail::quoted(model.name),
                              ", got ",
                              a.pipeline_stages));
    } else {
      for (auto [first, last] : a.layers)
        ranges.push_back({static_cast<std::int32_t>(first), static_cast<std::int32_t>(last)});
      try {
        check_pipeline_stages(ranges, model.num_layers);
      } catch (tangram::invalid_argument const& e) {
        throw_plan_option_error(e);
      }
    }
    std::size_t n = balanced ? static_cast<std::size_t>(a.pipeline_stages) : ranges.size();
    check_stage_context(model, o, a.stage_context);
    if (out)
      for (std::size_t k = 0; k < n; ++k) check_output_path("--out", stage_path(*out, k, n));
    if (balanced) {
      try {
        ranges = balanced_pipeline_stages(layer_kv_tokens(model, src.profile, o, a.stage_context),
                                          a.pipeline_stages);
      } catch (tangram::invalid_argument const& e) {
        throw_plan_option_error(e);
      }
    }
    return stages_command(a, io, src, model, ranges, balanced);
  }
  if (!a.layers.empty()) {
    a.plan.layers = layer_range{static_cast<std::int32_t>(a.layers[0].first),
                                static_cast<std::int32_t>(a.layers[0].second)};
    try {
      (void)o.layers_of(model.num_layers);
    } catch (tangram::invalid_argument const& e) {
      throw_plan_option_error(e);
    }
  }
  if (out) {
    // Before the work: a plan that could not be read back is refused now, not after planning.
    try {
      check_plan_file_size(model, src.profile, o);
    } catch (tangram::invalid_argument const& e) {
      throw usage_error(cat("--out: ", e.what(), " (--tp-size, --group-size)"));
    }
  }
  auto plan = build_plan_for_cli(model, src.profile, o, src.samples ? &*src.samples : nullptr);
  if (out) save_static_plan(plan, *out);

  double waste = group_waste(plan.grouping, plan.rules);
  std::vector<std::optional<double>> scope_waste;
  for (auto sc : all_scopes) {
    try {
      scope_waste.emplace_back(group_waste(
          cluster_heads(plan.rules, plan.num_layers, plan.num_kv_heads, o.group_size, sc),
          plan.rules));
    } catch (tangram::invalid_argument const&) {
      scope_waste.emplace_back(std::nullopt);  // Hp does not divide that scope's heads
    }
  }
  std::int32_t per_kind[3] = {0, 0, 0};
  for (auto const& g : plan.grouping.groups) ++per_kind[static_cast<int>(g.rule.kind)];
  reference_batch batch;
  // An elastic plan's heads hold their groups' placed lengths, not their budgets: measured on
  // placements of the samples when there are samples.
  bool on_placements         = o.reservation.mode == reservation_mode::elastic && src.samples;
  bool split_from_placements = on_placements && o.split.weighting == split_weighting::batch_share;
  auto imb                   = on_placements
                                   ? elastic_layer_imbalance(plan, *src.samples, batch.contexts(), batch.seed)
                                   : layer_imbalance(plan.rules, plan.splits, batch.contexts());

  if (as_json) {
    auto v = json::value::object();
    v.set("command", "plan");
    v.set("input", src.source);
    v.set("model", model.name);
    v.set("profile_model", src.profile.model);
    v.set("scorer", src.profile.scorer);
    v.set("calibrated_from_samples", src.samples.has_value());
    v.set("num_layers", plan.num_layers);
    v.set("num_kv_heads", plan.num_kv_heads);
    v.set("tp_size", o.tp_size);
    v.set("tp_rank", o.tp_rank);
    v.set("first_layer", plan.first_layer);
    v.set("last_layer", plan.first_layer + plan.num_layers);
    v.set("group_size", o.group_size);
    v.set("scope", to_string(o.scope));
    v.set("page_tokens", o.page_tokens);
    v.set("page_bytes", plan.page_bytes());
    v.set("num_ctas", plan.splits.num_ctas());
    v.set("split_weighting", to_string(o.split.weighting));
    v.set("reservation", to_string(o.reservation.mode));
    bool const elastic = o.reservation.mode == reservation_mode::elastic;
    v.set(
        "margin",
        elastic ? json::value(plan.options.reservation.margin_or_default()) : json::value(nullptr));
    v.set("margin_from_samples", margin_from_samples(o, src));
    v.set("num_groups", plan.num_groups());
    auto kinds = json::value::object();
    for (auto k : {layer_kind::compressed, layer_kind::sliding_window, layer_kind::uncompressed})
      kinds.set(std::string(to_string(k)), per_kind[static_cast<int>(k)]);
    v.set("groups_by_kind", std::move(kinds));
    v.set("group_waste", waste);
    auto sw = json::value::object();
    for (std::size_t i = 0; i < 3; ++i)
      sw.set(std::string(to_string(all_scopes[i])),
             scope_waste[i] ? json::value(*scope_waste[i]) : json::value(nullptr));
    v.set("group_waste_by_scope", std::move(sw));
    v.set("split_imbalance", imb.aot.mean);
    v.set("split_imbalance_p95", imb.aot.p95);
    v.set("split_imbalance_max", imb.aot.max);
    v.set("equal_split_imbalance", imb.equal_split.mean);
    v.set("greedy_imbalance", imb.greedy.mean);
    v.set("greedy_fine_imbalance", imb.greedy_fine.mean);
    v.set("balanced_split_imbalance", imb.balanced.mean);  // a design: eval/balanced_split.hpp
    auto b = json::value::object();
    b.set("requests", batch.requests);
    b.set("min_context", batch.min_context);
    b.set("max_context", batch.max_context);
    b.set("seed", static_cast<std::int64_t>(batch.seed));
    v.set("imbalance_batch", std::move(b));
    v.set("imbalance_lengths", on_placements ? "elastic_placements" : "budgets");
    v.set("split_from_placements", split_from_placements);
    v.set("out", out ? json::value(*out) : json::value(nullptr));
    io.out << json::dump(v, -1) << "\n";
    return 0;
  }

  auto& s = io.out;
  print_heading(s, src.source, model, o);
  s << ", head_dim " << model.head_dim << ", " << to_string(model.kv_dtype) << "\n";
  if (o.layers)
    s << "  pipeline stage: layers " << layer_text(plan.stage_layers()) << " (" << plan.num_layers
      << " of " << model.num_layers << "; the plan's local layer 0 is model layer "
      << plan.first_layer << ")\n";
  if (src.samples)
    s << "  budgets calibrated from " << src.samples->samples.size() << " samples ("
      << to_string(cal.options.estimator) << ", "
      << (cal.options.estimator == budget_estimator::musigma ? cat("alpha ", cal.options.alpha)
                                                             : cat("q ", cal.options.quantile))
      << ", floor " << cal.options.floor << "), scorer " << printable(src.profile.scorer) << "\n";
  else
    s << "  budgets from profile (scorer " << printable(src.profile.scorer) << ")\n";
  s << "  page: " << o.page_tokens << " tokens x " << o.group_size << " heads x " << model.head_dim
    << " x " << to_string(model.kv_dtype) << " (K and V) = " << plan.page_bytes() << " bytes\n"
    << "  reservation: "
    << (o.reservation.mode == reservation_mode::elastic
            ? cat("elastic, margin ",
                  plan.options.reservation.margin_or_default(),
                  margin_from_samples(o, src) ? cat(" (", margin_from_samples_note, ")") : "",
                  " (the scorer's total per request, placed per group at eviction)")
            : std::string("static (each group its budget's pages)"))
    << "\n"
    << "  groups: " << plan.num_groups() << " (" << per_kind[0] << " compressed, " << per_kind[1]
    << " sliding_window, " << per_kind[2] << " uncompressed), scope " << to_string(o.scope) << "\n"
    << "  group waste over sum of budgets: " << percent(waste, 2) << "   (by scope:";
  for (std::size_t i = 0; i < 3; ++i)
    s << " " << to_string(all_scopes[i]) << " "
      << (scope_waste[i] ? percent(*scope_waste[i], 2) : std::string("n/a"));
  s << ")\n"
    << "  split map: N_CTA = " << plan.splits.num_ctas() << " (" << o.split.limits.sm_count
    << " SMs x " << o.split.limits.ctas_per_sm << "), weighting " << to_string(o.split.weighting)
    << (split_from_placements ? " over elastic placements of the samples"
        : o.reservation.mode == reservation_mode::elastic && !src.samples
            ? " over the groups' rules (a profile has no samples to place; plan from the "
              "retention samples for a better-balanced elastic map)"
            : "")
    << "\n\n"
    << "  split imbalance (max / mean CTA tokens) over the " << plan.num_layers << " layers, "
    << batch.requests << " requests, contexts log-uniform " << batch.min_context << ".."
    << batch.max_context << ", seed " << batch.seed << ", "
    << (on_placements ? "heads at elastic placements of the samples (scaled: modelled)"
                      : "heads at their budgets")
    << ":\n"
    << "    " << std::left << std::setw(26) << "planner" << std::right << std::setw(8) << "mean"
    << std::setw(8) << "p95" << std::setw(8) << "max"
    << "\n";
  auto line = [&](char const* name, imbalance_summary const& x) {
    s << "    " << std::left << std::setw(26) << name << std::right << std::setw(8)
      << fixed(x.mean, 3) << std::setw(8) << fixed(x.p95, 3) << std::setw(8) << fixed(x.max, 3)
      << "\n";
  };
  line("AOT split map (static)", imb.aot);
  line("equal split (FlashInfer)", imb.equal_split);
  line("greedy LPT, per step", imb.greedy);
  line("greedy LPT x4, per step", imb.greedy_fine);
  line("device-balanced (design)", imb.balanced);
  if (out) s << "\nwrote " << printable(*out) << "\n";
  return 0;
}

}  // namespace

command_body setup_plan(CLI::App& app) {
  auto a  = std::make_shared<plan_args>();
  auto& o = a->plan;
  add_text(app,
           "SAMPLES_OR_PROFILE.json",
           a->input,
           "",
           "Retention samples (calibrated here) or a budget profile, a file or a bundled name");
  add_calibration_options(app, a->cal);
  add_group_size(app, o.group_size);
  add_scope(app, o.scope);
  add_page_tokens(app, o.page_tokens);
  add_text(app,
           "--model",
           a->model,
           "NAME_OR_FILE",
           "A model-spec file or preset (default: the preset the input names)");
  add_sms(app, o.split.limits.sm_count);
  add_integer(app,
              "--ctas-per-sm",
              o.split.limits.ctas_per_sm,
              1,
              64,
              "CTAs per SM: N_CTA = sms x ctas-per-sm");
  add_choice(
      app,
      "--weighting",
      [&o](std::string const& v) { o.split.weighting = parse_split_weighting(v); },
      std::string(to_string(o.split.weighting)),
      {"budget", "batch_share"},
      "How the split map weighs heads: by budget, or by share of reference batches");
  a->batch_share_only.push_back(add_integer_list(
      app,
      "--reference-contexts",
      o.split.reference_contexts,
      1,
      split_limits::max_reference_context,
      split_limits::max_reference_contexts,
      cat("batch_share: the context lengths reference requests draw from (default: ",
          o.split.reference_contexts.size(),
          " lengths, log-spaced ",
          o.split.reference_contexts.front(),
          "..",
          o.split.reference_contexts.back(),
          ")")));
  a->batch_share_only.push_back(
      add_number(app,
                 "--share-quantile",
                 o.split.share_quantile,
                 {0, 1},
                 "batch_share: quantile of a head's shares taken as its weight"));
  add_choice(
      app,
      "--reservation",
      [&o](std::string const& v) { o.reservation.mode = *reservation_mode_named(v); },
      std::string(to_string(o.reservation.mode)),
      {"static", "elastic"},
      "static: every group reserves its budget's pages; elastic: each request reserves the "
      "scorer's total plus a margin, placed per group at eviction");
  a->margin = add_number(app,
                         "--margin",
                         o.reservation.margin,
                         {0, max_elastic_margin},
                         "elastic: reserve (1 + margin) x the scorer's total (default: from "
                         "retention samples, mean + 2 sd of their required margins and at least "
                         "0.02; from a budget profile, 0.02)");
  add_integer(app, "--tp-size", o.tp_size, 1, 1024, "Tensor-parallel ranks sharing the KV heads");
  add_integer(app, "--tp-rank", o.tp_rank, 0, 1023, "The rank this plan is for, below --tp-size");
  a->layers_opt = add_layer_ranges(
      app,
      "--layers",
      a->layers,
      model_limits::max_layers,
      model_limits::max_layers,
      "Pipeline stages as model layer ranges [FIRST, LAST): one range plans that stage (to --out); "
      "several must cover the model in order and write one plan per stage (PLAN.stageK-of-N.json)");
  a->stages_opt = add_integer(app,
                              "--pipeline-stages",
                              a->pipeline_stages,
                              1,
                              model_limits::max_layers,
                              "Split the layers into N pipeline stages balanced by KV memory; "
                              "writes one plan per stage, PLAN.stageK-of-N.json beside --out");
  a->stage_context_opt =
      add_integer(app,
                  "--stage-context",
                  a->stage_context,
                  1,
                  max_footprint_tokens,
                  "--pipeline-stages: the request length (tokens) whose KV memory is balanced "
                  "(and reported per stage)");
  add_text(
      app, "--out", a->out, "PLAN.json", "Write the plan (read by `tangram inspect` and engines)");
  app.add_flag("--json", a->json, "One JSON document instead of the text report");
  return [a](streams io) { return plan_command(*a, io); };
}

}  // namespace tangram::cli
