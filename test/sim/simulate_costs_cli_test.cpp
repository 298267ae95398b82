// SPDX-License-Identifier: Apache-2.0
// `tangram simulate` (issue 13): the cost constants printed and in --json, their overrides, the
// reservation settings, the time breakdown, --sensitivity, and errors naming the option.
#include <algorithm>
#include <map>
#include <sstream>

#include "cli_support.hpp"
#include "commands.hpp"
#include "tangram/io/detail/json.hpp"
#include "test_support.hpp"

using tangram::test::run;
using tangram::test::run_json;

namespace {


/// A small run; deterministic (the measured control plane left out), as the comparisons between
/// runs below need.
std::vector<std::string> small(std::vector<std::string> extra) {
  return tangram::test::with_args(
      {"simulate", "--sessions", "12", "--turns", "2", "--quiet", "--no-control-plane"}, extra);
}

}  // namespace

TEST_CASE("simulate --json reports the costs, the reservation and each policy's time breakdown",
          "[simulate][cli][issue13]") {
  namespace json = tangram::detail::json;
  auto r         = run_json(small({"--json", "--step-overhead-us", "250", "--max-tokens", "2048"}));
  auto root      = r.root();
  auto costs = root["cost_model"]["serving_costs"];
  CHECK(costs["step_overhead_s"].as_double(0, 1) == Approx(250e-6));
  CHECK(root["calibration"].as_string() == "in_sample");  // --verdict is the out-of-sample replay
  // The paper's costs by default (issue 30): reclamation a share of the reclaiming chunks'
  // prefill, no per-page constant fitted to a run.
  CHECK(costs["reclaim_s_per_page"].as_double(0, 1) == 0);
  CHECK(costs["reclaim_prefill_fraction"].as_double(0, 1) == Approx(0.175));
  CHECK(costs["replan"].as_string() == "fraction");
  CHECK(costs["replan_fraction"].as_double(0, 1) == Approx(0.175));
  CHECK_FALSE(costs["control_plane_charged"].as_bool());  // --no-control-plane
  CHECK(costs["baseline_balance"].as_string() == "replan");
  CHECK(costs["padded_reads"].type() == json::kind::boolean);
  CHECK(costs["tangram_skew_measured"].as_double(1, 10) >= 1);
  CHECK(root["reservation"]["max_tokens"].as_int(0, 1 << 30) == 2048);
  CHECK(root["reservation"]["baseline_retention"].as_string().find("own") == 0);
  for (char const* policy : {"full_kv", "unified_nonuniform", "tangram", "tangram_elastic"}) {
    INFO(policy);
    auto p        = root["policies"][policy];
    auto t        = p["modelled_time_breakdown"];
    double sum    = 0;
    for (char const* term : {"prefill_s",
                             "eviction_pass_s",
                             "decode_attention_s",
                             "weights_s",
                             "reclamation_s",
                             "replanning_s",
                             "overhead_s",
                             "decode_launch_s",
                             "control_plane_s",
                             "idle_s"})
      sum += t[term].as_double(0, 1e12);
    CHECK(sum == Approx(p["modelled_makespan_s"].as_double(0, 1e12)));
    CHECK(t["overhead_s"].as_double(0, 1e12) ==
          Approx(250e-6 * static_cast<double>(p["steps"].as_int(0, 1LL << 40))));
    CHECK(p["modelled_requests_per_s"].as_double(1e-9, 1e9) > 0);
    CHECK(p["completed_requests"].as_int(0, 1000) == 24);
    CHECK(p["mean_resident_sessions"].as_double(0, 1e6) > 0);
    // Resident sessions while memory binds: over a part of the run, 0 when it never binds.
    double bound_s = p["memory_bound_s"].as_double(0, 1e12);
    CHECK(bound_s <= p["modelled_makespan_s"].as_double(0, 1e12));
    CHECK((bound_s > 0) == (p["mean_resident_sessions_memory_bound"].as_double(0, 1e6) > 0));
    // Against a baseline memory never binds the ratio is undefined (null), else a number.
    auto base_bound = root["policies"]["unified_nonuniform"]["memory_bound_s"].as_double(0, 1e12);
    auto rb = root["ratios_vs_unified_nonuniform"][policy]["mean_resident_sessions_memory_bound"];
    CHECK((rb.type() == json::kind::null) == (bound_s == 0 || base_bound == 0));
    CHECK(root["ratios_vs_unified_nonuniform"][policy]["modelled_tokens_per_s"].as_double(0, 100) > 0);
  }
  CHECK(root["policies"]["unified_nonuniform"]["modelled_time_breakdown"]["replanning_s"].as_double(
            1e-12, 1e12) > 0);
  CHECK(root["policies"]["tangram"]["modelled_time_breakdown"]["replanning_s"].as_double(0, 0) == 0);
  CHECK(root["ratios_vs_unified_nonuniform"]["unified_nonuniform"]["modelled_tokens_per_s"].as_double(
            0, 100) == Approx(1));
}

TEST_CASE("simulate --reclaim-us-per-page alone is the whole reclamation charge",
          "[simulate][cli][issue29][issue30]") {
  // Issue 29's competent comparison passes --reclaim-us-per-page 0: the baseline must then be
  // charged no reclamation at all, not the paper's share of prefill behind the flag's back.
  auto reclamation = [](std::vector<std::string> extra) {
    extra.push_back("--json");
    auto r       = run_json(small(extra));
    auto root    = r.root();
    auto costs = root["cost_model"]["serving_costs"];
    auto unified = root["policies"]["unified_nonuniform"];
    REQUIRE(unified["reclaim_ops"].as_int(0, 1LL << 40) > 0);  // it does reclaim in this run
    return std::make_pair(costs["reclaim_prefill_fraction"].as_double(0, 10),
                          unified["modelled_time_breakdown"]["reclamation_s"].as_double(0, 1e12));
  };
  auto paper = reclamation({});
  CHECK(paper.first == Approx(0.175));
  CHECK(paper.second > 0);
  auto zero = reclamation({"--reclaim-us-per-page", "0"});
  CHECK(zero.first == 0);
  CHECK(zero.second == 0);
  auto both = reclamation({"--reclaim-us-per-page", "0", "--reclaim-prefill-fraction", "0.1"});
  CHECK(both.first == Approx(0.1));
  CHECK(both.second > 0);
}

TEST_CASE("simulate switches: no padded reads, the unbalanced baseline, the budget baseline",
          "[simulate][cli][issue13]") {
  auto r    = run_json(small({"--json",
                              "--no-padded-reads",
                              "--baseline-balance",
                              "none",
                              "--unbalanced-skew",
                              "1.6",
                              "--baseline-retention",
                              "budgets"}));
  auto root = r.root();
  CHECK_FALSE(root["cost_model"]["serving_costs"]["padded_reads"].as_bool());
  CHECK(root["cost_model"]["serving_costs"]["baseline_balance"].as_string() == "none");
  CHECK(root["reservation"]["baseline_retention"].as_string().find("budgets") == 0);
  CHECK(root["policies"]["unified_nonuniform"]["modelled_time_breakdown"]["replanning_s"].as_double(
            0, 0) == 0);
}

TEST_CASE("simulate --sensitivity prints the verdict's range and reports it in --json",
          "[simulate][cli][issue13]") {
  auto t = run(small({"--sensitivity"}));
  INFO(t.err);
  REQUIRE(t.code == 0);
  CHECK(t.out.find("verdict range, tangram vs unified") != std::string::npos);
  CHECK(t.out.find("reclaim_s_per_page = ") != std::string::npos);
  CHECK(t.out.find("Costs (--costs paper and overrides; eval/sim/serving_costs.hpp") !=
        std::string::npos);

  namespace json = tangram::detail::json;
  auto r         = run(small({"--sensitivity", "--json"}));
  REQUIRE(r.code == 0);
  auto doc = json::parse(r.out, "stdout");
  json::node root(doc, "stdout");
  auto s = root["sensitivity"];
  // 4 charges at both ends; a balanced planner; the baseline's kernel padded and masked;
  // max_tokens 512, 8192 and the rest of the context; the baseline under both admission rules
  CHECK(s["points"].size() == 16);
  CHECK(t.out.find("baseline_balance = perfect") != std::string::npos);
  CHECK(t.out.find("max_tokens = 512") != std::string::npos);
  CHECK(t.out.find("max_tokens = 8192") != std::string::npos);
  CHECK(t.out.find("max_tokens = context (") != std::string::npos);
  CHECK(t.out.find("baseline_reads = masked") != std::string::npos);
  std::int32_t masked_points = 0;
  for (std::size_t i = 0; i < s["points"].size(); ++i)
    if (s["points"][i]["constant"].as_string() == "baseline_reads" && s["points"][i]["end"].as_string() == "masked") {
      masked_points += 1;
      CHECK(s["points"][i]["value"].as_double(0, 1) == 0);
    }
  CHECK(masked_points == 1);
  for (char const* policy : {"tangram", "tangram_elastic"}) {
    auto rg = s["range_vs_unified_nonuniform"][policy];
    CHECK(rg["low"]["modelled_tokens_per_s"].as_double(0, 100) <=
          rg["high"]["modelled_tokens_per_s"].as_double(0, 100));
  }
}

TEST_CASE("simulate --baseline-reads masked: the baseline reads live tokens, Tangram whole group pages",
          "[simulate][cli][issue13]") {
  namespace json = tangram::detail::json;
  auto attention = [](std::string const& out, char const* policy) {
    auto doc = json::parse(out, "stdout");
    json::node root(doc, "stdout");
    return root["policies"][policy]["modelled_time_breakdown"]["decode_attention_s"].as_double(0, 1e12);
  };
  auto padded = run(small({"--json"}));
  auto masked = run(small({"--json", "--baseline-reads", "masked"}));
  INFO(masked.err);
  REQUIRE(padded.code == 0);
  REQUIRE(masked.code == 0);
  auto doc = json::parse(masked.out, "stdout");
  json::node root(doc, "stdout");
  CHECK(root["cost_model"]["serving_costs"]["baseline_reads"].as_string() == "masked");
  CHECK(attention(masked.out, "unified_nonuniform") < attention(padded.out, "unified_nonuniform"));
  CHECK(attention(masked.out, "tangram") == attention(padded.out, "tangram"));
}

TEST_CASE("simulate --decode-window: Tangram reserves a window and says so", "[simulate][cli][issue13]") {
  namespace json = tangram::detail::json;
  auto r         = run_json(small({"--json", "--decode-window", "128", "--max-tokens", "131072"}));
  auto root      = r.root();
  CHECK(root["reservation"]["decode_window"].as_int(0, 1 << 30) == 128);
  CHECK(root["reservation"]["max_tokens"].as_int(0, 1 << 30) == 131072);
  auto t = run(small({"--decode-window", "128"}));
  CHECK(t.out.find("Tangram reserves 128 answer tokens at a time") != std::string::npos);
  // The window reaches the policies: with max_tokens at the rest of the context, up-front
  // reservation holds fewer sessions than reserving 128 tokens at a time (7.3 against 6.4 here).
  auto up = run(small({"--json", "--max-tokens", "131072", "--decode-window", "0"}));
  REQUIRE(up.code == 0);
  auto doc_up = json::parse(up.out, "stdout");
  json::node root_up(doc_up, "stdout");
  for (char const* policy : {"tangram", "tangram_elastic"}) {
    INFO(policy);
    CHECK(root["policies"][policy]["mean_resident_sessions"].as_double(0, 1e6) >
          1.05 * root_up["policies"][policy]["mean_resident_sessions"].as_double(0, 1e6));
  }
}

TEST_CASE("simulate --baseline-balance perfect: re-planning still charged, no skew", "[simulate][cli][issue13]") {
  namespace json = tangram::detail::json;
  auto measured = run(small({"--json"}));
  auto perfect  = run(small({"--json", "--baseline-balance", "perfect"}));
  REQUIRE(measured.code == 0);
  REQUIRE(perfect.code == 0);
  auto dm = json::parse(measured.out, "stdout");
  auto dp = json::parse(perfect.out, "stdout");
  json::node m(dm, "stdout"), p(dp, "stdout");
  CHECK(p["cost_model"]["serving_costs"]["baseline_balance"].as_string() == "perfect");
  auto t = [](json::node const& root, char const* field) {
    return root["policies"]["unified_nonuniform"]["modelled_time_breakdown"][field].as_double(0, 1e12);
  };
  CHECK(t(p, "replanning_s") > 0);
  CHECK(t(p, "decode_attention_s") < t(m, "decode_attention_s"));  // the measured planner's skew is above 1
  CHECK(p["policies"]["tangram"]["modelled_makespan_s"].as_double(0, 1e12) ==
        m["policies"]["tangram"]["modelled_makespan_s"].as_double(0, 1e12));
}

TEST_CASE("simulate --decode-split: Tangram on the balanced map pays its launch and no more skew",
          "[simulate][cli][issue29]") {
  auto balanced_run = run_json(small({"--json"}));  // the default
  auto aot_run      = run_json(small({"--json", "--decode-split", "aot"}));
  auto b = balanced_run.root(), a = aot_run.root();
  auto cb = b["cost_model"]["serving_costs"], ca = a["cost_model"]["serving_costs"];
  CHECK(cb["tangram_decode_split"].as_string() == "balanced");
  CHECK(ca["tangram_decode_split"].as_string() == "aot");
  CHECK(cb["split_balance_s_by_batch"][std::size_t{0}][std::size_t{1}].as_double(0, 1) == Approx(11.7e-6));
  CHECK(ca["split_balance_s_by_batch"].size() == 0);
  // The balanced map's fullest CTA is never above the AOT map's on the same lengths.
  for (char const* skew : {"tangram_skew_measured", "tangram_elastic_skew_measured"}) {
    INFO(skew);
    CHECK(cb[skew].as_double(1, 10) <= ca[skew].as_double(1, 10));
    CHECK(cb[skew].as_double(1, 10) < ca[skew].as_double(1, 10) - 1e-3);  // this profile's AOT skew
  }
  auto launches = [](auto const& root, char const* policy) {
    return root["policies"][policy]["modelled_time_breakdown"]["decode_launch_s"].as_double(0,
                                                                                            1e12);
  };
  for (char const* policy : {"tangram", "tangram_elastic"}) {
    INFO(policy);
    CHECK(launches(a, policy) == 0);
    // One launch for each step that decoded (11.7 us at these batches of at most 12): more than
    // none, at most one per step.
    CHECK(launches(b, policy) > 0);
    CHECK(launches(b, policy) <=
          11.7e-6 * static_cast<double>(b["policies"][policy]["steps"].as_int(0, 1LL << 40)) +
              1e-12);
  }
  // The layer stream: no launch, and its fullest CTA within one token of the mean (below the
  // balanced map's whole CTAs per head).
  auto stream_run = run_json(small({"--json", "--decode-split", "stream"}));
  auto st         = stream_run.root();
  CHECK(st["cost_model"]["serving_costs"]["tangram_decode_split"].as_string() == "stream");
  CHECK(st["cost_model"]["serving_costs"]["split_balance_s_by_batch"].size() == 0);
  for (char const* skew : {"tangram_skew_measured", "tangram_elastic_skew_measured"}) {
    INFO(skew);
    CHECK(st["cost_model"]["serving_costs"][skew].as_double(1, 10) <= cb[skew].as_double(1, 10));
    CHECK(st["cost_model"]["serving_costs"][skew].as_double(1, 10) < 1.001);
  }
  for (char const* policy : {"tangram", "tangram_elastic"}) CHECK(launches(st, policy) == 0);
  for (char const* policy : {"full_kv", "unified_nonuniform"}) {
    INFO(policy);
    CHECK(launches(b, policy) == 0);
    CHECK(b["policies"][policy]["modelled_makespan_s"].as_double(0, 1e12) ==
          a["policies"][policy]["modelled_makespan_s"].as_double(0, 1e12));
  }
}

TEST_CASE("simulate refuses bad cost and reservation options, naming them",
          "[simulate][cli][errors][issue13]") {
  tangram::test::check_refusals({
      {{"simulate", "--max-tokens", "0"}, "--max-tokens: must be in [1, 1073741824], got 0"},
      {{"simulate", "--max-context", "100"},
       "--max-context: must be in [4096, 2147483647], got 100"},
      {{"simulate", "--baseline-balance", "foo"},
       "--baseline-balance: expected one of replan, none, perfect"},
      {{"simulate", "--baseline-reads", "dense"},
       "--baseline-reads: expected one of padded, masked"},
      {{"simulate", "--decode-split", "even"},
       "--decode-split: expected one of balanced, aot, stream"},
      {{"simulate", "--decode-window", "-1"},
       "--decode-window: must be in [0, 1073741824], got -1"},
      {{"simulate", "--baseline-retention", "x"},
       "--baseline-retention: expected one of own, budgets"},
      {{"simulate", "--unbalanced-skew", "0.5"}, "--unbalanced-skew: must be in [1, 100], got 0.5"},
      {{"simulate", "--reclaim-us-per-page", "-1"},
       "--reclaim-us-per-page: must be in [0, 1e6], got -1"},
      {{"simulate", "--replan-fraction", "11"}, "--replan-fraction: must be in [0, 10], got 11"},
      {{"simulate", "--step-overhead-us", "nan"}, "--step-overhead-us"},
  });
}

TEST_CASE("simulate --sensitivity replays the baseline under both admission rules",
          "[simulate][cli][issue13]") {
  // [run's rule][row's rule][policy][field]: each run's rows, and its own verdicts as [rule][rule].
  std::map<std::string, std::map<std::string, std::map<std::string, std::map<std::string, double>>>> seen;
  for (std::string rule : {"chunk", "whole"}) {
    INFO("--baseline-admission " << rule);
    auto r    = run_json(small({"--sensitivity", "--json", "--baseline-admission", rule}));
    auto root = r.root();
    CHECK(root["reservation"]["baseline_admission"].as_string() == rule);
    auto s   = root["sensitivity"];
    auto pts = s["points"];
    // The two rows of the admission rule, in order chunk then whole.
    std::vector<std::string> ends;
    std::size_t at_default = 0;
    for (std::size_t i = 0; i < pts.size(); ++i) {
      if (pts[i]["constant"].as_string() != "baseline_admission") continue;
      ends.push_back(pts[i]["end"].as_string());
      if (ends.back() == rule) at_default = i;
    }
    REQUIRE(ends == std::vector<std::string>{"chunk", "whole"});
    for (char const* policy : {"tangram", "tangram_elastic"}) {
      INFO(policy);
      // The row under the run's own rule is the default run's verdict.
      auto def = root["ratios_vs_unified_nonuniform"][policy];
      for (char const* field : {"modelled_tokens_per_s", "mean_resident_sessions"}) {
        INFO(field);
        double v = def[field].as_double(0, 1e6);
        CHECK(pts[at_default][policy][field].as_double(0, 1e6) == Approx(v));
        // The range includes the default run's verdict.
        auto rg = s["range_vs_unified_nonuniform"][policy];
        CHECK(rg["low"][field].as_double(0, 1e6) <= v);
        CHECK(rg["high"][field].as_double(0, 1e6) >= v);
        for (std::size_t i = 0; i < pts.size(); ++i)
          if (pts[i]["constant"].as_string() == "baseline_admission")
            seen[rule][pts[i]["end"].as_string()][policy][field] = pts[i][policy][field].as_double(0, 1e6);
        seen[rule][rule][policy][std::string(field) + " (run)"] = v;
      }
    }
  }
  // The row under the other rule is that rule's own run: the same verdict.
  for (char const* policy : {"tangram", "tangram_elastic"})
    for (char const* field : {"modelled_tokens_per_s", "mean_resident_sessions"}) {
      INFO(policy << " " << field);
      CHECK(seen["chunk"]["whole"][policy][field] == Approx(seen["whole"]["whole"][policy][std::string(field) + " (run)"]));
      CHECK(seen["whole"]["chunk"][policy][field] == Approx(seen["chunk"]["chunk"][policy][std::string(field) + " (run)"]));
    }
  auto t = run(small({"--sensitivity"}));
  REQUIRE(t.code == 0);
  CHECK(t.out.find("baseline_admission = chunk") != std::string::npos);
  CHECK(t.out.find("baseline_admission = whole") != std::string::npos);
}
