// SPDX-License-Identifier: Apache-2.0
/**
 * @file eval/sim/replay.hpp
 * @brief Replays a multi-turn workload against a KV-memory policy, step by step, the way a
 * continuous-batching engine with chunked prefill would, and reports memory, admission and
 * (modelled) throughput figures.
 *
 * The engine loop (`detail_replay::replay_engine`, over the state and between-step moves of
 * eval/sim/detail/replay_run.hpp) is policy-agnostic; policies (eval/sim/policies.hpp) drive the
 * real library objects (pools, page tables, admission) on a simulated memory resource. Time
 * advances by the roofline cost model (eval/sim/cost_model.hpp) plus each policy's `step_charges`:
 * every time figure is modelled, and `replay_result::time` breaks the makespan into its terms. The
 * control-plane time is the wall-clock time actually spent inside policy calls, measured (not
 * added to modelled time).
 *
 * No oracle: a turn reserves `max_tokens` of decode (capped by what the context allows); its
 * answer length comes from the workload, truncated at that reservation, and is decoded until it
 * ends. Every policy sees the same arrivals and answer lengths.
 */
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "tangram/core/error.hpp"
#include "tangram/eval/sim/cost_model.hpp"
#include "tangram/eval/sim/detail/replay_run.hpp"
#include "tangram/eval/sim/measured_costs.hpp"
#include "tangram/eval/sim/replay_types.hpp"
#include "tangram/eval/sim/workload.hpp"

namespace tangram::sim {

namespace detail_replay {

/// @brief The engine loop over a `replay_run`: arrivals, admission, one step (decode, prefill
/// chunks, its modelled time, its accounting), finished turns; then the figures (`replay`).
class replay_engine : public replay_run {
 public:
  using replay_run::replay_run;

  replay_result run() {
    policy.begin_replay(options.counts);
    while (finished_turns < total_turns) {
      arrive();
      deliver_counts(false);
      memory_bound = false;
      // Admission: continuing turns first; new sessions only behind them.
      if (try_admit(ready_continue, false)) try_admit(ready_new, true);
      if (running.empty()) {
        if (!wait_or_reject()) break;
        continue;
      }
      // One engine step.
      begin_step();
      decode_step();
      prefill_chunks();
      charge_step();
      account_step();
      end_turns();
      if (options.progress && out.steps - last_progress_step >= 512) {
        last_progress_step = out.steps;
        options.progress(static_cast<double>(finished_turns) / static_cast<double>(total_turns));
      }
    }
    return summarise();
  }

 private:
  /// 1. Arrivals and think timers that are due.
  void arrive() {
    while (next_arrival < by_arrival.size() && spec(by_arrival[next_arrival]).arrival_s <= t &&
           (options.concurrency == 0 || active < options.concurrency)) {
      std::int32_t s = by_arrival[next_arrival++];
      set_turn(s, 0);  // ready now: a closed-loop client enters when a slot frees
      if (options.concurrency == 0) ss_of(s).ready_s = spec(s).arrival_s;  // open loop: on arrival
      if (options.on_turn) options.on_turn(s, 0, ss_of(s).ready_s, ss_of(s).answer);
      ready_new.push_back(s);
      ++active;
    }
    std::sort(thinking.begin(), thinking.end());
    while (!thinking.empty() && thinking.front().first <= t) {
      std::int32_t s = thinking.front().second;
      thinking.erase(thinking.begin());
      set_turn(s, ss_of(s).turn + 1);
      if (options.on_turn) options.on_turn(s, ss_of(s).turn, ss_of(s).ready_s, ss_of(s).answer);
      (ss_of(s).holds_kv ? ready_continue : ready_new).push_back(s);
    }
  }

  /// Nothing runs: waits for the next arrival or wake-up, or frees memory held by idle sessions
  /// (LRU), or gives up on a turn that cannot fit even on an empty GPU. False: nothing is left.
  bool wait_or_reject() {
    // Nothing runs, so the GPU is idle: kept counts in flight have landed, and what they held
    // is free before anything idle is evicted or any turn given up.
    if (!counts_in_flight.empty()) {
      deliver_counts(true);
      return true;
    }
    double next = std::numeric_limits<double>::infinity();
    if (next_arrival < by_arrival.size() &&
        (options.concurrency == 0 || active < options.concurrency))
      next = spec(by_arrival[next_arrival]).arrival_s;
    for (auto const& th : thinking) next = std::min(next, th.first);
    if (std::isfinite(next) && (ready_continue.empty() && ready_new.empty())) {
      resident_area += resident * std::max(0.0, next - t);
      out.time.idle_s += std::max(0.0, next - t);
      t = std::max(t, next);
      return true;
    }
    // Turns wait and nothing runs: free memory held by idle sessions (LRU), or give up on a
    // turn that cannot fit even on an empty GPU.
    if (evict_idle(-1)) return true;
    if (!ready_continue.empty() || !ready_new.empty()) {
      auto& queue    = ready_continue.empty() ? ready_new : ready_continue;
      std::int32_t s = queue.front();
      queue.pop_front();
      reject(s);  // its KV (on the GPU or parked) goes with it
      return true;
    }
    return std::isfinite(next);
  }

  /// Starts a step: its token budget and the sequences it decodes.
  void begin_step() {
    budget     = options.step_token_budget;
    step_s     = 0;
    kv_read    = 0;
    link_bytes = 0;
    any_decode = false;
    ran        = false;
    first_token_now.clear();
    snapshot.assign(running.begin(), running.end());
    decoders.clear();
    for (auto s : running) {
      if (waits_for_counts(s)) {
        out.counts_wait_steps += 1;
        continue;
      }
      if (ss_of(s).state == phase::decode) decoders.push_back(s);
    }
  }

  /// Kept counts that reached the host before this step's admission (`all`: every one in
  /// flight): the policy may free what it held for them (kv_policy::counts_arrived).
  void deliver_counts(bool all) {
    for (std::size_t i = 0; i < counts_in_flight.size();) {
      std::int32_t s = counts_in_flight[i];
      auto& ss       = ss_of(s);
      if (!all && ss.counts_wait_step >= step_index) {
        ++i;
        continue;
      }
      timed(&control_plane_time::prefill_chunks_s, [&] {
        policy.counts_arrived(s);
        return 0;
      });
      ss.counts_wait_step = -1;
      counts_in_flight[i] = counts_in_flight.back();
      counts_in_flight.pop_back();
    }
  }

  /// True when `s` sits out this step: its last chunk's kept counts have not reached the host.
  bool waits_for_counts(std::int32_t s) { return ss_of(s).counts_wait_step == step_index; }

  bool is_running(std::int32_t s) const {
    return std::find(running.begin(), running.end(), s) != running.end();
  }

  /// One decode step; sessions the policy parked to make room stop (they decode nothing now).
  bool decode_once() {
    bool ok = timed(&control_plane_time::decode_s, [&] { return policy.decode(decoders); });
    absorb_parked();
    decoders.erase(
        std::remove_if(
            decoders.begin(), decoders.end(), [&](std::int32_t s) { return !is_running(s); }),
        decoders.end());
    return ok;
  }

  /// 2. The decoding sequences emit a token each, preempting (or giving up) when out of pages.
  void decode_step() {
    while (!decoders.empty() && !decode_once()) {
      // Out of pages (baselines only): preempt the latest admitted sequence and try again.
      if (!make_room(-1)) {
        // Alone on a pool with no idle session left, its answer still outgrows the memory: the
        // session can never finish here, so it is given up like a turn that never fits at
        // admission (counted in rejected_sessions), not the whole run.
        give_up(decoders.front());
      }
      decoders.erase(
          std::remove_if(
              decoders.begin(), decoders.end(), [&](std::int32_t s) { return !is_running(s); }),
          decoders.end());
    }
    for (auto s : decoders) {
      auto& ss   = ss_of(s);
      any_decode = true;
      ran        = true;
      budget -= 1;
      ss.decoded_this_turn += 1;
      ss.cached += 1;
      seen_tokens += 1;
      ss.to_decode -= 1;
      out.generated_tokens += 1;
    }
  }

  /// 3. Prefill chunks fill the rest of the step's token budget.
  void prefill_chunks() {
    for (auto s : snapshot) {
      auto& ss = ss_of(s);
      // Offloaded tokens come first in the prompt and are reloaded, outside the token budget.
      std::int64_t reload = offload_on ? std::min(ss.offloaded, options.prefill_chunk) : 0;
      if (ss.state != phase::prefill || (budget <= 0 && reload == 0) || !is_running(s) ||
          waits_for_counts(s))
        continue;
      std::int64_t compute = std::min({ss.to_prefill - reload,
                                       std::max<std::int64_t>(budget, 0),
                                       options.prefill_chunk - reload});
      std::int64_t chunk   = reload + compute;
      if (chunk == 0) continue;
      std::int64_t reclaimed_before =
          ch.reclaim_prefill_fraction > 0 ? policy.reclaimed_pages() : 0;
      double past = policy.attended_tokens(s);
      bool ok     = false;
      while (!(ok = timed(&control_plane_time::prefill_chunks_s,
                          [&] { return policy.prefill_chunk(s, chunk); }))) {
        if (!prefix_cache) {
          if (!make_room(s)) break;
          continue;
        }
        // vLLM v1 (pages per scheduled chunk): evict cached idle blocks, then preempt the newest
        // running request, which may be this one; alone, it can never fit and is given up.
        if (evict_idle(s)) continue;
        if (running.size() < 2) {
          give_up(s);
          break;
        }
        std::int32_t victim = newest_running(-1);
        preempt(victim);
        if (victim == s) break;
      }
      // Nothing left to preempt and the chunk still does not fit (a policy that admits on its
      // first chunk, e.g. unified_nonuniform with chunk admission): the session can never finish
      // here, so it is given up (counted in rejected_sessions), not the whole run.
      if (!ok && !prefix_cache && is_running(s)) give_up(s);
      if (!ok) continue;
      // Making room may have pushed this session's own blocks out of host memory: what is no
      // longer there is computed instead.
      if (std::int64_t gone = reload - std::min(reload, ss.offloaded); gone > 0) {
        reload -= gone;
        compute += gone;
      }
      double prefill = cost.prefill_s(compute, static_cast<std::int64_t>(past) + reload);
      step_s += prefill;
      out.time.prefill_s += prefill;
      // The paper's reclamation: a share of the prefill of every chunk that reclaimed pages.
      if (ch.reclaim_prefill_fraction > 0 && policy.reclaimed_pages() > reclaimed_before) {
        step_s += ch.reclaim_prefill_fraction * prefill;
        out.time.reclamation_s += ch.reclaim_prefill_fraction * prefill;
      }
      if (reload > 0) {
        ss.offloaded -= reload;
        host_tokens -= reload;
        out.reloaded_tokens += reload;
        link_bytes += static_cast<double>(reload) * token_bytes;
      }
      if (double extra = policy.prefill_chunk_extra_bytes(s); extra > 0) {
        step_s += cost.hbm_s(extra);
        out.time.eviction_pass_s += cost.hbm_s(extra);
      }
      ran = true;
      // The documented engine loop learns the kept counts a step later (counts_arrival).
      if (options.counts == counts_arrival::next_step && counts_from_gpu) {
        if (ss.counts_wait_step < 0) counts_in_flight.push_back(s);
        ss.counts_wait_step = step_index + 1;
      }
      budget -= compute;
      ss.to_prefill -= chunk;
      ss.prefilled_this_turn += chunk;
      ss.cached += chunk;
      seen_tokens += chunk;
      out.prefilled_tokens += compute;  // reloaded tokens are not prefilled again
      if (ss.to_prefill == 0) {
        // The step that completes a prefill also samples the turn's first token.
        ss.state = phase::decode;
        ss.decoded_this_turn += 1;
        ss.to_decode -= 1;
        out.generated_tokens += 1;
        first_token_now.push_back(s);
      }
    }
  }

  /// 4. The step's modelled time: weights, attention, replanning, reloads, host traffic.
  void charge_step() {
    std::int64_t decoding = 0;
    for (auto s : running)
      if (ss_of(s).state == phase::decode && !waits_for_counts(s)) {
        kv_read += ch.padded_reads ? policy.kv_bytes_read_padded(s) : policy.kv_bytes_read(s);
        ++decoding;
      }
    if (any_decode || !first_token_now.empty()) {
      double weights = cost.weights_s(), attention = cost.hbm_s(kv_read) * ch.skew_for(decoding);
      double replan = 0;
      if (ch.replan == replan_mode::fraction) {
        replan = ch.replan_fraction * (weights + attention);
      } else if (ch.replan_sequences_per_request > 0) {  // a measured planner's host time
        double host = planner_host_s(decoding * ch.replan_sequences_per_request);
        replan      = ch.replan == replan_mode::planner ? host : std::max(0.0, host - prev_step_s);
      }
      double launch = ch.balanced_split && decoding > 0 ? split_balance_s(decoding) : 0.0;
      step_s += weights + attention + replan + launch;
      out.time.decode_launch_s += launch;
      out.time.weights_s += weights;
      out.time.decode_attention_s += attention;
      out.time.replanning_s += replan;
    }
    // Reloads over the host link overlap the step's GPU work: the step lasts at least as long.
    if (double link = cost.host_link_s(link_bytes); link > step_s) {
      out.time.reload_stall_s += link - step_s;
      step_s = link;
    }
    // A step where every running session waited for its kept counts runs nothing on the GPU:
    // the host only waits for the previous step, already charged.
    if (ran) {
      step_s += ch.step_overhead_s;
      out.time.overhead_s += ch.step_overhead_s;
      out.steps += 1;
    }
    step_index += 1;

    // Parks and restores of this step (admission, decode) over the host link (modelled).
    auto traffic = policy.take_host_traffic();
    double host  = cost.host_link_s(traffic.parked_bytes + traffic.restored_bytes);
    step_s += host;
    out.time.host_transfer_s += host;
    out.parked_bytes += traffic.parked_bytes;
    out.restored_bytes += traffic.restored_bytes;
  }

  /// 5. The step's accounting: reclamation and control plane charged, peaks and areas, the
  /// clock, token latencies, the memory timeline.
  void account_step() {
    auto mem = policy.memory();  // accounting, not engine work: not timed
    // Reclamation happens inside this step's chunks and decode: charged to this step.
    double reclaim = static_cast<double>(mem.reclaim_ops - reclaim_seen) * ch.reclaim_s_per_page;
    reclaim_seen   = mem.reclaim_ops;
    step_s += reclaim;
    out.time.reclamation_s += reclaim;
    // The policy time measured since the last charge: this step's admission, chunks and decode,
    // and what came between the steps (the previous step's ended turns and releases, admission
    // attempts while nothing ran), all on the host's critical path.
    if (ch.control_plane) {
      step_s += control_s - control_charged;
      out.time.control_plane_s += control_s - control_charged;
    }
    control_charged             = control_s;
    out.kv_bytes_allocated_peak = std::max(out.kv_bytes_allocated_peak, mem.allocated_bytes);
    out.kv_bytes_live_peak      = std::max(out.kv_bytes_live_peak, mem.live_bytes);
    out.peak_resident_sessions  = std::max(out.peak_resident_sessions, resident);
    out.peak_running = std::max(out.peak_running, static_cast<std::int32_t>(running.size()));
    resident_area += resident * step_s;
    if (memory_bound) {
      bound_resident_area += resident * step_s;
      bound_s += step_s;
    }
    if (mem.allocated_bytes > 0) util_area += mem.live_bytes / mem.allocated_bytes * step_s;
    seen_area += static_cast<double>(seen_tokens) * step_s;
    live_area += mem.live_bytes * step_s;
    staging_area += mem.staging_bytes * step_s;
    allocated_area += mem.allocated_bytes * step_s;
    held_area += (mem.held_bytes < 0 ? mem.allocated_bytes : mem.held_bytes) * step_s;
    t += step_s;
    prev_step_s = step_s;
    for (auto s : decoders) {  // still running: each produced a token this step
      tbt.add(t - ss_of(s).last_token_s);
      ss_of(s).last_token_s = t;
    }
    for (auto s : first_token_now) {
      auto& ss = ss_of(s);
      if (!ss.ttft_recorded) {
        ss.ttft_recorded = true;
        ttft.push_back(t - ss.ready_s);
      } else {
        tbt.add(t - ss.last_token_s);  // resumed after a preemption: the stall counts
      }
      ss.last_token_s = t;
    }
    timeline.add({t, mem.allocated_bytes, mem.live_bytes, resident});
  }

  /// 6. Finished turns: a session thinks before its next turn, or leaves.
  void end_turns() {
    for (std::size_t i = 0; i < running.size();) {
      std::int32_t s = running[i];
      auto& ss       = ss_of(s);
      if (ss.state != phase::decode || ss.to_decode > 0) {
        ++i;
        continue;
      }
      running.erase(running.begin() + static_cast<std::ptrdiff_t>(i));
      finished_turns += 1;
      out.completed_requests += 1;
      ss.context += turn_of(s).prompt_tokens + ss.answer;
      ss.history += ss.prefilled_this_turn + ss.decoded_this_turn;
      ss.prefilled_this_turn = 0;
      ss.decoded_this_turn   = 0;
      ss.idle_since_s        = t;
      if (ss.turn + 1 < static_cast<std::int32_t>(spec(s).turns.size())) {
        timed(&control_plane_time::end_turn_s, [&] {
          policy.end_turn(s);
          return 0;
        });
        ss.state = phase::thinking;
        thinking.emplace_back(t + turn_of(s).think_s, s);
      } else {
        ss.state = phase::done;
        release_kv(s);
        --active;
      }
    }
  }

  /// The figures of the whole run, after the last releases.
  replay_result summarise() {
    // The last step's ended turns and releases: the run ends when the host is done with them.
    if (ch.control_plane && control_s > control_charged) {
      t += control_s - control_charged;
      out.time.control_plane_s += control_s - control_charged;
    }
    auto end                = policy.memory();  // after the last releases
    out.timeline            = timeline.finish({t, end.allocated_bytes, end.live_bytes, resident});
    out.modelled_makespan_s = t;
    out.mean_resident_sessions = t > 0 ? resident_area / t : 0;
    out.memory_bound_s         = bound_s;
    out.mean_resident_sessions_memory_bound = bound_s > 0 ? bound_resident_area / bound_s : 0;
    out.mean_utilisation       = t > 0 ? util_area / t : 0;
    out.control_plane_us_per_step =
        out.steps > 0 ? control_s * 1e6 / static_cast<double>(out.steps) : 0;
    out.modelled_tokens_per_s    = t > 0 ? static_cast<double>(out.generated_tokens) / t : 0;
    out.modelled_requests_per_s  = t > 0 ? static_cast<double>(out.completed_requests) / t : 0;
    out.modelled_eviction_pass_s = out.time.eviction_pass_s;
    out.modelled_host_transfer_s = out.time.host_transfer_s;
    out.mean_staging_bytes       = t > 0 ? staging_area / t : 0;
    out.mean_allocated_bytes     = t > 0 ? allocated_area / t : 0;
    out.mean_held_bytes          = t > 0 ? held_area / t : 0;
    out.mean_live_bytes          = t > 0 ? live_area / t : 0;
    out.mean_admission_wait_s =
        out.admission_waits > 0 ? wait_total_s / static_cast<double>(out.admission_waits) : 0;
    out.reclaim_ops    = end.reclaim_ops;
    out.released_pages = end.released_pages;
    if (!ttft.empty()) {
      double sum = 0;
      for (double x : ttft) sum += x;
      out.modelled_ttft_mean_s = sum / static_cast<double>(ttft.size());
      std::sort(ttft.begin(), ttft.end());
      out.modelled_ttft_p95_s =
          ttft[static_cast<std::size_t>(0.95 * static_cast<double>(ttft.size() - 1))];
      out.modelled_ttft_p50_s =
          ttft[static_cast<std::size_t>(0.50 * static_cast<double>(ttft.size() - 1))];
    }
    out.modelled_tbt_p50_s = tbt.quantile(0.50);
    out.modelled_tbt_p95_s = tbt.quantile(0.95);
    if (double seen_bytes = seen_area * static_cast<double>(cost.model().kv_bytes_per_token());
        seen_bytes > 0) {
      out.compressed_keep_ratio = live_area / seen_bytes;
      out.stored_keep_ratio     = held_area / seen_bytes;
    }
    if (options.progress) options.progress(1.0);
    return std::move(out);
  }

  step_charges const& ch          = options.charges;
  double control_charged          = 0;  ///< the measured policy time charged so far
  std::int64_t last_progress_step = 0;
  std::int64_t reclaim_seen       = 0;  ///< the policy's reclaim operations already charged
  double prev_step_s = 0;  ///< the previous engine step (overlapped planning hides in it)
  // The step's: token budget left, modelled time, KV bytes read, host-link bytes, any decode.
  std::int64_t budget = 0;
  double step_s = 0, kv_read = 0, link_bytes = 0;
  bool any_decode = false;
  bool ran                = false;  ///< a decode or a chunk ran this step (counted in out.steps)
  std::int64_t step_index = 0;      ///< steps so far, those where nothing ran included
  std::vector<std::int32_t> first_token_now, snapshot, decoders;  // per step; reused
};

}  // namespace detail_replay

/**
 * @brief Replays `work` against `policy`.
 *
 * Scheduling (the same for every policy): continuing turns of resident sessions are admitted
 * first, then new sessions, first come first served; a turn that does not fit blocks the ones
 * behind it. Each step every decoding sequence emits one token and prefill chunks fill the rest
 * of the step's token budget. A running sequence that cannot get memory preempts the most
 * recently admitted other sequence (vLLM's recompute policy). If nothing runs and the next turn
 * still does not fit, the least recently used idle session's KV is dropped (an idle eviction;
 * its history is prefilled again later). A policy whose idle KV is a prefix cache
 * (`kv_policy::idle_kv_is_prefix_cache`, full_kv as vLLM v1) gets no continuation headroom, has
 * idle KV evicted (LRU) before anything is preempted, whenever admission, a chunk or a decode
 * step needs memory; a chunk that does not fit preempts the newest running request, itself
 * included, and a preempted request keeps its KV as cached blocks until they are evicted.
 * @throw invalid_argument for bad options.
 */
inline replay_result replay(workload const& work,
                            kv_policy& policy,
                            cost_model const& cost,
                            replay_options const& options = {}) {
  struct at_least {
    const char* field;
    std::int64_t value, lo;
  };
  for (auto const& c : {at_least{"step_token_budget", options.step_token_budget, 1},
                        at_least{"prefill_chunk", options.prefill_chunk, 1},
                        at_least{"max_running", options.max_running, 1},
                        at_least{"concurrency", options.concurrency, 0}})
    TANGRAM_EXPECTS(c.value >= c.lo,
                    invalid_argument,
                    "replay.",
                    c.field,
                    ": must be >= ",
                    c.lo,
                    ", got ",
                    c.value);
  // The headroom's bound keeps headroom x resident sessions (<= 10^6) from overflowing.
  struct in_range {
    const char* field;
    std::int64_t value, lo, hi;
  };
  for (auto const& c :
       {in_range{"continuation_headroom_tokens",
                 options.continuation_headroom_tokens,
                 0,
                 workload_limits::max_session_tokens},
        in_range{"max_tokens", options.max_tokens, 1, workload_limits::max_tokens},
        in_range{"max_context", options.max_context, 1, workload_limits::max_session_tokens}})
    TANGRAM_EXPECTS(c.value >= c.lo && c.value <= c.hi,
                    invalid_argument,
                    "replay.",
                    c.field,
                    ": must be in [",
                    c.lo,
                    ", ",
                    c.hi,
                    "], got ",
                    c.value);
  options.charges.validate();
  TANGRAM_EXPECTS(
      options.offload.capacity_bytes >= 0 && std::isfinite(options.offload.capacity_bytes),
      invalid_argument,
      "replay.offload.capacity_bytes: must be >= 0, got ",
      options.offload.capacity_bytes);
  TANGRAM_EXPECTS(options.timeline_points >= 2 && options.timeline_points <= 1000000,
                  invalid_argument,
                  "replay.timeline_points: must be in [2, 1000000], got ",
                  options.timeline_points);
  return detail_replay::replay_engine(work, policy, cost, options).run();
}

}  // namespace tangram::sim
