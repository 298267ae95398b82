// SPDX-License-Identifier: Apache-2.0
/**
 * @file kernels/detail/eviction_compact.cuh
 * @brief The compaction of the fused chunk eviction (kernels/detail/eviction.cuh, whose file
 * comment describes it): the token copies (`copy_tokens`, split by byte range), the in-order
 * compaction of the selected keys (`compact_selected`, which elastic_eviction.cuh reuses) and
 * `select_compact_kernel`.
 */
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <cub/block/block_scan.cuh>
#include <type_traits>

#include "tangram/core/config.hpp"
#include "tangram/kernels/detail/eviction_common.cuh"
#include "tangram/kernels/detail/eviction_select.cuh"
#include "tangram/kernels/detail/snapkv_mma.cuh"
#include "tangram/kernels/detail/vec.cuh"
#include "tangram/kernels/eviction.hpp"
#include "tangram/kernels/head_cursor.hpp"
#include "tangram/kernels/math.hpp"

namespace tangram::detail {

// ---------------------------------------------------------------------------------------------
// Select and compact.
// ---------------------------------------------------------------------------------------------

/// The type the compaction copies a T element as: only its size matters (f16 and bf16 share
/// the bfloat16 instantiation, fp8_e4m3 and fp8_e5m2 the float8_e4m3 one). Shared with the
/// elastic compaction.
template <std::size_t Bytes>
struct copy_type;
template <>
struct copy_type<4> {
  using type = float;
};
template <>
struct copy_type<2> {
  using type = bfloat16;
};
template <>
struct copy_type<1> {
  using type = float8_e4m3;
};
template <class T>
using copy_type_t = typename copy_type<sizeof(T)>::type;

/// Shape of the select-and-compact kernel for storage rows of D elements of T.
template <class T, int D>
struct compact_config {
  static constexpr int threads    = 256;
  static constexpr int items      = 4;                ///< candidates per thread per scan tile
  static constexpr int tile       = threads * items;  ///< candidates per scan tile
  static constexpr int per16      = 16 / static_cast<int>(sizeof(T));
  static constexpr int row_chunks = D / per16;  ///< 16-byte chunks of one K (or V) row
  static constexpr int regs       = 8;          ///< 16-byte chunks a thread holds per batch
  /// CTAs sharing one head's copies, each a disjoint byte range of every token's K and V rows
  /// (32 bytes or more: whole 32-byte sectors); a power of two dividing 2 * row_chunks.
  static constexpr int splits = row_chunks < 16 ? row_chunks : 16;
  static_assert(D % per16 == 0 && threads * regs >= 2 * row_chunks,
                "rows must be whole 16-byte chunks; one token must fit a batch");
  static_assert((2 * row_chunks) % splits == 0, "whole chunks per split");
};

/// This CTA's share of a head's copies (0 .. compact_config::splits - 1): the 16-byte chunks
/// `[index * per, (index + 1) * per)` of every token (K chunks first, then V). Disjoint bytes:
/// the CTAs of one head never touch each other's data, so each keeps the in-place argument of a
/// single CTA.
struct copy_split {
  int index = 0;
};

/// Copies tokens `[0, count)` with `src_of(t)` = candidate index and `dst_of(t)` = column
/// position, in batches whose loads all complete before their stores; this CTA moves the chunks
/// of `split` only. Candidates that are held tokens already at their destination are skipped.
template <class T, int D, class Src, class Dst>
__device__ __forceinline__ void copy_tokens(eviction_args const& a,
                                            eviction_head const& x,
                                            int count,
                                            Src src_of,
                                            Dst dst_of,
                                            copy_split split) {
  using cfg           = compact_config<T, D>;
  constexpr int per   = 2 * cfg::row_chunks / cfg::splits;  // chunks of a token this CTA copies
  constexpr int batch = cfg::threads * cfg::regs / per;     // tokens per copy batch
  static_assert(per <= cfg::row_chunks && cfg::threads % per == 0,
                "a split's chunks lie in K or in V; a thread keeps its chunk across tokens");
  const int tid = static_cast<int>(threadIdx.x);
  // The thread's chunk (the same for every token) and its first token of a batch.
  const int kv   = split.index * per / cfg::row_chunks;
  const int part = split.index * per % cfg::row_chunks + tid % per;
  const int tok0 = tid / per;
  for (int b0 = 0; b0 < count; b0 += batch) {
    const int nb = count - b0 < batch ? count - b0 : batch;
    uint4 buf[cfg::regs];
#pragma unroll
    for (int u = 0; u < cfg::regs; ++u) {
      const int tok = tok0 + u * (cfg::threads / per);
      if (tok < nb) {
        const std::int64_t src = src_of(b0 + tok);
        const std::int64_t dst = dst_of(b0 + tok);
        if (!(src < x.e.len && src == dst)) {
          buf[u] = reinterpret_cast<const uint4*>(candidate_ptr<T>(a, x, src, kv))[part];
        }
      }
    }
    sync_block(sync_site::compact_loaded);
#pragma unroll
    for (int u = 0; u < cfg::regs; ++u) {
      const int tok = tok0 + u * (cfg::threads / per);
      if (tok < nb) {
        const std::int64_t src = src_of(b0 + tok);
        const std::int64_t dst = dst_of(b0 + tok);
        if (!(src < x.e.len && src == dst)) {
          reinterpret_cast<uint4*>(
              x.cur.ptr_at_position<T>(static_cast<std::int32_t>(dst), kv))[part] = buf[u];
        }
      }
    }
    __syncthreads();
  }
}

/// Shared memory of the compaction of one head.
template <class T, int D>
struct select_smem {
  using cfg    = compact_config<T, D>;
  using scan_t = cub::BlockScan<std::uint32_t, cfg::threads>;
  typename scan_t::TempStorage scan;
  std::int32_t list_src[cfg::tile];
};

/**
 * Keeps the `k` largest of the `n` candidate keys `key_at(i)` of head `x` (ties to the earlier
 * position) and compacts them in order to column positions [0, k): the keys above the threshold the
 * histogram passes left in `s.state` and the first `remaining` keys equal to it. Called by every
 * thread of the CTA, after the three select_histogram_pass launches of the same head.
 */
template <class T, int D, class KeyAt>
__device__ __forceinline__ void compact_selected(eviction_args const& a,
                                                 eviction_head const& x,
                                                 std::int64_t n,
                                                 std::int64_t k,
                                                 KeyAt key_at,
                                                 select_slots const& s,
                                                 select_smem<T, D>& sm,
                                                 copy_split split) {
  using cfg     = compact_config<T, D>;
  using scan_t  = typename select_smem<T, D>::scan_t;
  const int tid = static_cast<int>(threadIdx.x);
  if (k <= 0) return;
  const std::uint32_t threshold = s.state[select_prefix], ties_needed = s.state[select_remaining];

  // Keep keys above the threshold and the first `ties_needed` keys equal to it.
  std::uint32_t carry_tie = 0, carry_keep = 0;
  for (std::int64_t base = 0; base < n; base += cfg::tile) {
    std::uint32_t key[cfg::items], tie[cfg::items], keep[cfg::items], rank[cfg::items];
#pragma unroll
    for (int u = 0; u < cfg::items; ++u) {
      const std::int64_t i = base + tid * cfg::items + u;
      key[u]               = i < n ? key_at(i) : 0u;
      tie[u]               = i < n && key[u] == threshold ? 1u : 0u;
    }
    std::uint32_t tie_total, keep_total;
    scan_t(sm.scan).ExclusiveSum(tie, rank, tie_total);
    __syncthreads();
#pragma unroll
    for (int u = 0; u < cfg::items; ++u) {
      const std::int64_t i = base + tid * cfg::items + u;
      keep[u] =
          i < n && (key[u] > threshold || (tie[u] && carry_tie + rank[u] < ties_needed)) ? 1u : 0u;
    }
    scan_t(sm.scan).ExclusiveSum(keep, rank, keep_total);
#pragma unroll
    for (int u = 0; u < cfg::items; ++u)
      if (keep[u]) sm.list_src[rank[u]] = static_cast<std::int32_t>(base + tid * cfg::items + u);
    __syncthreads();
    const std::uint32_t dst0 = carry_keep;
    copy_tokens<T, D>(
        a,
        x,
        static_cast<int>(keep_total),
        [&](int t) { return static_cast<std::int64_t>(sm.list_src[t]); },
        [&](int t) { return static_cast<std::int64_t>(dst0) + t; },
        split);
    carry_tie += tie_total;
    carry_keep += keep_total;
  }
}

/// compact_config::splits CTAs per (request, KV head) (blockIdx.x: the split, blockIdx.y: the
/// head): ring/append copies, staging, or select-and-compact (see file comment), each CTA moving
/// its byte range of every token. T only sets the element size (copy_type_t).
template <class T, int D>
TANGRAM_KERNEL __launch_bounds__(256) void select_compact_kernel(eviction_args const a) {
  using cfg = compact_config<T, D>;
  __shared__ select_smem<T, D> sm;
  const int tid            = static_cast<int>(threadIdx.x);
  const copy_split split   = {static_cast<int>(blockIdx.x)};
  const eviction_head x    = resolve_head(a, blockIdx.y);
  eviction_params const& p = a.p;
  if (tid == 0 && split.index == 0) p.new_len[x.rh] = static_cast<std::int32_t>(x.e.keep);
  switch (x.e.action) {
    case eviction_action::unchanged:
    case eviction_action::invalid:
      return;
    case eviction_action::ring: {
      const std::int64_t first =
          x.e.n_seen - x.e.window > x.e.n_before ? x.e.n_seen - x.e.window : x.e.n_before;
      // Candidate index of chunk token t is len + t; ring position of sequence token s is s % ring.
      copy_tokens<T, D>(
          a,
          x,
          static_cast<int>(x.e.n_seen - first),
          [&](int t) { return x.e.len + (first - x.e.n_before) + t; },
          [&](int t) { return (first + t) % x.cur.ring; },
          split);
      return;
    }
    case eviction_action::stage:
    case eviction_action::append:
    case eviction_action::select:
      break;
  }
  const std::int64_t n = x.e.candidates;
  const float* raw =
      (p.source == score_source::supplied ? p.scores : a.raw) + x.rh * p.max_candidates;
  const std::int32_t pool = p.pool();
  if (x.e.action == eviction_action::stage) {  // elastic: keys out, chunk appended
    std::uint32_t* keys = p.stage_keys + stage_key_block(p.stage_key_base, p.kv, x.r, p.layer, x.h);
    for (std::int64_t i = split.index * cfg::threads + tid; i < n;
         i += static_cast<std::int64_t>(cfg::splits) * cfg::threads) {
      if (i >= x.e.lead)  // the lead's key is implied (staged_key)
        keys[x.cur.list_offset(static_cast<std::int32_t>(i))] =
            candidate_key(raw, n, i, pool, x.e.lead, x.e.window);
      if (p.scores_out) p.scores_out[x.rh * p.max_candidates + i] = raw[i];
    }
  }
  if (x.e.action != eviction_action::select) {
    copy_tokens<T, D>(
        a,
        x,
        static_cast<int>(x.e.chunk),
        [&](int t) { return x.e.len + t; },
        [&](int t) { return x.e.len + t; },
        split);
    return;
  }
  const std::uint32_t* keys = a.keys + x.rh * p.max_candidates;
  compact_selected<T, D>(
      a,
      x,
      n,
      x.e.keep,
      [&](std::int64_t i) { return keys[i]; },
      eviction_select_slots(a, x.rh),
      sm,
      split);
}

}  // namespace tangram::detail
