// SPDX-License-Identifier: Apache-2.0
/**
 * @file kernels/detail/snapkv_mma.cuh
 * @brief SnapKV scores on tensor cores from the prefill's log-sum-exp (`eviction_params::q_lse`):
 * every logit computed once, for 16-bit K (bf16, f16) and fp8 K (e4m3, e5m2, read as f16).
 *
 * Grid: blocks of `keys` candidates x (request, KV head). A CTA stages its block of K rows in
 * shared memory as the mma input type (fp8 widened to f16 on the way, exactly), then walks the
 * head's observation-window queries (window-major, group-minor, as the CUDA-core scorer numbers
 * them) one m16 tile at a time: the CTA writes the tile into shared memory and each of its four
 * warps runs S = Q K^T with `mma.sync` m16n8k16 for its quarter of the block's keys (queries are
 * the A rows, keys the n columns). Each score becomes the weight `exp2(s log2(e) scale -
 * lse log2(e))` (0 for keys the query does not see: causal within the chunk), which the lane adds
 * to its running sum per key; at the end the sum over the warp's rows (three shuffles) gives each
 * key's total, divided by the window's query count. Fixed order throughout: deterministic.
 *
 * Query rows. With `Split` (the queries' dtype is not the mma type, e.g. f32 queries), rows g and
 * g + 8 hold query g's value rounded to the mma type and the rounding remainder (split2 in
 * mma.cuh; the decode kernel does the same), so a score is C[g][n] + C[g + 8][n] and carries
 * ~16 (bf16) / ~22 (f16) significand bits: 8 queries per tile. Without it (bf16 queries on bf16 K,
 * f16 queries on f16 or fp8 K) the queries are exact in the mma type and rows g and g + 8 are two
 * queries: 16 per tile, half the mma work. The scale and the fp8 K scale multiply the f32 scores.
 */
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "tangram/config.hpp"
#include "tangram/kernels/detail/eviction_common.cuh"
#include "tangram/kernels/detail/mma.cuh"
#include "tangram/kernels/detail/vec.cuh"
#include "tangram/kernels/eviction.hpp"
#include "tangram/kernels/math.hpp"

namespace tangram::detail {

/// The K storage types the tensor-core SnapKV scorer reads: bf16/f16 as they are, fp8 as f16.
template <class T>
inline constexpr bool snapkv_uses_mma = std::is_same_v<T, bfloat16> ||
                                        std::is_same_v<T, float16> ||
                                        std::is_same_v<T, float8_e4m3> ||
                                        std::is_same_v<T, float8_e5m2>;

/// The mma input type for K storage type T: T itself, or f16 for fp8 (its values are f16 values).
template <class T>
using snapkv_mma_type_t = std::conditional_t<sizeof(T) == 1, float16, T>;

/// Compile-time shape of the tensor-core SnapKV scorer for head dim D: the K block and one query
/// tile (16 rows) in static shared memory, rows padded by 16 bytes.
template <int D>
struct snapkv_mma_config {
  static constexpr int warps        = 4;
  static constexpr int threads      = 32 * warps;
  static constexpr int keys         = D == 256 ? 64 : 128;  ///< candidates per CTA
  static constexpr int row          = D + 8;  ///< 16-bit elements per shared row (16-byte pad)
  static constexpr int warp_n_tiles = keys / 8 / warps;  ///< n tiles (8 keys) of each warp
  static_assert(D % 16 == 0 && warp_n_tiles % 2 == 0, "whole mma tiles, ldmatrix pairs");
  static_assert((keys + 16) * row * 2 <= 48 * 1024, "static shared memory");
};

template <class T, int D, bool Split>
TANGRAM_KERNEL __launch_bounds__(snapkv_mma_config<D>::threads) void snapkv_mma_kernel(
    eviction_args const a) {
  using cfg             = snapkv_mma_config<D>;
  using M               = snapkv_mma_type_t<T>;
  constexpr int KB      = cfg::keys;
  constexpr int row     = cfg::row;
  constexpr int threads = cfg::threads;
  constexpr int NW      = cfg::warp_n_tiles;
  constexpr int QR      = Split ? 8 : 16;  ///< queries per m16 tile
  __shared__ uint4 ks_vec[KB * row / 8];   // uint4: 16-byte aligned rows for ldmatrix
  __shared__ uint4 qs_vec[16 * row / 8];
  M* ks = reinterpret_cast<M*>(ks_vec);
  M* qs = reinterpret_cast<M*>(qs_vec);

  const eviction_head x = resolve_head(a, blockIdx.y);
  if (!eviction_scores(x.e.action)) return;
  const std::int64_t n = x.e.candidates, len = x.e.len, c = x.e.chunk;
  const std::int64_t i0 = static_cast<std::int64_t>(blockIdx.x) * KB;
  if (i0 >= n) return;
  const int tid = static_cast<int>(threadIdx.x), lane = tid % 32, warp = tid / 32;
  const int g = lane / 4, tq = lane % 4;  // fragment row and column pair

  // The block's K rows into shared memory: `lpt` lanes per token, each resolving the token's row
  // once and copying whole 16-byte chunks (fp8: widened to 32 bytes of f16).
  {
    constexpr int eb     = static_cast<int>(sizeof(T));
    constexpr int chunks = D * eb / 16;
    constexpr int lpt    = chunks < 8 ? chunks : 8;
    for (int kk = tid / lpt; kk < KB; kk += threads / lpt) {
      const std::int64_t i = i0 + kk;
      const uint4* src =
          i < n ? reinterpret_cast<const uint4*>(candidate_ptr<T>(a, x, i, 0)) : nullptr;
#pragma unroll
      for (int u = 0; u < chunks / lpt; ++u) {
        const int part = tid % lpt + lpt * u;
        uint4 v        = {0u, 0u, 0u, 0u};
        if (src != nullptr) v = src[part];
        if constexpr (eb == 1) {
          uint4 wide[2];
          fp8x16_to_f16<T>(v, wide);
          auto* dst = reinterpret_cast<uint4*>(ks + kk * row + part * 16);
          dst[0]    = wide[0];
          dst[1]    = wide[1];
        } else {
          *reinterpret_cast<uint4*>(ks + kk * row + part * 8) = v;
        }
      }
    }
  }

  const int G             = a.p.group;
  const std::int64_t w    = c < a.p.obs_window ? c : a.p.obs_window;
  const int nq            = static_cast<int>(w) * G;
  const int q_tiles       = (nq + QR - 1) / QR;
  const std::int64_t hq   = static_cast<std::int64_t>(a.p.kv.num_kv_heads) * G;  // query heads
  const std::int64_t row0 = a.p.chunk_indptr[x.r] + (c - w);  // the window's first chunk row
  const float s2          = a.scale2 * a.p.scales.k_of(x.h);  // base-2 logit per unit of q . k
  auto q_at               = [&](int qq, int dim) {  // element `dim` of window query qq (0 past)
    return qq < nq ? load_scalar(
                         a.p.q, a.p.q_dtype, (row0 + qq / G) * hq * D + (x.h * G + qq % G) * D + dim)
                   : 0.f;
  };
  // ldmatrix row addresses (elements): A rows 0-15 x k halves; B keys (0-7 | 8-15) x dim halves
  // of this warp's n tiles.
  const int q_lane = (lane % 16) * row + (lane / 16) * 8;
  const int k_lane =
      (warp * NW * 8 + (lane / 16) * 8 + lane % 8) * row + ((lane / 8) % 2) * 8;

  float wsum[NW][2];  // this lane's weights of its keys 8 nt + 2 tq + i, summed over its rows
#pragma unroll
  for (int nt = 0; nt < NW; ++nt) wsum[nt][0] = wsum[nt][1] = 0.f;

  for (int qt = 0; qt < q_tiles; ++qt) {
    // (Not a numbered mutation site: the emulator runs every thread to its next barrier before
    // any warp collective executes, so it cannot observe these barriers' absence.)
    __syncthreads();  // the K block is stored; every warp is done with the previous query tile
    // The query tile: rows g and g + 8 are one query (hi, lo: split2) or two, two dims a step.
    for (int e = tid; e < (Split ? 8 : 16) * (D / 2); e += threads) {
      const int r = e / (D / 2), dim = 2 * (e % (D / 2)), qq = qt * QR + r;
      const float v0 = q_at(qq, dim), v1 = q_at(qq, dim + 1);
      if constexpr (Split) {
        unsigned hi, lo;
        split2<M>(v0, v1, hi, lo);
        *reinterpret_cast<unsigned*>(qs + r * row + dim)       = hi;
        *reinterpret_cast<unsigned*>(qs + (r + 8) * row + dim) = lo;
      } else {
        *reinterpret_cast<unsigned*>(qs + r * row + dim) = pack2<M>(v0, v1);
      }
    }
    __syncthreads();

    // S = Q K^T for this warp's keys.
    float cs[NW][4];
#pragma unroll
    for (int nt = 0; nt < NW; ++nt) cs[nt][0] = cs[nt][1] = cs[nt][2] = cs[nt][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      unsigned qa[4];
      ldmatrix_x4<false>(qa, qs + q_lane + kk * 16);
#pragma unroll
      for (int np = 0; np < NW / 2; ++np) {
        unsigned kb[4];
        ldmatrix_x4<false>(kb, ks + k_lane + np * 16 * row + kk * 16);
        mma_m16n8k16<M>(cs[2 * np], qa, {kb[0], kb[1]});
        mma_m16n8k16<M>(cs[2 * np + 1], qa, {kb[2], kb[3]});
      }
    }
    // Weights: rows g and g + 8 (one query or two), each with its normaliser (base 2) and its
    // last visible candidate (len + its chunk position; -1 past the window: sees nothing).
    const int qa_ = qt * QR + g, qb_ = Split ? qa_ : qa_ + 8;
    auto lse2_of  = [&](int qq) {
      return qq < nq ? a.p.q_lse[(row0 + qq / G) * hq + x.h * G + qq % G] * log2e : 0.f;
    };
    auto last_of = [&](int qq) { return qq < nq ? len + (c - w) + qq / G : std::int64_t{-1}; };
    const float lse_a = lse2_of(qa_), lse_b = lse2_of(qb_);
    const std::int64_t last_a = last_of(qa_), last_b = last_of(qb_);
#pragma unroll
    for (int nt = 0; nt < NW; ++nt)
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const std::int64_t key = i0 + (warp * NW + nt) * 8 + 2 * tq + i;
        float p;
        if constexpr (Split) {
          p = key <= last_a ? exp2_shifted((cs[nt][i] + cs[nt][i + 2]) * s2, lse_a) : 0.f;
        } else {
          p = (key <= last_a ? exp2_shifted(cs[nt][i] * s2, lse_a) : 0.f) +
              (key <= last_b ? exp2_shifted(cs[nt][i + 2] * s2, lse_b) : 0.f);
        }
        wsum[nt][i] += p;
      }
  }

  // Each key's total over the warp's rows (lanes with the same tq); every key is one warp's.
#pragma unroll
  for (int nt = 0; nt < NW; ++nt)
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      float v = wsum[nt][i];
      v += __shfl_xor_sync(0xffffffffu, v, 4);
      v += __shfl_xor_sync(0xffffffffu, v, 8);
      v += __shfl_xor_sync(0xffffffffu, v, 16);
      const std::int64_t key = i0 + (warp * NW + nt) * 8 + 2 * tq + i;
      if (g == 0 && key < n) a.raw[x.rh * a.p.max_candidates + key] = v / static_cast<float>(nq);
    }
}

/// Enqueues the tensor-core SnapKV scorer for (T, D) (`a.p.q_lse` set) through `launch`.
template <class T, int D, class Launch>
void launch_snapkv_mma_with(eviction_args const& a, Launch const& launch) {
  using cfg                     = snapkv_mma_config<D>;
  const auto heads              = static_cast<unsigned>(a.p.kv.batch_size * a.p.kv.num_kv_heads);
  const auto blocks             = static_cast<unsigned>(
      (std::int64_t{a.p.max_candidates} + cfg::keys - 1) / cfg::keys);
  constexpr dtype exact_q       = std::is_same_v<snapkv_mma_type_t<T>, bfloat16> ? dtype::bf16
                                                                                 : dtype::f16;
  if (a.p.q_dtype == exact_q)
    launch(snapkv_mma_kernel<T, D, false>, dim3(blocks, heads), cfg::threads, 0, a);
  else
    launch(snapkv_mma_kernel<T, D, true>, dim3(blocks, heads), cfg::threads, 0, a);
}

}  // namespace tangram::detail
