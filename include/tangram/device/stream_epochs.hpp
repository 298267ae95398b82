// SPDX-License-Identifier: Apache-2.0
/**
 * @file device/stream_epochs.hpp
 * @brief The stream-ordered path of deferred page reuse for CUDA pools: one CUDA event per
 * manager epoch, polled without blocking, releasing every epoch whose work completed.
 *
 * Declared here (host-compilable, no CUDA headers), defined in `kernels/stream_epochs.cu`, so it
 * is usable only when the program links `tangram::kernels`. Only the CUDA runtime is used.
 *
 * Per step (see docs/integration.md#6a-several-streams-deferred-reuse), with
 * `manager_options::deferred_reuse`: the manager's calls (admission, chunks, decode, end_turn,
 * free, ...) retire the pages they drop under the open epoch → the engine enqueues the step's
 * kernels → `epochs.end_step(kv, stream)` records an event on `stream` behind them and closes the
 * epoch → at any later point (typically the start of the next step, before admission)
 * `epochs.poll(kv)` asks each in-flight event, oldest first, whether it completed
 * (`cudaEventQuery`, never a wait) and calls `kv.release_epochs_through(e)` for the newest epoch e
 * whose event completed.
 */
#pragma once

#include <cstdint>
#include <vector>

#include "tangram/core/stream.hpp"
#include "tangram/memory/kv_cache_manager.hpp"

struct CUevent_st;  // the CUDA runtime's opaque event type (cudaEvent_t is CUevent_st*)

namespace tangram {

/**
 * @brief A fixed ring of CUDA events, one per closed epoch of one manager still in flight.
 *
 * Memory: `max_in_flight` events (created with cudaEventDisableTiming on `device_id`) allocated by
 * the constructor; `end_step` and `poll` allocate nothing. When every event is in flight,
 * `end_step` first polls, and if the oldest epoch still has not completed it merges the new
 * epoch into the newest event (the stream waits on that event, which is then recorded again
 * behind this step's work): nothing blocks and nothing fails, pages are only released later, in
 * coarser steps (`merged()` counts it).
 *
 * Synchronisation: `end_step` must come after everything that may read the pages retired in the
 * epoch it closes was enqueued, on `stream` or on streams `stream` waits for (join them into it
 * with `cudaStreamWaitEvent` first); `poll` never waits. `drain` waits (cudaEventSynchronize) and
 * is meant for shutdown and tests. Neither records inside a CUDA graph capture: call `end_step`
 * on the stream a captured graph is launched into, after the launch (a graph launch is ordered
 * on its stream like any kernel).
 *
 * Ownership: owns its events (destroyed by the destructor, which does not wait: epochs still in
 * flight then stay unreleased in the manager, whose retired pages are returned with its pool).
 * References the manager given to the constructor: every call must pass that manager (checked).
 * Not thread-safe: `end_step` and `poll` are mutating calls of the manager and must be
 * serialised with its other calls. Not copyable; movable (a moved-from object owns nothing and
 * may only be destroyed or assigned to).
 */
class stream_epochs {
 public:
  /// Most events `max_in_flight` may ask for.
  static constexpr std::int32_t max_events = 1 << 16;

  /**
   * @brief Creates `max_in_flight` events on `device_id` for manager `kv` (which must outlive the
   * calls; identified by address).
   * @throw invalid_argument naming the value when max_in_flight is not in [1, max_events];
   *        cuda_error naming the call when there is no usable device, `device_id` is not in
   *        [0, device count) or an event cannot be created (none is left behind).
   */
  explicit stream_epochs(kv_cache_manager const& kv,
                         std::int32_t max_in_flight = 8,
                         std::int32_t device_id     = 0);
  ~stream_epochs();

  stream_epochs(stream_epochs const&)            = delete;
  stream_epochs& operator=(stream_epochs const&) = delete;
  stream_epochs(stream_epochs&& other) noexcept;
  stream_epochs& operator=(stream_epochs&& other) noexcept;

  /**
   * @brief Records an event on `stream` behind the work enqueued so far and closes the manager's
   * open epoch (`kv.advance_epoch()`), polling first when the ring is full (see the class).
   * @return the epoch closed.
   * @throw logic_error when `kv` is not the constructor's manager or the object was moved from;
   *        cuda_error naming the call when CUDA fails (the epoch is then not closed: the pages it
   *        retired wait for the next successful `end_step`).
   */
  std::int64_t end_step(kv_cache_manager& kv, cuda_stream_t stream);

  /**
   * @brief Asks the in-flight events, oldest first, whether their work completed
   * (`cudaEventQuery`; never waits) and releases the manager's epochs through the newest
   * completed one. Allocation-free.
   * @return the pages that became free.
   * @throw logic_error as `end_step`; cuda_error naming the call when a query reports an error
   *        other than "not ready" (nothing is released then).
   */
  std::int64_t poll(kv_cache_manager& kv);

  /**
   * @brief Waits (cudaEventSynchronize) for every in-flight epoch and releases them all: for
   * shutdown and tests, never in a serving step.
   * @return the pages that became free. @throw as `poll`.
   */
  std::int64_t drain(kv_cache_manager& kv);

  /// Epochs closed by `end_step` whose release is still pending (events in flight).
  [[nodiscard]] std::int32_t in_flight() const noexcept { return count_; }
  /// Events in the ring (`max_in_flight`).
  [[nodiscard]] std::int32_t capacity() const noexcept { return capacity_; }
  /// Times `end_step` found the ring full and merged its epoch into the newest event.
  [[nodiscard]] std::int64_t merged() const noexcept { return merged_; }
  [[nodiscard]] std::int32_t device_id() const noexcept { return device_id_; }

 private:
  void check_manager(kv_cache_manager const& kv, char const* op) const;
  /// Releases the oldest `done` in-flight epochs. @return pages freed.
  std::int64_t release_oldest(kv_cache_manager& kv, std::int32_t done);
  void destroy() noexcept;
  void swap(stream_epochs& other) noexcept;

  kv_cache_manager const* manager_ = nullptr;
  std::int32_t device_id_          = -1;
  std::int32_t capacity_           = 0;
  std::vector<::CUevent_st*> events_;  ///< the ring, `capacity_` events
  std::vector<std::int64_t> epochs_;   ///< the epoch each in-flight event closes
  std::int32_t head_   = 0;            ///< the oldest in-flight event
  std::int32_t count_  = 0;
  std::int64_t merged_ = 0;
};

}  // namespace tangram
