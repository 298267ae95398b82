// SPDX-License-Identifier: Apache-2.0
/**
 * @file kernels/detail/snapkv_mma.cuh
 * @brief SnapKV scores on tensor cores from the prefill's log-sum-exp (`eviction_params::q_lse`):
 * every logit computed once, for 16-bit K (bf16, f16) and fp8 K (e4m3, e5m2, read as f16).
 *
 * Grid: blocks of `keys` candidates x (request, KV head). A CTA stages its block of K rows in
 * shared memory as the mma input type (fp8 widened to f16 on the way, exactly) with every load of
 * the block in flight at once (the row addresses first, then the loads, then the stores); each
 * of its four warps then holds its quarter of the block's keys as mma B fragments in registers.
 * It walks the head's observation-window queries (window-major, group-minor, as the CUDA-core
 * scorer numbers them) one m16 tile at a time through two buffers in the K block's memory, the
 * next tile copied (cp.async, exact rows) or built (split rows) while the warps score the current
 * one: S = Q K^T with `mma.sync` m16n8k16 (queries are the A rows, keys the n columns). Each score
 * becomes the weight `exp2(s log2(e) scale - lse log2(e))` (0 for keys the query does not see:
 * causal within the chunk), which the lane adds to its running sum per key; at the end the sum
 * over the warp's rows (three shuffles) gives each key's total, divided by the window's query
 * count. Fixed order throughout: deterministic.
 *
 * Query rows. With `Split` (the queries' dtype is not the mma type, e.g. f32 queries), rows g and
 * g + 8 hold query g's value rounded to the mma type and the rounding remainder (split2 in
 * mma.cuh; the decode kernel does the same), so a score is C[g][n] + C[g + 8][n] and carries
 * ~16 (bf16) / ~22 (f16) significand bits: 8 queries per tile. Without it (bf16 queries on bf16 K,
 * f16 queries on f16 or fp8 K, `q` 16-byte aligned) the queries are exact in the mma type and
 * rows g and g + 8 are two queries: 16 per tile, half the mma work. The scale and the fp8 K scale
 * multiply the f32 scores.
 */
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <type_traits>

#include "tangram/core/config.hpp"
#include "tangram/kernels/detail/eviction_common.cuh"
#include "tangram/kernels/detail/mma.cuh"
#include "tangram/kernels/detail/vec.cuh"
#include "tangram/kernels/eviction.hpp"
#include "tangram/kernels/math.hpp"

namespace tangram::detail {

/// The K storage types the tensor-core SnapKV scorer reads: bf16/f16 as they are, fp8 as f16.
template <class T>
inline constexpr bool snapkv_uses_mma =
    std::is_same_v<T, bfloat16> || std::is_same_v<T, float16> || std::is_same_v<T, float8_e4m3> ||
    std::is_same_v<T, float8_e5m2>;

/// The mma input type for K storage type T: T itself, or f16 for fp8 (its values are f16 values).
template <class T>
using snapkv_mma_type_t = std::conditional_t<sizeof(T) == 1, float16, T>;

/// Compile-time shape of the tensor-core SnapKV scorer for storage type T and head dim D: the K
/// block in static shared memory (rows padded by 16 bytes), which, once every warp holds its keys
/// as mma B fragments in registers, the two query-tile buffers reuse.
template <class T, int D>
struct snapkv_mma_config {
  static constexpr int warps        = 4;
  static constexpr int threads      = 32 * warps;
  static constexpr int keys         = D == 256 ? 64 : 128;  ///< candidates per CTA
  static constexpr int row          = D + 8;  ///< 16-bit elements per shared row (16-byte pad)
  static constexpr int warp_n_tiles = keys / 8 / warps;  ///< n tiles (8 keys) of each warp
  static constexpr int elem_bytes   = static_cast<int>(sizeof(T));
  static constexpr int row_chunks   = D * elem_bytes / 16;  ///< 16-byte chunks of a stored K row
  static constexpr int lpt          = row_chunks < 4 ? row_chunks : 4;  ///< lanes per token
  static constexpr int passes       = keys / (threads / lpt);  ///< tokens each thread stages
  static constexpr int per_lane     = row_chunks / lpt;        ///< its chunks of each token
  static constexpr int sub_tiles    = 2;  ///< m16 query tiles per step (one barrier a step)
  static constexpr int q_chunks     = sub_tiles * 16 * D / 8 / threads;  ///< query copies a step
  static_assert(D % 16 == 0 && warp_n_tiles % 2 == 0, "whole mma tiles, ldmatrix pairs");
  static_assert(keys % (threads / lpt) == 0 && row_chunks % lpt == 0, "whole tokens per pass");
  static_assert(q_chunks >= 1 && (D / 8) % q_chunks == 0, "whole query rows per copy round");
  static_assert(keys * row * 2 <= 48 * 1024, "static shared memory");
  static_assert(2 * sub_tiles * 16 <= keys, "two steps of query tiles fit the K block's memory");
};

/// One window query's place, moved a fixed number of queries (window-major, group-minor) per
/// tile without a division: its chunk row from the window's first, its query head in the group,
/// and `at`, its index among the chunk's [rows][query heads] (its q_lse entry; its q row * d).
struct window_query {
  std::int64_t at = 0;
  int row = 0, head = 0;
  window_query() = default;
  /// Query `qq` of the window of KV head `h` (window's first chunk row `row0`, `hq` query heads).
  __device__ __forceinline__
  window_query(int qq, int group, std::int64_t row0, std::int64_t hq, int h)
      : row(qq / group), head(qq % group) {
    at = (row0 + row) * hq + static_cast<std::int64_t>(h) * group + head;
  }
  /// Moves `rows * group + heads` queries on (heads < group).
  __device__ __forceinline__ void advance(int rows, int heads, int group, std::int64_t hq) {
    row += rows;
    head += heads;
    at += rows * hq + heads;
    if (head >= group) {
      head -= group;
      ++row;
      at += hq - group;
    }
  }
};

template <class T, int D, bool Split>
TANGRAM_KERNEL __launch_bounds__(snapkv_mma_config<T, D>::threads) void snapkv_mma_kernel(
    eviction_args const a) {
  using cfg             = snapkv_mma_config<T, D>;
  using M               = snapkv_mma_type_t<T>;
  constexpr int KB      = cfg::keys;
  constexpr int row     = cfg::row;
  constexpr int threads = cfg::threads;
  constexpr int NW      = cfg::warp_n_tiles;
  constexpr int QR      = Split ? 8 : 16;  ///< queries per m16 tile
  constexpr int eb      = cfg::elem_bytes;
  __shared__ uint4 ks_vec[KB * row / 8];  // uint4: 16-byte aligned rows for ldmatrix
  M* ks = reinterpret_cast<M*>(ks_vec);

  const eviction_head x = resolve_head(a, blockIdx.y);
  if (!eviction_scores(x.e.action)) return;
  const std::int64_t n = x.e.candidates, len = x.e.len, c = x.e.chunk;
  const std::int64_t i0 = static_cast<std::int64_t>(blockIdx.x) * KB;
  if (i0 >= n) return;
  const int tid = static_cast<int>(threadIdx.x), lane = tid % 32, warp = tid / 32;
  const int g = lane / 4, tq = lane % 4;  // fragment row and column pair

  // The block's K rows into shared memory as the mma type: `lpt` lanes per token, adjacent
  // 16-byte chunks; a thread's `passes` tokens are consecutive candidates. Every row address
  // first (held tokens: one division for the first, then a step per token, one page-table entry
  // each; chunk tokens: their staging rows), then every load of the block (all in flight at once),
  // then the stores (fp8 widened to f16, exactly).
  {
    const std::int64_t first = i0 + (tid / cfg::lpt) * cfg::passes;
    const head_cursor& cur   = x.cur;  // a growing column (scored heads hold no ring)
    std::int32_t pidx        = static_cast<std::int32_t>(first / cur.page_tokens),
                 in          = static_cast<std::int32_t>(first % cur.page_tokens);
    const auto* held         = reinterpret_cast<const unsigned char*>(cur.pool) + cur.k_offset * eb;
    const unsigned char* hp  = first < len ? held + cur.pages[pidx] * cur.page_bytes +
                                                static_cast<std::int64_t>(in) * (D * eb)
                                           : held;
    const std::int64_t chunk_stride = static_cast<std::int64_t>(a.p.kv.num_kv_heads) * (D * eb);
    // Byte offset of candidate `first`'s chunk row (used once first + j >= len).
    std::int64_t coff = (a.p.chunk_indptr[x.r] + (first - len)) * chunk_stride + x.h * (D * eb);
    const uint4* src[cfg::passes];
#pragma unroll
    for (int j = 0; j < cfg::passes; ++j) {
      const std::int64_t i = first + j;
      src[j]               = i >= n    ? nullptr
                             : i < len ? reinterpret_cast<const uint4*>(hp)
                                       : reinterpret_cast<const uint4*>(
                               static_cast<const unsigned char*>(a.p.chunk_k) + coff);
      coff += chunk_stride;
      hp += D * eb;
      if (++in == cur.page_tokens) {  // the next token starts a page
        in = 0;
        ++pidx;
        if (i + 1 < len) hp = held + cur.pages[pidx] * cur.page_bytes;
      }
    }
    uint4 v[cfg::passes][cfg::per_lane];
#pragma unroll
    for (int j = 0; j < cfg::passes; ++j)
#pragma unroll
      for (int u = 0; u < cfg::per_lane; ++u)
        v[j][u] = src[j] != nullptr ? src[j][tid % cfg::lpt + cfg::lpt * u] : uint4{0u, 0u, 0u, 0u};
#pragma unroll
    for (int j = 0; j < cfg::passes; ++j)
#pragma unroll
      for (int u = 0; u < cfg::per_lane; ++u) {
        const int kk = (tid / cfg::lpt) * cfg::passes + j, part = tid % cfg::lpt + cfg::lpt * u;
        if constexpr (eb == 1) {
          uint4 wide[2];
          fp8x16_to_f16<T>(v[j][u], wide);
          auto* dst = reinterpret_cast<uint4*>(ks + kk * row + part * 16);
          dst[0]    = wide[0];
          dst[1]    = wide[1];
        } else {
          *reinterpret_cast<uint4*>(ks + kk * row + part * 8) = v[j][u];
        }
      }
  }
  __syncthreads();  // the K block is stored
  // This warp's keys as B fragments of S = Q K^T, in registers for every query tile: keys
  // (0-7 | 8-15) x dim halves of its n tiles.
  unsigned kb[D / 16][NW / 2][4];
  {
    const int k_lane = (warp * NW * 8 + (lane / 16) * 8 + lane % 8) * row + ((lane / 8) % 2) * 8;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
#pragma unroll
      for (int np = 0; np < NW / 2; ++np)
        ldmatrix_x4<false>(kb[kk][np], ks + k_lane + np * 16 * row + kk * 16);
  }

  const int G             = a.p.group;
  const std::int64_t w    = c < a.p.obs_window ? c : a.p.obs_window;
  const int nq            = static_cast<int>(w) * G;
  const std::int64_t hq   = static_cast<std::int64_t>(a.p.kv.num_kv_heads) * G;  // query heads
  const std::int64_t row0 = a.p.chunk_indptr[x.r] + (c - w);  // the window's first chunk row
  const float s2          = a.scale2 * a.p.scales.k_of(x.h);  // base-2 logit per unit of q . k
  // The queries go in steps of SUB m16 tiles (QS queries), which share the step's barrier,
  // copies and bookkeeping, through two buffers in the K block's memory: step t + 1 is loaded
  // while t is scored. Exact rows (queries of the mma type, 16-byte aligned: the launcher's
  // choice): cp.async copies, `q_chunks` per thread (row r, a 16-byte part of it), each row's
  // place kept without a division. Split rows: element pairs, split2 into hi and lo rows.
  constexpr int SUB = cfg::sub_tiles, QS = SUB * QR, BUF = SUB * 16 * row;
  const int q_steps   = (nq + QS - 1) / QS;
  const int step_rows = QS / G, step_heads = QS % G;  // a step's advance in the window
  const int rows8 = 8 / G, heads8 = 8 % G;            // eight queries on
  M* qbuf = ks;
  // (Rows of one thread's copies are `threads / (D / 8)` queries apart.)
  constexpr int q_apart = threads / (D / 8);
  const int apart_rows = q_apart / G, apart_heads = q_apart % G;
  window_query qc[cfg::q_chunks];
  qc[0] = window_query(tid / (D / 8), G, row0, hq, x.h);
#pragma unroll
  for (int v = 1; v < cfg::q_chunks; ++v) {
    qc[v] = qc[v - 1];
    qc[v].advance(apart_rows, apart_heads, G, hq);
  }
  auto fill = [&](int t) {  // query step t into buffer t % 2
    M* qs = qbuf + (t % 2) * BUF;
    if constexpr (!Split) {  // query r of the step is row r (sub-tile r / 16)
#pragma unroll
      for (int v = 0; v < cfg::q_chunks; ++v) {
        const int e = tid + v * threads, r = e / (D / 8), part = e % (D / 8);
        const bool ok = t * QS + r < nq;
        const M* src  = static_cast<const M*>(a.p.q) + qc[v].at * D + part * 8;
        copy16_async_zfill(
            qs + r * row + part * 8, ok ? static_cast<const void*>(src) : a.p.q, ok ? 16u : 0u);
        qc[v].advance(step_rows, step_heads, G, hq);
      }
    } else {  // query r: hi in row 16 (r / 8) + r % 8 (its sub-tile), lo 8 rows below
      for (int e = tid; e < QS * (D / 2); e += threads) {
        const int r = e / (D / 2), dim = 2 * (e % (D / 2)), qq = t * QS + r;
        const int at = 16 * (r / 8) + r % 8;
        float v[2]   = {};  // dims dim, dim + 1 of window query qq (0 past the window)
        if (qq < nq)
          load_run(a.p.q, a.p.q_dtype, (row0 + qq / G) * hq * D + (x.h * G + qq % G) * D + dim, v);
        unsigned hi, lo;
        split2<M>(v[0], v[1], hi, lo);
        *reinterpret_cast<unsigned*>(qs + at * row + dim)       = hi;
        *reinterpret_cast<unsigned*>(qs + (at + 8) * row + dim) = lo;
      }
    }
    copy_async_commit();
  };
  // This lane's queries: rows g and g + 8 of each sub-tile (one query or two); their
  // normalisers (base 2) and last visible candidates (len + chunk position; none past the
  // window), relative to the block. Each is eight queries after the one before.
  constexpr int PER = Split ? 1 : 2;  ///< queries per lane and sub-tile
  window_query lq[SUB * PER];
  lq[0] = window_query(g, G, row0, hq, x.h);
#pragma unroll
  for (int u = 1; u < SUB * PER; ++u) {
    lq[u] = lq[u - 1];
    lq[u].advance(rows8, heads8, G, hq);
  }

  float wsum[NW][2];  // this lane's weights of its keys 8 nt + 2 tq + i, summed over its rows
#pragma unroll
  for (int nt = 0; nt < NW; ++nt) wsum[nt][0] = wsum[nt][1] = 0.f;

  __syncthreads();  // every warp holds its K fragments: the K block's memory takes the queries
  fill(0);
  // Every window row sees the whole block unless it holds keys past the first row's last one
  // (the last block or two of a head): then each score is masked. CTA-uniform; a row past the
  // window gets an infinite normaliser either way (its weights exp2(-inf) = 0).
  const bool masked = i0 + KB - 1 > len + (c - w);
  auto steps        = [&](auto mask) {
    constexpr bool Masked = decltype(mask)::value;
    for (int t = 0; t < q_steps; ++t) {
      float lse2[SUB * PER];
      int last[SUB * PER];  // in [-1, KB]
#pragma unroll
      for (int u = 0; u < SUB * PER; ++u) {
        const bool in_window = t * QS + g + 8 * u < nq;
        lse2[u]              = in_window ? a.p.q_lse[lq[u].at] * log2e : INFINITY;
        const std::int64_t l = len + (c - w) + lq[u].row - i0;
        last[u]              = !in_window || l < 0 ? -1 : (l > KB ? KB : static_cast<int>(l));
        lq[u].advance(step_rows, step_heads, G, hq);
      }
      copy_async_wait<0>(sync_site::snapkv_queries);
      sync_block(sync_site::snapkv_queries);  // step t is in its buffer; t - 1's is free
      if (t + 1 < q_steps) fill(t + 1);

#pragma unroll
      for (int sub = 0; sub < SUB; ++sub) {
        // S = Q K^T for this warp's keys.
        const M* qs = qbuf + (t % 2) * BUF + sub * 16 * row;
        float cs[NW][4];
#pragma unroll
        for (int nt = 0; nt < NW; ++nt) cs[nt][0] = cs[nt][1] = cs[nt][2] = cs[nt][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
          unsigned qf[4];
          ldmatrix_x4<false>(qf, qs + (lane % 16) * row + (lane / 16) * 8 + kk * 16);
#pragma unroll
          for (int np = 0; np < NW / 2; ++np) {
            mma_m16n8k16<M>(cs[2 * np], qf, {kb[kk][np][0], kb[kk][np][1]});
            mma_m16n8k16<M>(cs[2 * np + 1], qf, {kb[kk][np][2], kb[kk][np][3]});
          }
        }
        // Weights: exp2 of each score against its row's normaliser; masked, a key past its
        // row's last visible one gets exp2(-inf) = 0 (no branch).
        const int ua = sub * PER;  // (and ua + 1: rows g + 8 of exact rows)
#pragma unroll
        for (int nt = 0; nt < NW; ++nt)
#pragma unroll
          for (int i = 0; i < 2; ++i) {
            const int key    = (warp * NW + nt) * 8 + 2 * tq + i;
            const bool see_a = !Masked || key <= last[ua];
            if constexpr (Split) {
              wsum[nt][i] +=
                  exp2_flush(see_a ? (cs[nt][i] + cs[nt][i + 2]) * s2 - lse2[ua] : -INFINITY);
            } else {
              const int ub     = ua + PER - 1;
              const bool see_b = !Masked || key <= last[ub];
              wsum[nt][i] += exp2_flush(see_a ? cs[nt][i] * s2 - lse2[ua] : -INFINITY) +
                             exp2_flush(see_b ? cs[nt][i + 2] * s2 - lse2[ub] : -INFINITY);
            }
          }
      }
    }
  };
  if (masked)
    steps(std::true_type{});
  else
    steps(std::false_type{});

  // Each key's total over the warp's rows (lanes with the same tq); every key is one warp's.
  const float inv_nq = 1.f / static_cast<float>(nq);  // the mean over the window's queries
#pragma unroll
  for (int nt = 0; nt < NW; ++nt)
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      float v = wsum[nt][i];
      v += __shfl_xor_sync(0xffffffffu, v, 4);
      v += __shfl_xor_sync(0xffffffffu, v, 8);
      v += __shfl_xor_sync(0xffffffffu, v, 16);
      const std::int64_t key = i0 + (warp * NW + nt) * 8 + 2 * tq + i;
      if (g == 0 && key < n) a.raw[x.rh * a.p.max_candidates + key] = v * inv_nq;
    }
}

/// Enqueues the tensor-core SnapKV scorer for (T, D) (`a.p.q_lse` set) through `launch`.
template <class T, int D, class Launch>
void launch_snapkv_mma_with(eviction_args const& a, Launch const& launch) {
  using cfg        = snapkv_mma_config<T, D>;
  const auto heads = static_cast<unsigned>(a.p.kv.batch_size * a.p.kv.num_kv_heads);
  const auto blocks =
      static_cast<unsigned>((std::int64_t{a.p.max_candidates} + cfg::keys - 1) / cfg::keys);
  constexpr dtype exact_q =
      std::is_same_v<snapkv_mma_type_t<T>, bfloat16> ? dtype::bf16 : dtype::f16;
  // Exact rows need the queries in the mma type and 16-byte aligned (their tiles are copied with
  // cp.async); others take the split rows (unaligned exact queries: hi = the query, lo = 0, the
  // same scores at twice the mma work).
  if (a.p.q_dtype == exact_q && reinterpret_cast<std::uintptr_t>(a.p.q) % 16 == 0)
    launch(snapkv_mma_kernel<T, D, false>, dim3(blocks, heads), cfg::threads, 0, a);
  else
    launch(snapkv_mma_kernel<T, D, true>, dim3(blocks, heads), cfg::threads, 0, a);
}

}  // namespace tangram::detail
