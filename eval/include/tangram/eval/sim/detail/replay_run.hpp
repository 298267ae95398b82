// SPDX-License-Identifier: Apache-2.0
/**
 * @file eval/sim/detail/replay_run.hpp
 * @brief The state of one replay (eval/sim/replay.hpp) and what acts on it between engine steps:
 * turns starting, admission, and making room (preemption, idle eviction, host offload, parks).
 * `replay_engine` (eval/sim/replay.hpp) adds the step itself.
 */
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <utility>
#include <vector>

#include "tangram/core/error.hpp"
#include "tangram/eval/sim/cost_model.hpp"
#include "tangram/eval/sim/log_histogram.hpp"
#include "tangram/eval/sim/replay_types.hpp"
#include "tangram/eval/sim/workload.hpp"

namespace tangram::sim {

namespace detail_replay {

enum class phase : std::uint8_t { pending, waiting, prefill, decode, thinking, done };

struct session_state {
  phase state                      = phase::pending;
  std::int32_t turn                = 0;
  std::int64_t history             = 0;  ///< tokens of finished turns the session holds
  std::int64_t to_prefill          = 0;  ///< tokens of this turn not yet prefilled
  std::int64_t to_decode           = 0;  ///< answer tokens not yet produced
  std::int64_t prefilled_this_turn = 0;
  std::int64_t decoded_this_turn   = 0;
  std::int64_t context             = 0;  ///< tokens of finished turns (prompts and answers)
  std::int64_t reserve             = 0;  ///< decode tokens this turn reserves (max_new)
  std::int64_t answer              = 0;  ///< this turn's answer length (after truncation)
  double ready_s                   = 0;  ///< when the current turn became ready
  double idle_since_s              = 0;  ///< when it last stopped running (LRU eviction)
  double last_token_s              = 0;  ///< when it last produced a token (time between tokens)
  bool waited                      = false;
  bool paused = false;  ///< preempted with its KV kept as a prefix cache (resumes where it was)
  bool ttft_recorded = false;
  bool holds_kv      = false;
  bool parked        = false;  ///< its KV is in host memory (kv_policy::take_parked): not resident
  std::int64_t cached =
      0;  ///< tokens handed to the policy (prefill chunks, decode appends) it holds
  std::uint64_t admit_seq = 0;  ///< admission order (preemption picks the latest)
  /// The step it sits out: its last chunk's kept counts are still on their way to the host
  /// (replay_options::counts); -1: none.
  std::int64_t counts_wait_step = -1;

  /// Tokens in host memory (host_offload): the first ones of `to_prefill`, reloaded, not
  /// recomputed; when its blocks last went there (host LRU).
  std::int64_t offloaded = 0;
  double offloaded_at    = 0;
};

/**
 * @brief Bounded memory timeline: steps are added one by one and merged into runs of `stride`
 * consecutive steps (each field the maximum of the run, time of its last step); when the buffer
 * reaches twice the cap, neighbouring points merge pairwise and the stride doubles. Holds at most
 * `2 * cap` points, whatever the number of steps.
 */
class timeline_thinner {
 public:
  /// @param cap points `finish` returns at most (>= 2; `replay` validates it).
  explicit timeline_thinner(std::int32_t cap) : cap_(static_cast<std::size_t>(cap)) {
    points_.reserve(2 * cap_);
  }

  void add(timeline_point const& p) {
    if (pending_steps_ == 0)
      pending_ = p;
    else
      merge(pending_, p);
    if (++pending_steps_ < stride_) return;
    points_.push_back(pending_);
    pending_steps_ = 0;
    if (points_.size() >= 2 * cap_) {
      merge_groups(2);
      stride_ *= 2;
    }
  }

  /// Points held now (at most `2 * cap`).
  [[nodiscard]] std::size_t size() const noexcept { return points_.size() + (pending_steps_ > 0); }

  /// The timeline: at most `cap - 1` merged points of the steps, then `last` as it is.
  std::vector<timeline_point> finish(timeline_point const& last) {
    if (pending_steps_ > 0) points_.push_back(pending_);
    pending_steps_   = 0;
    std::size_t keep = cap_ - 1;
    if (points_.size() > keep) merge_groups((points_.size() + keep - 1) / keep);
    points_.push_back(last);
    return std::move(points_);
  }

 private:
  static void merge(timeline_point& into, timeline_point const& later) {
    into.time_s          = later.time_s;
    into.allocated_bytes = std::max(into.allocated_bytes, later.allocated_bytes);
    into.live_bytes      = std::max(into.live_bytes, later.live_bytes);
    into.resident        = std::max(into.resident, later.resident);
  }
  // Merges each group of `k` consecutive points (the last group may be shorter) into one.
  void merge_groups(std::size_t k) {
    std::size_t out = 0;
    for (std::size_t i = 0; i < points_.size(); i += k) {
      timeline_point m = points_[i];
      for (std::size_t j = i + 1; j < std::min(i + k, points_.size()); ++j) merge(m, points_[j]);
      points_[out++] = m;
    }
    points_.resize(out);
  }

  std::size_t cap_;
  std::vector<timeline_point> points_;
  timeline_point pending_;
  std::int64_t pending_steps_ = 0;
  std::int64_t stride_        = 1;
};

/// @brief One replay's state: the sessions, queues, clock and running figures, and the moves
/// between steps (admission, preemption, eviction); `replay_engine` runs the steps over it.
class replay_run {
 public:
  using clock = std::chrono::steady_clock;

  /// Options validated (`replay`); all four outlive the run.
  replay_run(workload const& work_in,
             kv_policy& policy_in,
             cost_model const& cost_in,
             replay_options const& options_in)
      : work(work_in),
        policy(policy_in),
        cost(cost_in),
        options(options_in),
        timeline(options_in.timeline_points) {
    out.policy         = policy.name();
    out.capacity_bytes = policy.capacity_bytes();
    n_sessions         = static_cast<std::int32_t>(work.sessions.size());
    st.resize(static_cast<std::size_t>(n_sessions));
    by_arrival.resize(static_cast<std::size_t>(n_sessions));
    for (std::int32_t i = 0; i < n_sessions; ++i) by_arrival[static_cast<std::size_t>(i)] = i;
    std::stable_sort(by_arrival.begin(), by_arrival.end(), [&](std::int32_t a, std::int32_t b) {
      return spec(a).arrival_s < spec(b).arrival_s;
    });
    for (auto const& s : work.sessions) total_turns += static_cast<std::int64_t>(s.turns.size());
    prefix_cache   = policy.idle_kv_is_prefix_cache();
    keep_preempted = prefix_cache || policy.preempted_kv_is_cache();
    offload_on     = options.offload.enabled && prefix_cache;
    counts_from_gpu = policy.kept_counts_from_gpu();
    token_bytes    = static_cast<double>(cost.model().kv_bytes_per_token());
  }

  session_state& ss_of(std::int32_t s) { return st[static_cast<std::size_t>(s)]; }
  session_spec const& spec(std::int32_t s) const {
    return work.sessions[static_cast<std::size_t>(s)];
  }
  turn_spec const& turn_of(std::int32_t s) {
    return spec(s).turns[static_cast<std::size_t>(ss_of(s).turn)];
  }
  void forget(session_state& ss) {
    seen_tokens -= ss.cached;
    ss.cached = 0;
  }

  /// The control plane's clock (replay_options::control_clock, else the steady clock), seconds.
  double now_s() const {
    if (options.control_clock) return options.control_clock();
    return std::chrono::duration<double>(clock::now().time_since_epoch()).count();
  }

  /// Runs a policy call and adds its wall time to the control plane, total and `into` (one of
  /// out.control_plane's terms).
  template <class Fn>
  auto timed(double control_plane_time::*into, Fn&& fn) {
    const double t0 = now_s();
    auto r          = fn();
    const double d  = now_s() - t0;
    control_s += d;
    out.control_plane.*into += d;
    return r;
  }

  // The turn's reservation and answer depend only on the workload and the options, never on the
  // policy: every policy decodes the same answers. A session whose KV was dropped while it
  // thought prefills its history again (context - history).
  void set_turn(std::int32_t s, std::int32_t turn) {
    auto& ss            = ss_of(s);
    ss.turn             = turn;
    std::int64_t prompt = turn_of(s).prompt_tokens;
    ss.to_prefill       = prompt + (ss.context - ss.history);
    ss.reserve =
        turn_of(s).reservation(options.max_tokens, options.max_context - ss.context - prompt);
    ss.to_decode = std::min(turn_of(s).output_tokens, ss.reserve);
    ss.answer    = ss.to_decode;
    if (ss.to_decode < turn_of(s).output_tokens) out.truncated_answers += 1;
    ss.prefilled_this_turn = 0;
    ss.decoded_this_turn   = 0;
    ss.state               = phase::waiting;
    ss.ready_s             = t;
    ss.waited              = false;
    ss.ttft_recorded       = false;
  }

  // Sends `tokens` evicted tokens of session `s` to host memory (host_offload); when it is full,
  // the session whose blocks went there longest ago loses all of them (recomputed later).
  void to_host(std::int32_t s, std::int64_t tokens) {
    auto& ss = ss_of(s);
    ss.offloaded += tokens;
    ss.offloaded_at = t;
    host_tokens += tokens;
    while (static_cast<double>(host_tokens) * token_bytes > options.offload.capacity_bytes) {
      std::int32_t victim = -1;
      for (std::int32_t v = 0; v < n_sessions; ++v)
        if (ss_of(v).offloaded > 0 &&
            (victim < 0 || ss_of(v).offloaded_at < ss_of(victim).offloaded_at))
          victim = v;
      auto& vs = ss_of(victim);
      out.recomputed_tokens += vs.offloaded;
      host_tokens -= vs.offloaded;
      vs.offloaded = 0;
    }
    out.host_offload_peak_bytes =
        std::max(out.host_offload_peak_bytes, static_cast<double>(host_tokens) * token_bytes);
  }
  // Evicted tokens of session `s`: to host memory with an offload, else lost (recomputed later).
  void lose(std::int32_t s, std::int64_t tokens) {
    if (offload_on)
      to_host(s, tokens);
    else
      out.recomputed_tokens += tokens;
  }

  // Returns the KV session s holds (on the GPU or parked) to the policy; false: it held none.
  bool release_kv(std::int32_t s) {
    auto& ss = ss_of(s);
    if (!ss.holds_kv) return false;
    timed(&control_plane_time::release_s, [&] {
      policy.release(s);
      return 0;
    });
    ss.holds_kv         = false;
    ss.paused           = false;  // nothing left to resume: a next start prefills again
    if (ss.counts_wait_step >= 0) {  // nothing left whose counts matter
      ss.counts_wait_step = -1;
      counts_in_flight.erase(std::find(counts_in_flight.begin(), counts_in_flight.end(), s));
    }
    if (ss.parked)
      ss.parked = false;  // held in host memory: no longer counted resident
    else
      --resident;
    forget(ss);
    return true;
  }

  // Drops everything a session holds; its history must be prefilled again (or reloaded).
  void drop_kv(std::int32_t s) {
    if (!release_kv(s)) return;
    auto& ss = ss_of(s);
    lose(s, ss.history + ss.prefilled_this_turn + ss.decoded_this_turn);
    ss.to_prefill += ss.history + ss.prefilled_this_turn + ss.decoded_this_turn;
    ss.reserve -= ss.decoded_this_turn;  // decoded tokens become prompt; the rest stays reserved
    ss.history             = 0;
    ss.prefilled_this_turn = 0;
    ss.decoded_this_turn   = 0;
  }

  // The most recently admitted running sequence other than `keep` (-1: none).
  std::int32_t newest_running(std::int32_t keep) {
    std::int32_t victim = -1;
    for (auto s : running)
      if (s != keep && (victim < 0 || ss_of(s).admit_seq > ss_of(victim).admit_seq)) victim = s;
    return victim;
  }
  // vLLM's recompute preemption of `victim`: it drops its KV and waits first in line. With a
  // prefix cache (vLLM v1), or a policy whose preempted requests keep their KV as cache, its
  // pages become cached blocks instead: it keeps them, evictable (vLLM v1: like an idle
  // session's, most recently used, so last), and resumes where it stopped if they are still
  // there when it is scheduled again; if they were evicted it recomputes them.
  void preempt(std::int32_t victim) {
    running.erase(std::find(running.begin(), running.end(), victim));
    out.preemptions += 1;
    memory_bound = true;
    auto& ss = ss_of(victim);
    if (keep_preempted) {
      ss.paused       = true;
      ss.idle_since_s = t;
      ss.state        = phase::waiting;
      ready_continue.push_front(victim);  // first in line, holding its KV
      return;
    }
    drop_kv(victim);
    ss.state = phase::waiting;
    ready_new.push_front(victim);  // first in line once memory frees up
  }
  // Preempts the most recently admitted running sequence other than `keep`.
  bool preempt_one(std::int32_t keep) {
    if (keep < 0 && running.size() < 2) return false;  // a step must keep at least one sequence
    std::int32_t victim = newest_running(keep);
    if (victim < 0) return false;
    preempt(victim);
    return true;
  }
  // Gives up a running session that cannot fit even alone (counted in rejected_sessions).
  void give_up(std::int32_t s) {
    memory_bound = true;
    running.erase(std::find(running.begin(), running.end(), s));
    reject(s);
  }
  // Gives up session s (not running): what it holds is released, its turns count as finished
  // (counted in rejected_sessions).
  void reject(std::int32_t s) {
    release_kv(s);
    host_tokens -= ss_of(s).offloaded;  // its offloaded blocks are of no use any more
    ss_of(s).offloaded = 0;
    out.rejected_sessions += 1;
    finished_turns += static_cast<std::int64_t>(spec(s).turns.size()) - ss_of(s).turn;
    ss_of(s).state = phase::done;
    --active;
  }

  // Sessions the policy parked in host memory: no longer resident; a running turn stops and waits
  // first in line to resume where it was (its KV comes back without recompute).
  void absorb_parked() {
    for (auto s : policy.take_parked()) {
      auto& ss = ss_of(s);
      TANGRAM_EXPECTS(ss.holds_kv && !ss.parked,
                      logic_error,
                      "replay: ",
                      policy.name(),
                      " parked session ",
                      s,
                      ", which holds no KV on the GPU");
      ss.parked    = true;
      memory_bound = true;
      --resident;
      out.parks += 1;
      auto it = std::find(running.begin(), running.end(), s);
      if (it == running.end()) continue;
      running.erase(it);
      out.parked_running += 1;
      ss.paused = true;
      ss.state  = phase::waiting;
      ready_continue.push_front(s);
    }
  }

  // Prompt tokens the running sequences still have to prefill: a new turn is admitted only when
  // the next step has token budget left for it (it is scheduled as it is admitted, like vLLM).
  std::int64_t prefill_backlog() {
    std::int64_t n = 0;
    for (auto s : running)
      if (ss_of(s).state == phase::prefill) n += ss_of(s).to_prefill;
    return n;
  }
  // Drops a waiting or idle session's KV; a turn waiting among the continuing ones waits among
  // the new ones then (it holds nothing any more).
  void drop_to_new(std::int32_t victim) {
    drop_kv(victim);
    auto it = std::find(ready_continue.begin(), ready_continue.end(), victim);
    if (it != ready_continue.end()) {
      ready_continue.erase(it);
      ready_new.push_front(victim);
    }
  }
  // Drops the KV of the least recently used idle resident session other than `keep` (thinking,
  // or waiting for its next turn); false when there is none.
  bool evict_idle(std::int32_t keep) {
    std::int32_t victim = -1;
    for (std::int32_t s = 0; s < n_sessions; ++s) {
      auto const& ss = ss_of(s);
      if (s != keep && ss.holds_kv && !ss.parked && ss.state != phase::prefill &&
          ss.state != phase::decode && (victim < 0 || ss.idle_since_s < ss_of(victim).idle_since_s))
        victim = s;
    }
    if (victim < 0) return false;
    memory_bound = true;
    // A policy that parks (tangram) moves the victim's KV to host memory: nothing is recomputed.
    if (!ss_of(victim).paused &&
        timed(&control_plane_time::park_idle_s, [&] { return policy.park_idle(victim); })) {
      absorb_parked();
      return true;
    }
    // Block-level prefix cache: the victim's tail block goes, its prefix stays cached; its next
    // turn prefills the evicted tokens again. A preempted (paused) request is dropped whole.
    if (auto& vs = ss_of(victim);
        !vs.paused && vs.prefilled_this_turn == 0 && vs.decoded_this_turn == 0) {
      std::int64_t left = timed(&control_plane_time::evict_cached_s,
                                [&] { return policy.evict_cached_block(victim); });
      if (left > 0) {
        std::int64_t evicted = vs.cached - left;
        TANGRAM_EXPECTS(evicted > 0 && evicted <= vs.history,
                        logic_error,
                        "replay: session ",
                        victim,
                        " evicted ",
                        evicted,
                        " cached tokens of ",
                        vs.cached);
        out.prefix_blocks_evicted += 1;
        lose(victim, evicted);
        seen_tokens -= evicted;
        vs.cached -= evicted;
        vs.history -= evicted;
        if (vs.state == phase::waiting) vs.to_prefill += evicted;
        return true;
      }
      if (left == 0) out.prefix_blocks_evicted += 1;
    }
    out.idle_evictions += 1;
    drop_to_new(victim);
    return true;
  }
  // Drops the cached KV of the least recently preempted request other than `keep` that still
  // holds it (a policy whose preempted requests keep their KV as cache); false when there is none.
  bool evict_paused(std::int32_t keep) {
    std::int32_t victim = -1;
    for (std::int32_t s = 0; s < n_sessions; ++s)
      if (s != keep && ss_of(s).paused && ss_of(s).holds_kv &&
          (victim < 0 || ss_of(s).idle_since_s < ss_of(victim).idle_since_s))
        victim = s;
    if (victim < 0) return false;
    memory_bound = true;
    out.idle_evictions += 1;
    drop_to_new(victim);
    return true;
  }
  // Frees memory for a running sequence that needs it: preempt another running sequence, or
  // failing that drop an idle session's KV. With a prefix cache, idle KV goes first (vLLM v1
  // evicts cached blocks before it preempts); a policy whose preempted requests keep their KV as
  // cache drops that cache before it preempts another.
  bool make_room(std::int32_t keep) {
    if (prefix_cache) return evict_idle(keep) || preempt_one(keep);
    if (keep_preempted) return evict_paused(keep) || preempt_one(keep) || evict_idle(-1);
    return preempt_one(keep) || evict_idle(-1);
  }

  bool try_admit(std::deque<std::int32_t>& queue, bool new_sessions) {
    while (!queue.empty() && static_cast<std::int32_t>(running.size()) < options.max_running &&
           prefill_backlog() + static_cast<std::int64_t>(running.size()) <
               options.step_token_budget) {
      std::int32_t s = queue.front();
      auto& ss       = ss_of(s);
      std::int64_t headroom =
          new_sessions && !prefix_cache ? options.continuation_headroom_tokens * resident : 0;
      auto start = [&] {
        return timed(&control_plane_time::admission_s, [&] {
          return policy.start_turn(s, ss.history, ss.to_prefill, ss.reserve, headroom);
        });
      };
      bool ok = start();
      absorb_parked();  // sessions the policy parked to make room for this turn
      // A prefix cache counts idle sessions' blocks as free: evict them (LRU) until it fits.
      while (!ok && prefix_cache && evict_idle(s)) ok = start();
      if (!ok) {
        memory_bound = true;
        if (!ss.waited && !ss.paused) {
          ss.waited = true;
          out.admission_waits += 1;
        }
        return false;
      }
      queue.pop_front();
      ss.admit_seq = ++admit_counter;
      running.push_back(s);
      if (ss.parked) {  // its KV is back from host memory
        ss.parked = false;
        ++resident;
        out.resumes += 1;
      }
      if (ss.paused) {  // resumes its turn where the preemption stopped it
        ss.paused = false;
        ss.state  = ss.to_prefill > 0 ? phase::prefill : phase::decode;
        continue;
      }
      out.reserved_decode_tokens += ss.reserve;
      if (ss.waited) wait_total_s += t - ss.ready_s;
      if (!ss.holds_kv) {
        ss.holds_kv = true;
        ++resident;
      }
      ss.state = phase::prefill;
    }
    return true;
  }

  workload const& work;
  kv_policy& policy;
  cost_model const& cost;
  replay_options const& options;
  replay_result out;
  std::int32_t n_sessions = 0;
  std::vector<session_state> st;
  std::vector<std::int32_t> by_arrival;
  std::int64_t total_turns = 0, finished_turns = 0;
  std::deque<std::int32_t> ready_continue;  // next turns of resident sessions
  std::deque<std::int32_t> ready_new;       // first turns (and sessions that lost their KV)
  std::vector<std::int32_t> running;        // prefill or decode, admission order
  std::vector<std::pair<double, std::int32_t>> thinking;  // (wake time, session)
  std::vector<double> ttft;
  log_histogram tbt;  // one sample per token after a request's first: bounded memory
  bool prefix_cache           = false;
  bool keep_preempted         = false;
  bool offload_on             = false;
  bool counts_from_gpu        = false;  // kv_policy::kept_counts_from_gpu
  /// Sessions whose last chunk's kept counts are on their way to the host (counts_wait_step set).
  std::vector<std::int32_t> counts_in_flight;
  double token_bytes          = 0;
  std::int64_t host_tokens    = 0;  // tokens offloaded to host memory (host_offload)
  std::size_t next_arrival    = 0;
  std::uint64_t admit_counter = 0;
  double t = 0, control_s = 0, wait_total_s = 0, resident_area = 0, util_area = 0;
  // Memory bound this iteration (`memory_bound`: a turn did not fit at admission, or a sequence
  // was preempted, idle KV evicted, a session parked or given up for memory), the resident
  // sessions' time integral over such steps, and their modelled time.
  bool memory_bound          = false;
  double bound_resident_area = 0, bound_s = 0;
  // Tokens handed to the policy that it still holds (prefill chunks and decode appends of the
  // resident sessions), and its time integral beside the live and held bytes' (the keep ratios).
  std::int64_t seen_tokens = 0;
  double seen_area = 0, live_area = 0, held_area = 0, staging_area = 0, allocated_area = 0;
  std::int32_t resident = 0;
  std::int32_t active   = 0;  // sessions arrived and not finished (closed-loop concurrency)
  timeline_thinner timeline;  // bounded: not one point per step
};

}  // namespace detail_replay

}  // namespace tangram::sim
