// SPDX-License-Identifier: Apache-2.0
/**
 * @file eval/sim/replay.hpp
 * @brief Replays a multi-turn workload against a KV-memory policy, step by step, the way a
 * continuous-batching engine with chunked prefill would, and reports memory, admission and
 * (modelled) throughput figures.
 *
 * The engine loop is policy-agnostic; policies (eval/sim/policies.hpp) drive the real library
 * objects (pools, page tables, admission) on a simulated memory resource. Time advances by the
 * roofline cost model (eval/sim/cost_model.hpp) plus each policy's `step_charges`: every time
 * figure is modelled, and `replay_result::time` breaks the makespan into its terms. The
 * control-plane time is the wall-clock time actually spent inside policy calls, measured (not
 * added to modelled time).
 *
 * No oracle: a turn reserves `max_tokens` of decode (capped by what the context allows); its
 * answer length comes from the workload, truncated at that reservation, and is decoded until it
 * ends. Every policy sees the same arrivals and answer lengths.
 */
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <deque>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "tangram/core/error.hpp"
#include "tangram/eval/sim/cost_model.hpp"
#include "tangram/eval/sim/log_histogram.hpp"
#include "tangram/eval/sim/measured_costs.hpp"
#include "tangram/eval/sim/workload.hpp"

namespace tangram::sim {

/// @brief Memory accounting a policy reports.
struct policy_memory {
  double allocated_bytes      = 0;  ///< bytes of pages held or reserved for sequences
  double live_bytes           = 0;  ///< bytes of tokens actually stored
  /// Bytes of pages handed out to sequences (page rounding and padding included, reservations
  /// not yet backed by pages excluded); < 0: the same as `allocated_bytes`.
  double held_bytes           = -1;
  std::int64_t reclaim_ops    = 0;  ///< pages freed after eviction (allocate-then-free)
  std::int64_t released_pages = 0;  ///< pages returned when a recompression shrinks a group
  /// Bytes reserved only to stage prefill chunks (elastic reservation: what the prefilling
  /// turns hold beyond their limit and answer), now.
  double staging_bytes = 0;
};

/**
 * @brief What the replay needs from a KV-memory policy. Sessions are identified by their index
 * in the workload. A call that returns false means "no memory now"; the engine then waits
 * (admission) or preempts (running sequences, baselines only).
 */
class kv_policy {
 public:
  virtual ~kv_policy()                           = default;
  [[nodiscard]] virtual std::string name() const = 0;
  /// Starts a turn: `history` tokens already held (0 for a new session or after preemption),
  /// `prompt` new tokens to prefill, up to `max_new` tokens to decode. It must also leave room
  /// for `headroom_tokens` more uncompressed tokens in every page table of the model (the
  /// engine's allowance for resident sessions' next turns). False: does not fit now.
  virtual bool start_turn(std::int32_t session,
                          std::int64_t history,
                          std::int64_t prompt,
                          std::int64_t max_new,
                          std::int64_t headroom_tokens) = 0;
  /// Prefills `tokens` more prompt tokens (one chunk, compressed if the policy compresses).
  virtual bool prefill_chunk(std::int32_t session, std::int64_t tokens) = 0;
  /// HBM bytes the session's last successful `prefill_chunk` moved outside the forward pass (an
  /// unfused eviction pass); the replay charges them at the HBM bandwidth (modelled). Default 0.
  [[nodiscard]] virtual double prefill_chunk_extra_bytes(std::int32_t) const { return 0; }
  /// Appends one decoded token to every session of `sessions` (one engine decode step).
  virtual bool decode(std::vector<std::int32_t> const& sessions) = 0;
  /// The turn's answer is complete; the session keeps its (compressed) history.
  virtual void end_turn(std::int32_t session) = 0;
  /// The session leaves (finished or preempted): everything it holds is returned.
  virtual void release(std::int32_t session) = 0;
  /// Bytes of KV a decode step reads for this session (its live tokens).
  [[nodiscard]] virtual double kv_bytes_read(std::int32_t session) const = 0;
  /// Bytes a decode step reads when it reads whole pages, padding included (charged with
  /// `step_charges::padded_reads`). Default: the live bytes.
  [[nodiscard]] virtual double kv_bytes_read_padded(std::int32_t session) const {
    return kv_bytes_read(session);
  }
  /// Tokens the session's heads hold on average (the "past" its next prefill chunk attends to).
  [[nodiscard]] virtual double attended_tokens(std::int32_t session) const = 0;
  [[nodiscard]] virtual policy_memory memory() const                       = 0;
  /// True when an idle session's KV is an evictable prefix cache (vLLM v1's automatic prefix
  /// caching): when memory is needed, at admission, for a prefill chunk or for a decode step,
  /// the least recently used idle session's KV is dropped before any running sequence is
  /// preempted, and admission keeps no continuation headroom for idle sessions. Default false.
  [[nodiscard]] virtual bool idle_kv_is_prefix_cache() const { return false; }
  /// A prefix cache evicting blocks, not whole sessions (vLLM v1's block pool): drops the last
  /// block (one page of every layer) of an idle session's cached KV and returns the tokens it
  /// still holds (0: nothing left, the replay then releases the session); -1 (the default): the
  /// policy evicts whole sessions only.
  virtual std::int64_t evict_cached_block(std::int32_t /*session*/) { return -1; }
  /// True when a preempted request keeps its KV as cached blocks: it waits first in line holding
  /// them, they are evicted (least recently preempted first) before another request is preempted,
  /// and it resumes where it stopped if they survive. False: a preempted request drops its KV and
  /// recomputes it. Default: as `idle_kv_is_prefix_cache` (vLLM v1 keeps both as cache).
  [[nodiscard]] virtual bool preempted_kv_is_cache() const { return idle_kv_is_prefix_cache(); }
  /// Pages reclaimed so far, as `memory().reclaim_ops` (a policy may answer it more cheaply).
  [[nodiscard]] virtual std::int64_t reclaimed_pages() const { return memory().reclaim_ops; }
  /// Pages in the pool, for utilisation figures.
  [[nodiscard]] virtual double capacity_bytes() const = 0;
  /// Sessions the policy parked in host memory during its calls since the last `take_parked`
  /// (`tangram_policy`: when an answer's growth does not fit). Their KV leaves the GPU and comes
  /// back at their next `start_turn` without recompute: a running turn stops and then resumes
  /// where it was, an idle session's next turn restores it; neither is resident meanwhile.
  /// Default: none.
  virtual std::vector<std::int32_t> take_parked() { return {}; }
  /// Parks idle session `s` in host memory (reported by `take_parked`) instead of having its KV
  /// dropped and recomputed: the replay asks before an idle eviction. Default false (cannot).
  virtual bool park_idle(std::int32_t /*session*/) { return false; }
  /// Bytes copied to host memory by parks and back by restores since the last call; the replay
  /// charges them at the GPU's host-link bandwidth (modelled). Default none.
  struct host_traffic {
    double parked_bytes   = 0;
    double restored_bytes = 0;
  };
  virtual host_traffic take_host_traffic() { return {}; }
};

/**
 * @brief KV offloaded to host memory (vLLM's offloading connector, LMCache): the blocks a
 * prefix-cache policy (`kv_policy::idle_kv_is_prefix_cache`) evicts stay in host memory, up to
 * `capacity_bytes` (when full, the session whose blocks went there longest ago loses all of
 * them), and a session that needs them again reloads them over the host link
 * (`gpu_spec::host_link_bytes_per_s`, uncompressed `kv_bytes_per_token` each) instead of
 * recomputing them. A reload moves up to one prefill chunk of a session per step, outside the
 * step's token budget, overlapped with the step's GPU work: the step lasts at least the transfer.
 */
struct host_offload {
  bool enabled          = false;
  double capacity_bytes = 256e9;  ///< host memory for offloaded KV (DGX H100/H200: 2 TB per 8 GPUs)
};

/// @brief Engine settings of the replay.
struct replay_options {
  std::int64_t step_token_budget = 8192;  ///< tokens per engine step (decode + prefill chunks)
  std::int64_t prefill_chunk     = 8192;  ///< largest prefill chunk of one sequence per step
  std::int32_t max_running       = 1024;  ///< cap on sequences in the batch (vLLM max_num_seqs)
  std::int32_t concurrency       = 0;     ///< closed loop: sessions in the system at once (0: open)
  /// A new session is admitted only if every resident session could still grow by this many
  /// tokens (a follow-up prompt plus its answer), so idle sessions can always continue. Not
  /// applied to policies whose idle KV is a prefix cache (`kv_policy::idle_kv_is_prefix_cache`).
  std::int64_t continuation_headroom_tokens = 1024;
  /// Most points the memory timeline keeps, in [2, 1000000]: however long the run, the replay
  /// holds at most twice this many (see `replay_result::timeline`).
  std::int32_t timeline_points = 400;
  /// Decode tokens a turn reserves at admission (an engine's `max_tokens`; the answer length is
  /// not known in advance): min(max_tokens, max_context - context), at least 1; a turn that
  /// carries its own `turn_spec::max_tokens` uses that instead. 4096: see docs/benchmarks.md.
  std::int64_t max_tokens  = 4096;
  std::int64_t max_context = 131072;  ///< the model's context limit (Llama-3.1: 128K)
  step_charges charges;               ///< costs beyond the roofline (none by default)
  /// Host memory for the blocks a prefix cache evicts (off by default).
  host_offload offload;
  std::function<void(double)> progress;  ///< called with the completed fraction (optional)
  /// Called as each turn becomes ready (optional): the session, the turn, when it became ready
  /// (a first turn in an open loop: its arrival) and the answer it will decode. What the trace
  /// gave this policy, for checking that every policy saw the same arrivals and answers.
  std::function<void(std::int32_t session, std::int32_t turn, double ready_s, std::int64_t answer)> on_turn;
};

/// @brief Where the modelled makespan went; the terms sum to `modelled_makespan_s`.
struct time_breakdown {
  double prefill_s          = 0;  ///< prefill chunks (roofline FLOPs)
  double eviction_pass_s    = 0;  ///< unfused eviction passes (HBM traffic)
  double decode_attention_s = 0;  ///< KV read by decode steps, times the decode skew
  double weights_s          = 0;  ///< weights read by decode steps
  double reclamation_s      = 0;  ///< reclaimed pages x reclaim_s_per_page
  double replanning_s       = 0;  ///< per-step re-planning
  double overhead_s         = 0;  ///< fixed per-step overhead
  double control_plane_s    = 0;  ///< measured policy time, when `step_charges::control_plane`
  double reload_stall_s     = 0;  ///< host-link reloads (full_kv offload) a step's GPU work did not hide
  double host_transfer_s    = 0;  ///< parks and restores over the host link (not overlapped)
  double idle_s             = 0;  ///< nothing to run (waiting for arrivals or think time)
  [[nodiscard]] double sum() const {
    return prefill_s + eviction_pass_s + decode_attention_s + weights_s + reclamation_s +
           replanning_s + overhead_s + control_plane_s + reload_stall_s + host_transfer_s + idle_s;
  }
};

/// @brief One point of the memory timeline.
struct timeline_point {
  double time_s          = 0;
  double allocated_bytes = 0;
  double live_bytes      = 0;
  std::int32_t resident  = 0;
};

/// @brief Results of one policy's replay.
struct replay_result {
  std::string policy;
  std::int32_t peak_resident_sessions =
      0;                                 ///< sessions holding KV at once (running or between turns)
  double mean_resident_sessions    = 0;  ///< time-weighted
  std::int32_t peak_running        = 0;  ///< sequences in one decode batch at once
  double kv_bytes_allocated_peak   = 0;
  double kv_bytes_live_peak        = 0;
  double mean_utilisation          = 0;  ///< time-weighted live / allocated
  double capacity_bytes            = 0;
  std::int64_t admission_waits     = 0;  ///< turns that could not start at once for memory
  double mean_admission_wait_s     = 0;  ///< modelled
  std::int64_t reclaim_ops         = 0;
  std::int64_t released_pages      = 0;
  std::int64_t preemptions         = 0;  ///< running sequences preempted (recompute)
  std::int64_t idle_evictions      = 0;  ///< idle sessions whose KV was dropped to make room
  std::int64_t prefix_blocks_evicted = 0;  ///< tail blocks of idle sessions' cached KV evicted
  std::int64_t recomputed_tokens   = 0;  ///< tokens lost and prefilled again
  /// Sessions parked in host memory (`kv_policy::take_parked`): running turns (`parked_running`)
  /// and idle sessions; `resumes` brought back, the bytes each way, and the host-link time they
  /// cost (modelled, also in `time.host_transfer_s`).
  std::int64_t parks               = 0;
  std::int64_t parked_running      = 0;
  std::int64_t resumes             = 0;
  double parked_bytes              = 0;
  double restored_bytes            = 0;
  double modelled_host_transfer_s  = 0;
  double mean_staging_bytes        = 0;  ///< time-weighted policy_memory::staging_bytes
  /// Time-weighted policy_memory figures (where the bytes go, docs/memory.md): allocated (held
  /// and reserved), held (pages handed out) and live (tokens stored).
  double mean_allocated_bytes = 0, mean_held_bytes = 0, mean_live_bytes = 0;
  std::int64_t rejected_sessions   = 0;  ///< could never fit, even alone
  std::int64_t steps               = 0;
  double control_plane_us_per_step = 0;  ///< measured wall time inside the policy
  double modelled_makespan_s       = 0;
  double modelled_tokens_per_s     = 0;  ///< generated tokens / makespan
  double modelled_ttft_mean_s      = 0;
  double modelled_ttft_p95_s       = 0;
  double modelled_ttft_p50_s       = 0;
  double modelled_tbt_p50_s        = 0;  ///< time between a request's consecutive tokens
  double modelled_tbt_p95_s        = 0;  ///< (from a log histogram: within 1%)
  double modelled_eviction_pass_s  = 0;  ///< step time charged for unfused eviction passes
  std::int64_t generated_tokens    = 0;
  std::int64_t prefilled_tokens    = 0;
  std::int64_t completed_requests  = 0;  ///< turns whose answer finished
  double modelled_requests_per_s   = 0;  ///< completed requests / makespan
  std::int64_t truncated_answers   = 0;  ///< answers cut at the turn's max_tokens reservation
  std::int64_t reserved_decode_tokens = 0;  ///< decode tokens reserved at admission, summed
  /// Keep ratio as compressed: time-weighted live bytes (tokens the compressor kept) over the
  /// bytes the same resident tokens take uncompressed (model_spec::kv_bytes_per_token). 1 for
  /// full_kv; 0 when nothing was ever resident.
  double compressed_keep_ratio = 0;
  /// Keep ratio as stored: time-weighted bytes of pages held (policy_memory::held_bytes: padding
  /// of budgets and page rounding included, unbacked reservations not) over the same
  /// uncompressed bytes.
  double stored_keep_ratio = 0;
  /// Share of the modelled wanted head-tokens (retention samples) the policy's budgets or
  /// selection clipped; set by the caller (`tangram simulate`); none for uncompressed policies.
  std::optional<double> wanted_clipped_fraction;
  /// Host offload (`replay_options::offload`): tokens reloaded over the host link instead of
  /// recomputed, and the most host memory offloaded KV held at once.
  std::int64_t reloaded_tokens   = 0;
  double host_offload_peak_bytes = 0;
  time_breakdown time;                      ///< the makespan by term (modelled)
  /// Memory over time, at most `replay_options::timeline_points` points: one per engine step
  /// while the run is short; in a longer run each point stands for a run of consecutive steps and
  /// carries the largest allocated, live and resident figures of those steps (so every peak
  /// survives thinning) at the time of the run's last step. The last point is the state after the
  /// final releases, at the makespan.
  std::vector<timeline_point> timeline;
};

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
  bool ttft_recorded               = false;
  bool holds_kv                    = false;
  bool parked = false;  ///< its KV is in host memory (kv_policy::take_parked): not resident
  std::int64_t cached = 0;  ///< tokens handed to the policy (prefill chunks, decode appends) it holds
  std::uint64_t admit_seq          = 0;  ///< admission order (preemption picks the latest)

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
  using namespace detail_replay;
  using clock = std::chrono::steady_clock;
  TANGRAM_EXPECTS(options.step_token_budget >= 1,
                  invalid_argument,
                  "replay.step_token_budget: must be >= 1, got ",
                  options.step_token_budget);
  TANGRAM_EXPECTS(options.prefill_chunk >= 1,
                  invalid_argument,
                  "replay.prefill_chunk: must be >= 1, got ",
                  options.prefill_chunk);
  TANGRAM_EXPECTS(options.max_running >= 1,
                  invalid_argument,
                  "replay.max_running: must be >= 1, got ",
                  options.max_running);
  TANGRAM_EXPECTS(options.concurrency >= 0,
                  invalid_argument,
                  "replay.concurrency: must be >= 0, got ",
                  options.concurrency);
  // Bounded so that headroom x resident sessions (<= 10^6) cannot overflow.
  TANGRAM_EXPECTS(options.continuation_headroom_tokens >= 0 &&
                      options.continuation_headroom_tokens <= workload_limits::max_session_tokens,
                  invalid_argument,
                  "replay.continuation_headroom_tokens: must be in [0, ",
                  workload_limits::max_session_tokens,
                  "], got ",
                  options.continuation_headroom_tokens);
  TANGRAM_EXPECTS(options.max_tokens >= 1 && options.max_tokens <= workload_limits::max_tokens,
                  invalid_argument,
                  "replay.max_tokens: must be in [1, ",
                  workload_limits::max_tokens,
                  "], got ",
                  options.max_tokens);
  TANGRAM_EXPECTS(options.max_context >= 1 &&
                      options.max_context <= workload_limits::max_session_tokens,
                  invalid_argument,
                  "replay.max_context: must be in [1, ",
                  workload_limits::max_session_tokens,
                  "], got ",
                  options.max_context);
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

  replay_result out;
  out.policy            = policy.name();
  out.capacity_bytes    = policy.capacity_bytes();
  auto const n_sessions = static_cast<std::int32_t>(work.sessions.size());
  std::vector<session_state> st(static_cast<std::size_t>(n_sessions));
  auto ss_of = [&](std::int32_t s) -> session_state& { return st[static_cast<std::size_t>(s)]; };
  auto spec  = [&](std::int32_t s) -> session_spec const& {
    return work.sessions[static_cast<std::size_t>(s)];
  };
  auto turn_of = [&](std::int32_t s) -> turn_spec const& {
    return spec(s).turns[static_cast<std::size_t>(ss_of(s).turn)];
  };

  std::vector<std::int32_t> by_arrival(static_cast<std::size_t>(n_sessions));
  for (std::int32_t i = 0; i < n_sessions; ++i) by_arrival[static_cast<std::size_t>(i)] = i;
  std::stable_sort(by_arrival.begin(), by_arrival.end(), [&](std::int32_t a, std::int32_t b) {
    return spec(a).arrival_s < spec(b).arrival_s;
  });
  std::int64_t total_turns = 0, finished_turns = 0;
  for (auto const& s : work.sessions) total_turns += static_cast<std::int64_t>(s.turns.size());

  std::deque<std::int32_t> ready_continue;  // next turns of resident sessions
  std::deque<std::int32_t> ready_new;       // first turns (and sessions that lost their KV)
  std::vector<std::int32_t> running;        // prefill or decode, admission order
  std::vector<std::pair<double, std::int32_t>> thinking;  // (wake time, session)
  std::vector<double> ttft;
  log_histogram tbt;  // one sample per token after a request's first: bounded memory
  bool const prefix_cache     = policy.idle_kv_is_prefix_cache();
  bool const keep_preempted   = prefix_cache || policy.preempted_kv_is_cache();
  bool const offload_on       = options.offload.enabled && prefix_cache;
  double const token_bytes    = static_cast<double>(cost.model().kv_bytes_per_token());
  std::int64_t host_tokens    = 0;  // tokens offloaded to host memory (host_offload)
  std::size_t next_arrival    = 0;
  std::uint64_t admit_counter = 0;
  double t = 0, control_s = 0, wait_total_s = 0, resident_area = 0, util_area = 0;
  // Tokens handed to the policy that it still holds (prefill chunks and decode appends of the
  // resident sessions), and its time integral beside the live and held bytes' (the keep ratios).
  std::int64_t seen_tokens = 0;
  double seen_area = 0, live_area = 0, held_area = 0, staging_area = 0, allocated_area = 0;
  auto const forget = [&seen_tokens](session_state& ss) {
    seen_tokens -= ss.cached;
    ss.cached = 0;
  };
  std::int32_t resident = 0;
  std::int32_t active   = 0;  // sessions arrived and not finished (closed-loop concurrency)
  timeline_thinner timeline(options.timeline_points);  // bounded: not one point per step

  auto timed = [&](auto&& fn) {
    auto t0 = clock::now();
    auto r  = fn();
    control_s += std::chrono::duration<double>(clock::now() - t0).count();
    return r;
  };

  // The turn's reservation and answer depend only on the workload and the options, never on the
  // policy: every policy decodes the same answers. A session whose KV was dropped while it
  // thought prefills its history again (context - history).
  auto set_turn = [&](std::int32_t s, std::int32_t turn) {
    auto& ss               = ss_of(s);
    ss.turn                = turn;
    std::int64_t prompt    = turn_of(s).prompt_tokens;
    ss.to_prefill          = prompt + (ss.context - ss.history);
    ss.reserve             = turn_of(s).reservation(options.max_tokens, options.max_context - ss.context - prompt);
    ss.to_decode = std::min(turn_of(s).output_tokens, ss.reserve);
    ss.answer    = ss.to_decode;
    if (ss.to_decode < turn_of(s).output_tokens) out.truncated_answers += 1;
    ss.prefilled_this_turn = 0;
    ss.decoded_this_turn   = 0;
    ss.state               = phase::waiting;
    ss.ready_s             = t;
    ss.waited              = false;
    ss.ttft_recorded       = false;
  };

  // Sends `tokens` evicted tokens of session `s` to host memory (host_offload); when it is full,
  // the session whose blocks went there longest ago loses all of them (recomputed later).
  auto to_host = [&](std::int32_t s, std::int64_t tokens) {
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
  };
  // Evicted tokens of session `s`: to host memory with an offload, else lost (recomputed later).
  auto lose = [&](std::int32_t s, std::int64_t tokens) {
    if (offload_on)
      to_host(s, tokens);
    else
      out.recomputed_tokens += tokens;
  };

  // Drops everything a session holds; its history must be prefilled again (or reloaded).
  auto drop_kv = [&](std::int32_t s) {
    auto& ss = ss_of(s);
    if (!ss.holds_kv) return;
    timed([&] {
      policy.release(s);
      return 0;
    });
    ss.holds_kv = false;
    ss.paused   = false;  // nothing left to resume: the turn starts its prefill again
    if (ss.parked)
      ss.parked = false;  // held in host memory: no longer counted resident
    else
      --resident;
    forget(ss);
    lose(s, ss.history + ss.prefilled_this_turn + ss.decoded_this_turn);
    ss.to_prefill += ss.history + ss.prefilled_this_turn + ss.decoded_this_turn;
    ss.reserve -= ss.decoded_this_turn;  // decoded tokens become prompt; the rest stays reserved
    ss.history             = 0;
    ss.prefilled_this_turn = 0;
    ss.decoded_this_turn   = 0;
  };

  // The most recently admitted running sequence other than `keep` (-1: none).
  auto newest_running = [&](std::int32_t keep) {
    std::int32_t victim = -1;
    for (auto s : running)
      if (s != keep && (victim < 0 || ss_of(s).admit_seq > ss_of(victim).admit_seq)) victim = s;
    return victim;
  };
  // vLLM's recompute preemption of `victim`: it drops its KV and waits first in line. With a
  // prefix cache (vLLM v1), or a policy whose preempted requests keep their KV as cache, its
  // pages become cached blocks instead: it keeps them, evictable (vLLM v1: like an idle
  // session's, most recently used, so last), and resumes where it stopped if they are still
  // there when it is scheduled again; if they were evicted it recomputes them.
  auto preempt = [&](std::int32_t victim) {
    running.erase(std::find(running.begin(), running.end(), victim));
    out.preemptions += 1;
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
  };
  // Preempts the most recently admitted running sequence other than `keep`.
  auto preempt_one = [&](std::int32_t keep) -> bool {
    if (keep < 0 && running.size() < 2) return false;  // a step must keep at least one sequence
    std::int32_t victim = newest_running(keep);
    if (victim < 0) return false;
    preempt(victim);
    return true;
  };
  // Gives up a running session that cannot fit even alone (counted in rejected_sessions).
  auto give_up = [&](std::int32_t s) {
    running.erase(std::find(running.begin(), running.end(), s));
    timed([&] {
      policy.release(s);
      return 0;
    });
    ss_of(s).holds_kv = false;
    --resident;
    forget(ss_of(s));
    host_tokens -= ss_of(s).offloaded;  // its offloaded blocks are of no use any more
    ss_of(s).offloaded = 0;
    out.rejected_sessions += 1;
    finished_turns += static_cast<std::int64_t>(spec(s).turns.size()) - ss_of(s).turn;
    ss_of(s).state = phase::done;
    --active;
  };

  // Sessions the policy parked in host memory: no longer resident; a running turn stops and waits
  // first in line to resume where it was (its KV comes back without recompute).
  auto absorb_parked = [&] {
    for (auto s : policy.take_parked()) {
      auto& ss = ss_of(s);
      TANGRAM_EXPECTS(ss.holds_kv && !ss.parked,
                      logic_error,
                      "replay: ",
                      policy.name(),
                      " parked session ",
                      s,
                      ", which holds no KV on the GPU");
      ss.parked = true;
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
  };

  // Prompt tokens the running sequences still have to prefill: a new turn is admitted only when
  // the next step has token budget left for it (it is scheduled as it is admitted, like vLLM).
  auto prefill_backlog = [&] {
    std::int64_t n = 0;
    for (auto s : running)
      if (ss_of(s).state == phase::prefill) n += ss_of(s).to_prefill;
    return n;
  };
  // Drops a waiting or idle session's KV; a turn waiting among the continuing ones waits among
  // the new ones then (it holds nothing any more).
  auto drop_to_new = [&](std::int32_t victim) {
    drop_kv(victim);
    auto it = std::find(ready_continue.begin(), ready_continue.end(), victim);
    if (it != ready_continue.end()) {
      ready_continue.erase(it);
      ready_new.push_front(victim);
    }
  };
  // Drops the KV of the least recently used idle resident session other than `keep` (thinking,
  // or waiting for its next turn); false when there is none.
  auto evict_idle = [&](std::int32_t keep) -> bool {
    std::int32_t victim = -1;
    for (std::int32_t s = 0; s < n_sessions; ++s) {
      auto const& ss = ss_of(s);
      if (s != keep && ss.holds_kv && !ss.parked && ss.state != phase::prefill &&
          ss.state != phase::decode && (victim < 0 || ss.idle_since_s < ss_of(victim).idle_since_s))
        victim = s;
    }
    if (victim < 0) return false;
    // A policy that parks (tangram) moves the victim's KV to host memory: nothing is recomputed.
    if (!ss_of(victim).paused && timed([&] { return policy.park_idle(victim); })) {
      absorb_parked();
      return true;
    }
    // Block-level prefix cache: the victim's tail block goes, its prefix stays cached; its next
    // turn prefills the evicted tokens again. A preempted (paused) request is dropped whole.
    if (auto& vs = ss_of(victim); !vs.paused && vs.prefilled_this_turn == 0 && vs.decoded_this_turn == 0) {
      std::int64_t left = timed([&] { return policy.evict_cached_block(victim); });
      if (left > 0) {
        std::int64_t evicted = vs.cached - left;
        TANGRAM_EXPECTS(evicted > 0 && evicted <= vs.history, logic_error, "replay: session ", victim,
                        " evicted ", evicted, " cached tokens of ", vs.cached);
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
  };
  // Drops the cached KV of the least recently preempted request other than `keep` that still
  // holds it (a policy whose preempted requests keep their KV as cache); false when there is none.
  auto evict_paused = [&](std::int32_t keep) -> bool {
    std::int32_t victim = -1;
    for (std::int32_t s = 0; s < n_sessions; ++s)
      if (s != keep && ss_of(s).paused && ss_of(s).holds_kv &&
          (victim < 0 || ss_of(s).idle_since_s < ss_of(victim).idle_since_s))
        victim = s;
    if (victim < 0) return false;
    out.idle_evictions += 1;
    drop_to_new(victim);
    return true;
  };
  // Frees memory for a running sequence that needs it: preempt another running sequence, or
  // failing that drop an idle session's KV. With a prefix cache, idle KV goes first (vLLM v1
  // evicts cached blocks before it preempts); a policy whose preempted requests keep their KV as
  // cache drops that cache before it preempts another.
  auto make_room = [&](std::int32_t keep) {
    if (prefix_cache) return evict_idle(keep) || preempt_one(keep);
    if (keep_preempted) return evict_paused(keep) || preempt_one(keep) || evict_idle(-1);
    return preempt_one(keep) || evict_idle(-1);
  };

  auto try_admit = [&](std::deque<std::int32_t>& queue, bool new_sessions) -> bool {
    while (!queue.empty() && static_cast<std::int32_t>(running.size()) < options.max_running &&
           prefill_backlog() + static_cast<std::int64_t>(running.size()) <
               options.step_token_budget) {
      std::int32_t s        = queue.front();
      auto& ss              = ss_of(s);
      std::int64_t headroom =
          new_sessions && !prefix_cache ? options.continuation_headroom_tokens * resident : 0;
      auto start = [&] {
        return timed(
            [&] { return policy.start_turn(s, ss.history, ss.to_prefill, ss.reserve, headroom); });
      };
      bool ok = start();
      // A prefix cache counts idle sessions' blocks as free: evict them (LRU) until it fits.
      while (!ok && prefix_cache && evict_idle(s)) ok = start();
      if (!ok) {
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
  };

  std::int64_t last_progress_step = 0;
  std::int64_t reclaim_seen       = 0;  // the policy's reclaim operations already charged
  double prev_step_s = 0;  // the previous engine step (overlapped planning hides in it)
  std::vector<std::int32_t> first_token_now, snapshot, decoders;  // per step; reused
  while (finished_turns < total_turns) {
    // 1. Arrivals and think timers that are due.
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

    double const control_at_start = control_s;  // this iteration's policy time starts here
    // 2. Admission: continuing turns first; new sessions only behind them.
    if (try_admit(ready_continue, false)) try_admit(ready_new, true);

    if (running.empty()) {
      double next = std::numeric_limits<double>::infinity();
      if (next_arrival < by_arrival.size() &&
          (options.concurrency == 0 || active < options.concurrency))
        next = spec(by_arrival[next_arrival]).arrival_s;
      for (auto const& th : thinking) next = std::min(next, th.first);
      if (std::isfinite(next) && (ready_continue.empty() && ready_new.empty())) {
        resident_area += resident * std::max(0.0, next - t);
        out.time.idle_s += std::max(0.0, next - t);
        t = std::max(t, next);
        continue;
      }
      // Turns wait and nothing runs: free memory held by idle sessions (LRU), or give up on a
      // turn that cannot fit even on an empty GPU.
      if (evict_idle(-1)) continue;
      if (!ready_continue.empty() || !ready_new.empty()) {
        auto& queue    = ready_continue.empty() ? ready_new : ready_continue;
        std::int32_t s = queue.front();
        queue.pop_front();
        host_tokens -= ss_of(s).offloaded;
        ss_of(s).offloaded = 0;
        out.rejected_sessions += 1;
        finished_turns += static_cast<std::int64_t>(spec(s).turns.size()) - ss_of(s).turn;
        ss_of(s).state = phase::done;
        --active;
        continue;
      }
      if (!std::isfinite(next)) break;
      continue;
    }

    // 3. One engine step.
    auto const& ch      = options.charges;
    std::int64_t budget = options.step_token_budget;
    double step_s = 0, kv_read = 0, link_bytes = 0;
    bool any_decode = false;
    first_token_now.clear();
    snapshot.assign(running.begin(), running.end());
    auto is_running = [&](std::int32_t s) {
      return std::find(running.begin(), running.end(), s) != running.end();
    };
    decoders.clear();
    for (auto s : running)
      if (ss_of(s).state == phase::decode) decoders.push_back(s);
    // One decode step; sessions the policy parked to make room stop (they decode nothing now).
    auto decode_once = [&] {
      bool ok = timed([&] { return policy.decode(decoders); });
      absorb_parked();
      decoders.erase(
          std::remove_if(
              decoders.begin(), decoders.end(), [&](std::int32_t s) { return !is_running(s); }),
          decoders.end());
      return ok;
    };
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
      budget -= 1;
      ss.decoded_this_turn += 1;
      ss.cached += 1;
      seen_tokens += 1;
      ss.to_decode -= 1;
      out.generated_tokens += 1;
    }
    for (auto s : snapshot) {
      auto& ss = ss_of(s);
      // Offloaded tokens come first in the prompt and are reloaded, outside the token budget.
      std::int64_t reload = offload_on ? std::min(ss.offloaded, options.prefill_chunk) : 0;
      if (ss.state != phase::prefill || (budget <= 0 && reload == 0) || !is_running(s)) continue;
      std::int64_t compute = std::min({ss.to_prefill - reload,
                                       std::max<std::int64_t>(budget, 0),
                                       options.prefill_chunk - reload});
      std::int64_t chunk   = reload + compute;
      if (chunk == 0) continue;
      std::int64_t reclaimed_before =
          ch.reclaim_prefill_fraction > 0 ? policy.reclaimed_pages() : 0;
      double past = policy.attended_tokens(s);
      bool ok     = false;
      while (!(ok = timed([&] { return policy.prefill_chunk(s, chunk); }))) {
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
    std::int64_t decoding = 0;
    for (auto s : running)
      if (ss_of(s).state == phase::decode) {
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
      step_s += weights + attention + replan;
      out.time.weights_s += weights;
      out.time.decode_attention_s += attention;
      out.time.replanning_s += replan;
    }
    // Reloads over the host link overlap the step's GPU work: the step lasts at least as long.
    if (double link = cost.host_link_s(link_bytes); link > step_s) {
      out.time.reload_stall_s += link - step_s;
      step_s = link;
    }
    step_s += ch.step_overhead_s;
    out.time.overhead_s += ch.step_overhead_s;
    out.steps += 1;

    // Parks and restores of this step (admission, decode) over the host link (modelled).
    auto traffic = policy.take_host_traffic();
    double host  = cost.host_link_s(traffic.parked_bytes + traffic.restored_bytes);
    step_s += host;
    out.time.host_transfer_s += host;
    out.parked_bytes += traffic.parked_bytes;
    out.restored_bytes += traffic.restored_bytes;

    auto mem                    = policy.memory();  // accounting, not engine work: not timed
    // Reclamation happens inside this step's chunks and decode: charged to this step.
    double reclaim = static_cast<double>(mem.reclaim_ops - reclaim_seen) * ch.reclaim_s_per_page;
    reclaim_seen   = mem.reclaim_ops;
    step_s += reclaim;
    out.time.reclamation_s += reclaim;
    if (ch.control_plane) {  // admission, chunks and decode of this step, as measured
      step_s += control_s - control_at_start;
      out.time.control_plane_s += control_s - control_at_start;
    }
    out.kv_bytes_allocated_peak = std::max(out.kv_bytes_allocated_peak, mem.allocated_bytes);
    out.kv_bytes_live_peak      = std::max(out.kv_bytes_live_peak, mem.live_bytes);
    out.peak_resident_sessions  = std::max(out.peak_resident_sessions, resident);
    out.peak_running = std::max(out.peak_running, static_cast<std::int32_t>(running.size()));
    resident_area += resident * step_s;
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

    // 4. Finished turns.
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
        timed([&] {
          policy.end_turn(s);
          return 0;
        });
        ss.state = phase::thinking;
        thinking.emplace_back(t + turn_of(s).think_s, s);
      } else {
        ss.state = phase::done;
        timed([&] {
          policy.release(s);
          return 0;
        });
        ss.holds_kv = false;
        --resident;
        forget(ss);
        --active;
      }
    }
    if (options.progress && out.steps - last_progress_step >= 512) {
      last_progress_step = out.steps;
      options.progress(static_cast<double>(finished_turns) / static_cast<double>(total_turns));
    }
  }

  auto end                   = policy.memory();  // after the last releases
  out.timeline               = timeline.finish({t, end.allocated_bytes, end.live_bytes, resident});
  out.modelled_makespan_s    = t;
  out.mean_resident_sessions = t > 0 ? resident_area / t : 0;
  out.mean_utilisation       = t > 0 ? util_area / t : 0;
  out.control_plane_us_per_step =
      out.steps > 0 ? control_s * 1e6 / static_cast<double>(out.steps) : 0;
  out.modelled_tokens_per_s = t > 0 ? static_cast<double>(out.generated_tokens) / t : 0;
  out.modelled_requests_per_s =
      t > 0 ? static_cast<double>(out.completed_requests) / t : 0;
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
  if (double seen_bytes = seen_area * static_cast<double>(cost.model().kv_bytes_per_token()); seen_bytes > 0) {
    out.compressed_keep_ratio = live_area / seen_bytes;
    out.stored_keep_ratio     = held_area / seen_bytes;
  }
  if (options.progress) options.progress(1.0);
  return out;
}

}  // namespace tangram::sim
