// SPDX-License-Identifier: Apache-2.0
/**
 * @file kernels/detail/eviction.cuh
 * @brief Device code of the fused chunk eviction (see kernels/eviction.hpp).
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

#include <cstddef>
#include <cstdint>
#include <cub/block/block_scan.cuh>
#include <type_traits>

#include "tangram/core/config.hpp"
#include "tangram/kernels/detail/eviction_common.cuh"
#include "tangram/kernels/detail/snapkv_mma.cuh"
#include "tangram/kernels/detail/vec.cuh"
#include "tangram/kernels/eviction.hpp"
#include "tangram/kernels/head_cursor.hpp"
#include "tangram/kernels/math.hpp"

namespace tangram::detail {

// ---------------------------------------------------------------------------------------------
// SnapKV scoring.
// ---------------------------------------------------------------------------------------------

/// Statistics (Score == false) or scores (Score == true) of one tile of candidate keys.
template <class T, int D, bool Score>
TANGRAM_KERNEL __launch_bounds__(256) void snapkv_tile_kernel(eviction_args const a) {
  constexpr int KT  = snapkv_key_tile(D);
  constexpr int QT  = 16;       // queries per round
  constexpr int KPT = KT / 16;  // keys per thread
  __shared__ float ks[KT][D + 1];
  __shared__ float qs[QT][D];
  __shared__ float red[Score ? QT : 1][Score ? KT : 1];
  const eviction_head x = resolve_head(a, blockIdx.y);
  if (!eviction_scores(x.e.action)) return;
  const std::int64_t n = x.e.candidates, len = x.e.len, c = x.e.chunk;
  const std::int64_t i0 = static_cast<std::int64_t>(blockIdx.x) * KT;
  if (i0 >= n) return;
  const int G = a.p.group, tid = static_cast<int>(threadIdx.x);
  const std::int64_t w = c < a.p.obs_window ? c : a.p.obs_window;
  const int nq         = static_cast<int>(w) * G;
  for (int idx = tid; idx < KT * D; idx += 256) {
    int kk = idx / D, xx = idx % D;
    std::int64_t i = i0 + kk;
    ks[kk][xx]     = i < n ? widen(candidate_ptr<T>(a, x, i, 0)[xx]) : 0.f;
  }
  const int ql = tid / 16, kl = tid % 16;
  float acc[KPT];
#pragma unroll
  for (int u = 0; u < KPT; ++u) acc[u] = 0.f;
  const std::int64_t q_row_stride = static_cast<std::int64_t>(a.p.kv.num_kv_heads) * G * D;
  // fp8 K scale folded as in decode: q . (s_k k) = (s_k q) . k, once per head.
  const float q_scale = a.scale2 * a.p.scales.k_of(x.h);
  for (int q0 = 0; q0 < nq; q0 += QT) {
    __syncthreads();  // ks loaded / qs free
    for (int idx = tid; idx < QT * D; idx += 256) {
      int qq = q0 + idx / D, xx = idx % D;
      float v = 0.f;
      if (qq < nq) {
        std::int64_t row = a.p.chunk_indptr[x.r] + (c - w) + qq / G;
        v = load_scalar(a.p.q, a.p.q_dtype, row * q_row_stride + (x.h * G + qq % G) * D + xx) *
            q_scale;
      }
      qs[idx / D][xx] = v;
    }
    sync_block(sync_site::snapkv_queries);
    const int qq          = q0 + ql;
    const std::int64_t iq = (c - w) + qq / G;  // chunk position of the query
    float l[KPT];
#pragma unroll
    for (int u = 0; u < KPT; ++u) {
      const int kk = kl + 16 * u;
      float dot    = 0.f;
#pragma unroll 8
      for (int xx = 0; xx < D; ++xx) dot = fmaf(qs[ql][xx], ks[kk][xx], dot);
      const std::int64_t i = i0 + kk;
      const bool visible   = qq < nq && i < n && (i < len || i - len <= iq);
      l[u]                 = visible ? dot : -INFINITY;
    }
    if constexpr (!Score) {
      float m = -INFINITY;
#pragma unroll
      for (int u = 0; u < KPT; ++u) m = fmaxf(m, l[u]);
#pragma unroll
      for (int off = 8; off > 0; off /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
      float s = 0.f;
#pragma unroll
      for (int u = 0; u < KPT; ++u) s += exp2_shifted(l[u], m);
#pragma unroll
      for (int off = 8; off > 0; off /= 2) s += __shfl_xor_sync(0xffffffffu, s, off);
      if (kl == 0 && qq < nq)
        a.stats[(x.rh * a.key_tiles + blockIdx.x) * a.nq_max + qq] = make_float2(m, s);
    } else {
      if (qq < nq) {
        const float2 nm = snapkv_norm(a, x, qq, w);
#pragma unroll
        for (int u = 0; u < KPT; ++u) acc[u] += exp2_shifted(l[u], nm.x) / nm.y;
      }
    }
  }
  if constexpr (Score) {
#pragma unroll
    for (int u = 0; u < KPT; ++u) red[ql][kl + 16 * u] = acc[u];
    __syncthreads();
    for (int kk = tid; kk < KT; kk += 256) {
      float total = 0.f;
#pragma unroll
      for (int q = 0; q < QT; ++q) total += red[q][kk];
      const std::int64_t i = i0 + kk;
      if (i < n) a.raw[x.rh * a.p.max_candidates + i] = total / static_cast<float>(nq);
    }
  }
}

/// Each query's softmax (max, sum) over all candidates, from the per-tile statistics in order.
/// (A template only so that every translation unit may instantiate it.)
template <class Unused = void>
TANGRAM_KERNEL __launch_bounds__(256) void snapkv_reduce_kernel(eviction_args const a,
                                                                std::int32_t key_tile) {
  const eviction_head x = resolve_head(a, blockIdx.x);
  if (!eviction_scores(x.e.action)) return;
  const std::int64_t w     = x.e.chunk < a.p.obs_window ? x.e.chunk : a.p.obs_window;
  const int nq             = static_cast<int>(w) * a.p.group;
  const std::int64_t tiles = (x.e.candidates + key_tile - 1) / key_tile;
  for (int qq = static_cast<int>(threadIdx.x); qq < nq; qq += static_cast<int>(blockDim.x)) {
    const float2* st = a.stats + x.rh * a.key_tiles * a.nq_max + qq;
    float m          = -INFINITY;
    for (std::int64_t t = 0; t < tiles; ++t) m = fmaxf(m, st[t * a.nq_max].x);
    float s = 0.f;
    for (std::int64_t t = 0; t < tiles; ++t)
      s += st[t * a.nq_max].y * exp2_shifted(st[t * a.nq_max].x, m);
    a.norm[x.rh * a.nq_max + qq] = make_float2(m, s);
  }
}

// ---------------------------------------------------------------------------------------------
// Key-norm scoring.
// ---------------------------------------------------------------------------------------------

/// Minus the L2 norm of each candidate's K; one warp per candidate, 64 candidates per CTA.
template <class T, int D>
TANGRAM_KERNEL __launch_bounds__(256) void key_norm_kernel(eviction_args const a) {
  const eviction_head x = resolve_head(a, blockIdx.y);
  if (!eviction_scores(x.e.action)) return;
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  // ||s_k k|| = s_k ||k|| (s_k > 0): the fp8 K scale multiplies the norm once.
  const float k_scale = a.p.scales.k_of(x.h);
  for (int u = 0; u < 8; ++u) {
    const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * 64 + warp * 8 + u;
    if (i >= x.e.candidates) return;  // uniform per warp
    const T* k = candidate_ptr<T>(a, x, i, 0);
    float ss   = 0.f;
#pragma unroll
    for (int m = 0; m < D / 32; ++m) {
      float v = widen(k[lane + 32 * m]);
      ss      = fmaf(v, v, ss);
    }
#pragma unroll
    for (int off = 16; off > 0; off /= 2) ss += __shfl_xor_sync(0xffffffffu, ss, off);
    if (lane == 0) a.raw[x.rh * a.p.max_candidates + i] = -(sqrtf(ss) * k_scale);
  }
}

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

// ---------------------------------------------------------------------------------------------
// Multi-CTA top-k: the threshold search (radix select with 11/11/10-bit digits).
// ---------------------------------------------------------------------------------------------

/// One head's slots of the selection workspace (see eviction_workspace_layout).
struct select_slots {
  std::uint32_t* hist  = nullptr;  ///< [select_radix_bins] counts of the current pass
  std::uint32_t* state = nullptr;  ///< [select_state_words]: prefix, remaining, ticket
};

/// Word indices of select_slots::state.
enum select_state_word : int { select_prefix = 0, select_remaining = 1, select_ticket = 2 };

/// Lowest key bit of pass `pass`'s digit: bits 31..21, 20..10, 9..0.
TANGRAM_HOST_DEVICE constexpr int select_shift(int pass) {
  return pass == 0 ? 21 : (pass == 1 ? 10 : 0);
}
/// Bins of pass `pass`'s digit.
TANGRAM_HOST_DEVICE constexpr int select_bins(int pass) {
  return pass == 2 ? 1024 : select_radix_bins;
}
static_assert(select_shift(0) + 11 == 32 && select_shift(1) + 11 == select_shift(0) &&
                  select_bins(2) == 1 << select_shift(1) && select_radix_passes == 3,
              "the digits tile the 32-bit key from the top");

/// Shape of a histogram CTA.
struct select_config {
  static constexpr int threads = 256;
  static constexpr int items   = select_slice / threads;       ///< keys per thread
  static constexpr int per     = select_radix_bins / threads;  ///< bins per thread in the scan
  static_assert(select_slice % threads == 0 && select_radix_bins % threads == 0, "whole tiles");
};

/// Shared memory of a histogram CTA.
struct select_hist_smem {
  using scan_t = cub::BlockScan<std::uint32_t, select_config::threads>;
  typename scan_t::TempStorage scan;
  unsigned int bins[select_radix_bins];  // the CTA's private histogram
  std::uint32_t last;                    // this CTA is the head's last of the pass
};

/// Bin meaning "not counted" (a key outside the current prefix or past the candidates).
inline constexpr std::uint32_t select_no_bin = 0xffffffffu;

/// Adds one to `bins[bin]` for every lane of the warp: lanes with the same bin add once together
/// (thousands of equal keys, e.g. protected ones, would otherwise serialise on one bin). Called
/// by all 32 lanes.
__device__ __forceinline__ void warp_aggregated_count(unsigned int* bins, std::uint32_t bin) {
  const unsigned peers = __match_any_sync(0xffffffffu, bin);
  const int lane       = static_cast<int>(threadIdx.x) % 32;
  if (bin != select_no_bin && lane == __ffs(static_cast<int>(peers)) - 1)
    atomicAdd(&bins[bin], static_cast<unsigned int>(__popc(peers)));
}

/// Clears the histogram and ticket of head blockIdx.x + gridDim.x * blockIdx.y at the start of a
/// launch (the workspace is caller-owned and uninitialised; later passes clear after
/// themselves). (A template only so that every translation unit may instantiate it.)
template <class Unused = void>
TANGRAM_KERNEL __launch_bounds__(256) void select_reset_kernel(std::uint32_t* hist,
                                                               std::uint32_t* state) {
  const std::int64_t head =
      blockIdx.x + static_cast<std::int64_t>(gridDim.x) * static_cast<std::int64_t>(blockIdx.y);
  for (int b = static_cast<int>(threadIdx.x); b < select_radix_bins; b += 256)
    hist[head * select_radix_bins + b] = 0u;
  if (threadIdx.x == 0) state[head * select_state_words + select_ticket] = 0u;
}

/// The last CTA of a pass: finds the bin holding the remaining-th largest key among the keys
/// that match the prefix (descending bins, block scan), extends the prefix and the remaining
/// rank in the head's state, and clears the ticket for the next pass or launch. `take(b)` returns
/// bin b's count and clears it: the head's histogram (read and zeroed in one atomic) or, for a
/// head of one slice, the CTA's own.
template <class Take>
__device__ __forceinline__ void select_scan_pass(select_slots const& s,
                                                 int pass,
                                                 std::uint32_t prefix,
                                                 std::uint32_t remaining,
                                                 select_hist_smem& sm,
                                                 Take take) {
  using cfg     = select_config;
  const int tid = static_cast<int>(threadIdx.x), bins = select_bins(pass);
  std::uint32_t count[cfg::per];
  std::uint32_t total = 0;
  // Thread tid holds the bins tid * per + j from the top.
#pragma unroll
  for (int j = 0; j < cfg::per; ++j) {
    const int b = bins - 1 - (tid * cfg::per + j);  // < 0 past a narrower digit's bins
    count[j]    = b >= 0 ? take(b) : 0u;
    total += count[j];
  }
  std::uint32_t above;
  select_hist_smem::scan_t(sm.scan).ExclusiveSum(total, above);
#pragma unroll
  for (int j = 0; j < cfg::per; ++j) {
    // The bin with keys above it < remaining <= keys above it + its count (exactly one).
    if (above < remaining && remaining <= above + count[j]) {
      const int b               = bins - 1 - (tid * cfg::per + j);
      s.state[select_prefix]    = prefix | static_cast<std::uint32_t>(b) << select_shift(pass);
      s.state[select_remaining] = remaining - above;
    }
    above += count[j];
  }
  if (tid == 0) s.state[select_ticket] = 0u;
}

/**
 * The whole threshold search of a head whose `n <= select_slice` keys fit one CTA (the only CTA
 * of its passes): each thread keeps its 16 keys in registers (taken once from `key_of`, which
 * also stores them for the compaction) and the three radix passes count them into the shared
 * histogram and scan it there, with no global histogram, ticket or re-read of the keys; the
 * head's state ends as after the multi-CTA passes (prefix, remaining, ticket 0). Called by every
 * thread of the CTA in pass 0; passes 1 and 2 skip such heads.
 */
template <class KeyOf>
__device__ __forceinline__ void select_one_slice(
    select_slots const& s, std::int64_t n, std::int64_t k, KeyOf key_of, select_hist_smem& sm) {
  using cfg     = select_config;
  const int tid = static_cast<int>(threadIdx.x);
  std::uint32_t key[cfg::items];
#pragma unroll
  for (int u = 0; u < cfg::items; ++u) {
    const std::int64_t i = u * cfg::threads + tid;  // coalesced, as in the multi-CTA pass
    key[u]               = i < n ? key_of(i) : 0u;
  }
  std::uint32_t prefix = 0u, remaining = static_cast<std::uint32_t>(k);
  for (int pass = 0; pass < select_radix_passes; ++pass) {
    const std::uint32_t mask = pass == 0 ? 0u : ~0u << select_shift(pass - 1);
    const int shift = select_shift(pass), bins = select_bins(pass);
    for (int b = tid; b < bins; b += cfg::threads) sm.bins[b] = 0u;
    __syncthreads();
#pragma unroll
    for (int u = 0; u < cfg::items; ++u) {
      const std::int64_t i = u * cfg::threads + tid;
      std::uint32_t bin    = select_no_bin;
      if (i < n && (key[u] & mask) == prefix)
        bin = (key[u] >> shift) & static_cast<std::uint32_t>(bins - 1);
      warp_aggregated_count(sm.bins, bin);
    }
    sync_block(sync_site::select_counted);
    select_scan_pass(s, pass, prefix, remaining, sm, [&](int b) { return sm.bins[b]; });
    __syncthreads();  // the state this CTA wrote is visible to all its threads
    prefix    = s.state[select_prefix];
    remaining = s.state[select_remaining];
    __syncthreads();  // read before the next pass's scan writes the state again
  }
}

/**
 * One radix pass over slice blockIdx.x of a head's `n` keys (`k` to keep, 1 <= k): the CTA
 * counts the keys matching the prefix so far into a private shared histogram, adds its nonzero
 * bins to the head's global one, and the head's last CTA to finish (ticket after a fence) scans
 * it (select_scan_pass). Pass 0 takes each key from `key_of(i)` (which computes and stores it);
 * later passes read `keys[i]`. The slices of a head are ceil(n / select_slice) CTAs; those past
 * `n` return at once. Called by every thread of the CTA.
 */
template <class KeyOf>
__device__ __forceinline__ void select_histogram_pass(select_slots const& s,
                                                      int pass,
                                                      std::int64_t n,
                                                      std::int64_t k,
                                                      const std::uint32_t* keys,
                                                      KeyOf key_of,
                                                      select_hist_smem& sm) {
  using cfg                = select_config;
  const int tid            = static_cast<int>(threadIdx.x);
  const std::int64_t begin = static_cast<std::int64_t>(blockIdx.x) * select_slice;
  if (k <= 0 || begin >= n) return;
  if (n <= select_slice) {  // one slice: pass 0's CTA runs all three, keys kept in registers
    if (pass == 0) select_one_slice(s, n, k, key_of, sm);
    return;
  }
  // The previous pass's result (its kernel has finished: plain loads see it).
  const std::uint32_t prefix = pass == 0 ? 0u : s.state[select_prefix];
  const std::uint32_t remaining =
      pass == 0 ? static_cast<std::uint32_t>(k) : s.state[select_remaining];
  const std::uint32_t mask = pass == 0 ? 0u : ~0u << select_shift(pass - 1);
  const int shift = select_shift(pass), bins = select_bins(pass);
  for (int b = tid; b < bins; b += cfg::threads) sm.bins[b] = 0u;
  __syncthreads();
#pragma unroll 4
  for (int u = 0; u < cfg::items; ++u) {
    const std::int64_t i = begin + u * cfg::threads + tid;  // coalesced
    std::uint32_t bin    = select_no_bin;
    if (i < n) {
      const std::uint32_t key = pass == 0 ? key_of(i) : keys[i];
      if ((key & mask) == prefix) bin = (key >> shift) & static_cast<std::uint32_t>(bins - 1);
    }
    warp_aggregated_count(sm.bins, bin);
  }
  sync_block(sync_site::select_counted);
  for (int b = tid; b < bins; b += cfg::threads)
    if (sm.bins[b] != 0u) atomicAdd(&s.hist[b], sm.bins[b]);
  __threadfence();  // this CTA's counts reach the device before its ticket
  __syncthreads();
  if (tid == 0) {
    const std::int64_t parts = (n + select_slice - 1) / select_slice;
    sm.last = atomicAdd(&s.state[select_ticket], 1u) == static_cast<std::uint32_t>(parts - 1);
  }
  __syncthreads();
  if (!sm.last) return;
  __threadfence();  // every other CTA's counts are visible to this one
  select_scan_pass(s, pass, prefix, remaining, sm, [&](int b) { return atomicExch(&s.hist[b], 0u); });
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
 * Keeps the `k` largest of the `n` candidate keys of head `x` (ties to the earlier position) and
 * compacts them in order to column positions [0, k): the keys above the threshold the histogram
 * passes left in `s.state` and the first `remaining` keys equal to it. Called by every thread of
 * the CTA, after the three select_histogram_pass launches of the same head.
 */
template <class T, int D>
__device__ __forceinline__ void compact_selected(eviction_args const& a,
                                                 eviction_head const& x,
                                                 std::int64_t n,
                                                 std::int64_t k,
                                                 const std::uint32_t* keys,
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
      key[u]               = i < n ? keys[i] : 0u;
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

/// Head `rh`'s selection slots of an eviction launch.
__device__ __forceinline__ select_slots eviction_select_slots(eviction_args const& a,
                                                              std::int64_t rh) {
  return {a.select_hist + rh * select_radix_bins, a.select_state + rh * select_state_words};
}

/// Radix pass `pass` of slice blockIdx.x of head blockIdx.y, for heads whose action is select.
/// (A template only so that every translation unit may instantiate it.)
template <class Unused = void>
TANGRAM_KERNEL __launch_bounds__(256) void select_histogram_kernel(eviction_args const a,
                                                                   int pass) {
  __shared__ select_hist_smem sm;
  const eviction_head x = resolve_head(a, blockIdx.y);
  if (x.e.action != eviction_action::select) return;
  eviction_params const& p = a.p;
  const std::int64_t n     = x.e.candidates;
  const float* raw =
      (p.source == score_source::supplied ? p.scores : a.raw) + x.rh * p.max_candidates;
  const std::int32_t pool = p.pool();
  std::uint32_t* keys     = a.keys + x.rh * p.max_candidates;
  select_histogram_pass(
      eviction_select_slots(a, x.rh),
      pass,
      n,
      x.e.keep,
      keys,
      [&](std::int64_t i) {
        const std::uint32_t key = candidate_key(raw, n, i, pool, p.sink, x.e.window);
        keys[i]                 = key;
        if (p.scores_out) p.scores_out[x.rh * p.max_candidates + i] = raw[i];
        return key;
      },
      sm);
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
    std::uint32_t* out =
        p.stage_keys +
        ((static_cast<std::int64_t>(x.r) * p.kv.num_layers + p.layer) * p.kv.num_kv_heads + x.h) *
            p.max_candidates;
    for (std::int64_t i = split.index * cfg::threads + tid; i < n;
         i += static_cast<std::int64_t>(cfg::splits) * cfg::threads) {
      out[i] = candidate_key(raw, n, i, pool, p.sink, x.e.window);
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
  compact_selected<T, D>(a,
                         x,
                         n,
                         x.e.keep,
                         a.keys + x.rh * p.max_candidates,
                         eviction_select_slots(a, x.rh),
                         sm,
                         split);
}

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
