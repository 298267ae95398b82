// SPDX-License-Identifier: Apache-2.0
/**
 * @file kernels/detail/eviction_score.cuh
 * @brief The scoring kernels of the fused chunk eviction (kernels/detail/eviction.cuh, whose file
 * comment describes them): SnapKV tile statistics and scores, their reduction, key norm.
 */
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
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
    // 4 dims a step (load_run: vector loads where aligned)
    for (int idx = 4 * tid; idx < QT * D; idx += 4 * 256) {
      int qq = q0 + idx / D, xx = idx % D;
      float v[4] = {};
      if (qq < nq) {
        std::int64_t row = a.p.chunk_indptr[x.r] + (c - w) + qq / G;
        load_run(a.p.q, a.p.q_dtype, row * q_row_stride + (x.h * G + qq % G) * D + xx, v);
      }
#pragma unroll
      for (int i = 0; i < 4; ++i) qs[idx / D][xx + i] = qq < nq ? v[i] * q_scale : 0.f;
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

}  // namespace tangram::detail
