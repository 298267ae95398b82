// SPDX-License-Identifier: Apache-2.0
// `tangram simulate --rate-sweep`, the keep ratio as compressed and as stored, and the plots.
#include <sstream>
#include <vector>

#include "cli_support.hpp"
#include "commands.hpp"
#include "simulate_report.hpp"
#include "tangram/io/detail/file_io.hpp"
#include "tangram/io/detail/json.hpp"
#include "test_support.hpp"

using tangram::test::run;
using tangram::test::run_json;

namespace {


namespace json = tangram::detail::json;

}  // namespace

TEST_CASE("simulate --rate-sweep reports every policy at every rate on the same sessions", "[simulate][cli][rate_sweep]") {
  auto r     = run_json({"simulate",
                         "--workload",
                         "short",
                         "--sessions",
                         "8",
                         "--turns",
                         "2",
                         "--rate-sweep",
                         "0.5,4",
                         "--json",
                         "--quiet"});
  auto root  = r.root();
  auto sweep = root["rate_sweep"];
  CHECK(sweep["label"].as_string().find("modelled") == 0);
  auto pts = sweep["points"];
  REQUIRE(pts.size() == 2);
  double rates[] = {0.5, 4};
  std::vector<double> last;
  for (std::size_t k = 0; k < 2; ++k) {
    auto p = pts[k];
    CHECK(p["arrival_rate"].as_double(0, 1e9) == rates[k]);
    last.push_back(p["last_arrival_s"].as_double(0, 1e9));
    std::int64_t generated = -1, completed = -1;
    for (char const* policy : {"full_kv", "unified_nonuniform", "tangram", "tangram_elastic"}) {
      INFO(policy);
      auto q = p["policies"][policy];
      for (char const* field : {"modelled_ttft_p50_s", "modelled_ttft_p95_s", "modelled_tbt_p95_s",
                                "modelled_tokens_per_s", "modelled_requests_per_s", "mean_resident_sessions"})
        CHECK(q[field].type() == json::kind::number);
      CHECK(q["modelled_ttft_p50_s"].as_double(0, 1e9) <= q["modelled_ttft_p95_s"].as_double(0, 1e9));
      // The same answers for every policy: the same tokens generated and requests completed.
      auto g = q["generated_tokens"].as_int(1, 1LL << 40), c = q["completed_requests"].as_int(1, 1LL << 40);
      if (generated < 0) generated = g, completed = c;
      CHECK(g == generated);
      CHECK(c == 16);
      CHECK(c == completed);
    }
  }
  // The same arrival process, scaled: the last arrival 8 times earlier at 8 times the rate.
  CHECK(last[0] == Approx(last[1] * 8));
  // The main run is unchanged by the sweep: its policies are still there.
  CHECK(root["policies"]["tangram"]["modelled_ttft_p50_s"].type() == json::kind::number);
}

TEST_CASE("simulate --rate-sweep is printed as a table and refuses bad rates", "[simulate][cli][rate_sweep]") {
  auto r = run({"simulate", "--workload", "short", "--sessions", "4", "--turns", "1", "--rate-sweep", "1", "--quiet"});
  INFO(r.err);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("Arrival-rate sweep") != std::string::npos);
  CHECK(r.out.find("TTFT p95") != std::string::npos);
  for (char const* bad : {"0", "-1", "1,x", "nan", ""}) {
    INFO(bad);
    auto b = run({"simulate", "--rate-sweep", bad, "--quiet"});
    CHECK(b.code != 0);
    CHECK(b.err.find("--rate-sweep") != std::string::npos);
  }
  auto f = run({"simulate", "--workload", "no-such-trace.json", "--rate-sweep", "1", "--quiet"});
  CHECK(f.code != 0);
  CHECK(f.err.find("--rate-sweep: applies to generated workloads") != std::string::npos);
}

TEST_CASE("simulate reports the keep ratio as compressed and as stored", "[simulate][cli][keep]") {
  auto r    = run_json({"simulate",
                        "--workload",
                        "short",
                        "--sessions",
                        "6",
                        "--turns",
                        "2",
                        "--keep",
                        "0.25",
                        "--json",
                        "--quiet"});
  auto root = r.root();
  CHECK(root["keep_ratio_definitions"].as_string().find("stored_keep_ratio") != std::string::npos);
  auto full = root["policies"]["full_kv"];
  CHECK(full["compressed_keep_ratio"].as_double(0, 10) == Approx(1.0).epsilon(1e-9));
  CHECK(full["stored_keep_ratio"].as_double(0, 10) >= 1.0);
  for (char const* policy : {"unified_nonuniform", "tangram", "tangram_elastic"}) {
    INFO(policy);
    auto p        = root["policies"][policy];
    double kept   = p["compressed_keep_ratio"].as_double(0, 10);
    double stored = p["stored_keep_ratio"].as_double(0, 10);
    CHECK(kept > 0.1);
    CHECK(kept < 1.0);
    CHECK(stored >= kept);  // whole pages hold at least the kept tokens
  }
  // Tangram stores more than the scorer's 0.25: its budgets are padded (mu + alpha sigma).
  CHECK(root["policies"]["tangram"]["stored_keep_ratio"].as_double(0, 10) > 0.25);
  auto t = run({"simulate", "--workload", "short", "--sessions", "6", "--turns", "2", "--keep", "0.25", "--quiet"});
  REQUIRE(t.code == 0);
  CHECK(t.out.find("keep ratio, as compressed") != std::string::npos);
  CHECK(t.out.find("keep ratio, as stored") != std::string::npos);
}

TEST_CASE("simulate --plot also draws the time breakdown and the TTFT-vs-rate figure", "[simulate][cli][plot]") {
  std::string dir  = TANGRAM_BINARY_DIR;
  std::string path = dir + "/simulate_sweep_plot.svg";
  auto r = run({"simulate", "--workload", "short", "--sessions", "4", "--turns", "1", "--rate-sweep", "1,2", "--plot",
                path, "--quiet"});
  INFO(r.err);
  REQUIRE(r.code == 0);
  auto mem  = tangram::detail::read_file(path);
  auto time = tangram::detail::read_file(dir + "/simulate_sweep_plot-time.svg");
  auto rate = tangram::detail::read_file(dir + "/simulate_sweep_plot-rate.svg");
  CHECK(mem.find("<svg") == 0);
  CHECK(time.find("decode attention") != std::string::npos);
  CHECK(time.find("tangram_elastic") != std::string::npos);
  CHECK(rate.find("arrival rate (sessions/s)") != std::string::npos);
  CHECK(rate.find("<polyline") != std::string::npos);
  CHECK(r.out.find("simulate_sweep_plot-rate.svg") != std::string::npos);
  auto serving = tangram::detail::read_file(dir + "/simulate_sweep_plot-serving.svg");
  for (char const* panel : {"tokens/s", "requests/s", "mean resident sessions", "TTFT p50 / p95 (s)", "TBT p50 / p95 (ms)"})
    CHECK(serving.find(panel) != std::string::npos);
  CHECK(r.out.find("simulate_sweep_plot-serving.svg") != std::string::npos);
}

TEST_CASE("the serving figure's panels carry each policy's figures", "[simulate][plot]") {
  std::vector<tangram::sim::replay_result> rs(2);
  rs[0].policy                 = "a";
  rs[0].modelled_tokens_per_s  = 100;
  rs[0].modelled_requests_per_s = 2;
  rs[0].mean_resident_sessions = 7;
  rs[0].modelled_ttft_p50_s    = 1.5;
  rs[0].modelled_ttft_p95_s    = 4;
  rs[0].modelled_tbt_p50_s     = 0.02;
  rs[0].modelled_tbt_p95_s     = 0.05;
  rs[1].policy                 = "b";
  rs[1].modelled_tokens_per_s  = 300;
  auto panels = tangram::cli::serving_panels(rs);
  REQUIRE(panels.size() == 5);
  CHECK(panels[0].values == std::vector<double>{100, 300});
  CHECK(panels[1].values[0] == 2);
  CHECK(panels[2].values[0] == 7);
  CHECK(panels[3].values[0] == 1.5);
  CHECK(panels[3].p95[0] == 4);
  CHECK(panels[4].values[0] == Approx(20));  // ms
  CHECK(panels[4].p95[0] == Approx(50));
  CHECK(panels[0].p95.empty());
  auto svg = tangram::cli::serving_svg(rs, "t");
  CHECK(svg.find("a: 300") == std::string::npos);
  CHECK(svg.find("b: 300") != std::string::npos);
}

TEST_CASE("simulate --rate-sweep sizes the policies for the sweep's own sessions", "[simulate][cli][rate_sweep]") {
  // The sweep's sessions (Poisson arrivals drawn at 1 session/s) are not the main run's (all at
  // t = 0): here one of them is longer than any of the main run's, which once overflowed the
  // baseline's per-slot token limit ("takes slot 1 to 43802 tokens (max 43456)").
  auto r    = run_json({"simulate",
                        "--profile",
                        "fastkvzip/qwen3-4b-instruct-2507",
                        "--context-range",
                        "20000,45000",
                        "--turns",
                        "1",
                        "--sessions",
                        "64",
                        "--rate-sweep",
                        "2",
                        "--json",
                        "--quiet"});
  auto root = r.root();
  CHECK(root["rate_sweep"]["points"][0]["policies"]["unified_nonuniform"]["completed_requests"].as_int(0, 1000) == 64);
}

TEST_CASE("the time-breakdown figure's segments sum to the makespan's terms", "[simulate][plot]") {
  tangram::sim::time_breakdown t;
  t.prefill_s          = 1;
  t.eviction_pass_s    = 2;
  t.decode_attention_s = 4;
  t.weights_s          = 8;
  t.reclamation_s      = 16;
  t.replanning_s       = 32;
  t.overhead_s         = 64;
  t.control_plane_s    = 128;
  t.idle_s             = 256;
  double sum = 0;
  for (auto const& seg : tangram::cli::time_segments(t)) sum += seg.seconds;
  CHECK(sum == 511);  // every term once: 1 + 2 + ... + 256
  CHECK(tangram::cli::plot_path("out/m.svg", "-time") == "out/m-time.svg");
  CHECK(tangram::cli::plot_path("m", "-rate") == "m-rate");
  CHECK(tangram::cli::plot_path("a.b/m", "-rate") == "a.b/m-rate");
  CHECK(tangram::cli::plot_path(".svg", "-rate") == ".svg-rate");
}
