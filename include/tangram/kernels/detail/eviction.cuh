// SPDX-License-Identifier: Apache-2.0
/**
 * @file kernels/detail/eviction.cuh
 * @brief Device code of the fused chunk eviction (see kernels/eviction.hpp): the launch sequence;
 * the kernels are in eviction_score.cuh, eviction_select.cuh and eviction_compact.cuh.
 *
 * Every kernel first resolves its (request, KV head) with `plan_eviction`, the host/device
 * function the CPU reference uses, so all kernels of a launch agree on what each head does.
 *
 * - SnapKV scoring (heads that select): `snapkv_tile_kernel<..., false>` (grid: key tiles x
 *   heads) loads a tile of candidate keys and, 16 queries at a time, the observation-window
 *   queries into shared memory, and writes each query's tile (max, sum of exp2) of its causally
 *   masked base-2 logits; `snapkv_reduce_kernel` combines the tiles in order into each query's
 *   softmax normaliser; `snapkv_tile_kernel<..., true>` recomputes the logits and writes the mean
 *   probability per candidate (sums over queries in a fixed order: deterministic). Given the
 *   prefill's log-sum-exp (`q_lse`) only the scoring pass runs, with the prefill's normaliser
 *   (`snapkv_norm`), and for 16-bit and fp8 K it runs on tensor cores (snapkv_mma.cuh).
 * - Key norm: `key_norm_kernel`, one warp per candidate.
 * - fp8 K (any dtype `widen` covers) is dequantised by folding the head's K scale once: into the
 *   queries' pre-scale for SnapKV, into the norm for key norm.
 * - Threshold search (heads that select): `select_reset_kernel` zeroes each head's workspace
 *   histogram and ticket; `select_histogram_kernel` (grid: slices of select_slice candidates x
 *   heads), launched once per radix pass (digits of 11, 11 and 10 bits), counts its slice's keys
 *   that match the prefix so far in a shared histogram (warp-aggregated), adds it to the head's
 *   histogram, and the head's last CTA (ticket after a fence) finds the digit, records the
 *   prefix and remaining rank and clears the histogram. Pass 0 builds the keys (max-pool,
 *   protection). A head of one slice (`select_one_slice`) runs all three passes in pass 0's CTA
 *   over its shared histogram, keys in registers, never touching the global one. After pass 2
 *   the state holds the k-th largest key T and how many keys equal to T to keep (the earliest
 *   ones).
 * - `select_compact_kernel`, compact_config::splits CTAs per (request, KV head), each moving a
 *   disjoint byte range of every token (copy_split): scans keep flags in candidate order
 *   (block scans with carries) and moves survivors tile by tile: all loads of a batch of
 *   survivors complete before its stores, and every survivor moves to a position at or before its
 *   source, so compacting in place within the column is safe. Ring and append heads copy their
 *   chunk tokens in the same kernel; staged heads (elastic reservation) write their keys to
 *   `stage_keys` and append the chunk. `select_histogram_pass` and `compact_selected` are what
 *   the elastic compaction (elastic_eviction.cuh) reuses with its own keep counts.
 */
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "tangram/core/config.hpp"
#include "tangram/kernels/detail/eviction_common.cuh"
#include "tangram/kernels/detail/eviction_compact.cuh"
#include "tangram/kernels/detail/eviction_score.cuh"
#include "tangram/kernels/detail/eviction_select.cuh"
#include "tangram/kernels/detail/snapkv_mma.cuh"
#include "tangram/kernels/detail/vec.cuh"
#include "tangram/kernels/eviction.hpp"
#include "tangram/kernels/math.hpp"

namespace tangram::detail {

/// The kernels' arguments for validated parameters and a workspace of
/// eviction_workspace_bytes(p).
inline eviction_args make_eviction_args(eviction_params const& p, void* workspace) {
  auto const& g = p.kv.geometry;
  auto layout   = eviction_workspace(p.kv.batch_size,
                                   p.kv.num_kv_heads,
                                   p.max_candidates,
                                   p.source,
                                   p.group,
                                   p.obs_window,
                                   g.head_dim,
                                   p.q_lse != nullptr);
  auto* base    = static_cast<unsigned char*>(workspace);
  eviction_args a;
  a.p         = p;
  a.keys      = reinterpret_cast<std::uint32_t*>(base + layout.keys);
  a.raw       = reinterpret_cast<float*>(base + layout.raw);
  a.stats     = reinterpret_cast<float2*>(base + layout.stats);
  a.norm      = reinterpret_cast<float2*>(base + layout.norm);
  a.key_tiles = (p.max_candidates + snapkv_key_tile(g.head_dim) - 1) / snapkv_key_tile(g.head_dim);
  a.nq_max    = p.obs_window * p.group;
  a.scale2    = p.scale() * log2e;
  a.select_hist  = reinterpret_cast<std::uint32_t*>(base + layout.hist);
  a.select_state = reinterpret_cast<std::uint32_t*>(base + layout.state);
  a.slices       = static_cast<std::int32_t>(  // in int64: max_candidates may be near INT32_MAX
      (std::int64_t{p.max_candidates} + select_slice - 1) / select_slice);
  return a;
}

/// Enqueues the eviction kernels for (T, D) through the launch policy `launch` (vec.cuh).
template <class T, int D, class Launch>
void launch_eviction_with(eviction_args const& a, Launch const& launch) {
  const auto heads = static_cast<unsigned>(a.p.kv.batch_size * a.p.kv.num_kv_heads);
  using copy_t     = copy_type_t<T>;
  launch(select_reset_kernel<>, dim3(heads), 256, 0, a.select_hist, a.select_state);
  if (a.p.source == score_source::snapkv) {
    dim3 grid(static_cast<unsigned>(a.key_tiles), heads);
    bool scored = false;
    if constexpr (snapkv_uses_mma<T>) {
      if (a.p.q_lse != nullptr && a.p.tensor_cores) {
        launch_snapkv_mma_with<T, D>(a, launch);
        scored = true;
      }
    }
    if (!scored) {
      if (a.p.q_lse == nullptr) {  // each query's normaliser first
        launch(snapkv_tile_kernel<T, D, false>, grid, 256, 0, a);
        launch(snapkv_reduce_kernel<>, dim3(heads), 256, 0, a, snapkv_key_tile(D));
      }
      launch(snapkv_tile_kernel<T, D, true>, grid, 256, 0, a);
    }
  } else if (a.p.source == score_source::key_norm) {
    dim3 grid(static_cast<unsigned>((a.p.max_candidates + 63) / 64), heads);
    launch(key_norm_kernel<T, D>, grid, 256, 0, a);
  }
  for (int pass = 0; pass < select_radix_passes; ++pass)
    launch(
        select_histogram_kernel<>, dim3(static_cast<unsigned>(a.slices), heads), 256, 0, a, pass);
  launch(select_compact_kernel<copy_t, D>,
         dim3(static_cast<unsigned>(compact_config<copy_t, D>::splits), heads),
         256,
         0,
         a);
}

#if !defined(TANGRAM_EMULATION)
/// Launches the eviction kernels for (T, D) (defined per dtype in kernels/eviction_*.cu).
template <class T, int D>
cudaError_t launch_eviction(eviction_args const& a, cudaStream_t stream) {
  launch_eviction_with<T, D>(a, stream_launch{stream});
  return cudaGetLastError();
}

// clang-format off
/// Declares (with `extern`) or defines (empty) the explicit instantiations for one storage type:
/// every head dim of the list in core/kv_shape.hpp.
#define TANGRAM_EVICTION_INSTANTIATE_DIM(EXT, T, D)                                            \
  EXT template cudaError_t launch_eviction<T, D>(eviction_args const&, cudaStream_t);
#define TANGRAM_EVICTION_INSTANTIATE(EXT, T)                                                   \
  TANGRAM_KV_SHAPE_HEAD_DIMS(TANGRAM_EVICTION_INSTANTIATE_DIM, EXT, T)
// clang-format on
#endif  // !TANGRAM_EMULATION

}  // namespace tangram::detail
