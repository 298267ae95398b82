// SPDX-License-Identifier: Apache-2.0
/**
 * @file device/async_readback.hpp
 * @brief Device-to-host copies the host learns of without waiting: a fixed ring of pinned slots,
 * each filled by `cudaMemcpyAsync` behind the work that produced its data and polled with
 * `cudaEventQuery`. What the sync-free elastic engine loop uses to learn each chunk's kept
 * lengths (`evict_elastic`'s `new_len`) for `commit_chunk` (docs/integration.md).
 *
 * Declared here (host-compilable, no CUDA headers), defined in `kernels/async_readback.cu`, so it
 * is usable only when the program links `tangram::kernels`. Only the CUDA runtime is used.
 */
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "tangram/core/stream.hpp"

struct CUevent_st;  // the CUDA runtime's opaque event type (cudaEvent_t is CUevent_st*)

namespace tangram {

/// @brief One enqueued readback: a slot of the ring and the use of it (stale tickets are refused).
struct readback_ticket {
  std::int32_t slot = -1;
  std::int64_t use  = -1;
};

/// @brief A device buffer to read back: `bytes` bytes at device address `src`.
struct readback_part {
  void const* src   = nullptr;
  std::size_t bytes = 0;
};

/**
 * @brief A ring of `slots` pinned host slots of `slot_bytes` bytes each, with one CUDA event per
 * slot.
 *
 * `enqueue` copies up to 4 device buffers into a free slot (each part 256-byte aligned in the
 * slot, in order) with `cudaMemcpyAsync` on `stream`, records the slot's event behind them and
 * returns the ticket; `ready` asks the event (`cudaEventQuery`, never a wait); once ready,
 * `part(ticket, i)` is the host copy of part i until `release(ticket)` frees the slot. Nothing
 * here waits for the GPU except the destructor (an enqueued copy may still write a slot) and
 * `drain` (shutdown and tests).
 *
 * Memory: one pinned block of `slots * slot_bytes` bytes and `slots` events, allocated by the
 * constructor; `enqueue`, `ready`, `part` and `release` allocate nothing.
 *
 * Synchronisation: the copies are ordered on `stream` behind the work enqueued before them, so
 * a copy enqueued right after the kernel that writes `src` reads what it wrote. When every slot
 * is in use `enqueue` returns nullopt (it never waits): the caller releases a ready slot first,
 * or reads back later.
 *
 * Ownership: owns its pinned block and events. Not thread-safe: the caller serialises every call.
 * Not copyable; movable (a moved-from object owns nothing and may only be destroyed or assigned
 * to).
 */
class async_readback {
 public:
  /// Most parts one `enqueue` copies.
  static constexpr std::int32_t max_parts = 4;
  /// Alignment of every part inside a slot.
  static constexpr std::size_t part_alignment = 256;

  /**
   * @brief Allocates the pinned slots and their events on `device_id`.
   * @throw invalid_argument naming the field when `slot_bytes` is not in [1, 2^40] or `slots`
   *        not in [1, 65536]; cuda_error naming the call when there is no usable device,
   *        `device_id` is not in [0, device count), or an allocation fails.
   */
  async_readback(std::size_t slot_bytes, std::int32_t slots, std::int32_t device_id = 0);
  ~async_readback();

  async_readback(async_readback const&)            = delete;
  async_readback& operator=(async_readback const&) = delete;
  async_readback(async_readback&& other) noexcept;
  async_readback& operator=(async_readback&& other) noexcept;

  /**
   * @brief Enqueues on `stream` the copy of `count` parts into a free slot and records its event.
   * @return the ticket, or nullopt when every slot is in use (nothing enqueued).
   * @throw invalid_argument naming the part when `count` is not in [1, max_parts], a part's
   *        source is null, or the aligned parts exceed `slot_bytes()`; cuda_error naming the call
   *        when CUDA fails (the slot stays free).
   */
  std::optional<readback_ticket> enqueue(readback_part const* parts,
                                         std::int32_t count,
                                         cuda_stream_t stream);

  /// @brief True once the copies of `t` have landed. Never waits.
  /// @throw logic_error for a stale or released ticket; cuda_error when the query fails.
  [[nodiscard]] bool ready(readback_ticket t);

  /// @brief The host copy of part `i` of `t` (valid after `ready(t)` until `release(t)`).
  /// @throw logic_error for a stale ticket or one not yet ready; invalid_argument for `i`.
  [[nodiscard]] void const* part(readback_ticket t, std::int32_t i) const;

  /// @brief Frees the slot of `t` (ready: the copy landed; nothing else may read the slot).
  /// @throw logic_error for a stale ticket or one not yet ready.
  void release(readback_ticket t);

  /// @brief Waits for every enqueued copy (cudaEventSynchronize): shutdown and tests only.
  void drain();

  [[nodiscard]] std::size_t slot_bytes() const noexcept { return slot_bytes_; }
  [[nodiscard]] std::int32_t slots() const noexcept { return slots_; }
  /// @brief Slots enqueued and not yet released.
  [[nodiscard]] std::int32_t in_use() const noexcept { return in_use_; }

 private:
  enum class slot_state : std::uint8_t { free, pending, ready };
  struct slot_info {
    slot_state state              = slot_state::free;
    std::int64_t use              = 0;
    std::size_t offset[max_parts] = {};
    std::int32_t parts            = 0;
  };

  void destroy() noexcept;
  void swap(async_readback& other) noexcept;
  [[nodiscard]] slot_info const& checked(readback_ticket t, char const* op) const;
  [[nodiscard]] slot_info const& checked_ready(readback_ticket t, char const* op) const;

  std::size_t slot_bytes_ = 0;
  std::int32_t slots_     = 0;
  std::int32_t device_id_ = -1;
  std::int32_t next_      = 0;  ///< where the search for a free slot starts
  std::int32_t in_use_    = 0;
  std::int64_t uses_      = 0;
  std::byte* pinned_      = nullptr;   ///< slots * slot_bytes (cudaHostAlloc)
  std::vector<::CUevent_st*> events_;  ///< [slots]
  std::vector<slot_info> info_;        ///< [slots]
};

}  // namespace tangram
