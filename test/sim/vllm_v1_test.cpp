// SPDX-License-Identifier: Apache-2.0
// full_kv as vLLM v1 (issue 13): pages per scheduled chunk, idle sessions' KV as an evictable
// prefix cache (LRU) recomputed on a miss, no invented headroom rule; time between tokens.
#include <cmath>

#include "../memory/memory_fixtures.hpp"
#include "cli_support.hpp"
#include "contended_replay.hpp"
#include "tangram/eval/baselines/unified_paging.hpp"
#include "tangram/eval/sim/log_histogram.hpp"
#include "tangram/eval/sim/policies.hpp"
#include "tangram/eval/sim/replay.hpp"
#include "tangram/io/detail/json.hpp"
#include "tangram/model/presets.hpp"
#include "test_support.hpp"

using namespace tangram;
using namespace tangram::sim;

using test::unified_kv_bytes;

namespace {

/// The idle-eviction scenario (P tokens a page): A has a 6P-token prompt, a 2-token answer, then
/// 10 s of thinking and a P-token follow-up; B arrives at 1 s (A idle) with a 6P-token prompt.
workload idle_session_scenario(std::int64_t P) {
  workload w;
  w.sessions.push_back({0.0, {{6 * P, 2, 10.0}, {P, 1, 0.0}}});
  w.sessions.push_back({1.0, {{6 * P, 2, 0.0}}});
  return w;
}

/// The outcome common to full_kv's replays of idle_session_scenario on 10 pages per layer: B
/// never waits and nothing is preempted; A's second turn prefills the `recomputed` tokens of its
/// history it lost plus its P-token prompt; every turn completes and every page comes back.
void check_idle_session_replay(replay_result const& r,
                               unified_policy const& full,
                               std::int64_t P,
                               std::int64_t recomputed) {
  CHECK(r.preemptions == 0);
  CHECK(r.admission_waits == 0);
  CHECK(r.recomputed_tokens == recomputed);
  CHECK(r.prefilled_tokens == 6 * P + 6 * P + (recomputed + P));
  CHECK(r.generated_tokens == 5);
  CHECK(r.completed_requests == 3);
  CHECK(full.baseline().pool().used_pages() == 0);
}

}  // namespace

TEST_CASE("full_kv admits on its first scheduled chunk, unified_nonuniform needs the whole prompt",
          "[replay][vllm]") {
  auto plan      = test::llama_plan("snapkv");
  std::int64_t P = plan.geometry.page_tokens;
  double kv      = unified_kv_bytes(plan, 5);  // 5 pages per layer
  unified_policy full(plan, unified_mode::full_kv, kv, 4, 4, 1 << 20);
  unified_policy nonu(plan, unified_mode::compressed_reclaim, kv, 4, 4, 1 << 20);
  full.set_scheduled_chunk(2 * P);
  CHECK(full.idle_kv_is_prefix_cache());
  CHECK_FALSE(nonu.idle_kv_is_prefix_cache());
  // An 8-page prompt on a 5-page-per-layer pool: the first 2-page chunk fits now.
  CHECK(full.start_turn(0, 0, 8 * P, 1, 0));
  CHECK_FALSE(nonu.start_turn(0, 0, 8 * P, 1, 0));
  CHECK(full.prefill_chunk(0, 2 * P));
  CHECK(full.prefill_chunk(0, 2 * P));
  CHECK_FALSE(full.prefill_chunk(0, 2 * P));  // the third chunk (6 pages) no longer fits
  full.release(0);
}

TEST_CASE("unified_nonuniform with chunk admission admits on its first scheduled chunk",
          "[replay][vllm]") {
  auto plan      = test::llama_plan("snapkv");
  std::int64_t P = plan.geometry.page_tokens;
  double kv      = unified_kv_bytes(plan, 5);  // 5 pages per layer
  unified_policy nonu(plan, unified_mode::compressed_reclaim, kv, 4, 4, 1 << 20);
  nonu.set_scheduled_chunk(2 * P);
  CHECK_FALSE(nonu.chunk_admission());
  CHECK_FALSE(nonu.start_turn(0, 0, 8 * P, 1, 0));  // whole prompt: 8 pages > 5
  nonu.set_chunk_admission(true);
  CHECK(nonu.start_turn(0, 0, 8 * P, 1, 0));  // first chunk: 2 pages <= 5
  nonu.set_scheduled_chunk(6 * P);
  CHECK_FALSE(nonu.start_turn(1, 0, 8 * P, 1, 0));  // a 6-page first chunk does not fit 5 pages
  nonu.release(0);
}

TEST_CASE("full_kv: an idle session's KV is evicted for a new one and recomputed on its next turn",
          "[replay][vllm]") {
  auto plan      = test::llama_plan("snapkv");
  std::int64_t P = plan.geometry.page_tokens;
  auto m         = model_preset("llama-3.1-8b");
  cost_model cost(m, gpu_spec{});
  double kv = unified_kv_bytes(plan, 10);  // 10 pages per layer
  // B arrives while A is idle, holding 7 pages per layer.
  auto w = idle_session_scenario(P);
  unified_policy full(plan, unified_mode::full_kv, kv, 2, 2, 1 << 20);
  replay_options o;  // continuation headroom 1024 by default: not applied to a prefix cache
  auto r = replay(w, full, cost, o);
  // B's 6 pages do not fit next to A's 7: A's idle KV (6P + 2 tokens of history) is evicted at
  // once, so B never waits; A's second turn prefills its history again plus its prompt.
  CHECK(r.idle_evictions == 1);
  check_idle_session_replay(r, full, P, 6 * P + 2);

  // With room for both (20 pages per layer), nothing is evicted or recomputed.
  unified_policy roomy(plan, unified_mode::full_kv, unified_kv_bytes(plan, 20), 2, 2, 1 << 20);
  auto r2 = replay(w, roomy, cost, o);
  CHECK(r2.idle_evictions == 0);
  CHECK(r2.recomputed_tokens == 0);
  CHECK(r2.prefilled_tokens == 6 * P + 6 * P + P);
}

TEST_CASE("full_kv: a chunk that does not fit preempts the newest request, itself if newest",
          "[replay][vllm]") {
  auto plan      = test::llama_plan("snapkv");
  std::int64_t P = plan.geometry.page_tokens;
  auto m         = model_preset("llama-3.1-8b");
  cost_model cost(m, gpu_spec{});
  // 8 pages per layer. A (first) decodes a long answer from a 4P prompt; B (second, newer) has a
  // 6P prompt in chunks of 2P: its first chunks fit, then it runs out and, being the newest,
  // preempts itself (A keeps running), and resumes after A is done.
  workload w;
  w.sessions.push_back({0.0, {{4 * P, 40, 0.0}}});
  w.sessions.push_back({0.0, {{6 * P, 1, 0.0}}});
  unified_policy full(plan, unified_mode::full_kv, unified_kv_bytes(plan, 8), 2, 2, 1 << 20);
  replay_options o;
  o.prefill_chunk = 2 * P;
  full.set_scheduled_chunk(o.prefill_chunk);
  auto r = replay(w, full, cost, o);
  CHECK(r.preemptions >= 1);
  CHECK(r.rejected_sessions == 0);
  CHECK(r.generated_tokens == 41);
  CHECK(r.completed_requests == 2);
  // A was never preempted: only B's prefilled chunks were recomputed.
  CHECK(r.recomputed_tokens % (2 * P) == 0);
  CHECK(r.recomputed_tokens == r.prefilled_tokens - 4 * P - 6 * P);
  CHECK(full.baseline().pool().used_pages() == 0);
}

TEST_CASE("time between tokens: p50 and p95 of the steps between a request's tokens",
          "[replay][tbt]") {
  log_histogram h;
  CHECK(h.quantile(0.5) == 0);
  for (int i = 1; i <= 100; ++i) h.add(i * 1e-3);
  CHECK(h.count() == 100);
  CHECK(h.quantile(0.50) == Approx(50e-3).epsilon(0.01));
  CHECK(h.quantile(0.95) == Approx(95e-3).epsilon(0.01));

  auto plan = test::llama_plan("snapkv");
  auto m    = model_preset("llama-3.1-8b");
  cost_model cost(m, gpu_spec{});
  workload w;
  w.sessions.push_back({0.0, {{100, 3, 0.0}}});
  unified_policy full(plan, unified_mode::full_kv, unified_kv_bytes(plan, 100), 1, 1, 1 << 20);
  auto r = replay(w, full, cost);
  // Two gaps, each one decode step of 101 and 102 tokens' KV reads: weights dominate.
  double kv_token = head_token_bytes(plan) * plan.num_layers * plan.num_kv_heads;
  CHECK(r.modelled_tbt_p50_s == Approx(cost.decode_step_s(101 * kv_token)).epsilon(0.01));
  CHECK(r.modelled_tbt_p95_s == Approx(cost.decode_step_s(101 * kv_token)).epsilon(0.01));
}

TEST_CASE(
    "simulate --full-kv-scheduler pinned gives the session-aware full_kv, vllm is the default",
    "[simulate][cli][vllm]") {
  namespace json                = tangram::detail::json;
  std::vector<std::string> base = {"simulate",
                                   "--sessions",
                                   "24",
                                   "--turns",
                                   "3",
                                   "--gpu-mem",
                                   "40",
                                   "--quiet",
                                   "--json",
                                   "--no-control-plane"};
  auto with   = [&](std::vector<std::string> const& extra) { return test::with_args(base, extra); };
  auto r1     = test::run_json(with({}));
  auto r2     = test::run_json(with({"--full-kv-scheduler", "pinned"}));
  auto v1     = r1.root();
  auto pinned = r2.root();
  CHECK(v1["cost_model"]["full_kv_scheduler"].as_string() == "vllm");
  CHECK(pinned["cost_model"]["full_kv_scheduler"].as_string() == "pinned");
  // Pinned evicts idle sessions only when nothing can run; vLLM v1 on 40 GB evicts them for
  // every new request that needs the room, and recomputes more.
  auto evictions = [](json::node const& root) {
    return root["policies"]["full_kv"]["idle_evictions"].as_int(0, 1 << 30);
  };
  auto recomputed = [](json::node const& root) {
    return root["policies"]["full_kv"]["recomputed_tokens"].as_int(0, std::int64_t{1} << 40);
  };
  CHECK(evictions(pinned) < evictions(v1));
  CHECK(recomputed(pinned) < recomputed(v1));
  // The other policies do not change.
  CHECK(v1["policies"]["tangram"]["modelled_makespan_s"].as_double(0, 1e12) ==
        pinned["policies"]["tangram"]["modelled_makespan_s"].as_double(0, 1e12));

  auto r3 = test::run_cli({"simulate", "--full-kv-scheduler", "lru"});
  CHECK(r3.code == 2);
  CHECK(r3.err.find("--full-kv-scheduler: expected one of vllm, vllm-sessions, pinned") !=
        std::string::npos);

  // The default evicts the LRU idle session's tail blocks and keeps its prefix; vllm-sessions
  // evicts whole sessions, so it recomputes at least as much.
  auto r4       = test::run_json(with({"--full-kv-scheduler", "vllm-sessions"}));
  auto sessions = r4.root();
  CHECK(sessions["cost_model"]["full_kv_scheduler"].as_string() == "vllm-sessions");
  CHECK(v1["policies"]["full_kv"]["prefix_blocks_evicted"].as_int(0, std::int64_t{1} << 40) > 0);
  CHECK(sessions["policies"]["full_kv"]["prefix_blocks_evicted"].as_int(0, std::int64_t{1} << 40) == 0);
  CHECK(recomputed(v1) <= recomputed(sessions));
}

TEST_CASE("full_kv with block eviction: the idle session loses its tail blocks, keeps its prefix",
          "[replay][vllm][blocks]") {
  auto plan      = test::llama_plan("snapkv");
  std::int64_t P = plan.geometry.page_tokens;
  auto m         = model_preset("llama-3.1-8b");
  cost_model cost(m, gpu_spec{});
  // The scenario above, 10 pages per layer. A's first turn leaves 6P + 1 tokens cached (6P
  // prefilled, 1 decode append; 7 pages a layer) and 6P + 2 of history. B's admission needs its
  // first 6-page chunk: 3 free, so A's tail blocks go one by one: 6P + 1 -> 6P -> 5P -> 4P (3
  // blocks). B's decode append then needs a 7th page: one more block, 4P -> 3P. B finishes and
  // frees its pages; A's second turn prefills only what it lost: its history drops from 6P + 2
  // by the 3P + 1 evicted tokens, so it prefills (6P + 2) - (3P + 1) = 3P + 1 again, plus its
  // P-token prompt.
  auto w = idle_session_scenario(P);
  unified_policy full(plan, unified_mode::full_kv, unified_kv_bytes(plan, 10), 2, 2, 1 << 20);
  full.set_block_eviction(true);
  auto r = replay(w, full, cost);
  CHECK(r.prefix_blocks_evicted == 4);
  CHECK(r.idle_evictions == 0);
  check_idle_session_replay(r, full, P, 3 * P + 1);

  // The whole-session default recomputes all 6P + 2 tokens of A's history instead.
  unified_policy whole(plan, unified_mode::full_kv, unified_kv_bytes(plan, 10), 2, 2, 1 << 20);
  auto r2 = replay(w, whole, cost);
  CHECK(r2.prefix_blocks_evicted == 0);
  CHECK(r2.recomputed_tokens == 6 * P + 2);
}
