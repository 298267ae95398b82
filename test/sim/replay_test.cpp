// SPDX-License-Identifier: Apache-2.0
#include "tangram/eval/sim/replay.hpp"

#include <algorithm>
#include <map>

#include "../memory/memory_fixtures.hpp"
#include "contended_replay.hpp"
#include "tangram/eval/sim/policies.hpp"
#include "tangram/model/presets.hpp"
#include "tangram/plan/calibration.hpp"
#include "test_support.hpp"

using namespace tangram;
using namespace tangram::sim;

namespace {

// A policy that records every call, to check the engine by hand: memory for `capacity` sessions
// (unlimited by default).
class recording_policy final : public kv_policy {
 public:
  std::string name() const override { return "recording"; }
  bool start_turn(std::int32_t s,
                  std::int64_t history,
                  std::int64_t prompt,
                  std::int64_t max_new,
                  std::int64_t) override {
    tick(1);
    if (tokens.count(s) == 0 && tokens.size() >= capacity) return false;
    log.push_back(detail::cat("start ", s, " ", history, " ", prompt, " ", max_new));
    tokens[s] += 0;
    return true;
  }
  bool prefill_chunk(std::int32_t s, std::int64_t n) override {
    tick(2);
    log.push_back(detail::cat("prefill ", s, " ", n));
    tokens[s] += n;
    return true;
  }
  bool decode(std::vector<std::int32_t> const& ss) override {
    tick(4);
    ++decode_calls;
    for (auto s : ss) {
      log.push_back(detail::cat("decode ", s));
      tokens[s] += 1;
    }
    return true;
  }
  void end_turn(std::int32_t s) override {
    tick(8);
    log.push_back(detail::cat("end ", s));
  }
  void release(std::int32_t s) override {
    tick(16);
    log.push_back(detail::cat("release ", s));
    tokens.erase(s);
  }
  double kv_bytes_read(std::int32_t s) const override {
    return static_cast<double>(tokens.at(s)) * 1000.0;
  }
  double attended_tokens(std::int32_t s) const override {
    return static_cast<double>(tokens.at(s));
  }
  policy_memory memory() const override {
    policy_memory m;
    for (auto const& [s, n] : tokens) m.live_bytes += static_cast<double>(n) * 1000.0;
    m.allocated_bytes = m.live_bytes;
    return m;
  }
  double capacity_bytes() const override { return 1e18; }
  bool kept_counts_from_gpu() const override { return counts_from_gpu; }
  /// Advances `clock` (when set) by `units` ms: a control plane whose cost is known per call.
  void tick(int units) {
    if (clock) *clock += units * 1e-3;
  }
  std::vector<std::string> log;
  bool counts_from_gpu = false;
  double* clock             = nullptr;
  std::int64_t decode_calls = 0;
  std::map<std::int32_t, std::int64_t> tokens;
  std::size_t capacity = static_cast<std::size_t>(-1);
};

}  // namespace

TEST_CASE("the engine loop follows a hand-worked schedule", "[replay]") {
  workload w;
  w.sessions.push_back({0.0, {{100, 3, 1.0}, {20, 2, 0.0}}});
  recording_policy p;
  auto m = model_preset("llama-3.1-8b");
  cost_model cost(m, gpu_spec{});
  replay_options o;
  o.continuation_headroom_tokens    = 0;
  auto r                            = replay(w, p, cost, o);
  // No oracle: each turn reserves max_tokens (4096), not its answer length.
  std::vector<std::string> expected = {"start 0 0 100 4096",
                                       "prefill 0 100",  // step 1: prefill + first token
                                       "decode 0",
                                       "decode 0",
                                       "end 0",  // steps 2-3: two more tokens; turn ends
                                       "start 0 103 20 4096",
                                       "prefill 0 20",  // after 1 s of thinking
                                       "decode 0",
                                       "release 0"};
  CHECK(p.log == expected);
  CHECK(r.generated_tokens == 5);
  CHECK(r.prefilled_tokens == 120);
  CHECK(r.steps == 5);
  // Time: step 1 = prefill(100, past 0) + decode(100 tokens read); steps 2, 3 decode 101, 102;
  // think 1 s; step 4 = prefill(20, past 102) + decode(122); step 5 decode(123).
  double t = cost.prefill_s(100, 0) + cost.decode_step_s(100e3) + cost.decode_step_s(101e3) +
             cost.decode_step_s(102e3) + 1.0 + cost.prefill_s(20, 102) + cost.decode_step_s(122e3) +
             cost.decode_step_s(123e3);
  CHECK(r.modelled_makespan_s == Approx(t));
  CHECK(r.modelled_ttft_mean_s == Approx((cost.prefill_s(100, 0) + cost.decode_step_s(100e3) +
                                          cost.prefill_s(20, 102) + cost.decode_step_s(122e3)) /
                                         2));
  CHECK(r.peak_resident_sessions == 1);
  CHECK(r.preemptions == 0);
}

TEST_CASE("the measured control plane goes to the call that spent it, all of it charged",
          "[replay]") {
  // A clock only the policy's calls advance, by a cost of their own: 1 ms an admission attempt,
  // 2 a chunk, 4 a decode step, 8 an ended turn, 16 a release.
  workload w;
  w.sessions.push_back({0.0, {{300, 4, 0.0}, {40, 3, 0.0}}});
  w.sessions.push_back({0.0, {{50, 6, 0.0}}});
  auto m = model_preset("llama-3.1-8b");
  cost_model cost(m, gpu_spec{});
  replay_options o;
  o.continuation_headroom_tokens = 0;
  o.prefill_chunk                = 128;
  double fake                    = 0;
  o.control_clock                = [&] { return fake; };
  recording_policy p;
  p.clock    = &fake;
  auto count = [&](std::string const& prefix) {
    return static_cast<double>(std::count_if(
        p.log.begin(), p.log.end(), [&](auto const& e) { return e.rfind(prefix, 0) == 0; }));
  };
  auto plain          = replay(w, p, cost, o);  // measured, not charged
  auto const& by      = plain.control_plane;
  double const starts = count("start "), chunks = count("prefill "), ends = count("end "),
               releases = count("release "), decodes = static_cast<double>(p.decode_calls);
  CHECK(starts == 3);  // every admission fits: one attempt a turn
  CHECK(chunks == 5);  // 300 tokens in 3 chunks, 40 and 50 in one each
  CHECK(ends == 1);    // session 0's first turn; the last turns release instead
  CHECK(releases == 2);
  CHECK(by.admission_s == Approx(starts * 1e-3));
  CHECK(by.prefill_chunks_s == Approx(chunks * 2e-3));
  CHECK(by.decode_s == Approx(decodes * 4e-3));
  CHECK(by.end_turn_s == Approx(ends * 8e-3));
  CHECK(by.release_s == Approx(releases * 16e-3));
  CHECK(by.park_idle_s == 0);
  CHECK(by.evict_cached_s == 0);
  CHECK(plain.time.control_plane_s == 0);
  CHECK(plain.control_plane_us_per_step * 1e-6 * static_cast<double>(plain.steps) == Approx(fake));
  // Charged: every measured second is added to the makespan, the last release's included (no
  // wait for an arrival or a think timer here, which a later clock would shorten).
  REQUIRE(plain.time.idle_s == 0);
  recording_policy q;
  double charged_clock    = 0;
  q.clock                 = &charged_clock;
  o.control_clock         = [&] { return charged_clock; };
  o.charges.control_plane = true;
  auto charged            = replay(w, q, cost, o);
  CHECK(charged_clock == Approx(fake));
  CHECK(charged.time.control_plane_s == Approx(charged_clock));
  CHECK(charged.modelled_makespan_s ==
        Approx(plain.modelled_makespan_s + charged_clock).epsilon(1e-9));
  CHECK(charged.time.sum() == Approx(charged.modelled_makespan_s));
}

TEST_CASE("a session whose kept counts come from the GPU sits out the step after each chunk",
          "[replay]") {
  // One session: a 250-token prompt in chunks of 100, 3 answer tokens; a second one arrives
  // with it and decodes beside it, so the steps it sits out still run.
  workload w;
  w.sessions.push_back({0.0, {{250, 3, 0.0}}});
  w.sessions.push_back({0.0, {{10, 12, 0.0}}});
  auto m = model_preset("llama-3.1-8b");
  cost_model cost(m, gpu_spec{});
  replay_options o;
  o.continuation_headroom_tokens = 0;
  o.prefill_chunk                = 100;
  auto run                       = [&](bool from_gpu, counts_arrival counts) {
    recording_policy p;
    p.counts_from_gpu = from_gpu;
    o.counts          = counts;
    auto r            = replay(w, p, cost, o);
    return std::make_pair(r, p.log);
  };
  // Hand-worked, next step: chunks at steps 1, 3 and 5 (the last one samples the first token),
  // decodes at steps 7 and 8; it sits out steps 2, 4 and 6. Session 1 (one 10-token chunk at
  // step 1, first token) sits out step 2 and decodes its 11 other tokens at steps 3 to 13.
  // Nothing runs at step 2: 12 steps ran.
  auto [late, late_log] = run(true, counts_arrival::next_step);
  CHECK(late.counts_wait_steps == 4);
  CHECK(late.steps == 12);
  std::vector<std::string> steps_of_0;
  for (auto const& e : late_log)
    if (e == "prefill 0 100" || e == "prefill 0 50" || e == "decode 0") steps_of_0.push_back(e);
  CHECK(steps_of_0 ==
        std::vector<std::string>{
            "prefill 0 100", "prefill 0 100", "prefill 0 50", "decode 0", "decode 0"});
  // The time, step by step (session 1 holds 10 + its decodes so far; recording_policy reads
  // 1000 bytes a token): a session that sits out reads nothing; step 2 costs nothing.
  auto d        = [&](double tokens) { return cost.decode_step_s(tokens * 1e3); };
  double expect = cost.prefill_s(100, 0) + cost.prefill_s(10, 0) + d(10);  // step 1
  expect += cost.prefill_s(100, 100) + d(11);                              // step 3
  expect += d(12);                                                         // step 4
  expect += cost.prefill_s(50, 200) + d(13 + 250);                         // step 5
  expect += d(14);                                                   // step 6: session 0 sits out
  expect += d(15 + 251) + d(16 + 252);                               // steps 7 and 8
  for (int k = 17; k <= 21; ++k) expect += d(k);                     // steps 9 to 13
  CHECK(late.modelled_makespan_s == Approx(expect).epsilon(1e-12));  // a read is tiny here
  // At once, or counts known in advance: a chunk or decode every step (3 chunks, 2 decodes;
  // session 1 decodes at steps 2 to 12).
  for (auto [from_gpu, counts] :
       {std::pair{true, counts_arrival::at_once}, std::pair{false, counts_arrival::next_step}}) {
    auto [now, now_log] = run(from_gpu, counts);
    CHECK(now.counts_wait_steps == 0);
    CHECK(now.steps == 12);
    CHECK(now.generated_tokens == late.generated_tokens);
    // Session 0's first token comes two steps later (steps 5 against 3), session 1's at step 1
    // in both.
    CHECK(now.modelled_ttft_mean_s < late.modelled_ttft_mean_s);
  }
  // Step 2, where nothing ran, costs nothing, not even the fixed step overhead: the GPU was
  // still running step 1, already charged.
  o.prefill_chunk = 1000;
  w.sessions.pop_back();
  o.charges.step_overhead_s = 1e-3;
  auto [alone, alone_log]   = run(true, counts_arrival::next_step);
  auto [alone_now, _]       = run(true, counts_arrival::at_once);
  CHECK(alone.steps == alone_now.steps);  // 250 prompt tokens in one chunk, 3 tokens: 3 steps
  CHECK(alone.steps == 3);
  CHECK(alone.counts_wait_steps == 1);
  CHECK(alone.modelled_makespan_s == Approx(alone_now.modelled_makespan_s));
}

TEST_CASE("kept counts in flight land while the GPU is idle", "[replay]") {
  // A one-token answer ends the turn in its only chunk's step; its counts are still on the way
  // when the session thinks, and have landed when its next turn comes a second later: only the
  // second turn's chunk makes it sit out a step.
  workload w;
  w.sessions.push_back({0.0, {{100, 1, 1.0}, {50, 2, 0.0}}});
  auto m = model_preset("llama-3.1-8b");
  cost_model cost(m, gpu_spec{});
  replay_options o;
  o.continuation_headroom_tokens = 0;
  recording_policy p;
  p.counts_from_gpu = true;
  auto r            = replay(w, p, cost, o);
  CHECK(r.counts_wait_steps == 1);
  CHECK(r.steps == 3);  // turn 1's chunk; turn 2's chunk, then its decode after the wait
}

TEST_CASE("resident sessions while memory binds count only the steps after a turn did not fit",
          "[replay]") {
  // Memory for one session: session 1 waits through session 0's three steps (memory binds), then
  // runs its two alone (nothing waits). One session is resident throughout.
  workload w;
  w.sessions.push_back({0.0, {{100, 3, 0.0}}});
  w.sessions.push_back({0.0, {{50, 2, 0.0}}});
  auto m = model_preset("llama-3.1-8b");
  cost_model cost(m, gpu_spec{});
  recording_policy one;
  one.capacity = 1;
  auto r       = replay(w, one, cost, replay_options{});
  double bound = cost.prefill_s(100, 0) + cost.decode_step_s(100e3) + cost.decode_step_s(101e3) +
                 cost.decode_step_s(102e3);
  double rest = cost.prefill_s(50, 0) + cost.decode_step_s(50e3) + cost.decode_step_s(51e3);
  CHECK(r.admission_waits == 1);
  CHECK(r.memory_bound_s == Approx(bound));
  CHECK(r.modelled_makespan_s == Approx(bound + rest));
  CHECK(r.mean_resident_sessions_memory_bound == Approx(1.0));
  // Unlimited memory: both run at once and memory never binds.
  recording_policy roomy;
  auto free = replay(w, roomy, cost, replay_options{});
  CHECK(free.admission_waits == 0);
  CHECK(free.memory_bound_s == 0);
  CHECK(free.mean_resident_sessions_memory_bound == 0);
  CHECK(free.peak_resident_sessions == 2);
}

TEST_CASE("memory binds a prefix cache that evicts idle blocks to admit a turn", "[replay]") {
  // vLLM v1 full_kv with room for about 1,500 tokens: session 1 arrives while session 0 thinks
  // between turns holding 1,003 tokens, and is admitted only after session 0's idle blocks go.
  auto plan = test::llama_plan("snapkv");
  auto m    = model_preset("llama-3.1-8b");
  cost_model cost(m, gpu_spec{});
  const double token_bytes = 2.0 * m.num_layers * m.num_kv_heads * m.head_dim * 2;
  workload w;
  w.sessions.push_back({0.0, {{1000, 3, 10.0}, {10, 2, 0.0}}});
  w.sessions.push_back({1.0, {{1000, 2, 0.0}}});
  unified_policy full(plan, unified_mode::full_kv, 1500 * token_bytes, 2, 2, 131073);
  REQUIRE(full.idle_kv_is_prefix_cache());
  auto r = replay(w, full, cost, replay_options{});
  REQUIRE(r.prefix_blocks_evicted + r.idle_evictions > 0);  // room came from idle blocks
  CHECK(r.memory_bound_s > 0);
  CHECK(r.memory_bound_s < r.modelled_makespan_s);
  CHECK(r.mean_resident_sessions_memory_bound > 0);
}

TEST_CASE("open-loop time to first token counts from the arrival, not the next step", "[replay]") {
  // Session 1 arrives while the first step runs and is picked up when it ends, whether it arrived
  // 1 us or 2 us after t = 0: its time to first token differs by exactly 1 us (the mean of two
  // sessions by 0.5 us).
  auto m = model_preset("llama-3.1-8b");
  cost_model cost(m, gpu_spec{});
  auto ttft_mean = [&](double arrival_s) {
    workload w;
    w.sessions.push_back({0.0, {{100, 3, 0.0}}});
    w.sessions.push_back({arrival_s, {{50, 2, 0.0}}});
    recording_policy p;
    return replay(w, p, cost, replay_options{}).modelled_ttft_mean_s;
  };
  CHECK(ttft_mean(1e-6) - ttft_mean(2e-6) == Approx(0.5e-6).epsilon(1e-3));
}

TEST_CASE("replays return every page and never show more live than allocated bytes", "[replay]") {
  test::contended_replay fx;
  auto const& [plan, m, gpu, cost, kv, work, outputs] = fx;

  tangram_policy tp(plan, kv, 24, 24);
  unified_policy full(plan, unified_mode::full_kv, kv, 24, 24, 131073);
  unified_policy nonu(plan, unified_mode::compressed_reclaim, kv, 24, 24, 131073);
  for (kv_policy* p : std::initializer_list<kv_policy*>{&tp, &full, &nonu}) {
    auto r = replay(work, *p, cost);
    INFO(r.policy);
    CHECK(r.generated_tokens == outputs);
    CHECK(r.rejected_sessions == 0);
    CHECK(r.kv_bytes_allocated_peak <= r.capacity_bytes);
    for (auto const& pt : r.timeline) CHECK(pt.live_bytes <= pt.allocated_bytes + 1);
    auto mem = p->memory();
    CHECK(mem.allocated_bytes == 0);
    CHECK(mem.live_bytes == Approx(0).margin(1e-3));
  }
  CHECK(tp.manager().live_sequences() == 0);
  CHECK(tp.manager().pool().used_pages() == 0);
  CHECK(tp.manager().pool().reserved_pages() == 0);
  REQUIRE_NOTHROW(tp.manager().check_invariants());
  CHECK(full.baseline().pool().used_pages() == 0);
  CHECK(nonu.baseline().pool().used_pages() == 0);
}

TEST_CASE("baselines preempt and recompute when memory runs out, every turn still completes",
          "[replay]") {
  auto plan = test::llama_plan("snapkv");
  auto m    = model_preset("llama-3.1-8b");
  gpu_spec gpu;
  gpu.memory_bytes = 30e9;
  cost_model cost(m, gpu);
  double kv = gpu.kv_budget_bytes(m);
  workload_options wo;
  wo.kind     = workload_kind::short_context;
  wo.sessions = 40;
  wo.turns    = 2;
  auto work   = generate_workload(wo);
  replay_options o;
  o.continuation_headroom_tokens = 0;  // optimistic admission: forces preemption
  unified_policy full(plan, unified_mode::full_kv, kv, 40, 40, 131073);
  auto r               = replay(work, full, cost, o);
  std::int64_t outputs = 0;
  for (auto const& s : work.sessions)
    for (auto const& t : s.turns) outputs += t.output_tokens;
  CHECK(r.generated_tokens == outputs);
  CHECK(r.preemptions + r.idle_evictions > 0);
  CHECK(r.recomputed_tokens > 0);
  CHECK(full.baseline().pool().used_pages() == 0);
}

TEST_CASE("tangram holds at least 2x the sessions of full-KV on mid and long workloads",
          "[replay][acceptance]") {
  auto plan = test::llama_plan("snapkv");
  auto m    = model_preset("llama-3.1-8b");
  gpu_spec gpu;
  cost_model cost(m, gpu);
  double kv = gpu.kv_budget_bytes(m);
  for (auto kind : {workload_kind::mid_context, workload_kind::long_context}) {
    workload_options wo;
    wo.kind     = kind;
    wo.sessions = 96;
    auto work   = generate_workload(wo);
    tangram_policy tp(plan, kv, 96, 96);
    // Capacity like for like: full_kv with the same session-aware admission as tangram (idle
    // sessions kept, headroom for new ones); as vLLM v1 it admits on a chunk and then evicts.
    unified_policy full(plan, unified_mode::full_kv, kv, 96, 96, 131073);
    full.set_vllm_v1(false);
    unified_policy v1(plan, unified_mode::full_kv, kv, 96, 96, 131073);
    auto rt = replay(work, tp, cost);
    auto rf = replay(work, full, cost);
    auto rv = replay(work, v1, cost);
    CHECK(rt.mean_resident_sessions > rv.mean_resident_sessions);
    CHECK(rt.modelled_tokens_per_s > rv.modelled_tokens_per_s);
    INFO(to_string(kind) << ": tangram " << rt.peak_resident_sessions << " vs full_kv "
                         << rf.peak_resident_sessions);
    CHECK(rt.peak_resident_sessions >= 2 * rf.peak_resident_sessions);
    // Memory binds both for part of the run, and then too tangram holds twice the sessions.
    REQUIRE(rt.memory_bound_s > 0);
    REQUIRE(rf.memory_bound_s > 0);
    CHECK(rt.mean_resident_sessions_memory_bound >= 2 * rf.mean_resident_sessions_memory_bound);
    CHECK(rt.reclaim_ops == 0);
    CHECK(rt.preemptions == 0);
    CHECK(rt.idle_evictions == 0);
    CHECK(rt.recomputed_tokens == 0);
    CHECK(rt.modelled_tokens_per_s > rf.modelled_tokens_per_s);
  }
}

TEST_CASE("replays are deterministic", "[replay]") {
  auto plan = test::llama_plan("snapkv");
  auto m    = model_preset("llama-3.1-8b");
  cost_model cost(m, gpu_spec{});
  workload_options wo;
  wo.sessions = 16;
  auto work   = generate_workload(wo);
  double kv   = gpu_spec{}.kv_budget_bytes(m);
  tangram_policy a(plan, kv, 16, 16), b(plan, kv, 16, 16);
  auto ra = replay(work, a, cost), rb = replay(work, b, cost);
  CHECK(ra.modelled_makespan_s == rb.modelled_makespan_s);
  CHECK(ra.peak_resident_sessions == rb.peak_resident_sessions);
  CHECK(ra.kv_bytes_allocated_peak == rb.kv_bytes_allocated_peak);
  CHECK(ra.steps == rb.steps);
}
