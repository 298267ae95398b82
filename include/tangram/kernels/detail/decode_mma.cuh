// SPDX-License-Identifier: Apache-2.0
/**
 * @file kernels/detail/decode_mma.cuh
 * @brief Tensor-core decode split kernel for 16-bit K/V (bf16, f16), fp8 K/V (e4m3, e5m2, read
 * as f16) and GQA groups of 3 to 8 query heads per KV head: a drop-in for decode_split_kernel
 * (kernels/detail/decode_attention.cuh) on those instances, with the same split-map work
 * (decode_locate_work), the same pieces, partial slots and stores (decode_store_piece) and the same
 * merge kernel.
 *
 * Layout. The group's query heads are the rows of the m16n8k16 A operand: row g (< 8) holds
 * head g's query rounded to T (`hi`), row g + 8 the rounding remainder (`lo`, split2 in mma.cuh).
 * A score is then C[g][n] + C[g+8][n] of one mma, which both sit in the same lane, so the split
 * costs no instruction beyond one FADD, and scores carry ~16 (bf16) / ~22 (f16) significand bits
 * of the f32 query instead of 8 / 11. The probabilities P of O += P V are split the same way (rows
 * g and g + 8 of the A operand), so the output keeps f32-level accuracy: it meets the f32-output
 * tolerance of the CPU reference tests (5e-5 absolute), which one 16-bit P would not.
 * The hi/lo rows fill the 16 A rows that a group of <= 8 heads leaves free; heads >= group are
 * zero rows and are never stored.
 *
 * Work. Two warps per CTA; each streams its own tiles of the piece (16 tokens, 32 at d 64: 8 KiB
 * of K + V at d 64 and 128, 16 KiB at d 256; warp w takes tiles w, w + 2, ...) through its own
 * ring of `stages` shared-memory stages (2, 1 at d 256, within 45 KiB without an opt-in; two at
 * d 256 would need 74 KiB, an opt-in, and model no faster: docs/kernels.md, "Static roofline"):
 * the `lpt` lanes of each token compute its row address
 * once per tile from a page-table entry loaded one tile ahead, with no division
 * (decode_lane_stream), and the copies are row-contiguous (each warp instruction moves whole
 * rows: 4 cache lines per 512 bytes, conflict-free shared stores), each lane taking its row's
 * address from the row's lanes with a shuffle. So the tile loop has no block barrier: a
 * cp.async wait and a warp sync. Per 16 tokens S = Q K^T
 * is D / 16 ldmatrix pairs and D / 8 mma, the online softmax runs on the lane's scores of its head
 * (two shuffles for the row max, base 2, exp2_shifted, one rescale per tile), and O += P V is
 * D / 16 ldmatrix.trans and D / 8 mma with f32 accumulators. The warps' states combine in warp
 * order at the end of a piece.
 * Rows of every shared-memory tile are padded by 16 bytes so that the 8 rows an ldmatrix reads
 * fall in distinct banks.
 *
 * fp8. The ring holds the stored bytes (half the shared memory per stage, so 3 stages at d 64
 * and 128); per tile the warp widens the K rows into one f16 tile (`cvt.rn.f16x2.e4m3x2` /
 * `.e5m2x2`, exact: every e4m3 and e5m2 value is an f16 value), runs S = Q K^T on it, then
 * widens the V rows into the same tile for O += P V, with warp syncs in between. The f16 mma
 * then sees exactly the stored values. The K scale multiplies the scores (folded into the f16
 * query it would push the lo rows into f16's subnormal range for vLLM-sized scales); the V scale
 * the output, as in the CUDA-core kernel.
 */
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <type_traits>

#include "tangram/core/config.hpp"
#include "tangram/kernels/decode_attention.hpp"
#include "tangram/kernels/detail/decode_common.cuh"
#include "tangram/kernels/detail/mma.cuh"
#include "tangram/kernels/detail/vec.cuh"
#include "tangram/kernels/head_cursor.hpp"
#include "tangram/kernels/math.hpp"

namespace tangram::detail {

/// The 16-bit K/V storage types the tensor-core kernel reads as they are.
template <class T>
inline constexpr bool mma_input = std::is_same_v<T, bfloat16> || std::is_same_v<T, float16>;
/// The fp8 storage types it widens to f16 in shared memory first (exactly: both formats' values
/// are f16 values).
template <class T>
inline constexpr bool mma_fp8_input =
    std::is_same_v<T, float8_e4m3> || std::is_same_v<T, float8_e5m2>;
/// The mma input type for storage type T: T itself, or f16 for fp8.
template <class T>
using mma_type_t = std::conditional_t<mma_fp8_input<T>, float16, T>;

/// Whether (T, GB) runs the tensor-core kernel: 16-bit or fp8 K/V and a group bucket of 4 or 8.
template <class T, int GB>
inline constexpr bool decode_uses_mma = (mma_input<T> || mma_fp8_input<T>)&&(GB == 4 || GB == 8);

/// Compile-time shape of the tensor-core split kernel for storage type T and head dim D.
/// Shared memory: the query operand (16 rows of `row` 16-bit elements), then per warp its ring
/// of `stages` raw stages (K rows then V rows as stored, `raw_row` bytes apart) and, for fp8, one
/// 16-bit tile (`row` elements a row) that K and then V of the current tile are widened into.
template <class T, int D>
struct decode_mma_config {
  static constexpr int warps      = 2;
  static constexpr int threads    = 32 * warps;
  static constexpr int elem_bytes = static_cast<int>(sizeof(T));
  static constexpr bool widen     = elem_bytes == 1;  ///< fp8: widened to f16 per tile
  /// tokens per warp tile, a multiple of the k of O += P V (16-bit: 8 KiB of K + V at d 64, 128)
  static constexpr int tile        = D == 64 ? 32 : 16;
  static constexpr int lpt         = 32 / tile;  ///< lanes copying one token's rows
  static constexpr int row         = D + 8;      ///< 16-bit row stride in elements (16-byte pad)
  static constexpr int raw_row     = D * elem_bytes + 16;  ///< stored row stride in bytes (padded)
  static constexpr int stage_bytes = 2 * tile * raw_row;   ///< K rows, then V rows
  static constexpr int wide_bytes  = widen ? tile * row * 2 : 0;  ///< the widened K or V tile
  static constexpr int q_bytes     = 16 * row * 2;  ///< the A operand: hi rows 0-7, lo rows 8-15
  static constexpr int budget      = 45 * 1024;     ///< dynamic shared memory, no opt-in
  static constexpr int fit        = (budget - q_bytes - warps * wide_bytes) / (warps * stage_bytes);
  static constexpr int stages     = fit > 4 ? 4 : fit;                  ///< per warp
  static constexpr int warp_bytes = stages * stage_bytes + wide_bytes;  ///< a warp's region
  static constexpr int row_chunks = D * elem_bytes / 16;  ///< 16-byte chunks of a stored row
  /// Row-contiguous copies: copy instruction i of a K (or V) tile has lane l move chunk
  /// l % row_chunks of token i * per_copy + l / row_chunks, so a warp's 32 copies are whole rows.
  static constexpr int per_copy       = 32 / row_chunks;         ///< tokens per copy instruction
  static constexpr int copies         = tile * row_chunks / 32;  ///< copy instructions per K tile
  static constexpr int pipeline_bytes = warps * warp_bytes + q_bytes;
  static constexpr int prefix_bytes   = decode_max_batch * 8;
  static constexpr int smem_bytes = pipeline_bytes > prefix_bytes ? pipeline_bytes : prefix_bytes;
  /// Resident CTAs per SM both variants (plain and folded merge) are compiled for, so that the
  /// folded merge's extra code cannot lower the occupancy the plan was made with (checked from the
  /// built objects by scripts/kernel_stats.sh --check): shared memory allows 5 at every shape
  /// (39-42 KiB a CTA of 228 KiB); at d 256 the 16 x 256 f32 output fragment needs more than the
  /// 204 registers a thread has at 5, so 4 there.
  static constexpr int min_ctas_per_sm = D == 256 ? 4 : 5;

  static_assert(elem_bytes == 2 || elem_bytes == 1, "16-bit or fp8 K/V");
  static_assert(D % 16 == 0, "head dim: a multiple of the mma k");
  static_assert(tile % 16 == 0 && tile <= 32, "whole mma k steps, one token per lane at most");
  static_assert(row_chunks <= 32 && 32 % row_chunks == 0 && copies >= 1,
                "a copy instruction moves whole rows");
  static_assert(stages >= 1, "one stage per warp must fit");
  static_assert(warp_bytes >= decode_max_group * D * 4 && warp_bytes % 16 == 0,
                "a warp's region holds its output state for the merge");
  static_assert(smem_bytes <= 48 * 1024 - 2048, "dynamic shared memory must not need an opt-in");
};

/// `__syncwarp()` at a numbered site (the emulator's mutation tests may remove it).
__device__ __forceinline__ void sync_warp(sync_site site) {
#if defined(TANGRAM_EMULATION)
  if (::tangram::emu::mutation() == static_cast<int>(site)) return;
#else
  (void)site;
#endif
  __syncwarp();
}

template <class T, int D, int GB, bool Fold, bool Stream>
TANGRAM_KERNEL __launch_bounds__(
    decode_mma_config<T, D>::threads,
    decode_mma_config<T, D>::min_ctas_per_sm) void decode_mma_kernel(decode_args const a) {
  using cfg             = decode_mma_config<T, D>;
  using M               = mma_type_t<T>;  ///< what the mma reads: T, or f16 widened from fp8
  constexpr int warps   = cfg::warps;
  constexpr int threads = cfg::threads;
  constexpr int tile    = cfg::tile;
  constexpr int stages  = cfg::stages;
  constexpr int row     = cfg::row;
  constexpr int NT      = D / 8;      ///< n tiles of the output
  constexpr int KT      = tile / 16;  ///< k steps of O += P V per tile
  constexpr int lpt     = cfg::lpt;
  static_assert(GB <= 8, "the A operand holds at most 8 heads (hi and lo rows)");
  TANGRAM_DYNAMIC_SMEM(smem);
  __shared__ float s_m[warps][8], s_s[warps][8];

  decode_params const& p  = a.p;
  kv_cache_view const& kv = p.kv;
  const int tid           = static_cast<int>(threadIdx.x);
  const int lane = tid % 32, warp = tid / 32;
  const int g = lane / 4, tq = lane % 4;  // fragment row (query head) and column pair
  const int layer = p.layer, group = p.group;
  // One KV head's pieces (a per-head map's CTA serves one head; a layer stream's those it meets).
  auto serve_head = [&](int head) {
    const decode_cta_work work = decode_locate_work<threads, Fold, Stream>(a, smem, head);
    if (work.empty) return;  // uniform across the CTA
    std::int64_t pre = work.pre;

    M* qs                  = reinterpret_cast<M*>(smem);
    unsigned char* wregion = smem + cfg::q_bytes + warp * cfg::warp_bytes;     // this warp's ring
    M* wide      = reinterpret_cast<M*>(wregion + stages * cfg::stage_bytes);  // fp8: widened tile
    auto* wmerge = reinterpret_cast<float*>(wregion);  // its output state at the end of a piece
    // ldmatrix row addresses that depend only on the lane (elements).
    const int q_lane = (lane % 16) * row + (lane / 16) * 8;  // A: rows 0-15, k halves
    const int k_lane = ((lane / 16) * 8 + lane % 8) * row + ((lane / 8) % 2) * 8;  // B of S
    const int v_lane = (((lane / 8) % 2) * 8 + lane % 8) * row + (lane / 16) * 8;  // B of O
    // This lane's chunk of the rows it copies (row-contiguous: see decode_mma_config::copies).
    const int c_lane = (lane / cfg::row_chunks) * cfg::raw_row + (lane % cfg::row_chunks) * 16;
    // fp8 scales: the K scale multiplies the scores (folding it into the f16 query rows would push
    // their lo parts into f16's subnormal range for typical scales); the V scale the output
    // (decode_store_piece). 1 for 16-bit K/V.
    const float k_scale = p.scales.k_of(work.h);
    // fp8: the warp widens tile rows of a stage (K or V, D bytes each) into `wide`, exactly.
    // Lane l widens the 8-byte halves l + 32 u of the tile's stored rows into 16 bytes each, so
    // the 8 lanes of a 16-byte store phase write 128 contiguous bytes: conflict-free (before issue
    // #34 a lane widened 16 bytes into two stores 32 bytes apart, conflicting 2-way).
    auto widen_rows = [&](const auto* rows) {  // generic: instantiated for fp8 only
      constexpr int halves = D / 8;            // 8-byte halves of a stored fp8 row
#pragma unroll
      for (int u = 0; u < tile * halves / 32; ++u) {
        const int c = lane + 32 * u, tok = c / halves, part = c % halves;
        *reinterpret_cast<uint4*>(wide + tok * row + part * 8) =
            fp8x8_to_f16<T>(*reinterpret_cast<const uint2*>(rows + tok * cfg::raw_row + part * 8));
      }
    };

    for (int r = work.r_first; r <= work.r_last; ++r) {
      const std::int64_t len = kv.head_len(r, layer, work.h);
      decode_for_each_piece(a, work, r, len, pre, [&](decode_piece const& piece) {
        const head_cursor cur = make_head_cursor(kv, r, layer, work.h);
        const int t0 = static_cast<int>(piece.begin), t1 = static_cast<int>(piece.end);
        const int n_tiles = (t1 - t0 + tile - 1) / tile;
        const int n_mine  = n_tiles > warp ? (n_tiles - warp + warps - 1) / warps : 0;

        // The lane's token stream (token lane / lpt of each warp tile: its row address, computed
        // by `lpt` lanes) and the copies of the ring's first stages. The copies are row-contiguous
        // (whole 128-byte lines per warp instruction, conflict-free shared stores): each takes its
        // token's row offset from that token's lanes with a shuffle.
        decode_lane_stream ls;
        ls.start(cur, t0 + warp * tile + lane / lpt, warps * tile, t1, cfg::elem_bytes);
        const std::int64_t v_delta = (cur.v_offset - cur.k_offset) * cfg::elem_bytes;
        auto issue                 = [&](int k) {  // warp tile k of this warp into stage k % stages
          const int first        = ls.t - lane / lpt;  // the tile's first token
          const std::int64_t off = ls.next(warps * tile, t1) - ls.base;  // this lane's token's row
          unsigned char* st      = wregion + (k % stages) * cfg::stage_bytes + c_lane;
#pragma unroll
          for (int i = 0; i < cfg::copies; ++i) {
            const int tok = i * cfg::per_copy + lane / cfg::row_chunks;
            const auto lo = static_cast<unsigned>(off), hi = static_cast<unsigned>(off >> 32);
            const std::int64_t o =
                static_cast<std::int64_t>(
                    static_cast<std::uint64_t>(__shfl_sync(0xffffffffu, hi, tok * lpt)) << 32) |
                __shfl_sync(0xffffffffu, lo, tok * lpt);
            const bool ok            = first + tok < t1;
            const unsigned char* src = ok ? ls.base + o + (lane % cfg::row_chunks) * 16 : ls.base;
            unsigned char* dst       = st + i * cfg::per_copy * cfg::raw_row;
            copy16_async_zfill(dst, src, ok ? 16u : 0u);
            copy16_async_zfill(
                dst + tile * cfg::raw_row, ok ? src + v_delta : ls.base, ok ? 16u : 0u);
          }
        };
#pragma unroll
        for (int k = 0; k < stages - 1; ++k) {
          if (k < n_mine) issue(k);
          copy_async_commit();
        }

        // The A operand of S: hi rows 0-7 and lo rows 8-15 of the scaled queries (zero rows past
        // the group), 8 dims per thread and step (one 16-byte load of a 16-bit query where aligned,
        // load_run) and one 16-byte shared store per row.
        for (int e = tid; e < D; e += threads) {
          const int qg = e / (D / 8), x = 8 * (e % (D / 8));
          float q[8] = {};
          if (qg < group) {
            load_run(p.q,
                     p.q_dtype,
                     r * p.q_row_stride() + static_cast<std::int64_t>(work.h * group + qg) * D + x,
                     q);
#pragma unroll
            for (int i = 0; i < 8; ++i) q[i] *= a.scale2;
          }
          unsigned hi[4], lo[4];
#pragma unroll
          for (int i = 0; i < 4; ++i) split2<M>(q[2 * i], q[2 * i + 1], hi[i], lo[i]);
          *reinterpret_cast<uint4*>(qs + qg * row + x)       = uint4{hi[0], hi[1], hi[2], hi[3]};
          *reinterpret_cast<uint4*>(qs + (qg + 8) * row + x) = uint4{lo[0], lo[1], lo[2], lo[3]};
        }
        __syncthreads();  // the queries are in shared memory

        float o[NT][4];
#pragma unroll
        for (int n = 0; n < NT; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
        float m = -INFINITY, l = 0.f;  // head g: running max; this lane's share of the sum
        for (int k = 0; k < n_mine; ++k) {
          if (k + stages - 1 < n_mine) issue(k + stages - 1);
          copy_async_commit();
          copy_async_wait<stages - 1>(sync_site::decode_tile_wait);
          sync_warp(sync_site::decode_tile_ready);  // every lane's copies of the tile are visible
          const unsigned char* stage = wregion + (k % stages) * cfg::stage_bytes;
          const M* ks                = reinterpret_cast<const M*>(stage);
          if constexpr (cfg::widen) {
            widen_rows(stage);  // K rows
            __syncwarp();
            ks = wide;
          }

          // S = Q K^T: tokens 8 nt .. 8 nt + 7 of the tile as n tile nt.
          float sc[2 * KT][4];
#pragma unroll
          for (int nt = 0; nt < 2 * KT; ++nt) sc[nt][0] = sc[nt][1] = sc[nt][2] = sc[nt][3] = 0.f;
#pragma unroll
          for (int kk = 0; kk < D / 16; ++kk) {
            unsigned qa[4];
            ldmatrix_x4<false>(qa, qs + q_lane + kk * 16);
#pragma unroll
            for (int kt = 0; kt < KT; ++kt) {
              unsigned kb[4];
              ldmatrix_x4<false>(kb, ks + k_lane + kt * 16 * row + kk * 16);
              mma_m16n8k16<M>(sc[2 * kt], qa, {kb[0], kb[1]});
              mma_m16n8k16<M>(sc[2 * kt + 1], qa, {kb[2], kb[3]});
            }
          }
          // Online softmax of head g over the lane's tokens 8 nt + 2 tq + i (hi + lo rows).
          const int base = t0 + (warp + k * warps) * tile + 2 * tq;
          float s[2 * KT][2], mt = m;
#pragma unroll
          for (int nt = 0; nt < 2 * KT; ++nt)
#pragma unroll
            for (int i = 0; i < 2; ++i) {
              s[nt][i] = base + 8 * nt + i < t1 ? (sc[nt][i] + sc[nt][i + 2]) * k_scale : -INFINITY;
              mt       = fmaxf(mt, s[nt][i]);
            }
          mt                = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 1));
          mt                = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 2));
          const float alpha = exp2_shifted(m, mt);  // 0 while m is -inf
          m                 = mt;
          l *= alpha;
#pragma unroll
          for (int nt = 0; nt < 2 * KT; ++nt)
#pragma unroll
            for (int i = 0; i < 2; ++i) {
              s[nt][i] = exp2_shifted(s[nt][i], mt);
              l += s[nt][i];
            }
          // A of O += P V per k step: rows g (hi) and g + 8 (lo), tokens 2 tq and 2 tq + 8.
          unsigned pa[KT][4];
#pragma unroll
          for (int kt = 0; kt < KT; ++kt) {
            split2<M>(s[2 * kt][0], s[2 * kt][1], pa[kt][0], pa[kt][1]);
            split2<M>(s[2 * kt + 1][0], s[2 * kt + 1][1], pa[kt][2], pa[kt][3]);
          }
          const M* vs = ks + tile * row;
          if constexpr (cfg::widen) {
            __syncwarp();  // every lane's ldmatrix of the widened K is done
            widen_rows(stage + tile * cfg::raw_row);  // V rows
            __syncwarp();
            vs = wide;
          }
#pragma unroll
          for (int n = 0; n < NT; ++n)
#pragma unroll
            for (int i = 0; i < 4; ++i) o[n][i] *= alpha;
            // O += P V: output dims 8 n + 2 tq + i.
#pragma unroll
          for (int kt = 0; kt < KT; ++kt)
#pragma unroll
            for (int np = 0; np < D / 16; ++np) {
              unsigned vb[4];
              ldmatrix_x4<true>(vb, vs + v_lane + kt * 16 * row + np * 16);
              mma_m16n8k16<M>(o[2 * np], pa[kt], {vb[0], vb[1]});
              mma_m16n8k16<M>(o[2 * np + 1], pa[kt], {vb[2], vb[3]});
            }
          __syncwarp();  // the stage (and the widened tile) is refilled by a later issue
        }
        copy_async_wait<0>();
        __syncwarp();

        // This warp's state into its ring (free now), then the fixed-order combination.
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        if (g < group) {
          if (tq == 0) {
            s_m[warp][g] = m;
            s_s[warp][g] = l;
          }
#pragma unroll
          for (int n = 0; n < NT; ++n)
#pragma unroll
            for (int i = 0; i < 2; ++i) wmerge[g * D + 8 * n + 2 * tq + i] = o[n][i] + o[n][i + 2];
        }
        __syncthreads();
        const float* merge0 = reinterpret_cast<const float*>(smem + cfg::q_bytes);
        decode_store_piece<D, warps, threads, Fold>(
            a,
            work,
            r,
            len,
            piece,
            [&](int z, int hg) { return s_m[z][hg]; },
            [&](int z, int hg) { return s_s[z][hg]; },
            [&](int z, int hg, int x) { return merge0[z * (cfg::warp_bytes / 4) + hg * D + x]; });
        __syncthreads();  // shared memory is reused by the next piece
      });
      pre += len;
    }
    decode_finish_merges<threads, Fold>(a, work);
  };
  if constexpr (Stream) {
    decode_start_walk<threads>(a, smem);
    for (int head = decode_first_head<true>(a); head >= 0; head = decode_next_head<true>()) {
      serve_head(head);
      __syncthreads();  // the next head's scan reuses shared memory
    }
  } else {
    serve_head(decode_first_head<false>(a));
  }
}

}  // namespace tangram::detail
