// SPDX-License-Identifier: Apache-2.0
/**
 * @file device/kv_view_mirror.hpp
 * @brief A device copy of a manager's view, kept current from its change journal with one
 * asynchronous upload of the changes per step.
 *
 * Declared here (host-compilable, no CUDA headers), defined in `kernels/kv_view_mirror.cu`, so it
 * is usable only when the program links `tangram::kernels`. Only the CUDA runtime is used (never
 * libcuda): on a machine without a driver the constructor fails with `cuda_error`.
 *
 * Data flow per step: the manager's calls (admission, chunks, decode steps, set_batch, ...) write
 * its host arrays and note what changed in its journal → `mirror.sync(kv, stream)` copies the
 * changed ranges into a pinned shadow and enqueues their upload on `stream`, then clears the
 * journal → kernels launched on `stream` afterwards read `mirror.view(kind)`: the eviction kernel
 * `view(batch_kind::prefill)`, the append and decode kernels `view(batch_kind::decode)` (=
 * `view()`), so one sync serves a mixed step.
 */
#pragma once

#include <cstddef>
#include <cstdint>

#include "tangram/core/kv_view.hpp"
#include "tangram/core/stream.hpp"
#include "tangram/device/detail/mirror_layout.hpp"
#include "tangram/memory/kv_cache_manager.hpp"
#include "tangram/memory/memory_resource.hpp"

struct CUevent_st;  // the CUDA runtime's opaque event type (cudaEvent_t is CUevent_st*)

namespace tangram {

/**
 * @brief The arrays of a `kv_cache_manager`'s view in device memory, plus a `kv_cache_view` over
 * them that kernels take as is.
 *
 * Memory: one device block holding every array at the manager's fixed capacities
 * (`view_extents()`: max_batch entries for each batch kind's slot list, every slot and the
 * padding slot, the whole page-id arena), and two pinned host shadows of the same layout. All
 * are allocated by the constructor and never move, so `view(kind)` and its pointers stay valid
 * for the mirror's lifetime (a CUDA graph may capture them; `sync` itself must not be captured:
 * it waits on an event). The two device views share every array but `batch_slots`; with
 * fixed-capacity batches (`set_batch(kind, ids, count, padded_size)`) their `batch_size` stays
 * the captured size too, so a graph captured once replays after each sync.
 *
 * `sync` (once per step, before the kernels that read the view): copies into one shadow what
 * changed since its last use, enqueues on the stream the fewest `cudaMemcpyAsync` that cover this
 * step's changes (ranges closer than 32 KiB are uploaded as one span), records an event and
 * clears the manager's journal. The two shadows alternate, so a sync never writes the shadow that
 * the previous sync's upload may still be reading.
 *
 * Synchronisation: `sync` returns without waiting for the GPU, except that before writing a
 * shadow it waits for the upload enqueued two syncs earlier from that shadow: it asks first
 * (`cudaEventQuery`, never a wait) and calls `cudaEventSynchronize` only when that upload has not
 * run yet, i.e. only when the host runs more than one step ahead of the stream. An engine whose
 * GPU trails its host by at most one step never waits in `sync`. The uploads are ordered on
 * `stream`: kernels on the same stream see the new arrays, kernels on another stream need an
 * event from the caller. Conversely the upload overwrites the
 * arrays that kernels enqueued before it on the same stream are reading only after they end;
 * kernels on other streams that still read the previous step's view must be ordered before it
 * by the caller. The manager's host arrays are read during `sync` only: it may change freely
 * once `sync` returned.
 *
 * Ownership: the mirror owns its device block, shadows and events; it does not own the manager
 * or the pool. The pool pointer of `view()` is the manager's arena (`kv.pool().base()`): device
 * memory when the manager's resource is device memory (`cuda_memory_resource`). For a host pool
 * it is a host pointer, which a kernel may dereference only if that memory is mapped into the
 * device's address space (e.g. `cudaHostAlloc` with `cudaHostAllocMapped`); for a simulated pool
 * it is a fake address no kernel may read. The page tables are mirrored either way.
 *
 * The mirror must be the only consumer of the manager's journal: a `clear_view_changes()` by
 * anyone else between two syncs loses changes (call `invalidate()` then). Not thread-safe: `sync`
 * is a mutating call of the manager and must be serialised with its other calls. Not copyable;
 * movable (a moved-from mirror owns nothing and may only be destroyed or assigned to).
 */
class kv_view_mirror {
 public:
  /**
   * @brief Allocates the device block (zeroed) and the pinned shadows for `kv` on `device_id`.
   * The first `sync` uploads everything. `kv` must outlive the mirror's syncs (it is identified
   * by address).
   * @throw cuda_error naming the call when there is no usable device, `device_id` is not in
   *        [0, device count), or an allocation fails; invalid_argument when the manager's pool is
   *        device memory on another device, or the view's byte size overflows.
   */
  explicit kv_view_mirror(kv_cache_manager const& kv, std::int32_t device_id = 0);
  ~kv_view_mirror();

  kv_view_mirror(kv_view_mirror const&)            = delete;
  kv_view_mirror& operator=(kv_view_mirror const&) = delete;
  kv_view_mirror(kv_view_mirror&& other) noexcept;
  kv_view_mirror& operator=(kv_view_mirror&& other) noexcept;

  /**
   * @brief Enqueues on `stream` (a stream of `device_id()`; nullptr: the legacy default stream)
   * the upload of everything changed since the last sync (first sync, after a `full_resync` or
   * `invalidate()`: everything; each batch kind's slot list only when that batch changed), then
   * clears the manager's journal and sets both device views' `batch_size`. No allocation; waits
   * only as described above.
   * @throw logic_error when `kv` is not the manager the mirror was built for, when the mirror was
   *        moved from, or as `kv.view(kind)` when a member of either batch was freed since its
   *        `set_batch` (set that batch again, e.g. to no sequences; nothing enqueued, journal
   *        kept); cuda_error naming the call when CUDA fails: the journal is kept and the next
   *        sync uploads everything.
   */
  void sync(kv_cache_manager& kv, cuda_stream_t stream);

  /// @brief The device view of the batch of `kind`: pool = `kv.pool().base()` (see Ownership),
  /// every other array in device memory, `batch_size` as of the last sync (0 before the first),
  /// `padding_slot` the manager's. Owned by the mirror; valid (same pointers) for its lifetime.
  /// @throw invalid_argument for a value outside batch_kind.
  [[nodiscard]] kv_cache_view const& view(batch_kind kind) const {
    auto k = static_cast<std::size_t>(kind);
    TANGRAM_EXPECTS(k < batch_kind_count,
                    invalid_argument,
                    "kv_view_mirror::view.kind: must be batch_kind::decode or batch_kind::prefill, "
                    "got ",
                    k);
    return views_[k];
  }
  /// @brief `view(batch_kind::decode)`.
  [[nodiscard]] kv_cache_view const& view() const noexcept {
    return views_[static_cast<std::size_t>(batch_kind::decode)];
  }

  /// @brief The next sync uploads everything (e.g. after the journal was cleared elsewhere).
  void invalidate() noexcept { stager_.invalidate(); }

  [[nodiscard]] std::int32_t device_id() const noexcept { return device_id_; }
  /// @brief Bytes of the device block (every mirrored array, padded to 128 bytes each).
  [[nodiscard]] std::size_t bytes() const noexcept {
    return static_cast<std::size_t>(stager_.layout().total);
  }
  /// @brief Bytes of pinned host memory (two shadows of `bytes()`).
  [[nodiscard]] std::size_t pinned_bytes() const noexcept { return 2 * bytes(); }
  /// @brief Who may dereference `view().pool` (the manager's pool kind).
  [[nodiscard]] memory_kind pool_kind() const noexcept { return pool_kind_; }
  /// @brief Copies and bytes the last successful sync enqueued (bytes() and 1 for a full one).
  [[nodiscard]] std::int64_t last_sync_copies() const noexcept { return last_copies_; }
  [[nodiscard]] std::int64_t last_sync_bytes() const noexcept { return last_bytes_; }

 private:
  void release() noexcept;
  void swap(kv_view_mirror& other) noexcept;

  kv_cache_manager const* manager_ = nullptr;
  std::int32_t device_id_          = -1;
  memory_kind pool_kind_           = memory_kind::simulated;
  detail::mirror_stager stager_;
  std::byte* device_         = nullptr;             ///< the packed block (cudaMalloc)
  std::byte* shadow_[2]      = {nullptr, nullptr};  ///< pinned shadows (one cudaHostAlloc)
  ::CUevent_st* uploaded_[2] = {nullptr, nullptr};  ///< last upload read from each shadow
  int next_                  = 0;                   ///< the shadow the next sync writes
  std::int64_t last_copies_ = 0, last_bytes_ = 0;
  kv_cache_view views_[batch_kind_count];  ///< [batch_kind]
};

}  // namespace tangram
