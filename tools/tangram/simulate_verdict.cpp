// SPDX-License-Identifier: Apache-2.0
#include "simulate_verdict.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <iomanip>
#include <limits>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "simulate_report.hpp"
#include "tangram/eval/sim/elastic_policy.hpp"
#include "tangram/eval/sim/measured_costs.hpp"
#include "tangram/eval/sim/measured_skews.hpp"
#include "tangram/eval/sim/out_of_sample.hpp"
#include "tangram/eval/sim/per_head_policy.hpp"
#include "tangram/eval/sim/policies.hpp"
#include "tangram/eval/sim/sensitivity.hpp"
#include "tangram/eval/sim/serving_costs.hpp"
#include "tangram/io/detail/json.hpp"

namespace tangram::cli {

namespace {

namespace json = tangram::detail::json;
using tangram::detail::cat;
using namespace tangram::sim;

constexpr std::array<cost_setting, 2> settings{cost_setting::paper, cost_setting::competent};
constexpr std::array<char const*, 4> baselines{
    "full_kv", "full_kv_offload", "unified_nonuniform", per_head_dynamic_name};
constexpr char const* policy_name = "tangram_elastic";  // Tangram's default: elastic reservation

/// One way of the out-of-sample replay: Tangram calibrated on one fold, every input's retention
/// and every measured skew from the other.
struct fold_setup {
  std::size_t calibration_samples = 0, replay_samples = 0;
  static_plan plan, elastic_base;
  double margin = 0;  ///< Tangram's: --margin, or the plans' default on the calibration half
  elastic_needs needs;
  std::shared_ptr<retention_needs const> own;
  std::array<serving_costs, 2> costs;  ///< by `settings`
};

fold_setup prepare_fold(sample_fold const& f,
                        verdict_inputs const& in,
                        fold_calibration const& calibrate_on) {
  fold_setup s;
  s.calibration_samples = f.calibration.samples.size();
  s.replay_samples      = f.replay.samples.size();
  s.plan                = build_plan_for_cli(in.model, calibrate_on(f.calibration), in.po);
  s.elastic_base        = s.plan;
  s.needs.samples       = f.replay;
  if (in.keep) {
    s.elastic_base.profile.target_keep_ratio = *in.keep;
    s.needs.scale                            = *in.keep / in.src.profile.target_keep_ratio;
  }
  s.own = std::make_shared<retention_needs>(s.plan, s.needs);
  // Skews on each policy's own lengths of the REPLAYED prompts: the elastic plan (weighed on the
  // calibration fold's placements) on its placements of them; the baselines' planner on their
  // retention (layer-wide pages read to the longest head under the paper's padded reads).
  bool placements = s.needs.scale == 1.0;
  // Tangram's margin, as the planner decides it from the CALIBRATION half (never the replayed
  // prompts) unless --margin gives one; the replay's policy reserves that same margin.
  auto ep         = elastic_plan(s.elastic_base, in.margin, &f.calibration, placements);
  s.margin        = ep.options.reservation.margin_or_default();
  auto batches    = measured_skew_batches(in.ro.max_running);
  auto elastic    = measure_skew(batches, [&](std::vector<std::int64_t> const& c) {
    return elastic_skew_at(ep, placements ? &f.replay : nullptr, c, in.split);
  });
  auto planner    = [&](bool padded) {
    return measure_skew(batches, [&](std::vector<std::int64_t> const& c) {
      return planner_skew_at(s.plan, &f.replay, c, padded);
    });
  };
  auto layer_wide = planner(true), per_head = planner(false);
  for (std::size_t i = 0; i < settings.size(); ++i) {
    auto& c                          = s.costs[i];
    c                                = serving_costs::preset(settings[i]);
    c.control_plane                  = in.control_plane;
    c.split                          = in.split;
    c.kv_heads                       = s.plan.num_kv_heads;
    auto const& unified              = c.baseline_masked_reads ? per_head : layer_wide;
    c.planner_skew                   = unified.reference;
    c.planner_skew_by_batch          = unified.by_batch;
    c.per_head_planner_skew          = per_head.reference;
    c.per_head_planner_skew_by_batch = per_head.by_batch;
    c.tangram_elastic_skew           = elastic.reference;
    c.tangram_elastic_skew_by_batch  = elastic.by_batch;
  }
  return s;
}

/// Every replay of one workload.
struct workload_results {
  std::string name;
  replay_result full, offload;  ///< need no calibration and pay the same in both settings
  struct fold {
    replay_result tangram;                           ///< pays the same in both settings
    std::array<replay_result, 2> unified, per_head;  ///< by `settings`
  };
  std::vector<fold> folds;

  [[nodiscard]] replay_result const& baseline(std::string const& b,
                                              std::size_t f,
                                              std::size_t c) const {
    if (b == "full_kv") return full;
    if (b == "full_kv_offload") return offload;
    return b == "unified_nonuniform" ? folds[f].unified[c] : folds[f].per_head[c];
  }
};

/// One row of the verdict: the default policy against one baseline under one setting, per fold.
struct verdict_row {
  std::string workload, baseline;
  cost_setting costs = cost_setting::paper;
  std::vector<verdict> folds;
  [[nodiscard]] verdict mean() const {
    verdict m;
    std::size_t bound = 0;  // folds in which memory binds both sides (the ratio is defined)
    for (auto const& v : folds) {
      m.tokens_per_s_ratio += v.tokens_per_s_ratio / static_cast<double>(folds.size());
      m.mean_resident_ratio += v.mean_resident_ratio / static_cast<double>(folds.size());
      m.bound_resident_ratio += v.bound_resident_ratio;
      bound += v.bound_resident_ratio > 0;
    }
    m.bound_resident_ratio = bound > 0 ? m.bound_resident_ratio / static_cast<double>(bound) : 0;
    return m;
  }
};

std::string ratio_text(std::vector<verdict> const& folds, double verdict::*field) {
  verdict_row r;
  r.folds   = folds;
  auto mean = r.mean();
  // 0: undefined (memory never binds one side), "-"; the mean is over the folds that have one.
  auto text = [](double x) { return x > 0 ? fixed(x, 2) : std::string("-"); };
  if (mean.*field == 0) return "-";
  std::string out = text(mean.*field) + "x (";
  for (std::size_t i = 0; i < folds.size(); ++i) out += (i ? " / " : "") + text(folds[i].*field);
  return out + ")";
}

json::value sources_json(verdict_inputs const& in, double measured_free_s) {
  auto o = json::value::object();
  o.set("reclaim_paper",
        cat("paper: +10-25% of prefill time; charged ",
            paper_costs::reclaim_prefill_fraction,
            " of the prefill of every chunk that reclaims pages"));
  o.set("reclaim_competent_s_per_page", pinned_batched_free_s_per_page);
  o.set("reclaim_competent_source",
        "measured: batched free on this project's page_pool (bench_memory "
        "--benchmark_filter=batched_free, "
        "eval/sim/measured_costs.hpp)");
  o.set("reclaim_measured_now_s_per_page", measured_free_s);
  o.set("replan_paper",
        cat("paper: 15-20% of a decode step; charged ", paper_costs::replan_fraction));
  auto plan = json::value::array();
  for (auto const& [n, s] : flashinfer_plan_host_s) {
    auto pt = json::value::array();
    pt.push_back(n);
    pt.push_back(s);
    plan.push_back(std::move(pt));
  }
  o.set("replan_competent_planner_host_s", std::move(plan));
  o.set("replan_competent_source",
        "cited: FlashInfer decode plan() host time, flashinfer-ai/flashinfer pull request 5043 "
        "(RTX 4090, Ryzen 9 "
        "5950X); one planned sequence per (request, KV head); overlapped with the previous step");
  o.set("skew",
        "measured: per-step greedy planner on each baseline's own per-input lengths (paper); 1 "
        "(competent)");
  o.set("host_link_bytes_per_s", in.cost.gpu().host_link_bytes_per_s);
  o.set("host_link_source",
        "GPU preset: PCIe Gen5 x16 (H100/H200/B200, 128 GB/s both ways), Gen4 on A100");
  o.set("offload_capacity_bytes", in.offload_capacity_bytes);
  o.set("step_overhead_s", serving_costs{}.step_overhead_s);
  o.set("step_overhead_source", "uncalibrated: the same for every policy");
  return o;
}

}  // namespace

int simulate_verdict(verdict_inputs const& in, fold_calibration const& calibrate_on, streams io) {
  if (!in.src.samples || in.src.samples->samples.empty())
    throw usage_error(
        cat("--verdict: calibrates on half of the prompts and replays the other half, so it needs "
            "retention samples; ",
            tangram::detail::printable(in.src.source),
            " is a budget profile"));
  std::vector<sample_fold> folds;
  try {
    folds = prompt_folds(*in.src.samples);
  } catch (tangram::invalid_argument const& e) {
    throw usage_error(
        cat("--verdict: ", tangram::detail::printable(in.src.source), ": ", e.what()));
  }
  auto t_start         = std::chrono::steady_clock::now();
  double measured_free = measure_batched_free_s_per_page();
  std::vector<fold_setup> setups;
  for (auto const& f : folds) setups.push_back(prepare_fold(f, in, calibrate_on));

  double const keep_ratio         = in.keep.value_or(in.src.profile.target_keep_ratio);
  std::int64_t const staged_chunk = std::min(in.ro.prefill_chunk, in.ro.step_token_budget);
  std::int32_t const runs         = 3 * (2 + static_cast<std::int32_t>(setups.size()) * 5);
  std::int32_t done               = 0;
  std::vector<workload_results> all;
  for (auto kind :
       {workload_kind::short_context, workload_kind::mid_context, workload_kind::long_context}) {
    auto wo                 = in.wo;
    wo.kind                 = kind;
    wo.max_context          = in.ro.max_context;
    auto work               = generate_workload(wo);
    auto n                  = static_cast<std::int32_t>(work.sessions.size());
    auto slots              = std::min<std::int32_t>(n, 4096);
    std::int64_t max_tokens = 1;
    for (auto const& s : work.sessions) max_tokens = std::max(max_tokens, s.total_tokens() + 1);
    max_tokens = std::min<std::int64_t>(max_tokens, std::numeric_limits<std::int32_t>::max());
    workload_results w;
    w.name   = std::string(to_string(kind));
    auto run = [&](kv_policy& p, step_charges const& charges, bool offload = false) {
      replay_options o         = in.ro;
      o.charges                = charges;
      o.offload.enabled        = offload;
      o.offload.capacity_bytes = in.offload_capacity_bytes;
      auto r                   = replay(work, p, in.cost, o);
      if (offload) r.policy = "full_kv_offload";
      // Tangram and full_kv are replayed once for both settings, which differ for them only in
      // what reclamation costs: they must have reclaimed nothing.
      TANGRAM_EXPECTS(r.reclaim_ops == 0 || r.policy == "unified_nonuniform" ||
                          r.policy == per_head_dynamic_name,
                      logic_error,
                      "simulate --verdict: ",
                      r.policy,
                      " reclaimed ",
                      r.reclaim_ops,
                      " pages, so its replay cannot serve both cost settings");
      if (!in.quiet)
        io.err << "simulate --verdict: " << w.name << " " << r.policy << " (" << ++done << "/"
               << runs << ") "
               << fixed(std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start)
                            .count(),
                        1)
               << " s\n";
      return r;
    };
    for (bool offload : {false, true}) {  // vLLM v1, its idle KV a prefix cache losing tail blocks
      unified_policy full(setups[0].plan, unified_mode::full_kv, in.kv_bytes, slots, n, max_tokens);
      full.set_scheduled_chunk(staged_chunk);
      full.set_block_eviction(true);
      (offload ? w.offload : w.full) =
          run(full, setups[0].costs[0].charges_for("full_kv"), offload);
    }
    for (auto const& s : setups) {
      workload_results::fold f;
      auto tangram                      = make_tangram_elastic_policy(s.elastic_base,
                                                 in.kv_bytes,
                                                 slots,
                                                 n,
                                                 staged_chunk,
                                                 s.margin,
                                                 s.needs,
                                                 in.answers,
                                                 in.park_for_turns,
                                                 in.ro.max_context);
      f.tangram                         = run(*tangram, s.costs[0].charges_for(policy_name));
      f.tangram.wanted_clipped_fraction = wanted_clipped_fraction(*tangram);
      for (std::size_t c = 0; c < settings.size(); ++c) {
        unified_policy unified(
            s.plan, unified_mode::compressed_reclaim, in.kv_bytes, slots, n, max_tokens, s.own);
        unified.set_scheduled_chunk(staged_chunk);
        unified.set_chunk_admission(true);
        f.unified[c] = run(unified, s.costs[c].charges_for("unified_nonuniform"));
        f.unified[c].wanted_clipped_fraction = 0.0;  // each input keeps its own retention
        auto per_head                        = make_per_head_dynamic_policy(s.plan,
                                                     in.kv_bytes,
                                                     slots,
                                                     n,
                                                     max_tokens,
                                                     s.own,
                                                     estimated_scorer(s.plan, keep_ratio),
                                                     staged_chunk);
        f.per_head[c] = run(*per_head, s.costs[c].charges_for(per_head_dynamic_name));
        f.per_head[c].wanted_clipped_fraction = 0.0;
      }
      w.folds.push_back(std::move(f));
    }
    all.push_back(std::move(w));
  }
  double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();

  std::vector<verdict_row> rows;
  for (auto const& w : all)
    for (char const* b : baselines)
      for (std::size_t c = 0; c < settings.size(); ++c) {
        verdict_row r{w.name, b, settings[c], {}};
        for (std::size_t f = 0; f < w.folds.size(); ++f)
          r.folds.push_back(verdict_of(w.folds[f].tangram, w.baseline(b, f, c)));
        rows.push_back(std::move(r));
      }

  if (in.json) {
    auto v = json::value::object();
    v.set("calibration", "out_of_sample");
    v.set("control_plane_charged", in.control_plane);
    v.set("kept_counts", std::string(to_string(in.ro.counts)));
    v.set("label",
          "modelled: roofline plus charged costs; Tangram's default policy against each baseline");
    auto jr = json::value::array();
    for (auto const& r : rows) {
      auto o    = json::value::object();
      auto mean = r.mean();
      o.set("workload", r.workload);
      o.set("baseline", r.baseline);
      o.set("costs", std::string(to_string(r.costs)));
      o.set("policy", policy_name);
      o.set("tokens_per_s_ratio", mean.tokens_per_s_ratio);
      o.set("mean_resident_ratio", mean.mean_resident_ratio);
      o.set("bound_resident_ratio", bound_ratio_json(mean.bound_resident_ratio));
      auto fj = json::value::array();
      for (auto const& f : r.folds) {
        auto x = json::value::object();
        x.set("tokens_per_s_ratio", f.tokens_per_s_ratio);
        x.set("mean_resident_ratio", f.mean_resident_ratio);
        x.set("bound_resident_ratio", bound_ratio_json(f.bound_resident_ratio));
        fj.push_back(std::move(x));
      }
      o.set("folds", std::move(fj));
      jr.push_back(std::move(o));
    }
    v.set("rows", std::move(jr));
    auto fj = json::value::array();
    for (std::size_t f = 0; f < folds.size(); ++f) {
      auto x = json::value::object();
      x.set("calibration_samples", static_cast<std::int64_t>(setups[f].calibration_samples));
      x.set("replay_samples", static_cast<std::int64_t>(setups[f].replay_samples));
      x.set("margin", setups[f].margin);
      auto ids = json::value::array();
      for (auto k : folds[f].replay_ids) ids.push_back(static_cast<std::int64_t>(k));
      x.set("replay_sample_indices", std::move(ids));
      fj.push_back(std::move(x));
    }
    v.set("folds", std::move(fj));
    auto cj = json::value::object();
    for (std::size_t c = 0; c < settings.size(); ++c)
      cj.set(std::string(to_string(settings[c])), costs_json(setups[0].costs[c]));
    v.set("costs", std::move(cj));
    v.set("sources", sources_json(in, measured_free));
    auto res = json::value::object();
    for (auto const& w : all) {
      auto wj = json::value::object();
      wj.set("full_kv", result_json(w.full));
      wj.set("full_kv_offload", result_json(w.offload));
      auto fr = json::value::array();
      for (auto const& f : w.folds) {
        auto x = json::value::object();
        x.set(policy_name, result_json(f.tangram));
        for (std::size_t c = 0; c < settings.size(); ++c) {
          auto sj = json::value::object();
          sj.set("unified_nonuniform", result_json(f.unified[c]));
          sj.set(per_head_dynamic_name, result_json(f.per_head[c]));
          x.set(std::string(to_string(settings[c])), std::move(sj));
        }
        fr.push_back(std::move(x));
      }
      wj.set("folds", std::move(fr));
      res.set(w.name, std::move(wj));
    }
    v.set("results", std::move(res));
    v.set("wall_seconds", wall);
    auto doc = json::value::object();
    doc.set("verdict", std::move(v));
    doc.set("model", in.model.name);
    doc.set("profile", in.src.source);
    doc.set("gpu", in.cost.gpu().name);
    io.out << json::dump(doc, -1) << "\n";
    return 0;
  }

  std::string fold_margins;
  for (std::size_t f = 0; f < setups.size(); ++f)
    fold_margins += (f ? " / " : "") + cat(setups[f].margin);
  auto& o = io.out;
  o << "tangram simulate --verdict: " << tangram::detail::printable(in.model.name) << " on one "
    << tangram::detail::printable(in.cost.gpu().name) << ", profile "
    << tangram::detail::printable(in.src.source) << " (keep " << fixed(keep_ratio, 2) << "), "
    << in.wo.sessions << " sessions x " << in.wo.turns << " turns per workload (seed " << in.wo.seed
    << ")\n"
    << "  " << policy_name << " (Tangram's default: elastic reservation, margin "
    << (in.margin ? cat(*in.margin) : "from each calibration half: " + fold_margins)
    << ") against each baseline; ratios > 1 favour Tangram. MODELLED (roofline plus charged "
       "costs).\n"
    << "  Calibration out of sample: Tangram's budgets, groups and split maps from half of the "
       "prompts (2 folds\n"
    << "  grouped by prompt), every input's retention and measured skew from the other half, both "
       "ways; each\n"
    << "  figure is the mean of the two folds (each fold in brackets). Control plane: "
    << (in.control_plane ? "measured and charged" : "not charged (--no-control-plane)")
    << ". Kept counts: " << to_string(in.ro.counts) << ".\n\n";
  o << "  " << std::left << std::setw(9) << "workload" << std::setw(20) << "baseline"
    << std::setw(11) << "costs" << std::setw(24) << "tokens/s ratio" << std::setw(24)
    << "mean resident ratio"
    << "resident while memory binds\n";
  for (auto const& r : rows)
    o << "  " << std::setw(9) << r.workload << std::setw(20) << r.baseline << std::setw(11)
      << to_string(r.costs) << std::setw(24) << ratio_text(r.folds, &verdict::tokens_per_s_ratio)
      << std::setw(24) << ratio_text(r.folds, &verdict::mean_resident_ratio)
      << ratio_text(r.folds, &verdict::bound_resident_ratio) << "\n";
  o << std::right
    << "\n  Costs (eval/sim/serving_costs.hpp, eval/sim/measured_costs.hpp; docs/benchmarks.md):\n"
    << "    paper:     reclamation " << paper_costs::reclaim_prefill_fraction
    << " of each reclaiming chunk's prefill (paper: 10-25%); re-planning "
    << paper_costs::replan_fraction << " of a decode step (paper: 15-20%)\n"
    << "               with the per-step planner's skew measured on each baseline's own lengths; "
       "whole pages read.\n"
    << "    competent: reclamation " << fixed(pinned_batched_free_s_per_page * 1e9, 1)
    << " ns a page (batched free on this pool, measured; now " << fixed(measured_free * 1e9, 1)
    << " ns); planning overlapped\n"
    << "               (FlashInfer plan() host time, 76-112 us at 64-1024 sequences, flashinfer PR "
       "5043); perfect\n"
    << "               balance; masked reads.\n"
    << "    both:      step overhead " << fixed(serving_costs{}.step_overhead_s * 1e3, 1)
    << " ms (uncalibrated); full_kv_offload reloads evicted blocks over "
    << fixed(in.cost.gpu().host_link_bytes_per_s / 1e9, 0) << " GB/s (host link),\n"
    << "               " << fixed(in.offload_capacity_bytes / 1e9, 0)
    << " GB of host memory; Tangram reads whole group pages in both settings.\n"
    << "  " << fixed(wall, 1) << " s wall.\n";
  return 0;
}

}  // namespace tangram::cli
