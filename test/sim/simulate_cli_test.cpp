// SPDX-License-Identifier: Apache-2.0
// `tangram simulate` driven in-process: outputs, JSON fields, the plot, and bad options.
#include <iterator>
#include <sstream>
#include <vector>

#include "cli_support.hpp"
#include "commands.hpp"
#include "tangram/io/detail/file_io.hpp"
#include "tangram/io/detail/json.hpp"
#include "tangram/io/retention_samples.hpp"
#include "tangram/model/presets.hpp"
#include "tangram/plan/build_static_plan.hpp"
#include "tangram/plan/calibration.hpp"
#include "test_support.hpp"

using tangram::test::run;
using tangram::test::run_json;

namespace {}  // namespace

TEST_CASE("simulate --json reports every policy with the documented fields", "[simulate][cli]") {
  namespace json = tangram::detail::json;
  auto r         = run_json(
      {"simulate", "--sessions", "24", "--turns", "3", "--workload", "long", "--json", "--quiet"});
  auto root = r.root();
  for (char const* policy : {"full_kv", "unified_nonuniform", "tangram", "tangram_elastic"}) {
    auto p = root["policies"][policy];
    for (char const* field : {"peak_resident_sessions",
                              "kv_bytes_allocated_peak",
                              "kv_bytes_live_peak",
                              "reclaim_ops",
                              "preemptions",
                              "control_plane_us_per_step",
                              "modelled_tokens_per_s"})
      CHECK(p[field].type() == json::kind::number);
    CHECK(p["kv_bytes_live_peak"].as_double(0, 1e15) <=
          p["kv_bytes_allocated_peak"].as_double(0, 1e15) + 1);
    // The measured control plane by call adds up to the per-step figure times the steps, all of
    // it charged (the default).
    double by_call = 0;
    for (char const* call : {"admission_s",
                             "prefill_chunks_s",
                             "decode_s",
                             "end_turn_s",
                             "release_s",
                             "park_idle_s",
                             "evict_cached_s"})
      by_call += p["control_plane_by_call"][call].as_double(0, 1e6);
    CHECK(by_call == Approx(p["control_plane_us_per_step"].as_double(0, 1e12) * 1e-6 *
                            p["steps"].as_double(1, 1e12))
                         .epsilon(1e-6));
    CHECK(by_call ==
          Approx(p["modelled_time_breakdown"]["control_plane_s"].as_double(0, 1e6)).epsilon(1e-6));
  }
  CHECK(root["policies"]["tangram"]["reclaim_ops"].as_int(0, 0) == 0);
  CHECK(root["policies"]["tangram"]["preemptions"].as_int(0, 0) == 0);
  CHECK(root["policies"]["tangram_elastic"]["reclaim_ops"].as_int(0, 0) == 0);
  CHECK(root["policies"]["tangram_elastic"]["preemptions"].as_int(0, 0) == 0);
  CHECK(root["policies"]["tangram"]["modelled_eviction_pass_s"].as_double(0, 0) == 0);
  CHECK(root["policies"]["tangram_elastic"]["modelled_eviction_pass_s"].as_double(1e-12, 1e6) > 0);
  CHECK(root["policies"]["tangram_elastic"]["generated_tokens"].as_int(0, 1LL << 60) ==
        root["policies"]["tangram"]["generated_tokens"].as_int(0, 1LL << 60));
  CHECK(root["tangram_elastic"]["margin"].as_double(0, 10) == Approx(0.02));  // the default
  CHECK(root["tangram_elastic"]["margin_from_samples"].as_bool());  // the samples ask for less
  CHECK(
      root["tangram_elastic"]["default_reservation"].as_bool());  // the `tangram` column is static
  CHECK(root["tangram_elastic"]["max_chunk_tokens"].as_int(1, 1 << 24) == 8192);
  CHECK(root["tangram_elastic"]["needs"].as_string().find("modelled: retention sample") == 0);
  CHECK(root["tangram_elastic"]["eviction_pass"].as_string().find("modelled") == 0);
  CHECK(root["tangram_elastic"]["modelled_wanted_clipped_fraction"].as_double(0, 1) < 0.01);
  CHECK(root["ratios_vs_full_kv"]["tangram_elastic"]["peak_resident_sessions"].as_double(0, 100.0) >
        0);
  CHECK(root["policies"]["unified_nonuniform"]["reclaim_ops"].as_int(1, 1LL << 60) > 0);
  CHECK(root["cost_model"]["label"].as_string().find("modelled") != std::string::npos);
  CHECK(root["ratios_vs_full_kv"]["tangram"]["peak_resident_sessions"].as_double(2.0, 100.0) >=
        2.0);
  CHECK(root["model"].as_string() == "Llama-3.1-8B");
  // Dynamic compressors learn their kept counts a step after each chunk (the default loop).
  CHECK(root["cost_model"]["kept_counts"].as_string() == "next-step");
  for (char const* policy : {"unified_nonuniform", "tangram_elastic"})
    CHECK(root["policies"][policy]["counts_wait_steps"].as_int(1, 1LL << 40) > 0);
  for (char const* policy : {"full_kv", "tangram"})
    CHECK(root["policies"][policy]["counts_wait_steps"].as_int(0, 0) == 0);
}

TEST_CASE("simulate --kept-counts at-once: nothing waits for its counts", "[simulate][cli]") {
  auto r    = run_json({"simulate",
                        "--sessions",
                        "8",
                        "--turns",
                        "2",
                        "--workload",
                        "short",
                        "--kept-counts",
                        "at-once",
                        "--json",
                        "--quiet"});
  auto root = r.root();
  CHECK(root["cost_model"]["kept_counts"].as_string() == "at-once");
  auto text = run({"simulate", "--sessions", "4", "--turns", "1", "--kept-counts", "at-once"});
  CHECK(text.out.find("Kept counts (--kept-counts at-once): known before the step after each chunk") !=
        std::string::npos);
  for (char const* policy : {"full_kv", "unified_nonuniform", "tangram", "tangram_elastic"})
    CHECK(root["policies"][policy]["counts_wait_steps"].as_int(0, 0) == 0);
  auto bad = run({"simulate", "--kept-counts", "later"});
  CHECK(bad.code != 0);
  CHECK(bad.err.find("--kept-counts") != std::string::npos);
  CHECK(bad.err.find("later") != std::string::npos);
}

TEST_CASE("simulate: tangram_elastic reserves the margin its plan decides from the samples",
          "[simulate][cli]") {
  // The derived GPT-OSS-20B samples keep ~11% more than the scorer's total: the plan's margin
  // (as `tangram plan` decides it) keeps every wanted token; a fixed 0.02 clips.
  std::string const path = tangram::test::data_path("derived/gpt-oss-20b.derived.json");
  auto run               = [&](std::vector<std::string> const& extra) {
    std::vector<std::string> argv{"simulate",
                                  "--profile",
                                  path,
                                  "--sessions",
                                  "4",
                                  "--turns",
                                  "1",
                                  "--workload",
                                  "mid",
                                  "--json",
                                  "--quiet"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    return run_json(argv);
  };
  auto r    = run({});
  auto root = r.root();
  auto s    = tangram::load_retention_samples(path);
  auto plan =
      tangram::build_static_plan(tangram::model_preset(s.model), tangram::calibrate(s), {}, s);
  CHECK(root["tangram_elastic"]["margin"].as_double(0, 10) == plan.options.reservation.margin);
  CHECK(root["tangram_elastic"]["margin_from_samples"].as_bool());
  CHECK(root["policies"]["tangram_elastic"]["modelled_wanted_clipped_fraction"].as_double(0, 1) ==
        0);
  auto fixed = run({"--margin", "0.02"});
  auto froot = fixed.root();
  CHECK_FALSE(froot["tangram_elastic"]["margin_from_samples"].as_bool());
  CHECK(froot["policies"]["tangram_elastic"]["modelled_wanted_clipped_fraction"].as_double(0, 1) >
        0.01);
}

TEST_CASE("simulate prints a table and writes the memory plot", "[simulate][cli]") {
  std::string svg = std::string(TANGRAM_BINARY_DIR) + "/simulate_test_plot.svg";
  auto r =
      run({"simulate", "--sessions", "12", "--turns", "2", "--workload", "short", "--plot", svg});
  INFO(r.err);
  REQUIRE(r.code == 0);
  for (char const* piece :
       {"full_kv",
        "unified_nonuniform",
        "tangram",
        "resident sessions, peak",
        "(modelled)",
        "vs full_kv",
        "tangram: static per-group budgets (--reservation static)",
        "tangram_elastic: elastic reservation, the default",
        "margin 0.02 (from the samples: mean + 2 sd of their required margins, at least 0.02);",
        "Kept counts (--kept-counts next-step)",
        "steps sat out for kept counts"})
    CHECK(r.out.find(piece) != std::string::npos);
  // The header names four columns, static tangram third and tangram_elastic fourth; every row of
  // figures has four values.
  std::istringstream lines(r.out);
  std::string line;
  std::vector<std::string> header;
  while (std::getline(lines, line)) {
    std::istringstream words(line);
    std::vector<std::string> w{std::istream_iterator<std::string>(words), {}};
    if (!w.empty() && w[0] == "full_kv") header = w;
    if (line.find("resident sessions, peak") != std::string::npos) CHECK(w.size() == 3 + 4);
    if (line.find("makespan s (modelled)") != std::string::npos) CHECK(w.size() == 3 + 4);
  }
  CHECK(header ==
        std::vector<std::string>{"full_kv", "unified_nonuniform", "tangram", "tangram_elastic"});
  CHECK(r.err.find("simulate: tangram (3/4) 100%") != std::string::npos);  // progress on stderr
  CHECK(r.err.find("simulate: tangram_elastic (4/4) 100%") != std::string::npos);
  auto text = tangram::detail::read_file(svg);
  CHECK(text.rfind("<svg", 0) == 0);
  CHECK(text.find("polyline") != std::string::npos);
  CHECK(text.find("tangram") != std::string::npos);
  CHECK(text.find("tangram_elastic") != std::string::npos);
  std::remove(svg.c_str());
}

TEST_CASE("simulate replays a trace file", "[simulate][cli]") {
  std::string path = std::string(TANGRAM_BINARY_DIR) + "/simulate_test_trace.json";
  tangram::detail::write_file(path,
                              R"({"format": "tangram-workload/v1", "name": "trace", "sessions": [
    {"arrival_s": 0, "turns": [{"prompt_tokens": 30000, "output_tokens": 100, "think_s": 1}, {"prompt_tokens": 200, "output_tokens": 50}]},
    {"arrival_s": 0.5, "turns": [{"prompt_tokens": 60000, "output_tokens": 80}]}]})");
  auto r    = run_json({"simulate", "--workload", path, "--json", "--quiet"});
  auto root = r.root();
  CHECK(root["workload"]["name"].as_string() == "trace");
  CHECK(root["policies"]["tangram"]["generated_tokens"].as_int(0, 1000) == 230);
  CHECK(root["policies"]["full_kv"]["prefilled_tokens"].as_int(0, 1000000) == 90200);
  std::remove(path.c_str());
}

TEST_CASE("simulate rejects bad options with a one-line error", "[simulate][cli][errors]") {
  tangram::test::check_refusals({
      {{"simulate", "--sessions", "0"}, "--sessions: must be in [1, 1000000], got 0"},
      {{"simulate", "--workload", "/nonexistent/trace.json"},
       "cannot open \"/nonexistent/trace.json\""},
      {{"simulate", "--gpu-mem", "10"}, "--gpu-mem x --usable: 10 GB"},
      {{"simulate", "--usable", "0.01"}, "--gpu-mem x --usable: 141 GB x 0.01"},
      {{"simulate", "--workload", "nosuch"}, "--workload: cannot open \"nosuch\""},
      {{"simulate", "--group-size", "3"}, "--group-size: Hp = 3 does not divide"},
      {{"simulate", "--sessions", "1000001"}, "--sessions: must be in [1, 1000000]"},
      {{"simulate", "--turns", "1001"}, "--turns: must be in [1, 1000]"},
      {{"simulate", "--keep", "1.5"}, "--keep: must be in [0.001, 1], got 1.5"},
      {{"simulate", "--margin", "11"}, "--margin: must be in [0, 10], got 11"},
      {{"simulate", "--margin", "-0.5"}, "--margin: must be in [0, 10], got -0.5"},
      {{"simulate", "--model", "gpt-5"},
       "--model: \"gpt-5\" is neither a model-spec file nor a preset"},
      {{"simulate", "--scope", "diagonal"}, "--scope: expected one of adjacent, layer, global"},
      {{"simulate", "--frobnicate"}, "unknown option \"--frobnicate\""},
      {{"simulate", "--context-dist", "normal"},
       "--context-dist: expected one of loguniform, uniform, fixed, got"},
      {{"simulate", "--continuation-room", "spare"},
       "--continuation-room: expected one of park, headroom, got \"spare\""},
  });
}

TEST_CASE("simulate --continuation-room reports the rule, park only with a window",
          "[simulate][cli][issue29]") {
  auto room = [](std::vector<std::string> extra) {
    std::vector<std::string> args{
        "simulate", "--sessions", "4", "--turns", "2", "--workload", "short", "--json", "--quiet"};
    args.insert(args.end(), extra.begin(), extra.end());
    auto r = run_json(args);
    return std::string(r.root()["reservation"]["continuation_room"].as_string());
  };
  CHECK(room({}) == "park");
  CHECK(room({"--continuation-room", "headroom"}) == "headroom");
  CHECK(room({"--decode-window", "0"}) == "headroom");  // nothing may be parked without a window
}

TEST_CASE("simulate with a workload file refuses the generator's options and reports none",
          "[simulate][cli][errors][regression]") {
  auto trace = std::string(TANGRAM_SOURCE_DIR) + "/fuzz/corpus/workload/tiny.json";
  for (char const* opt :
       {"--sessions", "--turns", "--seed", "--arrival-rate", "--think", "--context-dist"}) {
    // --context-dist takes a name, the others a number
    std::string value = std::string(opt) == "--context-dist" ? "uniform" : "3";
    auto r            = run({"simulate", "--quiet", "--workload", trace, opt, value});
    INFO(r.err);
    CHECK(r.code == 2);
    CHECK(r.err.find(std::string(opt) + ": applies to generated workloads") != std::string::npos);
  }
  auto r = run({"simulate", "--quiet", "--workload", trace, "--json"});
  REQUIRE(r.code == 0);
  namespace json = tangram::detail::json;
  auto doc       = json::parse(r.out, "stdout");
  json::node root(doc, "stdout");
  CHECK(root["workload"]["seed"].raw().type() == json::kind::null);
  CHECK(root["workload"]["context_dist"].raw().type() == json::kind::null);
  CHECK(root["workload"]["arrival_rate"].raw().type() == json::kind::null);
  auto text = run({"simulate", "--quiet", "--workload", trace});
  CHECK(text.out.find("arrivals from the file") != std::string::npos);
  CHECK(text.out.find("seed") == std::string::npos);
}

TEST_CASE("simulate --margin sizes tangram_elastic's reservation only", "[simulate][cli]") {
  auto peak = [](std::string const& margin, char const* policy) {
    auto r    = run_json({"simulate",
                          "--sessions",
                          "6",
                          "--turns",
                          "1",
                          "--workload",
                          "mid",
                          "--margin",
                          margin,
                          "--json",
                          "--quiet"});
    auto root = r.root();
    CHECK(root["tangram_elastic"]["margin"].as_double(0, 10) == Approx(std::stod(margin)));
    CHECK_FALSE(root["tangram_elastic"]["margin_from_samples"].as_bool());
    return root["policies"][policy]["kv_bytes_allocated_peak"].as_double(0, 1e15);
  };
  // Six mid sessions (20-100K tokens) fit at once: a larger margin reserves more for the elastic
  // policy only. (On short prompts both margins reach the cap of the uncompressed footprint.)
  CHECK(peak("1", "tangram_elastic") > peak("0", "tangram_elastic"));
  CHECK(peak("1", "tangram") == peak("0", "tangram"));
}

TEST_CASE("simulate reports every compressed policy's clipped share of wanted head-tokens",
          "[simulate][cli][clipping]") {
  namespace json = tangram::detail::json;
  auto clipped   = [](std::vector<std::string> extra) {
    auto r    = run_json(tangram::test::with_args(
        {"simulate", "--sessions", "12", "--turns", "2", "--workload", "mid", "--json", "--quiet"},
        extra));
    auto root = r.root();
    CHECK(root["policies"]["full_kv"]["modelled_wanted_clipped_fraction"].type() ==
          json::kind::null);
    CHECK(root["policies"]["unified_nonuniform"]["modelled_wanted_clipped_fraction"].as_double(
              0, 1) == 0);
    CHECK(root["policies"]["tangram_elastic"]["modelled_wanted_clipped_fraction"].as_double(0, 1) ==
          root["tangram_elastic"]["modelled_wanted_clipped_fraction"].as_double(0, 1));
    return root["policies"]["tangram"]["modelled_wanted_clipped_fraction"].as_double(0, 1);
  };
  // Median budgets clip about half the inputs' wanted tokens; the default (padded) ones far less.
  double median = clipped({"--estimator", "quantile", "--quantile", "0.5"});
  double padded = clipped({});
  CHECK(median > 0.01);
  CHECK(padded < median);
  auto r = run({"simulate", "--sessions", "6", "--turns", "1", "--workload", "short", "--quiet"});
  REQUIRE(r.code == 0);
  CHECK(r.out.find("wanted head-tokens clipped") != std::string::npos);
  // A single run says it is calibrated on the prompts it replays (issue 30).
  CHECK(r.out.find("Calibration in sample") != std::string::npos);
}

TEST_CASE("simulate sizes tangram_elastic's staging by the chunk that runs", "[simulate][cli]") {
  auto elastic = [](std::string const& chunk) {
    auto r    = run_json({"simulate",
                          "--sessions",
                          "12",
                          "--turns",
                          "2",
                          "--workload",
                          "long",
                          "--step-tokens",
                          "2048",
                          "--chunk",
                          chunk,
                          "--json",
                          "--quiet",
                          "--no-control-plane"});
    auto root = r.root();
    CHECK(root["tangram_elastic"]["max_chunk_tokens"].as_int(1, 1 << 24) == 2048);
    auto p = root["policies"]["tangram_elastic"];
    return std::vector<double>{p["modelled_tokens_per_s"].as_double(0, 1e12),
                               p["kv_bytes_allocated_peak"].as_double(0, 1e15),
                               p["peak_resident_sessions"].as_double(0, 1e9)};
  };
  // Chunks never exceed --step-tokens, so a larger --chunk must change nothing.
  CHECK(elastic("8192") == elastic("2048"));
}

TEST_CASE("simulate refuses a trace prompt beyond --max-context, naming the session and value",
          "[simulate][cli][errors]") {
  std::string path = std::string(TANGRAM_BINARY_DIR) + "/simulate_test_long_trace.json";
  tangram::detail::write_file(path,
                              R"({"format": "tangram-workload/v1", "name": "trace", "sessions": [
    {"arrival_s": 0, "turns": [{"prompt_tokens": 1000, "output_tokens": 10}]},
    {"arrival_s": 0, "turns": [{"prompt_tokens": 30000, "output_tokens": 100}, {"prompt_tokens": 5000, "output_tokens": 10}]}]})");
  // Session 1 reaches 30000 + 100 + 5000 = 35100 tokens with its second prompt.
  auto r = run({"simulate", "--workload", path, "--max-context", "32768", "--quiet"});
  CHECK(r.code == 2);
  CHECK(r.err.find("--workload: session 1 turn 1 reaches 35100 tokens with its prompt, above "
                   "--max-context 32768") != std::string::npos);
  CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
  auto ok = run({"simulate", "--workload", path, "--max-context", "35100", "--quiet"});
  INFO(ok.err);
  CHECK(ok.code == 0);
  std::remove(path.c_str());
}

TEST_CASE("simulate reports and warns about sessions a policy never completed", "[simulate][cli]") {
  std::string path = std::string(TANGRAM_BINARY_DIR) + "/simulate_test_reject_trace.json";
  // 120K uncompressed tokens need 120000 x 128 KiB = 15.7 GB of KV; the GPU leaves about 5 GB.
  tangram::detail::write_file(path,
                              R"({"format": "tangram-workload/v1", "name": "trace", "sessions": [
    {"arrival_s": 0, "turns": [{"prompt_tokens": 2000, "output_tokens": 10}]},
    {"arrival_s": 0, "turns": [{"prompt_tokens": 120000, "output_tokens": 10}]}]})");
  auto r = run({"simulate", "--workload", path, "--gpu-mem", "24", "--quiet"});
  INFO(r.err);
  REQUIRE(r.code == 0);
  CHECK(r.err.find("simulate: warning: full_kv never completed 1 of 2 sessions") !=
        std::string::npos);
  auto at = r.out.find("rejected sessions");
  REQUIRE(at != std::string::npos);
  auto line = r.out.substr(at, r.out.find('\n', at) - at);
  std::istringstream cols(line.substr(std::string("rejected sessions").size()));
  std::vector<std::string> v{std::istream_iterator<std::string>(cols),
                             std::istream_iterator<std::string>()};
  REQUIRE(v.size() == 4);
  CHECK(v[0] == "1");
  std::remove(path.c_str());
}

TEST_CASE("simulate --baseline-admission picks the baseline's admission, per chunk by default",
          "[simulate][cli]") {
  auto admission = [](std::vector<std::string> extra) {
    auto r    = run_json(tangram::test::with_args(
        {"simulate", "--sessions", "6", "--turns", "1", "--workload", "short", "--json", "--quiet"},
        extra));
    auto root = r.root();
    return root["reservation"]["baseline_admission"].as_string();
  };
  CHECK(admission({}) == "chunk");
  CHECK(admission({"--baseline-admission", "whole"}) == "whole");
  auto bad = run({"simulate", "--baseline-admission", "half"});
  CHECK(bad.code == 2);
  CHECK(bad.err.find("--baseline-admission") != std::string::npos);
  CHECK(bad.err.find("half") != std::string::npos);
}

TEST_CASE("simulate --context-dist draws generated contexts as named and reports it",
          "[simulate][cli][context_dist]") {
  namespace json = tangram::detail::json;
  auto r         = run_json({"simulate",
                             "--quiet",
                             "--json",
                             "--sessions",
                             "6",
                             "--turns",
                             "1",
                             "--context-range",
                             "30000,50000",
                             "--context-dist",
                             "fixed"});
  auto root      = r.root();
  CHECK(root["workload"]["context_dist"].as_string() == "fixed");
  CHECK(root["workload"]["name"].as_string().find("(fixed contexts)") != std::string::npos);
  // Every session is the same 40000-token prompt: all policies prefill 6 x 40000 tokens.
  CHECK(root["policies"]["tangram"]["prefilled_tokens"].as_int(0, 1LL << 40) == 6 * 40000);
  auto d = run({"simulate", "--quiet", "--json", "--sessions", "2", "--turns", "1"});
  REQUIRE(d.code == 0);
  auto ddoc = json::parse(d.out, "stdout");
  CHECK(json::node(ddoc, "stdout")["workload"]["context_dist"].as_string() == "loguniform");
}
