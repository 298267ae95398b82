// SPDX-License-Identifier: Apache-2.0
// `tangram simulate`: replays a multi-turn workload for full_kv, unified_nonuniform, tangram
// (static per-group budgets, `--reservation static`) and tangram_elastic (elastic reservation,
// the library's default) side by side on the real library (simulated memory), with a roofline
// time model.
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <iomanip>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <ostream>
#include <sstream>

#include "option_values.hpp"
#include "output_path.hpp"
#include "plan_support.hpp"
#include "simulate_report.hpp"
#include "simulate_shared_prompt.hpp"
#include "simulate_verdict.hpp"
#include "subcommands.hpp"
#include "tangram/core/detail/checked_math.hpp"
#include "tangram/eval/io/workload_io.hpp"
#include "tangram/eval/sim/ablation.hpp"
#include "tangram/eval/sim/cost_model.hpp"
#include "tangram/eval/sim/elastic_policy.hpp"
#include "tangram/eval/sim/gpu_presets.hpp"
#include "tangram/eval/sim/measured_skews.hpp"
#include "tangram/eval/sim/policies.hpp"
#include "tangram/eval/sim/rate_sweep.hpp"
#include "tangram/eval/sim/replay.hpp"
#include "tangram/eval/sim/retention_needs.hpp"
#include "tangram/eval/sim/sensitivity.hpp"
#include "tangram/eval/sim/serving_costs.hpp"
#include "tangram/eval/sim/workload.hpp"
#include "tangram/eval/split_imbalance.hpp"
#include "tangram/io/detail/file_io.hpp"
#include "tangram/io/detail/json.hpp"
#include "tangram/plan/build_static_plan.hpp"
#include "tangram/plan/clustering.hpp"
#include "tangram/plan/static_plan.hpp"

namespace tangram::cli {

namespace {

namespace json = tangram::detail::json;
using tangram::detail::cat;
using namespace tangram::sim;

constexpr char const* default_profile = "snapkv/llama-3.1-8b-instruct";

/// Scales budgets from the profile's keep ratio to `keep` (an approximation of what the same
/// compressor would keep at another global ratio; labelled as such in the output).
void rescale_budgets(budget_profile& p, double keep) {
  TANGRAM_EXPECTS(p.target_keep_ratio > 0, invalid_argument,
                  "--keep: the profile records no target_keep_ratio to scale from");
  double f = keep / p.target_keep_ratio;
  for (auto& b : p.budgets) b = std::min(1.0, std::max(b * f, std::max(p.calibration.floor, 1e-6)));
}

std::string gb(double bytes) { return fixed(bytes / 1e9, 1); }

struct simulate_args {
  calibration_args cal;
  std::optional<std::string> model;
  std::string profile = default_profile;
  std::string workload = "mid";
  std::string gpu_key = "h200";  // --gpu: a preset; --gpu-mem, --hbm-tbps, --peak-tflops override it
  double gpu_mem = 141;
  CLI::Option* gpu_mem_option = nullptr;  // its text is quoted as given in messages
  CLI::Option *hbm_option = nullptr, *tflops_option = nullptr, *step_tokens_option = nullptr,
              *max_running_option = nullptr, *sms_option = nullptr;
  std::vector<CLI::Option*> generator_only;  // refused with a workload file
  double usable = 0.9;
  double hbm = 4.8;
  double tflops = 989;
  std::optional<double> keep;
  std::optional<double> margin;  // none: the plan's default (from the samples when there are any)
  workload_options wo;
  replay_options ro;
  // The `tangram` column is static budgets, explicitly (elastic is plan_options' default); the
  // tangram_elastic column re-plans these options elastically (elastic_plan).
  plan_options po = [] {
    plan_options o;
    o.reservation.mode = reservation_mode::static_budgets;
    return o;
  }();
  std::optional<std::string> plot;
  bool json = false;
  bool quiet = false;
  bool sensitivity = false;
  bool ablation = false;  // --ablation: also reservation_only and +head_groups
  std::vector<std::int64_t> context_range;  // --context-range LO,HI (generated workloads)
  std::vector<double> rate_sweep;           // --rate-sweep R1,R2,... sessions/s (generated workloads)
  bool full_kv_pinned = false;  // --full-kv-scheduler pinned: the earlier session-aware full_kv
  bool full_kv_blocks = true;  // --full-kv-scheduler vllm (default): block-level prefix eviction; vllm-sessions: whole
  bool baseline_chunk_admission = true;  // --baseline-admission chunk (vLLM v1) | whole
  bool baseline_budgets = false;  // --baseline-retention budgets: the old padded-budget baseline
  cost_setting costs_setting =
      cost_setting::paper;  // --costs: the preset the overrides below start from
  std::optional<baseline_balance> balance;
  std::optional<bool> baseline_masked;
  std::optional<replan_mode> replan_mode_;
  tangram_split split = tangram_split::balanced;  // --decode-split
  std::optional<double> reclaim_us, reclaim_fraction, skew, replan, overhead_us;
  bool no_padded_reads  = false;
  answer_window_options answers;  // --decode-window: Tangram grows its answer reservation
  bool park_for_turns = true;     // --continuation-room park | headroom
  bool no_control_plane = false;
  bool verdict = false;  // --verdict: short, mid, long x every baseline x both cost settings
  std::int64_t shared_prompt = 0;  // --shared-prompt S: the shared-system-prompt workload only
  double offload_host_gb = host_offload{}.capacity_bytes / 1e9;
  std::vector<CLI::Option*> single_run_only;  // refused with --verdict
  CLI::Option* offload_option = nullptr;      // --offload-host-gb: --verdict only
};

/// Per-policy (printed) figures of the cost model's constants.
int simulate(simulate_args& a, streams io) {
  check_calibration_args(a.cal);
  // --verdict runs its own workloads and both cost settings: a single run's options are refused.
  if (a.verdict) {
    auto refused = a.single_run_only;
    for (auto* opt : a.generator_only)
      if (opt->get_name() == "--context-range" || opt->get_name() == "--rate-sweep")
        refused.push_back(opt);
    for (auto* opt : refused)
      if (opt->count() > 0)
        throw usage_error(cat(opt->get_name(),
                              ": applies to a single simulate run; --verdict runs short, mid and "
                              "long under both cost settings"));
  } else if (a.offload_option->count() > 0) {
    throw usage_error("--offload-host-gb: applies to --verdict (its full_kv_offload baseline)");
  }
  // --gpu: the preset's figures and vLLM v1's default limits on it, unless given one by one.
  auto const preset = *find_gpu_preset(a.gpu_key);  // add_choice allows only preset keys
  if (a.gpu_mem_option->count() == 0) a.gpu_mem = preset.gpu.memory_bytes / 1e9;
  if (a.hbm_option->count() == 0) a.hbm = preset.gpu.hbm_bytes_per_s / 1e12;
  if (a.tflops_option->count() == 0) a.tflops = preset.gpu.peak_flops / 1e12;
  if (a.step_tokens_option->count() == 0) a.ro.step_token_budget = preset.max_num_batched_tokens;
  if (a.max_running_option->count() == 0) a.ro.max_running = preset.max_num_seqs;
  if (a.sms_option->count() == 0) a.po.split.limits.sm_count = preset.sm_count;
  auto const& cal          = a.cal;
  auto const& model_o      = a.model;
  double const gpu_mem     = a.gpu_mem;
  std::string gpu_mem_text = given_text(a.gpu_mem_option, cat(a.gpu_mem));
  double const usable      = a.usable;
  double const hbm         = a.hbm;
  double const tflops      = a.tflops;
  auto const& keep         = a.keep;
  auto& wo                 = a.wo;
  auto const& ro           = a.ro;
  auto const& po           = a.po;
  auto const& plot         = a.plot;
  bool const as_json       = a.json;
  bool const quiet         = a.quiet;
  // Checked before any work (the run can take minutes): where the plot goes, and whether a
  // generated workload fits in memory at all.
  if (plot) {
    check_output_path("--plot", *plot);
    check_output_path("--plot", plot_path(*plot, "-time"));
    check_output_path("--plot", plot_path(*plot, "-serving"));
    if (!a.rate_sweep.empty()) check_output_path("--plot", plot_path(*plot, "-rate"));
  }
  // --sensitivity replays every policy at max_tokens = the rest of the context (vLLM's default),
  // so the context must be a valid max_tokens too: refused now, not after the main run.
  if (a.sensitivity && ro.max_context > workload_limits::max_tokens)
    throw usage_error(cat("--sensitivity --max-context ", ro.max_context,
                          ": the sweep replays at max_tokens = the context, which must be at most ",
                          workload_limits::max_tokens, "; lower --max-context or drop --sensitivity"));
  std::string const& workload_name = a.workload;
  auto kind                 = workload_kind_named(workload_name);
  if (!kind)
    for (auto* opt : a.generator_only)
      if (opt->count() > 0)
        throw usage_error(cat(opt->get_name(),
                              ": applies to generated workloads (short, mid, long), not to the "
                              "workload file ",
                              tangram::detail::quoted(workload_name)));
  if (kind) {
    auto turns = tangram::detail::mul_checked<std::int64_t>(wo.sessions, wo.turns);
    if (!turns || *turns > workload_limits::max_generated_turns)
      throw usage_error(cat("--sessions ", wo.sessions, " x --turns ", wo.turns, " = ",
                            turns.value_or(-1), " turns, more than the limit of ",
                            workload_limits::max_generated_turns, " for a generated workload"));
  }

  auto src = read_samples_or_profile(a.profile, cal);
  if (keep) rescale_budgets(src.profile, *keep);
  double keep_ratio = keep.value_or(src.profile.target_keep_ratio);
  auto model = resolve_model(model_o, src.profile.model);
  if (model.num_kv_heads > po.split.limits.max_ctas())
    throw usage_error(cat("--sms: ", po.split.limits.sm_count, " SMs x ", po.split.limits.ctas_per_sm,
                          " CTAs = ", po.split.limits.max_ctas(), " CTAs, fewer than the ", model.num_kv_heads,
                          " KV heads per layer of ", model.name, " (each needs one); give --sms ",
                          ceil_div(model.num_kv_heads, po.split.limits.ctas_per_sm), " or more"));
  auto plan  = build_plan_for_cli(model, src.profile, po);

  gpu_spec gpu;
  gpu.name            = preset.gpu.name;
  gpu.memory_bytes    = gpu_mem * 1e9;
  gpu.usable_fraction = usable;
  gpu.hbm_bytes_per_s = hbm * 1e12;
  gpu.peak_flops      = tflops * 1e12;
  gpu.host_link_bytes_per_s = preset.gpu.host_link_bytes_per_s;
  cost_model cost(model, gpu);
  double kv_bytes = gpu.kv_budget_bytes(model);
  if (kv_bytes <= 0)
    throw usage_error(cat("--gpu-mem x --usable: ", gpu_mem_text, " GB x ", usable, " leaves no room for the KV cache after ",
                          model.weight_bytes / 1e9, " GB of weights"));
  // Every policy's pool must hold between one page and as many as a page id can number; the
  // smallest page (Tangram's head-group page) gives the most pages.
  for (double page : {static_cast<double>(plan.page_bytes()),
                      static_cast<double>(unified_paging_baseline::layer_geometry(plan).page_bytes())}) {
    double pages = std::floor(kv_bytes / page);
    if (pages < 1 || pages > static_cast<double>(page_pool<page_layout<>>::max_pages))
      throw usage_error(cat("--gpu-mem x --usable: ", gpu_mem_text, " GB x ", usable, " - ", model.weight_bytes / 1e9,
                            " GB of weights leaves ", kv_bytes / 1e9, " GB for KV: ", pages, " pages of ",
                            page, " bytes (--page-tokens ", po.page_tokens, "), outside the [1, ",
                            page_pool<page_layout<>>::max_pages, "] pages a pool can hold"));
  }
  if (a.shared_prompt > 0)
    return run_shared_prompt(model, plan, a.shared_prompt, ro.prefill_chunk,
                             {kv_bytes, cat(gpu_mem_text, " GB x ", usable, " - ", model.weight_bytes / 1e9,
                                            " GB of weights")},
                             as_json, io);

  // Costs beyond the roofline: the --costs preset (eval/sim/serving_costs.hpp), then the
  // overrides; the decode skews are measured on each policy's own lengths (measured_skews.hpp).
  serving_costs costs = serving_costs::preset(a.costs_setting);
  // A per-page price replaces the preset's share-of-prefill model unless both are given, so
  // `--reclaim-us-per-page 0` charges no reclamation (as it did before the share existed).
  if (a.reclaim_us) {
    costs.reclaim_s_per_page       = *a.reclaim_us * 1e-6;
    costs.reclaim_prefill_fraction = 0;
  }
  if (a.reclaim_fraction) costs.reclaim_prefill_fraction = *a.reclaim_fraction;
  if (a.skew) costs.unbalanced_skew = *a.skew;
  if (a.replan) costs.replan_fraction = *a.replan;
  if (a.replan_mode_) costs.replan = *a.replan_mode_;
  if (a.balance) costs.balance = *a.balance;
  if (a.baseline_masked) costs.baseline_masked_reads = *a.baseline_masked;
  if (a.overhead_us) costs.step_overhead_s = *a.overhead_us * 1e-6;
  costs.split         = a.split;
  costs.padded_reads  = !a.no_padded_reads;
  costs.control_plane = !a.no_control_plane;
  costs.kv_heads      = plan.num_kv_heads;
  if (a.verdict)
    return simulate_verdict(
        verdict_inputs{model,
                       src,
                       cost,
                       kv_bytes,
                       po,
                       wo,
                       ro,
                       keep,
                       a.margin,
                       a.answers,
                       a.park_for_turns,
                       costs.control_plane,
                       costs.split,
                       a.offload_host_gb * 1e9,
                       as_json,
                       quiet},
        [&](retention_samples const& calibration) {
          auto p = calibrate(calibration, cal.options);
          if (keep) rescale_budgets(p, *keep);
          return p;
        },
        io);
  // The skews at the reference batch (printed) and at every measured batch size (charged by the
  // step's decode batch size).
  auto const skew_batch_sizes = measured_skew_batches(ro.max_running);
  {
    auto tk            = measure_skew(skew_batch_sizes, [&](std::vector<std::int64_t> const& c) {
      return static_skew_at(plan, c, costs.split);
    });
    costs.tangram_skew = tk.reference;
    costs.tangram_skew_by_batch = tk.by_batch;
    // The baseline's planner on its own lengths: each input's retention (or, given Tangram's
    // budgets, those), read to the layer's longest head unless its kernel masks.
    bool const own_lengths = !a.baseline_budgets && src.samples && !src.samples->samples.empty();
    auto pk            = measure_skew(skew_batch_sizes, [&](std::vector<std::int64_t> const& c) {
      return planner_skew_at(plan,
                             own_lengths ? &*src.samples : nullptr,
                             c,
                             costs.padded_reads && !costs.baseline_masked_reads);
    });
    costs.planner_skew = pk.reference;
    costs.planner_skew_by_batch = pk.by_batch;
  }

  workload work;
  if (kind) {
    wo.kind        = *kind;
    wo.max_context = ro.max_context;  // a generated session fits the same context
    if (!a.context_range.empty()) {
      auto const& r = a.context_range;
      if (r.size() != 2 || r[0] > r[1] || r[1] > ro.max_context)
        throw usage_error(cat("--context-range: must be LO,HI with LO <= HI <= --max-context (", ro.max_context,
                              "), got ", r[0], r.size() > 1 ? cat(",", r[1]) : std::string()));
      wo.context_lo = r[0];
      wo.context_hi = r[1];
    }
    work = generate_workload(wo);
  } else {
    try {
      work = load_workload(workload_name);
    } catch (tangram::invalid_argument const& e) {
      throw usage_error(
          cat("--workload: ", e.what(), " (give short, mid, long or a tangram-workload/v1 file)"));
    }
  }
  // A trace's sessions must fit the context: the replay would reserve at least one token past it.
  if (!kind) {
    for (std::size_t i = 0; i < work.sessions.size(); ++i) {
      std::int64_t context = 0;
      auto const& turns    = work.sessions[i].turns;
      for (std::size_t t = 0; t < turns.size(); ++t) {
        context += turns[t].prompt_tokens;
        if (context > ro.max_context)
          throw usage_error(cat("--workload: session ", i, " turn ", t, " reaches ", context,
                                " tokens with its prompt, above --max-context ", ro.max_context));
        context += std::min(turns[t].output_tokens, turns[t].reservation(ro.max_tokens, ro.max_context - context));
      }
    }
  }
  // Turns that carry their own max_tokens (a trace's): --max-tokens and the sensitivity's
  // max_tokens points apply to the others only.
  std::int64_t own_max_tokens = 0, total_turns = 0;
  for (auto const& sess : work.sessions)
    for (auto const& t : sess.turns) {
      own_max_tokens += t.max_tokens > 0;
      total_turns += 1;
    }
  // --rate-sweep: the same sessions (generated once at 1 session/s) at each arrival rate; the
  // policies are sized for the longest session of either workload.
  workload unit;
  if (!a.rate_sweep.empty()) {
    workload_options uo = wo;
    uo.arrival_rate     = 1;
    unit                = generate_workload(uo);
  }
  std::int64_t max_tokens = 1;
  for (auto const* w : {&work, &unit})
    for (auto const& s : w->sessions) max_tokens = std::max(max_tokens, s.total_tokens() + 1);
  // The baselines count a head's tokens in 32 bits; a longer session is refused at admission.
  max_tokens = std::min<std::int64_t>(max_tokens, std::numeric_limits<std::int32_t>::max());
  auto n_sessions = static_cast<std::int32_t>(work.sessions.size());
  std::int32_t slots = std::min<std::int32_t>(n_sessions, 4096);

  std::vector<replay_result> results;
  // Carriage-return progress only on a terminal: in a log file it is one unreadable line.
  bool const show_progress = !quiet && (&io.err != &std::cerr || ::isatty(STDERR_FILENO) != 0);
  auto t_start = std::chrono::steady_clock::now();
  int const n_policies = a.ablation ? 6 : 4;
  std::string run_label;  // "" for the main run; "rate R, " in a sweep
  auto run = [&](workload const& w, std::vector<replay_result>& into, kv_policy& policy, int index) {
    replay_options o = ro;
    o.charges        = costs.charges_for(policy.name());
    if (show_progress) {
      o.progress = [&, index](double f) {
        double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
        io.err << "\rsimulate: " << run_label << policy.name() << " (" << index + 1 << "/" << n_policies << ") "
               << std::setw(3) << static_cast<int>(f * 100) << "%  " << fixed(el, 1) << " s" << std::flush;
      };
    }
    into.push_back(replay(w, policy, cost, o));
  };
  // The baseline keeps each input's own retention (the samples); --baseline-retention budgets,
  // or a budget profile without samples, gives it Tangram's padded budgets instead.
  std::shared_ptr<retention_needs const> own;
  if (!a.baseline_budgets && src.samples && !src.samples->samples.empty()) {
    elastic_needs bn;
    bn.samples = src.samples;
    if (keep) bn.scale = *keep / src.profile.target_keep_ratio;
    own = std::make_shared<retention_needs>(plan, std::move(bn));
  }
  // The baseline under `chunk` admission (vLLM v1) or whole-prompt admission; --baseline-admission
  // picks the run's rule, --sensitivity replays the other.
  auto make_unified = [&](bool chunk) {
    auto u = std::make_unique<unified_policy>(plan, unified_mode::compressed_reclaim, kv_bytes, slots, n_sessions,
                                              max_tokens, own);
    u->set_scheduled_chunk(std::min(ro.prefill_chunk, ro.step_token_budget));
    u->set_chunk_admission(chunk);
    return u;
  };
  // Elastic reservation on the same workload, chunking, cost model and pool. With --keep the
  // scorer total and the samples' needs follow the rescaled ratio.
  static_plan elastic_base = plan;
  elastic_needs needs;
  needs.samples = src.samples;
  if (keep) {
    elastic_base.profile.target_keep_ratio = *keep;
    needs.scale = *keep / src.profile.target_keep_ratio;
  }
  bool const needs_from_samples = needs.samples && !needs.samples->samples.empty();
  // Elastic heads hold their groups' placed lengths: with (unscaled) samples the skew is measured
  // on their placements, over the elastic plan weighed on them; else on the budgets. The plan
  // decides the margin as the planner does (elastic_plan_margin of the samples over its heads)
  // unless --margin gives one; the policy then reserves that same margin.
  bool const placements          = needs_from_samples && needs.scale == 1.0;
  bool const margin_from_samples = !a.margin && needs_from_samples;
  double margin                  = 0;
  {
    auto ep = elastic_plan(
        elastic_base, a.margin, needs_from_samples ? &*needs.samples : nullptr, placements);
    margin  = ep.options.reservation.margin_or_default();
    auto ek = measure_skew(skew_batch_sizes, [&](std::vector<std::int64_t> const& c) {
      return elastic_skew_at(ep, placements ? &*needs.samples : nullptr, c, costs.split);
    });
    costs.tangram_elastic_skew          = ek.reference;
    costs.tangram_elastic_skew_by_batch = ek.by_batch;
  }
  std::int64_t const staged_chunk = std::min(ro.prefill_chunk, ro.step_token_budget);
  auto make_elastic = [&] {
    // Staging holds the largest chunk that runs: a chunk never exceeds the step's token budget.
    return make_tangram_elastic_policy(elastic_base, kv_bytes, slots, n_sessions, staged_chunk, margin, needs,
                                       a.answers, a.park_for_turns, ro.max_context);
  };
  double elastic_clipped = 0;  // share of the modelled wanted head-tokens the selection clipped
  // A static-budget Tangram policy named `name` over `p` (tangram, or an ablation's plan). Its
  // eviction step only counts the budgets' clipping the way the elastic selection counts its own
  // (the samples' needs, or the budgets without samples, which clip nothing).
  auto make_static = [&](std::string name, static_plan const& p) {
    tangram_policy_options so;
    so.name     = std::move(name);
    so.eviction      = std::make_shared<static_clipping>(p, needs);
    so.answers       = a.answers;
    so.park_for_turns = a.park_for_turns;
    return std::make_unique<tangram_policy>(p, kv_bytes, slots, n_sessions, std::move(so));
  };
  // Any policy of the sensitivity sweep by name.
  auto make_named = [&](std::string const& name) -> std::unique_ptr<kv_policy> {
    if (name == "unified_nonuniform") return make_unified(a.baseline_chunk_admission);
    if (name == "tangram") return make_static("tangram", plan);
    return make_elastic();
  };
  // Runs a Tangram policy (static or elastic) and records its share of wanted head-tokens clipped.
  auto run_tangram =
      [&](workload const& w, std::vector<replay_result>& into, tangram_policy& policy, int index) {
        run(w, into, policy, index);
        into.back().wanted_clipped_fraction = wanted_clipped_fraction(policy);
      };
  std::optional<static_plan> ro_plan;  // --ablation: reservation_only's one-group-per-layer plan
  if (a.ablation) ro_plan = build_plan_for_cli(model, src.profile, reservation_only_options(po, plan.num_kv_heads));
  // Every policy on workload `w`, in the report's order.
  auto run_all = [&](workload const& w, bool main_run) {
    std::vector<replay_result> into;
    {
      unified_policy full(plan, unified_mode::full_kv, kv_bytes, slots, n_sessions, max_tokens);
      full.set_scheduled_chunk(staged_chunk);
      full.set_vllm_v1(!a.full_kv_pinned);
      full.set_block_eviction(a.full_kv_blocks);
      run(w, into, full, 0);
    }
    run(w, into, *make_unified(a.baseline_chunk_admission), 1);
    into.back().wanted_clipped_fraction = 0.0;  // keeps its own retention (or the budgets it is given)
    if (ro_plan) {  // the paper's incremental study (eval/sim/ablation.hpp)
      run_tangram(w, into, *make_static(reservation_only_name, *ro_plan), 2);
      run_tangram(w, into, *make_static(head_groups_name, plan), 3);
    }
    run_tangram(w, into, *make_static("tangram", plan), a.ablation ? 4 : 2);
    run_tangram(w, into, *make_elastic(), n_policies - 1);
    if (main_run) elastic_clipped = into.back().wanted_clipped_fraction.value_or(0.0);
    return into;
  };
  results = run_all(work, true);
  std::vector<rate_point> sweep;
  if (!a.rate_sweep.empty()) {
    std::size_t k = 0;
    sweep = sweep_arrival_rates(unit, a.rate_sweep, [&](workload const& w) {
      run_label = cat("rate ", a.rate_sweep[k++], "/s, ");
      return run_all(w, false);
    });
    run_label.clear();
  }
  if (show_progress) io.err << "\n";
  // --sensitivity: the verdict at each end of every uncalibrated constant's range.
  std::optional<sensitivity_report> sens;
  if (a.sensitivity) {
    std::map<std::string, replay_result> defaults;
    for (auto const& r : results) defaults.emplace(r.policy, r);
    // The engine's max_tokens (not measured): every policy replayed at 512, 8192 and the rest of
    // the context (vLLM's default when a request sets none).
    max_tokens_variation mt;
    mt.context = ro.max_context;
    mt.rerun = [&](std::string const& name, std::int64_t max_new) {
      replay_options o = ro;
      o.charges        = costs.charges_for(name);
      o.max_tokens     = max_new;
      auto p           = make_named(name);
      if (show_progress) io.err << "\rsimulate: sensitivity, max_tokens " << max_new << ", " << name << "   " << std::flush;
      return replay(work, *p, cost, o);
    };
    // The baseline's admission rule: replayed under the rule the run did not use.
    admission_variation admission;
    admission.default_chunk  = a.baseline_chunk_admission;
    admission.rerun_baseline = [&](bool chunk) {
      replay_options o = ro;
      o.charges        = costs.charges_for("unified_nonuniform");
      auto p           = make_unified(chunk);
      if (show_progress)
        io.err << "\rsimulate: sensitivity, baseline admission " << admission_rule_name(chunk) << "   " << std::flush;
      return replay(work, *p, cost, o);
    };
    sens = sweep_sensitivity(costs, defaults, "unified_nonuniform", {"tangram", "tangram_elastic"},
                             [&](std::string const& name, step_charges const& ch) {
                               replay_options o = ro;
                               o.charges        = ch;
                               auto p           = make_named(name);
                               if (show_progress) io.err << "\rsimulate: sensitivity, " << name << "   " << std::flush;
                               return replay(work, *p, cost, o);
                             },
                             &mt, &admission);
    if (show_progress) io.err << "\n";
  }
  double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();

  std::string const work_label = work.name.empty() ? std::string("(unnamed trace)") : work.name;
  std::string title = cat(model.name, " on ", gpu.name, ", workload ", work_label, ", ", n_sessions, " sessions");
  if (plot) {
    tangram::detail::write_file(*plot, memory_svg(results, kv_bytes / 1e9, title));
    tangram::detail::write_file(plot_path(*plot, "-time"),
                                time_breakdown_svg(results, cat("Modelled time breakdown: ", title)));
    tangram::detail::write_file(plot_path(*plot, "-serving"),
                                serving_svg(results, cat("Modelled serving figures: ", title)));
    if (!sweep.empty())
      tangram::detail::write_file(
          plot_path(*plot, "-rate"),
          ttft_rate_svg(sweep, cat("Modelled TTFT vs arrival rate: ", model.name, " on ", gpu.name, ", workload ",
                                   work_label, ", ", n_sessions, " sessions")));
  }

  // A policy that gave up on sessions reports figures over the rest only: say so.
  for (auto const& r : results)
    if (r.rejected_sessions > 0)
      io.err << "simulate: warning: " << r.policy << " never completed " << r.rejected_sessions << " of " << n_sessions
             << " sessions (a turn could not fit even alone); its figures cover the others only\n";
  auto const& base = results[0];
  auto ratio = [](double a_, double b_) { return b_ > 0 ? a_ / b_ : 0.0; };
  if (as_json) {
    auto doc = json::value::object();
    doc.set("model", model.name);
    doc.set("kv_dtype", to_string(model.kv_dtype));
    doc.set("profile", src.source);
    doc.set("keep_ratio", keep_ratio);
    doc.set("keep_rescaled", keep.has_value());
    // A single run fits Tangram on the prompts it replays; --verdict replays unseen ones.
    doc.set("calibration", "in_sample");
    doc.set("keep_ratio_definitions",
            "policies.*.compressed_keep_ratio: live bytes / the same tokens uncompressed; stored_keep_ratio: bytes "
            "of pages held (padding, group waste, page rounding; no unbacked reservation) / the same tokens "
            "uncompressed; both time-weighted over the tokens handed to each policy");
    auto w = json::value::object();
    w.set("name", work.name);
    w.set("sessions", n_sessions);
    w.set("turns_per_session", work.sessions.empty() ? 0 : static_cast<std::int64_t>(work.sessions[0].turns.size()));
    w.set("generated", kind.has_value());
    // A trace file's arrivals are its own: the generator's settings are reported only when used.
    w.set("arrival_rate", kind ? json::value(wo.arrival_rate) : json::value(nullptr));
    w.set("concurrency", ro.concurrency);
    w.set("seed", kind ? json::value(static_cast<std::int64_t>(wo.seed)) : json::value(nullptr));
    w.set("context_dist", kind ? json::value(to_string(wo.contexts)) : json::value(nullptr));
    doc.set("workload", std::move(w));
    auto c = json::value::object();
    c.set("label", "modelled: roofline, not measured");
    c.set("gpu", gpu.name);
    c.set("gpu_memory_bytes", gpu.memory_bytes);
    c.set("usable_fraction", gpu.usable_fraction);
    c.set("weight_bytes", model.weight_bytes);
    c.set("kv_budget_bytes", kv_bytes);
    c.set("hbm_bytes_per_s", gpu.hbm_bytes_per_s);
    c.set("peak_flops", gpu.peak_flops);
    c.set("host_link_bytes_per_s", gpu.host_link_bytes_per_s);
    c.set("gpu_preset", a.gpu_key);
    c.set("full_kv_scheduler", a.full_kv_pinned ? "pinned" : a.full_kv_blocks ? "vllm" : "vllm-sessions");
    c.set("step_token_budget", ro.step_token_budget);
    c.set("kept_counts", std::string(to_string(ro.counts)));
    c.set("sms", a.po.split.limits.sm_count);
    c.set("max_running", ro.max_running);
    c.set("active_weight_bytes", model.active_weight_bytes);
    c.set("active_parameters", model.active_parameters);
    c.set("serving_costs", costs_json(costs));
    doc.set("cost_model", std::move(c));
    auto rv = json::value::object();
    rv.set("max_tokens", ro.max_tokens);
    rv.set("decode_window", a.answers.window_tokens);
    rv.set("park_victims", to_string(a.answers.victims));
    rv.set("host_pool_ratio", a.answers.host_pool_ratio);
    rv.set("continuation_room", a.park_for_turns && a.answers.window_tokens > 0 ? "park" : "headroom");
    rv.set("max_context", ro.max_context);
    rv.set("baseline_retention", own ? "own (retention samples)" : "budgets (Tangram's padded budgets)");
    rv.set("baseline_admission", a.baseline_chunk_admission ? "chunk" : "whole");
    doc.set("reservation", std::move(rv));
    auto pl = json::value::object();
    pl.set("group_size", po.group_size);
    pl.set("scope", to_string(po.scope));
    pl.set("page_tokens", po.page_tokens);
    pl.set("num_groups", plan.num_groups());
    pl.set("group_waste", group_waste(plan.grouping, plan.rules));
    doc.set("plan", std::move(pl));
    auto el = json::value::object();
    el.set("default_reservation", plan_options{}.reservation.mode == reservation_mode::elastic);
    el.set("margin", margin);
    el.set("margin_from_samples", margin_from_samples);
    el.set("max_chunk_tokens", staged_chunk);
    el.set(
        "needs",
        needs_from_samples
            ? cat("modelled: retention sample (session mod samples) kept x seen / context",
                  keep ? " x --keep / the profile's keep ratio" : "",
                  ", at least the protected sink + window, capped by candidates")
            : "modelled: each head's budget x seen, capped by candidates (no retention samples)");
    el.set("modelled_wanted_clipped_fraction", elastic_clipped);
    el.set("staging",
           "charged: each prefilling request holds one chunk's staging pages (its prompt's when "
           "shorter)");
    el.set("eviction_pass", "modelled: one read + write of the compressed heads' kept K/V per chunk at HBM bandwidth");
    doc.set("tangram_elastic", std::move(el));
    auto policies = json::value::object();
    for (auto const& r : results) policies.set(r.policy, result_json(r));
    doc.set("policies", std::move(policies));
    auto ratios = json::value::object();
    for (auto const& r : results) {
      auto o = json::value::object();
      o.set("peak_resident_sessions", ratio(r.peak_resident_sessions, base.peak_resident_sessions));
      o.set("mean_resident_sessions", ratio(r.mean_resident_sessions, base.mean_resident_sessions));
      o.set("mean_resident_sessions_memory_bound", bound_ratio_json(verdict_of(r, base).bound_resident_ratio));
      o.set("modelled_tokens_per_s", ratio(r.modelled_tokens_per_s, base.modelled_tokens_per_s));
      ratios.set(r.policy, std::move(o));
    }
    doc.set("ratios_vs_full_kv", std::move(ratios));
    auto vs_unified = json::value::object();
    for (auto const& r : results) vs_unified.set(r.policy, verdict_json(verdict_of(r, results[1])));
    doc.set("ratios_vs_unified_nonuniform", std::move(vs_unified));
    if (sens) {
      auto sj = json::value::object();
      auto pts = json::value::array();
      for (auto const& pt : sens->points) {
        auto po_ = json::value::object();
        po_.set("constant", pt.variation.constant);
        po_.set("end", pt.variation.end);
        po_.set("value", pt.variation.value);
        for (auto const& [name, v] : pt.verdicts) po_.set(name, verdict_json(v));
        pts.push_back(std::move(po_));
      }
      sj.set("points", std::move(pts));
      auto rg = json::value::object();
      for (auto const& [name, r] : sens->range) {
        auto ro_ = json::value::object();
        ro_.set("low", verdict_json(r.low));
        ro_.set("high", verdict_json(r.high));
        rg.set(name, std::move(ro_));
      }
      sj.set("range_vs_unified_nonuniform", std::move(rg));
      sj.set("replays", sens->replays);
      doc.set("sensitivity", std::move(sj));
    }
    if (!sweep.empty()) doc.set("rate_sweep", sweep_json(sweep));
    doc.set("wall_seconds", wall);
    io.out << json::dump(doc, -1) << "\n";
    return 0;
  }

  auto& o = io.out;
  o << "tangram simulate: " << tangram::detail::printable(model.name) << " (" << to_string(model.kv_dtype) << " KV) on one " << tangram::detail::printable(gpu.name)
    << (a.gpu_mem_option->count() + a.hbm_option->count() + a.tflops_option->count() > 0 ? " (preset, figures overridden)" : "")
    << ": " << gb(gpu.memory_bytes) << " GB x " << fixed(usable, 2) << " - " << gb(model.weight_bytes)
    << " GB weights = " << gb(kv_bytes) << " GB for KV; engine: " << ro.step_token_budget << " tokens/step, "
    << ro.max_running << " sequences"
    << (a.step_tokens_option->count() + a.max_running_option->count() == 0 ? " (vLLM v1's defaults on this GPU)" : "")
    << "; split map for " << a.po.split.limits.sm_count << " SMs\n"
    << "  profile " << tangram::detail::printable(src.source) << " (keep ratio "
    << fixed(keep_ratio, 2)
    << (keep ? ", budgets rescaled" : "") << "), plan Hp=" << po.group_size << " " << to_string(po.scope)
    << " P=" << po.page_tokens << ", group waste " << percent(group_waste(plan.grouping, plan.rules), 2) << "\n"
    << "  workload " << tangram::detail::printable(work_label) << ": " << n_sessions << " sessions x " << work.sessions[0].turns.size()
    << " turns, "
    << (!kind                  ? std::string("arrivals from the file")
        : wo.arrival_rate > 0 ? cat(wo.arrival_rate, " sessions/s")
                              : std::string("all at t=0"))
    << (ro.concurrency > 0 ? cat(", concurrency ", ro.concurrency) : std::string())
    << (kind ? cat(", seed ", wo.seed) : std::string()) << "\n\n";
  auto row = [&](std::string const& label, auto value_of) {
    o << "  " << std::left << std::setw(30) << label << std::right;
    for (auto const& r : results) o << std::setw(20) << value_of(r);
    o << "\n";
  };
  row("", [](replay_result const& r) { return r.policy; });
  row("resident sessions, peak", [](replay_result const& r) { return cat(r.peak_resident_sessions); });
  row("resident sessions, mean", [](replay_result const& r) { return fixed(r.mean_resident_sessions, 1); });
  row("  while memory binds", [](replay_result const& r) {
    return r.memory_bound_s > 0 ? fixed(r.mean_resident_sessions_memory_bound, 1) : std::string("-");
  });
  row("running sequences, peak", [](replay_result const& r) { return cat(r.peak_running); });
  row("KV allocated peak (GB)", [](replay_result const& r) { return gb(r.kv_bytes_allocated_peak); });
  row("KV live peak (GB)", [](replay_result const& r) { return gb(r.kv_bytes_live_peak); });
  row("keep ratio, as compressed", [](replay_result const& r) { return fixed(r.compressed_keep_ratio, 3); });
  row("keep ratio, as stored", [](replay_result const& r) { return fixed(r.stored_keep_ratio, 3); });
  row("wanted head-tokens clipped", [](replay_result const& r) {
    return r.wanted_clipped_fraction ? percent(*r.wanted_clipped_fraction, 3) : std::string("-");
  });
  row("rejected sessions", [](replay_result const& r) { return cat(r.rejected_sessions); });
  row("utilisation live/alloc", [](replay_result const& r) { return percent(r.mean_utilisation, 1); });
  row("admission waits", [](replay_result const& r) { return cat(r.admission_waits); });
  row("reclaim ops (pages)", [](replay_result const& r) { return cat(r.reclaim_ops); });
  row("preemptions", [](replay_result const& r) { return cat(r.preemptions); });
  row("steps sat out for kept counts", [](replay_result const& r) { return cat(r.counts_wait_steps); });
  row("idle evictions", [](replay_result const& r) { return cat(r.idle_evictions); });
  row("recomputed tokens", [](replay_result const& r) { return cat(r.recomputed_tokens); });
  row("parks (running turns)", [](replay_result const& r) { return cat(r.parks, " (", r.parked_running, ")"); });
  row("parked GB, host link s (modelled)", [](replay_result const& r) {
    return cat(fixed(r.parked_bytes / 1e9, 1), ", ", fixed(r.modelled_host_transfer_s, 2));
  });
  row("control plane us/step", [](replay_result const& r) { return fixed(r.control_plane_us_per_step, 2); });
  row("answers cut at max_tokens", [](replay_result const& r) { return cat(r.truncated_answers); });
  row("tokens/s (modelled)", [](replay_result const& r) { return fixed(r.modelled_tokens_per_s, 0); });
  row("requests/s (modelled)", [](replay_result const& r) { return fixed(r.modelled_requests_per_s, 3); });
  row("TTFT mean s (modelled)", [](replay_result const& r) { return fixed(r.modelled_ttft_mean_s, 2); });
  row("TTFT p95 s (modelled)", [](replay_result const& r) { return fixed(r.modelled_ttft_p95_s, 2); });
  row("TBT p50 ms (modelled)", [](replay_result const& r) { return fixed(r.modelled_tbt_p50_s * 1e3, 1); });
  row("TBT p95 ms (modelled)", [](replay_result const& r) { return fixed(r.modelled_tbt_p95_s * 1e3, 1); });
  row("makespan s (modelled)", [](replay_result const& r) { return fixed(r.modelled_makespan_s, 1); });
  row("  prefill s", [](replay_result const& r) { return fixed(r.time.prefill_s, 1); });
  row("  decode attention s", [](replay_result const& r) { return fixed(r.time.decode_attention_s, 1); });
  row("  decode weights s", [](replay_result const& r) { return fixed(r.time.weights_s, 1); });
  row("  reclamation s", [](replay_result const& r) { return fixed(r.time.reclamation_s, 1); });
  row("  re-planning s", [](replay_result const& r) { return fixed(r.time.replanning_s, 1); });
  row("  eviction pass s", [](replay_result const& r) { return fixed(r.time.eviction_pass_s, 1); });
  row("  step overhead s", [](replay_result const& r) { return fixed(r.time.overhead_s, 1); });
  if (costs.split == tangram_split::balanced)
    row("  split balancing s",
        [](replay_result const& r) { return fixed(r.time.decode_launch_s, 2); });
  if (costs.control_plane)
    row("  control plane s (measured)", [](replay_result const& r) { return fixed(r.time.control_plane_s, 1); });
  row("  idle s", [](replay_result const& r) { return fixed(r.time.idle_s, 1); });
  o << "\n";
  row("vs full_kv: resident peak", [&](replay_result const& r) {
    return fixed(ratio(r.peak_resident_sessions, base.peak_resident_sessions), 2) + "x";
  });
  row("vs full_kv: tokens/s (modelled)", [&](replay_result const& r) {
    return fixed(ratio(r.modelled_tokens_per_s, base.modelled_tokens_per_s), 2) + "x";
  });
  row("vs unified: resident mean", [&](replay_result const& r) {
    return fixed(verdict_of(r, results[1]).mean_resident_ratio, 2) + "x";
  });
  row("vs unified: tokens/s (modelled)", [&](replay_result const& r) {
    return fixed(verdict_of(r, results[1]).tokens_per_s_ratio, 2) + "x";
  });
  print_sweep(o, sweep);
  if (sens) {
    o << "\n  Sensitivity (each uncalibrated constant at the low, then the high end of its range; the baseline's kernel\n"
      << "  reading whole pages or masked; max_tokens 512, 8192 and the rest of the context; the baseline under each\n"
      << "  admission rule; " << sens->replays << " replays):\n";
    o << "  " << std::left << std::setw(34) << "constant = value" << std::right << std::setw(22)
      << "tangram vs unified" << std::setw(24) << "elastic vs unified" << "\n";
    o << "  " << std::left << std::setw(34) << "" << std::right << std::setw(22) << "tok/s  resident" << std::setw(24)
      << "tok/s  resident" << "\n";
    auto pair = [](verdict const& v) { return cat(fixed(v.tokens_per_s_ratio, 2), "x  ", fixed(v.mean_resident_ratio, 2), "x"); };
    for (auto const& pt : sens->points)
      o << "  " << std::left << std::setw(34)
        << cat(pt.variation.constant, " = ",
               seconds_valued(pt.variation.constant)   ? fixed(pt.variation.value * 1e6, pt.variation.value < 1e-8 ? 4 : 2) + " us"
               : pt.variation.constant == "max_tokens"
                   ? (pt.variation.end == "context" ? cat("context (", fixed(pt.variation.value, 0), ")")
                                                    : fixed(pt.variation.value, 0))
               : pt.variation.constant == "baseline_admission" || pt.variation.constant == "baseline_reads" ||
                       pt.variation.constant == "baseline_balance"
                   ? pt.variation.end
                                                       : fixed(pt.variation.value, 3))
        << std::right
        << std::setw(22) << pair(pt.verdicts.at("tangram")) << std::setw(24) << pair(pt.verdicts.at("tangram_elastic"))
        << "\n";
    for (auto const& [name, r] : sens->range)
      o << "  verdict range, " << name << " vs unified: tokens/s " << fixed(r.low.tokens_per_s_ratio, 2) << "-"
        << fixed(r.high.tokens_per_s_ratio, 2) << "x, mean resident " << fixed(r.low.mean_resident_ratio, 2) << "-"
        << fixed(r.high.mean_resident_ratio, 2) << "x\n";
  }
  o << "\n  Modelled = roofline (decode: (weights + KV read) / " << fixed(hbm, 1)
    << " TB/s; prefill: FLOPs / " << fixed(tflops, 0)
    << " TFLOP/s) plus charged costs; control-plane time is measured, "
    << (costs.control_plane ? "and added. " : "not added (--no-control-plane). ") << fixed(wall, 1)
    << " s wall.\n"
    << "  Calibration in sample: Tangram's budgets and split maps are fitted on the prompts this "
       "run "
       "replays; `simulate --verdict` replays prompts held out of the calibration.\n"
    << "  Kept counts (--kept-counts " << to_string(ro.counts) << "): "
    << (ro.counts == counts_arrival::next_step
            ? "a dynamic compressor (tangram_elastic; unified_nonuniform on each input's own "
              "retention) learns a chunk's kept counts a step later, as the engine loop without "
              "host synchronisation does "
              "(docs/integration.md): the session sits out that step and what the counts free "
              "waits for them.\n"
            : "known before the step after each chunk (a synchronisation or a device-side commit, "
              "neither charged).\n")
    << "  Costs (--costs " << to_string(a.costs_setting)
    << " and overrides; eval/sim/serving_costs.hpp, sources in docs/benchmarks.md): reclamation "
    << fixed(costs.reclaim_prefill_fraction, 3) << " of each reclaiming chunk's prefill + "
    << fixed(costs.reclaim_s_per_page * 1e9, 2) << " ns/page; padded page reads "
    << (costs.padded_reads ? "on" : "off")
    << (costs.padded_reads && costs.baseline_masked_reads
            ? " (off for unified_nonuniform: --baseline-reads masked)"
            : "")
    << "; step overhead " << fixed(costs.step_overhead_s * 1e6, 0)
    << " us (uncalibrated, not measured: swept 200-3000 us by --sensitivity); baseline balance "
    << to_string(costs.balance)
    << (costs.balance == baseline_balance::none
            ? cat(" (unbalanced skew ", fixed(costs.unbalanced_skew, 2), ")")
            : cat(" (re-planning ",
                  costs.replan == replan_mode::fraction
                      ? cat(fixed(costs.replan_fraction, 3), " of a decode step")
                      : cat("FlashInfer plan()'s measured host time",
                            costs.replan == replan_mode::overlapped
                                ? ", overlapped with the previous step"
                                : ""),
                  costs.balance == baseline_balance::replan
                      ? ", the per-step planner's measured skew)"
                      : ", skew 1)"))
    << ";\n  Tangram's decode split map "
    << (costs.split == tangram_split::balanced
            ? cat("balanced per step on the device (one launch a decoding step: ",
                  fixed(split_balance_launch_s.front().second * 1e6, 1),
                  " us at batch ",
                  split_balance_launch_s.front().first,
                  " to ",
                  fixed(split_balance_launch_s.back().second * 1e6, 1),
                  " at ",
                  split_balance_launch_s.back().first,
                  ", measured on an H200)")
        : costs.split == tangram_split::stream
            ? std::string("the layer stream (--decode-split stream: CTAs cut each layer's "
                          "tokens across heads; nothing launched per step)")
            : std::string("the plan's ahead-of-time map (--decode-split aot)"))
    << ";\n  decode skew measured from the split maps at decode batch "
    << skew_curve_text(costs.tangram_skew_by_batch)
    << " (a step pays its own batch's):\n    planner  "
    << skew_curve_values(costs.planner_skew_by_batch) << "\n    tangram  "
    << skew_curve_values(costs.tangram_skew_by_batch) << "\n    elastic  "
    << skew_curve_values(costs.tangram_elastic_skew_by_batch) << "\n  full_kv: 1 (equal heads).\n"
    << "  Reservation: max_tokens " << ro.max_tokens << " per turn"
    << (own_max_tokens > 0
            ? cat(" without its own (",
                  own_max_tokens,
                  " of ",
                  total_turns,
                  " turns carry their own, which --sensitivity's max_tokens points keep)")
            : std::string())
    << " (context " << ro.max_context << ")"
    << (a.answers.window_tokens > 0 ? cat("; Tangram reserves ",
                                          a.answers.window_tokens,
                                          " answer tokens at a time (--decode-window) and parks a "
                                          "session in host memory when a growth ",
                                          a.park_for_turns ? "or a turn " : "",
                                          "does not fit (",
                                          fixed(gpu.host_link_bytes_per_s / 1e9, 1),
                                          " GB/s host link, modelled)")
                                    : std::string())
    << ", answers drawn separately; unified_nonuniform keeps "
    << (own ? "each input's own retention (samples)" : "Tangram's padded budgets") << ".\n"
    << "  tangram: static per-group budgets (--reservation static); tangram_elastic: elastic "
       "reservation, the default\n"
    << "  of plan_options and `tangram plan`, margin " << margin
    << (margin_from_samples ? cat(" (", margin_from_samples_note, ")") : std::string())
    << "; each prefilling request also holds staging for one " << staged_chunk
    << "-token chunk (its prompt, if shorter); per-head needs modelled from "
    << (needs_from_samples ? "the retention samples" : "the budgets") << " ("
    << percent(elastic_clipped, 3)
    << " of wanted head-tokens clipped);\n  its unfused eviction pass is charged as one read + "
       "write of the kept K/V"
    << " per chunk (modelled); its control plane includes the CPU group selection.\n"
    << (a.full_kv_pinned
            ? ""
            : cat("  The full_kv column is vLLM v1: pages per scheduled chunk, idle sessions' KV "
                  "an LRU prefix cache (",
                  a.full_kv_blocks
                      ? "the LRU\n  session's tail blocks evicted one by one, its prefix kept: "
                      : "evicted whole\n  (--full-kv-scheduler vllm-sessions): ",
                  a.full_kv_blocks ? cat(base.prefix_blocks_evicted, " blocks evicted;\n  ")
                                   : std::string(),
                  "recomputed as prefill on the next turn), the newest request preempted when a "
                  "step runs "
                  "out;\n  the other policies keep idle sessions and admit new ones with headroom "
                  "(see "
                  "--full-kv-scheduler).\n"));
  if (a.full_kv_pinned)
    o << "  --full-kv-scheduler pinned: full_kv admits whole prompts, keeps idle sessions and leaves headroom, "
         "like the compressed policies.\n";
  if (a.ablation)
    o << "  Ablation (--ablation): reservation_only and +head_groups balance decode like unified_nonuniform (no AOT\n"
      << "  split); +aot_split is tangram, +elastic is tangram_elastic (both on the per-step balanced map\n"
      << "  unless --decode-split aot, which gives the AOT map alone).\n";
  o << "  Keep ratio (time-weighted over resident tokens): as compressed = tokens kept / tokens seen (the scorer's "
    << fixed(keep_ratio, 2) << (keep ? ", rescaled by --keep" : "")
    << ", padded by the budgets'\n  calibration for tangram); as stored = bytes of pages held / the same tokens "
       "uncompressed (budget padding, group\n  waste and page rounding included; decode reservations not yet backed by "
       "pages excluded).\n";
  if (plot)
    o << "  wrote " << tangram::detail::printable(*plot) << ", " << tangram::detail::printable(plot_path(*plot, "-time"))
      << ", " << tangram::detail::printable(plot_path(*plot, "-serving"))
      << (sweep.empty() ? std::string() : cat(", ", tangram::detail::printable(plot_path(*plot, "-rate")))) << "\n";
  return 0;
}

}  // namespace

command_body setup_simulate(CLI::App& app) {
  auto a   = std::make_shared<simulate_args>();
  auto& wo = a->wo;
  auto& ro = a->ro;
  auto& po = a->po;
  // The defaults shown and used are those of workload_options, replay_options and plan_options.
  add_text(app, "--model", a->model, "NAME_OR_FILE",
           "A model-spec file or preset (default: the preset the profile names)");
  add_text(app, "--profile", a->profile, "NAME_OR_FILE",
           "Retention samples or a budget profile, a file or a bundled name");
  add_calibration_options(app, a->cal);
  add_number(app, "--margin", a->margin, {0, max_elastic_margin},
             "tangram_elastic: reserve the scorer's total times 1 + M (default: the plan's: from "
             "retention samples mean + 2 sd of their required margins, at least 0.02; 0.02 from a "
             "budget profile)");
  add_number(app, "--keep", a->keep, {0.001, 1},
             "Rescale the profile's budgets to this keep ratio (an approximation; default: as "
             "profiled)");
  auto* workload_option = add_text(app, "--workload", a->workload, "short|mid|long|FILE",
                                   "A generated workload, or a tangram-workload/v1 trace file");
  a->generator_only = {
      add_integer(app, "--sessions", wo.sessions, 1, workload_limits::max_sessions,
                  "Generated: sessions"),
      add_integer(app, "--turns", wo.turns, 1, workload_limits::max_generated_turns_per_session,
                  "Generated: turns per session"),
      add_number(app, "--arrival-rate", wo.arrival_rate, {0, 1e9},
                 "Generated: sessions per second (0: all at t = 0)"),
      add_number(app, "--think", wo.think_mean_s, {0, 1e6},
                 "Generated: mean think time between turns (s)"),
      add_integer(app, "--seed", wo.seed, 0, std::int64_t{1} << 62, "Generated: random seed"),
      add_integer_list(app, "--context-range", a->context_range, 1, workload_limits::max_session_tokens, 2,
                       "Generated: first-turn contexts in LO,HI tokens (drawn by --context-dist) instead of the "
                       "workload's (short 4096,20000; mid 20000,100000; long 100000,120000)"),
      add_choice(
          app, "--context-dist", [a](std::string const& v) { a->wo.contexts = *context_dist_named(v); }, "loguniform",
          {"loguniform", "uniform", "fixed"},
          "Generated: how first-turn contexts are drawn in the range: loguniform (mean (HI-LO)/ln(HI/LO)), "
          "uniform (mean (LO+HI)/2) or fixed (every context (LO+HI)/2); the other draws (answers, think "
          "times, arrivals) stay the same at a seed"),
      add_number_list(app, "--rate-sweep", a->rate_sweep, {0, 1e9, true}, max_sweep_rates,
                      "Generated: also replay the same sessions (generated once at --seed with Poisson arrivals "
                      "at 1 session/s, arrival times divided by R) at each rate R sessions/s, every policy, and "
                      "report TTFT p50/p95, TBT p95, tokens/s, requests/s and mean resident sessions per rate "
                      "(TTFT vs rate); costs one full run per rate on top of the main run"),
  };
  {
    std::vector<std::string> keys;
    std::string listed;
    for (auto const& p : gpu_presets()) {
      keys.push_back(p.key);
      listed += cat(listed.empty() ? "" : "; ", p.key, " = ", p.gpu.name, " (", p.gpu.memory_bytes / 1e9, " GB, ",
                    p.gpu.hbm_bytes_per_s / 1e12, " TB/s, ", p.gpu.peak_flops / 1e12, " TFLOP/s; vLLM ",
                    p.max_num_batched_tokens, " tokens/step, ", p.max_num_seqs, " seqs)");
    }
    add_choice(app, "--gpu", [a](std::string const& v) { a->gpu_key = v; }, "h200", keys,
               cat("GPU preset: memory, bandwidth, dense bf16 peak, SM count and vLLM v1's default --step-tokens "
                   "and --max-running on it, each overridable: ",
                   listed));
  }
  a->gpu_mem_option =
      add_number(app, "--gpu-mem", a->gpu_mem, {1, 1e6}, "GPU memory (GB), weights included (default: --gpu's)");
  add_number(app, "--usable", a->usable, {0.01, 1}, "Fraction of GPU memory the engine may use");
  a->hbm_option = add_number(app, "--hbm-tbps", a->hbm, {0.01, 1000}, "Modelled memory bandwidth (TB/s; default: --gpu's)");
  a->tflops_option =
      add_number(app, "--peak-tflops", a->tflops, {1, 1e6}, "Modelled dense compute (TFLOP/s; default: --gpu's)");
  a->sms_option = add_sms(app, po.split.limits.sm_count);
  a->sms_option->description("SMs of the GPU the split map is planned for (default: --gpu's)");
  add_integer(app, "--concurrency", ro.concurrency, 0, 1000000,
              "Sessions in flight at once (0: no limit)");
  add_integer(app, "--chunk", ro.prefill_chunk, 1, 1 << 24, "Prefill chunk (tokens)");
  a->step_tokens_option = add_integer(app, "--step-tokens", ro.step_token_budget, 1, 1 << 24,
                                      "Tokens per engine step (vLLM max_num_batched_tokens; default: --gpu's)");
  a->max_running_option = add_integer(app, "--max-running", ro.max_running, 1, 1 << 20,
                                      "Sequences per engine step (vLLM max_num_seqs; default: --gpu's)");
  add_group_size(app, po.group_size);
  add_scope(app, po.scope);
  add_page_tokens(app, po.page_tokens);
  a->single_run_only.push_back(
      add_text(app,
               "--plot",
               a->plot,
               "FILE.svg",
               "Draw memory over time to FILE.svg, the time breakdown per policy to FILE-time.svg, "
               "tokens/s, "
               "requests/s, mean resident sessions, TTFT and TBT p50/p95 per policy to "
               "FILE-serving.svg and, with "
               "--rate-sweep, TTFT p50/p95 vs arrival rate to FILE-rate.svg"));
  add_integer(app, "--decode-window", a->answers.window_tokens, 0, workload_limits::max_tokens,
              "Tangram policies reserve this many answer tokens at admission and grow by as many when a turn runs "
              "out, up to its max_tokens; a growth that does not fit parks an idle session, else the newest running "
              "turn, in host memory (2x the KV pool; charged at --gpu's host link), never recomputing. "
              "0: reserve the whole max_tokens up front (default: 256)");
  add_choice(app,
             "--continuation-room",
             [a](std::string const& v) { a->park_for_turns = v == "park"; },
             "park",
             {"park", "headroom"},
             "How Tangram policies make room for resident sessions' next turns: a turn that does not fit "
             "parks idle sessions in host memory (park, with a --decode-window; admission keeps no headroom, "
             "as vLLM keeps none) or new sessions wait until every resident one could grow by 1024 uncompressed "
             "tokens (headroom, what the baselines keep)");
  add_integer(app, "--max-tokens", ro.max_tokens, 1, workload_limits::max_tokens,
              "Decode tokens a turn reserves at admission (the engine's max_tokens; capped by the context)");
  add_integer(app, "--max-context", ro.max_context, 4096, workload_limits::max_session_tokens,
              "Model context limit (tokens): caps each turn's reservation and generated sessions");
  auto& single = a->single_run_only;
  single.push_back(add_integer(app, "--shared-prompt", a->shared_prompt, 1, workload_limits::max_tokens,
                               "Only the shared-system-prompt workload: 32 requests of this many shared prompt tokens "
                               "+ 256 own + 256 answer, committed memory with and without sharing the prompt "
                               "(Tangram: a pinned prefix; full_kv: vLLM prefix caching)"));
  single.push_back(workload_option);
  single.push_back(add_choice(
      app,
      "--baseline-retention",
      [a](std::string const& v) { a->baseline_budgets = v == "budgets"; },
      "own",
      {"own", "budgets"},
      "unified_nonuniform keeps each input's own retention from the samples (own) or Tangram's "
      "padded budgets"));
  single.push_back(add_choice(
      app,
      "--baseline-admission",
      [a](std::string const& v) { a->baseline_chunk_admission = v == "chunk"; },
      "chunk",
      {"chunk", "whole"},
      "unified_nonuniform admits a turn when its first scheduled chunk fits (chunk, as vLLM v1) or "
      "only when its "
      "whole uncompressed prompt fits (whole)"));
  single.push_back(add_enum<cost_setting>(
      app,
      "--costs",
      a->costs_setting,
      {{"paper", cost_setting::paper}, {"competent", cost_setting::competent}},
      "The charged costs the options below start from: paper (the paper's reclamation, 17.5% of "
      "each reclaiming "
      "chunk's prefill, and re-planning, 0.175 of a decode step, with the measured planner's skew, "
      "whole pages "
      "read) or competent (a measured batched free per reclaimed page, FlashInfer's measured "
      "planning time "
      "overlapped with the previous step, perfect balance, masked reads); "
      "eval/sim/serving_costs.hpp"));
  single.push_back(add_enum<baseline_balance>(
      app,
      "--baseline-balance",
      a->balance,
      {{"replan", baseline_balance::replan},
       {"none", baseline_balance::none},
       {"perfect", baseline_balance::perfect}},
      "unified_nonuniform balances decode by per-step re-planning (replan: the measured greedy "
      "planner's skew on its "
      "own lengths), not at all (none: the unbalanced decode skew) or by a re-planning that "
      "balances perfectly "
      "(perfect: skew 1, re-planning still charged); default: --costs'"));
  add_enum<tangram_split>(
      app,
      "--decode-split",
      a->split,
      {{"balanced", tangram_split::balanced},
       {"aot", tangram_split::aot},
       {"stream", tangram_split::stream}},
      "Tangram's decode split map: balanced (per step on the device from the batch's head "
      "lengths, kernels/balanced_split.hpp; one launch a decoding step charged), aot (the "
      "plan's ahead-of-time map alone) or stream (CTAs cut the layer's tokens across heads, "
      "layer_stream_split; nothing launched per step)");
  add_enum<counts_arrival>(
      app,
      "--kept-counts",
      a->ro.counts,
      {{"next-step", counts_arrival::next_step}, {"at-once", counts_arrival::at_once}},
      "When the host learns the kept counts a dynamic compressor's eviction chose on the GPU "
      "(tangram_elastic, unified_nonuniform, per_head_dynamic; every one pays the same): "
      "next-step (the engine loop of docs/integration.md, no host-device synchronisation: the "
      "session sits out the step after each chunk) or at-once (a synchronisation or a "
      "device-side commit, neither charged)");
  single.push_back(add_enum<replan_mode>(
      app,
      "--replan",
      a->replan_mode_,
      {{"fraction", replan_mode::fraction},
       {"planner", replan_mode::planner},
       {"overlapped", replan_mode::overlapped}},
      "How a per-step re-planning is charged: fraction (--replan-fraction of the decode step, the "
      "paper's), planner "
      "(FlashInfer plan()'s measured host time for the step's sequences, serialised) or overlapped "
      "(the same, "
      "hidden behind the previous step); default: --costs'"));
  single.push_back(
      add_number(app,
                 "--reclaim-us-per-page",
                 a->reclaim_us,
                 {0, 1e6},
                 "Charged time per reclaimed page, us (default: --costs'; paper 0, competent the "
                 "measured batched free, 0.0011); given alone, it is the whole reclamation "
                 "charge (--reclaim-prefill-fraction 0)"));
  single.push_back(add_number(
      app,
      "--reclaim-prefill-fraction",
      a->reclaim_fraction,
      {0, 10},
      "Reclamation charged as this share of the prefill of every chunk that reclaims pages "
      "(default: --costs'; paper 0.175, its 10-25%; competent 0)"));
  single.push_back(add_number(
      app,
      "--unbalanced-skew",
      a->skew,
      {1, 100},
      "Decode skew without load balancing, --baseline-balance none (default 1.55; paper 1.4-1.7)"));
  single.push_back(add_number(
      app,
      "--replan-fraction",
      a->replan,
      {0, 10},
      "Per-step re-planning with --replan fraction, share of a decode step (default 0.175; "
      "paper 0.15-0.20)"));
  single.push_back(add_number(app,
                              "--step-overhead-us",
                              a->overhead_us,
                              {0, 1e6},
                              "Fixed overhead per engine step, us (default 1000)"));
  single.push_back(app.add_flag("--no-padded-reads",
                                a->no_padded_reads,
                                "Decode reads live tokens only, not whole pages (every policy)"));
  single.push_back(add_choice(
      app,
      "--baseline-reads",
      [a](std::string const& v) { a->baseline_masked = v == "masked"; },
      "padded",
      {"padded", "masked"},
      "unified_nonuniform's decode kernel reads whole layer-wide pages (padded) or masks each head "
      "at its own "
      "length and reads its live tokens only (masked); default: --costs'"));
  app.add_flag("--no-control-plane",
               a->no_control_plane,
               "Leave the measured policy (control-plane) time out of modelled time, for "
               "deterministic runs (it is "
               "charged by default)");
  app.add_flag(
      "--verdict",
      a->verdict,
      "Run Tangram's default policy (tangram_elastic) against full_kv, full_kv with host offload, "
      "unified_nonuniform and per_head_dynamic on the short, mid and long workloads under the "
      "paper's and "
      "a competent engine's costs, calibrated on half of the prompts and replayed on the other "
      "half (both "
      "ways), and print one table (--json: {\"verdict\": ...})");
  a->offload_option = add_number(app,
                                 "--offload-host-gb",
                                 a->offload_host_gb,
                                 {0, 1e6},
                                 "--verdict: host memory (GB) full_kv_offload keeps evicted blocks "
                                 "in (default 256: a DGX H100/H200's 2 TB "
                                 "for 8 GPUs)");
  single.push_back(add_choice(
      app,
      "--full-kv-scheduler",
      [a](std::string const& v) {
        a->full_kv_pinned = v == "pinned";
        a->full_kv_blocks = v == "vllm";
      },
      "vllm", {"vllm", "vllm-sessions", "pinned"},
      "full_kv as vLLM v1 (vllm: per-chunk pages, idle KV an LRU prefix cache whose LRU session loses its tail "
      "blocks one by one, keeping its prefix, as vLLM v1's block pool does, recomputed on a miss; vllm-sessions: the "
      "same evicting whole sessions) or with "
      "the simulator's session-aware admission the compressed policies use (pinned: whole prompt, "
      "idle "
      "sessions kept, headroom for new sessions)"));
  single.push_back(app.add_flag(
      "--ablation",
      a->ablation,
      "Also run the paper's incremental study: reservation_only (Tangram's reservation on "
      "layer-wide pages) and +head_groups (head-group pages, no AOT split); +aot_split is "
      "tangram, +elastic tangram_elastic (on the per-step balanced map unless --decode-split aot)"));
  single.push_back(app.add_flag("--sensitivity",
                                a->sensitivity,
                                "Also rerun the comparison at each end of every uncalibrated "
                                "cost's range, with the baseline on both "
                                "--baseline-reads kernels, at max_tokens 512, 8192 and the rest of "
                                "the context (vLLM's default), and with the "
                                "baseline under both --baseline-admission rules"));
  app.add_flag("--json", a->json, "One JSON document instead of the table");
  app.add_flag("--quiet", a->quiet, "No progress on stderr");
  return [a](streams io) { return simulate(*a, io); };
}

}  // namespace tangram::cli
