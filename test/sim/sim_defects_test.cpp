// SPDX-License-Identifier: Apache-2.0
// Regression tests for the simulator defects of issue 11: memory that grew with the input's token
// counts (baseline page tables, the replay's timeline, generated workloads) instead of the pool and
// the session count, and `simulate` options (--sms, --gpu-mem, --plot).
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <vector>

#include "../memory/memory_fixtures.hpp"
#include "cli_support.hpp"
#include "commands.hpp"
#include "tangram/eval/baselines/unified_paging.hpp"
#include "tangram/eval/sim/policies.hpp"
#include "tangram/eval/sim/replay.hpp"
#include "tangram/eval/sim/workload.hpp"
#include "tangram/io/detail/file_io.hpp"
#include "tangram/io/detail/json.hpp"
#include "tangram/model/presets.hpp"
#include "test_support.hpp"

using namespace tangram;
using namespace tangram::sim;

namespace {

using tangram::test::run_cli;
using tangram::test::run_json;
using tangram::test::with_args;

bool exists(std::string const& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

// Unlimited memory; each session holds `tokens * 1000` bytes. Cheap enough for long replays.
class counting_policy final : public kv_policy {
 public:
  explicit counting_policy(std::size_t sessions) : tokens_(sessions, 0) {}
  std::string name() const override { return "counting"; }
  bool start_turn(std::int32_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t) override {
    return true;
  }
  bool prefill_chunk(std::int32_t s, std::int64_t n) override {
    tokens_[static_cast<std::size_t>(s)] += n;
    return true;
  }
  bool decode(std::vector<std::int32_t> const& ss) override {
    for (auto s : ss) tokens_[static_cast<std::size_t>(s)] += 1;
    return true;
  }
  void end_turn(std::int32_t) override {}
  void release(std::int32_t s) override { tokens_[static_cast<std::size_t>(s)] = 0; }
  double kv_bytes_read(std::int32_t s) const override {
    return static_cast<double>(tokens_[static_cast<std::size_t>(s)]) * 1000.0;
  }
  double attended_tokens(std::int32_t s) const override {
    return static_cast<double>(tokens_[static_cast<std::size_t>(s)]);
  }
  policy_memory memory() const override {
    policy_memory m;
    for (auto n : tokens_) m.allocated_bytes += static_cast<double>(n) * 1000.0;
    m.live_bytes = m.allocated_bytes / 2;
    return m;
  }
  double capacity_bytes() const override { return 1e18; }

 private:
  std::vector<std::int64_t> tokens_;
};

}  // namespace

// Defect 4: the replay kept one timeline point per engine step and thinned only at the end, by
// sampling, which also dropped the peak (the last step before the final releases).
TEST_CASE("the replay's timeline is capped and keeps the peaks and the final point",
          "[regression][replay]") {
  // One session decoding 20000 tokens: ~20000 steps, memory rising to its peak on the last step,
  // then 0 once the session is released.
  workload w;
  w.sessions.push_back({0.0, {{100, 20000, 0.0}}});
  counting_policy p(1);
  cost_model cost(model_preset("llama-3.1-8b"), gpu_spec{});
  replay_options o;
  o.timeline_points = 50;
  o.max_tokens      = 20000;  // the whole answer
  auto r            = replay(w, p, cost, o);
  REQUIRE(r.steps > 10000);
  CHECK(r.timeline.size() <= 50);
  CHECK(r.timeline.size() >= 25);
  // The peak on the last step: 100 prompt tokens + 19999 decoded ones of 1000 bytes (the answer's
  // first token comes with the prefill step and is stored by the next decode step).
  CHECK(r.kv_bytes_allocated_peak == Approx(20099 * 1000.0));
  double alloc_max = 0, live_max = 0;
  for (auto const& pt : r.timeline) {
    alloc_max = std::max(alloc_max, pt.allocated_bytes);
    live_max  = std::max(live_max, pt.live_bytes);
  }
  CHECK(alloc_max == Approx(r.kv_bytes_allocated_peak));
  CHECK(live_max == Approx(r.kv_bytes_live_peak));
  // The final point is the state after the last release, at the end of the run.
  CHECK(r.timeline.back().time_s == Approx(r.modelled_makespan_s));
  CHECK(r.timeline.back().allocated_bytes == 0);
  CHECK(r.timeline.back().resident == 0);
  // Times never go backwards.
  for (std::size_t i = 1; i < r.timeline.size(); ++i)
    CHECK(r.timeline[i - 1].time_s <= r.timeline[i].time_s);
}

TEST_CASE("the timeline thinner never holds more than twice its cap", "[regression][replay]") {
  detail_replay::timeline_thinner thin(10);
  std::size_t most = 0;
  for (int i = 1; i <= 100000; ++i) {
    // A saw-tooth with one tall spike at step 77777.
    double a = i == 77777 ? 1e9 : static_cast<double>(i % 100);
    thin.add({static_cast<double>(i), a, a / 2, i == 77777 ? 9 : 1});
    most = std::max(most, thin.size());
  }
  CHECK(most <= 20);
  auto points = thin.finish({100001.0, 0, 0, 0});
  REQUIRE(points.size() <= 10);
  CHECK(points.back().time_s == 100001.0);
  CHECK(points.back().allocated_bytes == 0);
  auto spike = std::max_element(points.begin(), points.end(), [](auto const& x, auto const& y) {
    return x.allocated_bytes < y.allocated_bytes;
  });
  CHECK(spike->allocated_bytes == 1e9);
  CHECK(spike->live_bytes == 5e8);
  CHECK(spike->resident == 9);
  CHECK(spike->time_s >= 77777.0);  // stamped at the end of the steps it stands for
}

TEST_CASE("a timeline cap outside [2, 1000000] is refused", "[regression][replay]") {
  workload w;
  w.sessions.push_back({0.0, {{10, 2, 0.0}}});
  counting_policy p(1);
  cost_model cost(model_preset("llama-3.1-8b"), gpu_spec{});
  for (std::int32_t bad : {0, 1, 1000001}) {
    replay_options o;
    o.timeline_points = bad;
    TANGRAM_REQUIRE_THROWS_WITH_ALL(replay(w, p, cost, o),
                                    invalid_argument,
                                    std::string("replay.timeline_points"),
                                    detail::cat("got ", bad));
  }
}

// Same class as defect 1: the admission allowance (headroom x resident sessions) was unbounded
// and its product could overflow.
TEST_CASE("the replay bounds the continuation headroom", "[regression][replay]") {
  workload w;
  w.sessions.push_back({0.0, {{10, 2, 0.0}}});
  counting_policy p(1);
  cost_model cost(model_preset("llama-3.1-8b"), gpu_spec{});
  replay_options o;
  o.continuation_headroom_tokens = INT64_MAX;
  TANGRAM_REQUIRE_THROWS_WITH_ALL(replay(w, p, cost, o),
                                  invalid_argument,
                                  "replay.continuation_headroom_tokens",
                                  "2147483647], got 9223372036854775807");
  o.continuation_headroom_tokens = 2147483647;  // the largest allowed still runs
  CHECK(replay(w, p, cost, o).generated_tokens == 2);
}

// Defect 8, in the library: the policies cast kv_bytes / page_bytes to an integer unchecked (UB
// for huge or non-finite values), and the pool then reported its own field.
TEST_CASE("policies refuse a KV budget outside what a pool can hold, naming kv_bytes",
          "[regression][simulate]") {
  auto plan = test::tiny_plan(test::tiny_budgets());
  for (double kv : {1e300, std::nan(""), 10.0}) {
    INFO(kv);
    TANGRAM_REQUIRE_THROWS_WITH_ALL(tangram_policy(plan, kv, 2, 2), invalid_argument, "kv_bytes: ");
    TANGRAM_REQUIRE_THROWS_WITH_ALL(
        unified_policy(plan, unified_mode::full_kv, kv, 2, 2, 64), invalid_argument, "kv_bytes: ");
  }
  CHECK(pool_pages(1e6, 512) == 1953);
  CHECK(pool_pages(512, 512) == 1);
}

// Defect 4: the baseline sized its page table as sequences x layers x ceil(max_tokens / P), so
// one long session in a trace asked for gigabytes however small the pool.
TEST_CASE("the unified-paging baseline's tables are bounded by the pool, not max_tokens",
          "[regression][baseline]") {
  auto plan = test::tiny_plan(test::tiny_budgets());  // 4 layers x 4 heads, P = 4
  simulated_memory_resource mr;
  std::int64_t const pages = 100;
  std::int32_t const seqs  = 2;
  // 2^22 tokens: the old table took 2 x 4 x 2^20 x 4 bytes = 32 MiB for a 100-page pool.
  unified_paging_baseline b(plan, unified_mode::full_kv, mr, pages, seqs, std::int64_t{1} << 22);
  // Per page one link, per (sequence, layer) a top and a count, per (sequence, layer, head) a
  // length, per sequence a token count, a held tail, a liveness flag and a free-slot entry.
  std::size_t bound = static_cast<std::size_t>(pages) * 4 + seqs * 4 * 2 * 8 + seqs * 16 * 4 +
                      seqs * (8 + 8 + 1 + 4);
  CHECK(b.bookkeeping_bytes() <= bound);
  // Still pages in order: fill the pool across both sequences, then free one and reuse it.
  auto s0 = *b.try_admit();
  auto s1 = *b.try_admit();
  REQUIRE(b.prefill_chunk(s0, 100));  // 25 pages x 4 layers
  CHECK_FALSE(b.prefill_chunk(s1, 4));
  CHECK(b.pool().stats().used == 100);
  CHECK(b.bookkeeping_bytes() <= bound);
  b.free(s0);
  CHECK(b.pool().stats().used == 0);
  REQUIRE(b.prefill_chunk(s1, 60));
  std::int32_t one[] = {s1};
  for (int i = 0; i < 40; ++i) REQUIRE(b.decode_step(one, 1));
  CHECK(b.pages_held(s1) == 100);
  CHECK_FALSE(b.decode_step(one, 1));  // the 101st page
  b.free(s1);
  CHECK(b.pool().stats().used == 0);
  CHECK(b.pool().stats().free == 100);
  CHECK(b.bookkeeping_bytes() <= bound);
}

TEST_CASE("the baseline holds a chunk's tail pages until its counts arrive, out of reach meanwhile",
          "[baseline][issue29]") {
  auto plan = test::tiny_plan(test::tiny_budgets());  // 4 layers x 4 heads, P = 4
  simulated_memory_resource mr;
  unified_paging_baseline b(plan, unified_mode::compressed_reclaim, mr, 100, 2, 1 << 10);
  auto s0 = *b.try_admit();
  auto s1 = *b.try_admit();
  std::vector<std::int32_t> keep8(16, 8);
  // 40 tokens: 10 pages a layer for the chunk, 2 kept (8 tokens): 8 pages a layer held back.
  REQUIRE(b.prefill_chunk(s0, 40, keep8.data(), /*hold_tail=*/true));
  CHECK(b.pool().stats().used == 8);
  CHECK(b.held_tail_pages() == 32);
  CHECK(b.available_pages() == 100 - 8 - 32);
  CHECK(b.stats().reclaim_ops == 32);
  // 64 tokens need 16 pages a layer: 64 > 60 while the tail is held.
  CHECK_FALSE(b.prefill_chunk(s1, 64, keep8.data()));
  std::int32_t both[] = {s0, s1};
  b.release_tail(s0);
  CHECK(b.held_tail_pages() == 0);
  CHECK(b.available_pages() == 92);
  REQUIRE(b.prefill_chunk(s1, 64, keep8.data(), true));  // 2 kept a layer, 14 held
  CHECK(b.held_tail_pages() == 56);
  // A decode step beside held tails: in use at their highest, the tails included.
  REQUIRE(b.decode_step(both, 2));  // 8 + 1 tokens: a third page a layer for each
  CHECK(b.pool().stats().used == 24);
  CHECK(b.peak_pages() >= 24 + 56);
  b.free(s1);  // a release frees its held tail too
  CHECK(b.held_tail_pages() == 0);
  CHECK(b.available_pages() == 100 - 12);
  b.release_tail(s0);  // nothing held: nothing changes
  CHECK(b.available_pages() == 88);
}

// Same class as defect 1, in the baseline: `seq_tokens + chunk` wrapped negative and passed the
// max_tokens check; decode steps were not checked at all and wrote past the sequence's table row.
TEST_CASE("the baseline refuses chunks that overflow and decodes past max_tokens, unchanged",
          "[regression][baseline]") {
  auto plan = test::tiny_plan(test::tiny_budgets());
  simulated_memory_resource mr;
  unified_paging_baseline b(plan, unified_mode::full_kv, mr, 100, 2, 8);  // 2 pages of P = 4
  auto s = *b.try_admit();
  REQUIRE(b.prefill_chunk(s, 4));
  TANGRAM_REQUIRE_THROWS_WITH_ALL(b.prefill_chunk(s, INT64_MAX), logic_error, "prefill_chunk");
  CHECK(b.pages_held(s) == 4);
  CHECK(b.head_len(s, 0, 0) == 4);
  std::int32_t one[] = {s};
  for (int i = 0; i < 4; ++i) REQUIRE(b.decode_step(one, 1));  // 8 tokens: the limit
  CHECK(b.pages_held(s) == 8);
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      b.decode_step(one, 1), logic_error, "decode_step", "the most tokens allowed (8)");
  CHECK(b.pages_held(s) == 8);
  CHECK(b.head_len(s, 3, 0) == 8);
  CHECK(b.pool().stats().used == 8);
  b.free(s);
  CHECK(b.pool().stats().used == 0);
}

// Defect 4: a 178-byte trace of one session of 2^31 - 1 tokens asked for a 17 GB page table.
TEST_CASE("simulate runs a tiny trace of one 2^31-token session without huge tables",
          "[regression][simulate][cli]") {
  std::string path = std::string(TANGRAM_BINARY_DIR) + "/sim_defects_long_session.json";
  std::string trace =
      R"({"format":"tangram-workload/v1","sessions":[{"arrival_s":0,"turns":[{"prompt_tokens":1073741824,"output_tokens":1},{"prompt_tokens":1073741821,"output_tokens":1}]}]})";
  REQUIRE(trace.size() <= 178);
  tangram::detail::write_file(path, trace);
  // The context limit as large as a session may be, so the trace reaches the policies (at the
  // default --max-context it is refused up front, naming the session).
  auto r = run_json(
      {"simulate", "--workload", path, "--max-context", "2147483647", "--json", "--quiet"});
  std::remove(path.c_str());
  auto root = r.root();
  // The session cannot fit in 110 GB of KV under any policy: it is rejected, nothing generated.
  for (char const* policy : {"full_kv", "unified_nonuniform", "tangram"}) {
    INFO(policy);
    CHECK(root["policies"][policy]["rejected_sessions"].as_int(0, 10) == 1);
    CHECK(root["policies"][policy]["generated_tokens"].as_int(0, 10) == 0);
  }
}

// Review finding: a valid trace whose answer outgrows the whole pool while full_kv decodes alone
// ended the run with "a decode step cannot run even with one sequence" (an internal logic_error).
TEST_CASE("a session whose answer outgrows the pool is rejected, not the whole run",
          "[regression][simulate][cli]") {
  std::string path = std::string(TANGRAM_BINARY_DIR) + "/sim_defects_long_answer.json";
  tangram::detail::write_file(
      path,
      R"({"format":"tangram-workload/v1","sessions":[{"arrival_s":0,"turns":[{"prompt_tokens":20000,"output_tokens":200000}]},)"
      R"({"arrival_s":0,"turns":[{"prompt_tokens":1000,"output_tokens":10}]}]})");
  // The whole answer is reserved and decoded: no max_tokens or context cap cuts it. A 32 GB GPU
  // (16 GB of weights) outgrows at about 77K tokens: the shape of the finding (first seen at 141
  // GB and a 1.1M-token session) in a sixteenth of the decode steps.
  auto r = run_json({"simulate",
                     "--workload",
                     path,
                     "--json",
                     "--quiet",
                     "--gpu-mem",
                     "32",
                     "--max-tokens",
                     "1073741824",
                     "--max-context",
                     "2147483647"});
  std::remove(path.c_str());
  auto root = r.root();
  // full_kv holds 220K tokens of Llama-3.1-8B KV in no 32 GB GPU: the long session is given up,
  // the short one still runs to the end.
  CHECK(root["policies"]["full_kv"]["rejected_sessions"].as_int(0, 10) == 1);
  CHECK(root["policies"]["full_kv"]["generated_tokens"].as_int(0, 2000000) >= 10);
}

// Review finding: max_tokens near INT64_MAX overflowed in ceil_div and head lengths are 32-bit.
TEST_CASE("the baseline refuses max_tokens beyond a 32-bit head length", "[regression][baseline]") {
  auto plan = test::tiny_plan(test::tiny_budgets());
  simulated_memory_resource mr;
  for (std::int64_t bad : {std::int64_t{0}, std::int64_t{1} << 31, INT64_MAX}) {
    INFO(bad);
    TANGRAM_REQUIRE_THROWS_WITH_ALL(
        (unified_paging_baseline(plan, unified_mode::full_kv, mr, 100, 2, bad)),
        invalid_argument,
        "unified_paging_baseline.max_tokens",
        "2147483647");
  }
  unified_paging_baseline ok(plan, unified_mode::full_kv, mr, 100, 2, (std::int64_t{1} << 31) - 1);
  CHECK(ok.try_admit().has_value());
}

// Defect 4: --sessions 1000000 --turns 1000 materialised 10^9 turns and died with std::bad_alloc.
TEST_CASE("a generated workload too large to hold is refused up front, naming the options",
          "[regression][simulate][cli]") {
  workload_options wo;
  wo.sessions = 1000000;
  wo.turns    = 1000;
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      generate_workload(wo), invalid_argument, "workload.sessions x workload.turns", "1000000000");
  auto r = run_cli({"simulate", "--sessions", "1000000", "--turns", "1000", "--quiet"});
  CHECK(r.code == 2);
  CHECK(r.out.empty());
  for (char const* piece : {"--sessions 1000000 x --turns 1000", "1000000000 turns", "1048576"})
    CHECK(r.err.find(piece) != std::string::npos);
  CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
  // The largest products within the cap still generate.
  wo.sessions = 1024;
  wo.turns    = 1000;
  CHECK(generate_workload(wo).sessions.size() == 1024);
}

// Defect 8: `--gpu-mem 1e6` reported "page_pool.num_pages" instead of the option.
TEST_CASE("a --gpu-mem too large for a page pool names the option and its value",
          "[regression][simulate][cli]") {
  auto r = run_cli({"simulate", "--gpu-mem", "1e6", "--quiet"});
  INFO(r.err);
  CHECK(r.code == 2);
  CHECK(r.err.find("--gpu-mem x --usable: 1e6 GB") != std::string::npos);
  CHECK(r.err.find("page_pool") == std::string::npos);
  CHECK(r.err.find("2147483647") != std::string::npos);
  CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
}

// Defect 8: a model with more KV heads per layer than 132 SMs x 2 CTAs could not be simulated.
TEST_CASE("simulate --sms runs models with more than 264 KV heads per layer",
          "[regression][simulate][cli]") {
  std::string dir     = std::string(TANGRAM_BINARY_DIR);
  std::string model   = dir + "/sim_defects_wide_model.json";
  std::string profile = dir + "/sim_defects_wide_profile.json";
  tangram::detail::write_file(
      model,
      R"({"name": "wide", "num_layers": 1, "num_query_heads": 300, "num_kv_heads": 300, "head_dim": 64,
          "kv_dtype": "bf16", "weight_bytes": 1e9, "active_weight_bytes": 1e9, "active_parameters": 5e8,
          "layers": [{"kind": "compressed"}]})");
  std::string budgets;
  for (int h = 0; h < 300; ++h) budgets += (h ? "," : "") + std::string(h % 2 ? "0.2" : "0.4");
  tangram::detail::write_file(
      profile,
      R"({"format": "tangram-budget-profile/v1", "model": "wide", "num_model_layers": 1,
          "num_kv_heads": 300, "layer_ids": [0], "sink_tokens": 4, "window_tokens": 64,
          "target_keep_ratio": 0.3, "budgets": [[)" +
          budgets + "]]}");
  std::vector<std::string> base = {"simulate",
                                   "--model",
                                   model,
                                   "--profile",
                                   profile,
                                   "--sessions",
                                   "4",
                                   "--turns",
                                   "2",
                                   "--workload",
                                   "short",
                                   "--quiet"};
  // The default (132 SMs x 2 CTAs = 264) is too small: the error says which option to raise.
  auto r = run_cli(base);
  CHECK(r.code == 2);
  CHECK(r.err.find("--sms") != std::string::npos);
  auto with = [&](std::vector<std::string> const& extra) { return with_args(base, extra); };
  auto ok   = run_json(with({"--sms", "150", "--json"}));
  auto root = ok.root();
  CHECK(root["policies"]["tangram"]["rejected_sessions"].as_int(0, 10) == 0);
  CHECK(root["policies"]["tangram"]["generated_tokens"].as_int(1, 1 << 20) > 0);
  for (auto const& [value, piece] :
       {std::pair<char const*, char const*>{"0", "--sms: must be in [1, 65536], got 0"},
        {"65537", "--sms: must be in [1, 65536], got 65537"},
        {"x", "--sms: expected an integer, got \"x\""}}) {
    r = run_cli(with({"--sms", value}));
    CHECK(r.code == 2);
    CHECK(r.err.find(piece) != std::string::npos);
  }
  std::remove(model.c_str());
  std::remove(profile.c_str());
}

// Defect 8: --plot was checked only when the SVG was written, after the whole run.
TEST_CASE("simulate checks --plot before the run and creates nothing when the run fails",
          "[regression][simulate][cli]") {
  std::string missing_dir = std::string(TANGRAM_BINARY_DIR) + "/sim_defects_no_such_dir/plot.svg";
  // A short run whose --plot is `path`.
  auto with_plot = [](std::string const& path) {
    return run_cli(
        {"simulate", "--sessions", "4", "--turns", "1", "--workload", "short", "--plot", path});
  };
  auto r = with_plot(missing_dir);
  CHECK(r.code == 2);
  CHECK(r.out.empty());                             // no table: nothing ran
  CHECK(r.err.find("(1/3)") == std::string::npos);  // no progress either
  CHECK(r.err.find("--plot: cannot write") != std::string::npos);
  CHECK(r.err.find(missing_dir) != std::string::npos);
  CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);

  r = with_plot(TANGRAM_BINARY_DIR);  // a directory
  CHECK(r.code == 2);
  CHECK(r.out.empty());
  CHECK(r.err.find("--plot") != std::string::npos);
  CHECK(r.err.find("directory") != std::string::npos);

  // A writable path with a run that fails afterwards: the file is not created.
  std::string plot = std::string(TANGRAM_BINARY_DIR) + "/sim_defects_plot.svg";
  std::remove(plot.c_str());
  r = run_cli({"simulate", "--gpu-mem", "1e6", "--quiet", "--plot", plot});
  CHECK(r.code == 2);
  CHECK_FALSE(exists(plot));
}
