// SPDX-License-Identifier: Apache-2.0
/**
 * @file eval/sim/replay_types.hpp
 * @brief What the replay (eval/sim/replay.hpp) and a KV-memory policy share: the policy interface
 * (`kv_policy`) and its memory accounting, the engine settings (`replay_options`) and the figures
 * a replay reports (`replay_result`).
 */
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "tangram/eval/sim/cost_model.hpp"
#include "tangram/eval/sim/measured_costs.hpp"

namespace tangram::sim {

/// @brief Memory accounting a policy reports.
struct policy_memory {
  double allocated_bytes = 0;  ///< bytes of pages held or reserved for sequences
  double live_bytes      = 0;  ///< bytes of tokens actually stored
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
 * @brief When the host learns a chunk's kept counts from the GPU
 * (`kv_policy::kept_counts_from_gpu`).
 */
enum class counts_arrival : std::uint8_t {
  /// The engine loop of docs/integration.md with no host-device synchronisation: the GPU runs one
  /// step behind the host and the counts come back by an asynchronous copy, so the session sits
  /// out the step after each such chunk (no chunk, no decode) and runs again the step after.
  next_step,
  /// The next step already knows them: a host synchronisation per chunk or a device-side commit
  /// of the counts (neither is charged here; issue 29 item 7 has no device-side commit built).
  at_once,
};

constexpr std::string_view to_string(counts_arrival c) noexcept {
  return c == counts_arrival::next_step ? "next-step" : "at-once";
}

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
  /// for `headroom_tokens` more uncompressed tokens in every page table of the model that grows
  /// with the context (`grows_with_context`: not one of sliding-window rings only), the engine's
  /// allowance for resident sessions' next turns. False: does not fit now.
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
  /// True when a compressed chunk's kept counts are chosen on the GPU from the scores (a dynamic
  /// compressor: elastic reservation, reclamation of a chunk's tail) and the host needs them
  /// before the session's next chunk or decode step (to free or return pages, to place the next
  /// tokens). The replay then applies `replay_options::counts`. Default false (counts known in
  /// advance: static budgets, no compression).
  [[nodiscard]] virtual bool kept_counts_from_gpu() const { return false; }
  /// Before the replay's first call: when the counts arrive. With counts_arrival::next_step a
  /// policy that frees pages by its kept counts holds them until `counts_arrived`. Default:
  /// nothing.
  virtual void begin_replay(counts_arrival /*counts*/) {}
  /// The kept counts of `session`'s last chunk reached the host (counts_arrival::next_step: the
  /// replay calls it before admission of the second step after the chunk, or when the GPU went
  /// idle): what was held for them may go. Default: nothing.
  virtual void counts_arrived(std::int32_t /*session*/) {}
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
  /// When a dynamic compressor's kept counts reach the host (`counts_arrival`); every policy
  /// whose counts come from the GPU pays the same.
  counts_arrival counts = counts_arrival::next_step;
  std::function<void(double)> progress;  ///< called with the completed fraction (optional)
  /// Called as each turn becomes ready (optional): the session, the turn, when it became ready
  /// (a first turn in an open loop: its arrival) and the answer it will decode. What the trace
  /// gave this policy, for checking that every policy saw the same arrivals and answers.
  std::function<void(std::int32_t session, std::int32_t turn, double ready_s, std::int64_t answer)>
      on_turn;
  /// The clock the control plane is measured with, in seconds (optional; default the host's
  /// steady clock). A test passes one that only its policy's calls advance.
  std::function<double()> control_clock;
};

/// @brief The measured policy (control-plane) time by the call that spent it, in seconds of wall
/// time on the host running the simulation; the terms sum to the whole measured time
/// (`replay_result::control_plane_us_per_step` times the steps).
struct control_plane_time {
  double admission_s      = 0;  ///< turns started (`start_turn`, with the parks it makes)
  double prefill_chunks_s = 0;  ///< prefill chunks (`prefill_chunk`: staging, eviction, commit)
  double decode_s         = 0;  ///< decode steps (`decode`, with growths and parks)
  double end_turn_s       = 0;  ///< turns ended (`end_turn`)
  double release_s        = 0;  ///< sessions' KV given back (`release`)
  double park_idle_s      = 0;  ///< idle sessions parked by the scheduler (`park_idle`)
  double evict_cached_s   = 0;  ///< prefix-cache blocks evicted (`evict_cached_block`)
  [[nodiscard]] double sum() const {
    return admission_s + prefill_chunks_s + decode_s + end_turn_s + release_s + park_idle_s +
           evict_cached_s;
  }
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
  double decode_launch_s    = 0;  ///< Tangram's split balancing launch, each step that decodes
  double control_plane_s    = 0;  ///< measured policy time, when `step_charges::control_plane`
  double reload_stall_s =
      0;  ///< host-link reloads (full_kv offload) a step's GPU work did not hide
  double host_transfer_s = 0;  ///< parks and restores over the host link (not overlapped)
  double idle_s          = 0;  ///< nothing to run (waiting for arrivals or think time)
  [[nodiscard]] double sum() const {
    return prefill_s + eviction_pass_s + decode_attention_s + weights_s + reclamation_s +
           replanning_s + overhead_s + decode_launch_s + control_plane_s + reload_stall_s +
           host_transfer_s + idle_s;
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
      0;  ///< sessions holding KV at once (running or between turns)
  double mean_resident_sessions      = 0;  ///< time-weighted
  /// Time-weighted over the steps at which memory binds the policy: a ready turn did not fit at
  /// admission, or a sequence preempted, evicted idle KV, parked or was given up for memory
  /// (ramp-up, drain and lulls left out); 0 when memory never binds.
  double mean_resident_sessions_memory_bound = 0;
  double memory_bound_s                      = 0;  ///< modelled time of those steps
  std::int32_t peak_running          = 0;  ///< sequences in one decode batch at once
  double kv_bytes_allocated_peak     = 0;
  double kv_bytes_live_peak          = 0;
  double mean_utilisation            = 0;  ///< time-weighted live / allocated
  double capacity_bytes              = 0;
  std::int64_t admission_waits       = 0;  ///< turns that could not start at once for memory
  double mean_admission_wait_s       = 0;  ///< modelled
  std::int64_t reclaim_ops           = 0;
  std::int64_t released_pages        = 0;
  std::int64_t preemptions           = 0;  ///< running sequences preempted (recompute)
  /// Request-steps a running session sat out waiting for its last chunk's kept counts
  /// (`replay_options::counts`, counts_arrival::next_step).
  std::int64_t counts_wait_steps     = 0;
  std::int64_t idle_evictions        = 0;  ///< idle sessions whose KV was dropped to make room
  std::int64_t prefix_blocks_evicted = 0;  ///< tail blocks of idle sessions' cached KV evicted
  std::int64_t recomputed_tokens     = 0;  ///< tokens lost and prefilled again
  /// Sessions parked in host memory (`kv_policy::take_parked`): running turns (`parked_running`)
  /// and idle sessions; `resumes` brought back, the bytes each way, and the host-link time they
  /// cost (modelled, also in `time.host_transfer_s`).
  std::int64_t parks              = 0;
  std::int64_t parked_running     = 0;
  std::int64_t resumes            = 0;
  double parked_bytes             = 0;
  double restored_bytes           = 0;
  double modelled_host_transfer_s = 0;
  double mean_staging_bytes       = 0;  ///< time-weighted policy_memory::staging_bytes
  /// Time-weighted policy_memory figures (where the bytes go, docs/memory.md): allocated (held
  /// and reserved), held (pages handed out) and live (tokens stored).
  double mean_allocated_bytes = 0, mean_held_bytes = 0, mean_live_bytes = 0;
  std::int64_t rejected_sessions      = 0;  ///< could never fit, even alone
  /// Engine steps that ran a decode or a chunk (a step where every running session waited for
  /// its kept counts ran nothing and is not one).
  std::int64_t steps                  = 0;
  double control_plane_us_per_step    = 0;  ///< measured wall time inside the policy
  control_plane_time control_plane;         ///< that time by call (measured)
  double modelled_makespan_s          = 0;
  double modelled_tokens_per_s        = 0;  ///< generated tokens / makespan
  double modelled_ttft_mean_s         = 0;
  double modelled_ttft_p95_s          = 0;
  double modelled_ttft_p50_s          = 0;
  double modelled_tbt_p50_s           = 0;  ///< time between a request's consecutive tokens
  double modelled_tbt_p95_s           = 0;  ///< (from a log histogram: within 1%)
  double modelled_eviction_pass_s     = 0;  ///< step time charged for unfused eviction passes
  std::int64_t generated_tokens       = 0;
  std::int64_t prefilled_tokens       = 0;
  std::int64_t completed_requests     = 0;  ///< turns whose answer finished
  double modelled_requests_per_s      = 0;  ///< completed requests / makespan
  std::int64_t truncated_answers      = 0;  ///< answers cut at the turn's max_tokens reservation
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
  time_breakdown time;  ///< the makespan by term (modelled)
  /// Memory over time, at most `replay_options::timeline_points` points: one per engine step
  /// while the run is short; in a longer run each point stands for a run of consecutive steps and
  /// carries the largest allocated, live and resident figures of those steps (so every peak
  /// survives thinning) at the time of the run's last step. The last point is the state after the
  /// final releases, at the makespan.
  std::vector<timeline_point> timeline;
};

}  // namespace tangram::sim
