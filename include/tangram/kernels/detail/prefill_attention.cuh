// SPDX-License-Identifier: Apache-2.0
/**
 * @file kernels/detail/prefill_attention.cuh
 * @brief Device code of chunked-prefill attention over ragged pages (see
 * kernels/prefill_attention.hpp).
 *
 * Grid (query tiles, KV heads, requests), 128 threads (4 warps). A CTA owns
 * `prefill_rows_per_cta` (16) consecutive "row-heads" `m = t * group + g` of one (request r,
 * KV head h): chunk row `t`, query head `h * group + g`, so the GQA group shares every K/V tile.
 * Each warp owns 4 row-heads. The CTA streams the keys `[first, len + t_last]` (held tokens
 * through the head's `head_cursor`, then the chunk's rows; `first` from the sliding window of
 * its first row) through a shared-memory K/V tile of `kt` keys, and runs a flash-attention style
 * online softmax in base 2 per row-head:
 *
 * - scores: `32 / kt` lanes per key, each a slice of the dot product with the (pre-scaled, f32)
 *   queries held in shared memory, reduced with shuffles; masked keys (causal, window, past the
 *   end) get -inf;
 * - softmax: the tile's max and sum by warp shuffles, one rescale of (m, l, o) per tile;
 * - PV: lane owns `D / 32` output dims; each key's weight is broadcast by a shuffle.
 *
 * Finally the sink joins the denominator and o / lse are stored (lse in natural log).
 *
 * Not optimised yet (documented in docs/kernels.md): CUDA cores only (no mma / tensor cores), a
 * single tile buffer with synchronous 16-byte loads (no cp.async double buffering), a page-table
 * read per 16-byte copy, 16 row-heads per CTA (K/V are re-read by every query tile of the
 * chunk), and no split of long held contexts over several CTAs.
 */
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <type_traits>

#include "tangram/core/config.hpp"
#include "tangram/kernels/detail/vec.cuh"
#include "tangram/kernels/head_cursor.hpp"
#include "tangram/kernels/math.hpp"
#include "tangram/kernels/prefill_attention.hpp"

namespace tangram::detail {

/// Compile-time shape of the prefill kernel for storage type T and head dim D.
template <class T, int D>
struct prefill_config {
  static constexpr int threads       = 128;
  static constexpr int warps         = threads / 32;
  static constexpr int rows          = prefill_rows_per_cta;  ///< row-heads per CTA
  static constexpr int rows_per_warp = rows / warps;
  static constexpr int elem_bytes    = static_cast<int>(sizeof(T));
  /// keys per tile: K + V of a tile within 16 KiB, at most 32 (one per lane)
  static constexpr int kt = 16384 / (2 * D * elem_bytes) < 32 ? 16384 / (2 * D * elem_bytes) : 32;
  static constexpr int lanes_per_key = 32 / kt;
  static constexpr int key_dims      = D / lanes_per_key;  ///< dims of a lane's score slice
  static constexpr int per16         = 16 / elem_bytes;    ///< elements per 16-byte vector
  static constexpr int out_dims      = D / 32;             ///< output dims per lane
  static constexpr int row_chunks    = D * elem_bytes / 16;
  static constexpr int ld            = D + per16;  ///< shared row stride (16-byte pad: banks)
  static constexpr int q_bytes       = rows * D * 4;
  static constexpr int kv_bytes      = 2 * kt * ld * elem_bytes;
  static constexpr int smem_bytes    = q_bytes + kv_bytes;

  static_assert(rows % warps == 0, "row-heads split evenly over the warps");
  static_assert(kt >= 1 && 32 % kt == 0, "keys per tile divide the warp");
  static_assert(key_dims % per16 == 0, "a lane's score slice is whole 16-byte vectors");
  static_assert(D % 32 == 0, "every lane owns the same output dims");
  static_assert(smem_bytes <= 48 * 1024, "dynamic shared memory must not need an opt-in");
};

/// Everything a prefill launch needs on the device (passed by value).
struct prefill_args {
  prefill_params p;
  float scale2 = 0.f;  ///< sm_scale * log2(e)
};

template <class T, int D>
TANGRAM_KERNEL __launch_bounds__(128) void prefill_kernel(prefill_args const a) {
  using cfg           = prefill_config<T, D>;
  constexpr int kt    = cfg::kt;
  constexpr int lpk   = cfg::lanes_per_key;
  constexpr int rpw   = cfg::rows_per_warp;
  constexpr int ld    = cfg::ld;
  constexpr int vo    = cfg::out_dims;
  constexpr int per16 = cfg::per16;
  TANGRAM_DYNAMIC_SMEM(smem);

  prefill_params const& p = a.p;
  kv_cache_view const& kv = p.kv;
  const int tid = static_cast<int>(threadIdx.x), lane = tid % 32, warp = tid / 32;
  const int h = static_cast<int>(blockIdx.y), r = static_cast<int>(blockIdx.z);
  const int H = kv.num_kv_heads, G = p.group, Hq = H * G;
  const std::int64_t row0 = p.chunk_indptr[r];
  const int c             = static_cast<int>(p.chunk_indptr[r + 1] - row0);
  TANGRAM_DEVICE_CHECK(c >= 0 && c <= p.max_chunk,
                       "prefill: a chunk is negative or longer than max_chunk");
  const int m0    = static_cast<int>(blockIdx.x) * cfg::rows;  // first row-head of the CTA
  const int m_end = c * G < m0 + cfg::rows ? c * G : m0 + cfg::rows;
  if (m0 >= m_end) return;  // uniform across the CTA

  const head_cursor cur     = make_head_cursor(kv, r, p.layer, h);
  const std::int64_t len    = cur.len;
  const std::int64_t window = kv.group_window[kv.slot_of(p.layer, h).group];
  const int t_first = m0 / G, t_last = (m_end - 1) / G;
  const std::int64_t k_begin = prefill_first_key(t_first, len, window);
  const std::int64_t k_end   = len + t_last + 1;

  // fp8 scales (kv_scales.hpp) folded as in decode: the K scale into the queries' pre-scale
  // (q . s_k k = s_k q . k), the V scale into the stored output (linear in V). Exact up to
  // rounding; one multiply per query and output element instead of one per K/V element.
  const float q_scale = a.scale2 * p.scales.k_of(h);
  const float v_scale = p.scales.v_of(h);
  float* qs = reinterpret_cast<float*>(smem);  // [rows][D] queries * scale * log2 e * s_k
  T* ks     = reinterpret_cast<T*>(smem + cfg::q_bytes);
  T* vs     = ks + kt * ld;
  // 4 dims a step (load_run: vector loads where aligned)
  for (int e = 4 * tid; e < cfg::rows * D; e += 4 * cfg::threads) {
    const int m = m0 + e / D, x = e % D;
    float v[4] = {};
    if (m < m_end)
      load_run(
          p.q,
          p.q_dtype,
          (row0 + m / G) * p.q_row_stride() + (static_cast<std::int64_t>(h) * G + m % G) * D + x,
          v);
#pragma unroll
    for (int i = 0; i < 4; ++i) qs[e + i] = m < m_end ? v[i] * q_scale : 0.f;
  }

  // This warp's row-heads: (chunk row, liveness) and the online-softmax state.
  const int lr0 = warp * rpw;
  // Row-head i of the warp is m0 + lr0 + i: live while < m_end, chunk row (m0 + lr0 + i) / G.
  const int live_rows = m_end - (m0 + lr0);  // row-heads i < live_rows are live (may be <= 0)
  float o[rpw][vo], mx[rpw], l[rpw];
#pragma unroll
  for (int i = 0; i < rpw; ++i) {
    mx[i] = -INFINITY;
    l[i]  = 0.f;
#pragma unroll
    for (int e = 0; e < vo; ++e) o[i][e] = 0.f;
  }
  const int key_local = lane / lpk, part = lane % lpk;
  const T* chunk_k = static_cast<const T*>(p.chunk_k);
  const T* chunk_v = static_cast<const T*>(p.chunk_v);

  for (std::int64_t kb = k_begin; kb < k_end; kb += kt) {
    __syncthreads();  // every warp is done with the previous tile
    for (int ci = tid; ci < 2 * kt * cfg::row_chunks; ci += cfg::threads) {
      const int kvsel = ci / (kt * cfg::row_chunks), rem = ci % (kt * cfg::row_chunks);
      const int tok = rem / cfg::row_chunks, ch = rem % cfg::row_chunks;
      const std::int64_t k = kb + tok;
      uint4 val{0u, 0u, 0u, 0u};  // keys past the end: zeros (weight 0, never NaN)
      if (k < k_end) {
        const T* src =
            k < len ? cur.ptr_at_position<T>(cur.position(static_cast<std::int32_t>(k)), kvsel)
                    : (kvsel ? chunk_v : chunk_k) + ((row0 + k - len) * H + h) * D;
        val = reinterpret_cast<const uint4*>(src)[ch];
      }
      reinterpret_cast<uint4*>((kvsel ? vs : ks) + tok * ld)[ch] = val;
    }
    sync_block(sync_site::prefill_tile_ready);  // the tile (first pass: the queries) is stored

    // Scores of this lane's key for the warp's row-heads.
    const std::int64_t k = kb + key_local;
    float sc[rpw];
#pragma unroll
    for (int i = 0; i < rpw; ++i) sc[i] = 0.f;
#pragma unroll
    for (int ch = 0; ch < cfg::key_dims / per16; ++ch) {
      const int x0 = part * cfg::key_dims + ch * per16;
      float kf[per16];
      load_widen<T, per16>(ks + key_local * ld + x0, kf);
#pragma unroll
      for (int i = 0; i < rpw; ++i)
#pragma unroll
        for (int e = 0; e < per16; ++e) sc[i] = fmaf(qs[(lr0 + i) * D + x0 + e], kf[e], sc[i]);
    }
#pragma unroll
    for (int i = 0; i < rpw; ++i) {
#pragma unroll
      for (int off = lpk / 2; off > 0; off /= 2) sc[i] += __shfl_xor_sync(0xffffffffu, sc[i], off);
      const bool visible =
          i < live_rows && k < k_end && prefill_visible(k, (m0 + lr0 + i) / G, len, window);
      sc[i] = visible ? sc[i] : -INFINITY;
    }

    // Online softmax: one rescale per tile; sc becomes the key's weight.
#pragma unroll
    for (int i = 0; i < rpw; ++i) {
      float tmax = sc[i];
#pragma unroll
      for (int off = 16; off > 0; off /= 2)
        tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, off));
      const float mnew  = fmaxf(mx[i], tmax);
      const float alpha = exp2_shifted(mx[i], mnew);  // 0 while mx is -inf
      sc[i]             = exp2_shifted(sc[i], mnew);
      float psum        = part == 0 ? sc[i] : 0.f;
#pragma unroll
      for (int off = 16; off > 0; off /= 2) psum += __shfl_xor_sync(0xffffffffu, psum, off);
      l[i]  = l[i] * alpha + psum;
      mx[i] = mnew;
#pragma unroll
      for (int e = 0; e < vo; ++e) o[i][e] *= alpha;
    }

    // o += P V over the tile.
#pragma unroll
    for (int j = 0; j < kt; ++j) {
      float vf[vo];
#pragma unroll
      for (int e = 0; e < vo; ++e) vf[e] = widen(vs[j * ld + lane * vo + e]);
#pragma unroll
      for (int i = 0; i < rpw; ++i) {
        const float pj = __shfl_sync(0xffffffffu, sc[i], j * lpk);
#pragma unroll
        for (int e = 0; e < vo; ++e) o[i][e] = fmaf(pj, vf[e], o[i][e]);
      }
    }
  }

  // The sink joins the denominator; store o and the natural-log lse.
#pragma unroll
  for (int i = 0; i < rpw; ++i) {
    if (i >= live_rows) continue;
    const int m           = m0 + lr0 + i;
    const std::int64_t qh = (row0 + m / G) * Hq + static_cast<std::int64_t>(h) * G + m % G;
    const float sink2     = p.sinks ? p.sinks[h * G + m % G] * log2e : -INFINITY;
    const float mm        = sink2 > mx[i] ? sink2 : mx[i];
    const float alpha     = exp2_shifted(mx[i], mm);
    const float den       = l[i] * alpha + exp2_shifted(sink2, mm);
#pragma unroll
    for (int e = 0; e < vo; ++e)
      store_scalar(p.o, p.o_dtype, qh * D + lane * vo + e, o[i][e] * alpha * v_scale / den);
    if (lane == 0 && p.lse) p.lse[qh] = (mm + log2_of(den)) * ln2;
  }
}

/// The kernel's arguments for validated parameters.
inline prefill_args make_prefill_args(prefill_params const& p) {
  prefill_args a;
  a.p      = p;
  a.scale2 = p.scale() * log2e;
  return a;
}

/// Enqueues the kernel for (T, D) through the launch policy `launch` (vec.cuh); nothing when
/// the batch or every chunk is empty.
template <class T, int D, class Launch>
void launch_prefill_with(prefill_args const& a, Launch const& launch) {
  using cfg                = prefill_config<T, D>;
  const std::int32_t tiles = prefill_query_tiles(a.p.max_chunk, a.p.group);
  if (tiles == 0 || a.p.kv.batch_size == 0) return;
  launch(prefill_kernel<T, D>,
         dim3(static_cast<unsigned>(tiles),
              static_cast<unsigned>(a.p.kv.num_kv_heads),
              static_cast<unsigned>(a.p.kv.batch_size)),
         cfg::threads,
         cfg::smem_bytes,
         a);
}

}  // namespace tangram::detail
