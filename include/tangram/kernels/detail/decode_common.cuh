// SPDX-License-Identifier: Apache-2.0
/**
 * @file kernels/detail/decode_common.cuh
 * @brief What every decode split kernel shares (kernels/detail/decode_attention.cuh for the
 * CUDA-core kernel, kernels/detail/decode_mma.cuh for the tensor-core one): the launch
 * arguments, the CTA's share of the static split map (its KV head, stream range and requests),
 * and the fixed-order combination and store of a piece's per-warp (or per-token-group) states.
 * Both kernels therefore cover exactly the same pieces and write the same partial slots.
 */
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <cub/block/block_scan.cuh>

#include "tangram/core/config.hpp"
#include "tangram/kernels/decode_attention.hpp"
#include "tangram/kernels/detail/vec.cuh"
#include "tangram/kernels/head_cursor.hpp"
#include "tangram/kernels/math.hpp"

namespace tangram::detail {

/// Everything a decode launch needs on the device (passed by value).
struct decode_args {
  decode_params p;
  float* partial_o     = nullptr;
  float* partial_lse   = nullptr;
  std::int64_t* prefix = nullptr;  ///< [num_kv_heads][batch + 1]
  float scale2         = 0.f;      ///< sm_scale * log2(e)
};

/**
 * Where one thread's token of successive tiles lives, as (page-list index, token in page): the
 * token advances by a fixed step per tile (the tokens between a thread's tiles: warps * tile in
 * the tensor-core kernel, tile in the CUDA-core one; reduced modulo the ring once per piece and
 * split into whole pages plus tokens), so the tile loops of both decode kernels need no division
 * for any page size, and the page-table entry of the next tile is loaded one tile ahead.
 */
struct decode_lane_stream {
  const unsigned char* base = nullptr;  ///< the pool plus the column's K offset
  const std::int32_t* pages = nullptr;
  std::int64_t page_bytes   = 0;
  std::int32_t row_bytes    = 0;
  std::int32_t page_tokens  = 1;
  std::int32_t ring_pages   = 0;  ///< pages of a sliding-window ring, 0 for a growing group
  std::int32_t step_pages = 0, step_tokens = 0;  ///< the per-tile advance
  std::int32_t t    = 0;                         ///< the lane's token of the next tile to issue
  std::int32_t pidx = 0;                         ///< its index in the page list
  std::int32_t in   = 0;                         ///< its token in the page
  std::int32_t page = 0;  ///< its page (loaded ahead; 0 when t is past the piece)

  /// Starts at held token `t` of `cur`, advancing `advance` tokens per tile.
  __device__ __forceinline__ void start(head_cursor const& cur,
                                        std::int32_t first,
                                        std::int32_t advance,
                                        std::int32_t t1,
                                        int elem_bytes) {
    base        = reinterpret_cast<const unsigned char*>(cur.pool) + cur.k_offset * elem_bytes;
    pages       = cur.pages;
    page_bytes  = cur.page_bytes;
    row_bytes   = cur.head_dim * elem_bytes;
    page_tokens = cur.page_tokens;
    ring_pages  = cur.ring / cur.page_tokens;
    const std::int32_t step = cur.ring > 0 ? advance % cur.ring : advance;
    step_pages              = step / page_tokens;
    step_tokens             = step % page_tokens;
    t                       = first;
    const std::int32_t pos  = cur.position(first);
    pidx                    = pos / page_tokens;
    in                      = pos % page_tokens;
    page                    = t < t1 ? pages[pidx] : 0;
  }
  /// Address of the current token's K row; moves to the next tile and loads its page.
  __device__ __forceinline__ const unsigned char* next(std::int32_t advance, std::int32_t t1) {
    const unsigned char* k = base + static_cast<std::int64_t>(page) * page_bytes +
                             static_cast<std::int64_t>(in) * row_bytes;
    t += advance;
    in += step_tokens;
    pidx += step_pages;
    if (in >= page_tokens) {
      in -= page_tokens;
      ++pidx;
    }
    if (ring_pages > 0 && pidx >= ring_pages) pidx -= ring_pages;  // the ring wraps by pages
    page = t < t1 ? pages[pidx] : 0;
    return k;
  }
};

/// Combines (m, s, o) of the output with an optional base-2 sink logit and stores o and lse.
__device__ __forceinline__ void finalize_store(decode_args const& a,
                                               std::int64_t out_index,
                                               std::int64_t lse_index,
                                               float m,
                                               float s,
                                               float o,
                                               float sink2,
                                               bool write_lse) {
  float mm    = sink2 > m ? sink2 : m;
  float alpha = exp2_shifted(m, mm);
  float den   = s * alpha + exp2_shifted(sink2, mm);
  store_scalar(a.p.o, a.p.o_dtype, out_index, o * alpha / den);
  if (write_lse && a.p.lse) a.p.lse[lse_index] = (mm + log2_of(den)) * ln2;
}

/// One CTA's work on one KV head: head `h`, the CTA's index `j` among the head's `share` CTAs,
/// the stream's total `W` and the requests [r_first, r_last] its range overlaps (`pre`: the
/// stream position of r_first's first token). With a per-head map the stream is the head's (j
/// local, W its tokens over the batch); with a layer stream it is the layer's (j the CTA's index,
/// share N_CTA, pre counted from the layer's first head). `empty`: the CTA's range holds none of
/// the head's tokens.
struct decode_cta_work {
  int h = 0, r_first = 0, r_last = -1;
  std::int64_t j = 0, share = 0, W = 0, pre = 0;
  bool empty = true;
};

/// The KV heads one CTA walks, in order from `first` to `last`: with a per-head map the CTA's one
/// head; with a layer stream every head whose tokens meet the CTA's range [begin, end) of the
/// layer's W tokens, or whose origin lies in it (that CTA writes the head's merge prefix and,
/// folded, its empty requests; heads that start at W go to the last CTA). None when first > last.
/// `next` and `origin`: the next head to locate and its first token's stream position (both
/// advanced by decode_locate_stream_head, so the kernels' loops hold no walk state in registers).
struct decode_cta_heads {
  int first = 0, last = -1, next = 0;
  std::int64_t origin = 0, W = 0, begin = 0, end = 0;
};

/// This CTA's walk (decode_start_walk), in static shared memory: kept out of the registers that
/// the kernels' piece loops need (one object per CTA).
__device__ __forceinline__ decode_cta_heads& decode_walk() {
  __shared__ decode_cta_heads walk;
  return walk;
}

/**
 * Merges the partials of request `r` on KV head `h` (`len` tokens, stream prefix `pre`, the
 * stream's `W` tokens over `share` CTAs from CTA `first_cta`: the head's, or the layer's with a
 * layer stream; CTA j's partial at slot first_cta + j + h * batch + r) in piece order, `M =
 * max(sink, lse_i)`, and stores the output and LSE; a head without tokens gets zeros (LSE = sink or
 * -inf). The merge kernel's body, and the folded merge's (decode_params::merge_counters).
 * Collective over `Threads` threads; not for a request of a single piece (the split kernels write
 * it).
 */
template <int Threads>
__device__ __forceinline__ void decode_merge_request(decode_args const& a,
                                                     int r,
                                                     int h,
                                                     std::int64_t pre,
                                                     std::int64_t len,
                                                     std::int64_t W,
                                                     std::int64_t share,
                                                     std::int64_t first_cta) {
  decode_params const& p = a.p;
  const int B = p.kv.batch_size, D = p.kv.geometry.head_dim, group = p.group;
  const int K = p.invariant_pieces;
  // The request's partial slots in piece order: the CTAs of its span (split map) or its pieces
  // (batch-invariant mode).
  auto for_each_slot = [&](auto&& f) {
    if (K > 0) {
      const std::int64_t n = invariant_piece_count(len, K);
      for (std::int64_t i = 0; i < n; ++i) f(invariant_slot(h, r, i, B, K));
      return;
    }
    const cta_span span = request_ctas(pre, len, share, W);
    for (std::int64_t jj = span.first; jj <= span.last; ++jj)
      if (!piece_of(jj, share, W, pre, len).empty())
        f(first_cta + jj + static_cast<std::int64_t>(h) * B + r);
  };
  for (int e = static_cast<int>(threadIdx.x); e < group * D; e += Threads) {
    const int g = e / D, x = e % D;
    const std::int64_t qh = static_cast<std::int64_t>(r) * p.num_q_heads() + h * group + g;
    const float sink2     = p.sinks ? p.sinks[h * group + g] * log2e : -INFINITY;
    if (len == 0) {
      store_scalar(p.o, p.o_dtype, qh * D + x, 0.f);
      if (x == 0 && p.lse) p.lse[qh] = sink2 * ln2;
      continue;
    }
    // Partials come from other CTAs: read through L2 (`__ldcg`), which the folded merge's fence
    // makes current, never from a possibly stale L1 line.
    float mm = sink2;
    for_each_slot(
        [&](std::int64_t slot) { mm = fmaxf(mm, __ldcg(a.partial_lse + slot * group + g)); });
    float den = exp2_shifted(sink2, mm), num = 0.f;
    for_each_slot([&](std::int64_t slot) {
      const float w = exp2_shifted(__ldcg(a.partial_lse + slot * group + g), mm);
      den += w;
      num += w * __ldcg(a.partial_o + (slot * group + g) * D + x);
    });
    store_scalar(p.o, p.o_dtype, qh * D + x, num / den);
    if (x == 0 && p.lse) p.lse[qh] = (mm + log2_of(den)) * ln2;
  }
}

/// Bit (r - r_first) of request r: this CTA completed r's merge count (decode_store_piece) and
/// merges it at the end (decode_finish_merges). Static shared memory, one object per CTA.
__device__ __forceinline__ unsigned* decode_merge_mask() {
  __shared__ unsigned mask[decode_max_batch / 32];
  return mask;
}

/**
 * Stores head `h`'s inclusive length prefix over the batch in `incl` (shared memory, batch_size
 * entries; block scan, collective over the CTA of `Threads` threads) and returns the head's total,
 * the same in every thread. Reads only the view's arrays.
 */
template <int Threads>
__device__ __forceinline__ std::int64_t decode_scan_head(decode_args const& a,
                                                         int h,
                                                         std::int64_t* incl) {
  constexpr int scan_items = 4;  ///< requests per thread per prefix tile
  using scan_t             = cub::BlockScan<std::int64_t, Threads>;
  __shared__ typename scan_t::TempStorage scan_storage;
  kv_cache_view const& kv = a.p.kv;
  const int tid           = static_cast<int>(threadIdx.x);
  const int B             = kv.batch_size;
  std::int64_t carry      = 0;
  for (int base = 0; base < B; base += Threads * scan_items) {
    std::int64_t items[scan_items];
#pragma unroll
    for (int u = 0; u < scan_items; ++u) {
      int r    = base + tid * scan_items + u;
      items[u] = r < B ? kv.head_len(r, a.p.layer, h) : 0;
    }
    std::int64_t tile_total;
    scan_t(scan_storage).InclusiveSum(items, items, tile_total);
#pragma unroll
    for (int u = 0; u < scan_items; ++u) {
      int r = base + tid * scan_items + u;
      if (r < B) incl[r] = carry + items[u];
    }
    carry += tile_total;
    __syncthreads();
  }
  return carry;
}

/**
 * Sets this CTA's walk over a layer stream (decode_walk; collective over the CTA of `Threads`
 * threads): sums each head's tokens over the batch once, a warp per head (shuffle reductions into
 * `smem`, num_kv_heads * 8 bytes, free again on return; decode_params::validate bounds the heads
 * by decode_max_batch), then thread 0 walks the totals to the CTA's range. Reads only the view's
 * arrays (before the PDL wait).
 */
template <int Threads>
__device__ __forceinline__ void decode_start_walk(decode_args const& a, unsigned char* smem) {
  decode_params const& p = a.p;
  const int cta          = static_cast<int>(blockIdx.x);
  const int tid          = static_cast<int>(threadIdx.x);
  constexpr int warps    = Threads / 32;
  const int H = p.kv.num_kv_heads, N = p.splits.num_ctas, B = p.kv.batch_size;
  const int lane = tid % 32, warp = tid / 32;
  auto* totals = reinterpret_cast<std::int64_t*>(smem);
  for (int h = warp; h < H; h += warps) {
    std::int64_t sum = 0;
    for (int r = lane; r < B; r += 32) sum += p.kv.head_len(r, p.layer, h);
#pragma unroll
    for (int off = 16; off > 0; off /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, off);
    if (lane == 0) totals[h] = sum;
  }
  __syncthreads();
  if (tid == 0) {
    decode_cta_heads c;
    for (int h = 0; h < H; ++h) c.W += totals[h];
    const stream_range range = split_range(cta, N, c.W);
    c.begin                  = range.begin;
    c.end                    = range.end;
    const bool last_cta      = cta == N - 1;
    c.first                  = H;  // none yet
    std::int64_t origin      = 0;
    for (int h = 0; h < H; ++h) {
      // Heads that start at or past the range's end belong to later CTAs (the last CTA also
      // takes those that start at W: empty heads after the last token).
      if (origin >= c.end && !(last_cta && origin == c.W)) break;
      if (c.first == H && (origin + totals[h] > c.begin || origin >= c.begin)) {
        c.first  = h;
        c.origin = origin;
      }
      if (c.first != H) c.last = h;
      origin += totals[h];
    }
    if (c.first == H) c.first = 0;  // nothing to walk (c.last stays -1)
    c.next        = c.first;
    decode_walk() = c;
  }
  __syncthreads();  // the walk is set; shared memory is reused by the caller
}

/// The first KV head this CTA serves, -1 for none: a per-head map's one head (its boundaries'
/// binary search), or the layer stream's walk (after decode_start_walk).
template <bool Stream>
__device__ __forceinline__ int decode_first_head(decode_args const& a) {
  decode_params const& p = a.p;
  if constexpr (Stream) {
    TANGRAM_DEVICE_CHECK(p.splits.layer_stream, "decode: kernel variant is not the map's");
    return decode_walk().next <= decode_walk().last ? decode_walk().next : -1;
  } else {
    // Debug builds: the layer's row of the split map must cover exactly the grid.
    TANGRAM_DEVICE_CHECK(!p.splits.layer_stream && p.splits.begin(p.layer, 0) == 0 &&
                             p.splits.begin(p.layer, p.kv.num_kv_heads) == p.splits.num_ctas,
                         "decode: split map row must run from 0 to num_ctas");
    return p.splits.head_of_cta(p.layer, static_cast<int>(blockIdx.x));
  }
}

/// The next KV head this CTA serves, -1 for none (a per-head map's CTA serves one head, so its
/// kernels have no loop back).
template <bool Stream>
__device__ __forceinline__ int decode_next_head() {
  if constexpr (Stream) return decode_walk().next <= decode_walk().last ? decode_walk().next : -1;
  return -1;
}

/// (PDL) The locate steps before this read only the split map and the view's arrays; q, the K/V
/// pages and the workspace (which the previous decode launch's merge may still read) wait for the
/// previous kernel in the stream. Then the merge kernel may be scheduled: its CTAs wait for this
/// grid in their own grid_dependency_wait.
__device__ __forceinline__ void decode_wait_previous_kernel() {
  grid_dependency_wait();
  grid_dependency_launch_dependents();
}

/// Writes head `h`'s exclusive length prefix over the batch for the merge kernel (stream
/// positions: `origin` plus the head's own, from its inclusive prefix `incl`). Collective over
/// `Threads` threads.
template <int Threads>
__device__ __forceinline__ void decode_write_prefix(decode_args const& a,
                                                    int h,
                                                    std::int64_t const* incl,
                                                    std::int64_t origin) {
  const int B = a.p.kv.batch_size;
  for (int r = static_cast<int>(threadIdx.x); r <= B; r += Threads)
    a.prefix[static_cast<std::int64_t>(h) * (B + 1) + r] = origin + (r == 0 ? 0 : incl[r - 1]);
}

/// With the merge folded (no merge kernel): writes the outputs of head `w.h`'s empty requests
/// among r = first, first + step, ... (zeros, LSE = sink or -inf; decode_merge_request).
/// Collective over `Threads` threads.
template <int Threads>
__device__ __forceinline__ void decode_merge_empties(
    decode_args const& a, decode_cta_work const& w, std::int64_t const* incl, int first, int step) {
  const int B = a.p.kv.batch_size;
  for (int r = first; r < B; r += step)
    if (incl[r] == (r > 0 ? incl[r - 1] : 0))
      decode_merge_request<Threads>(a, r, w.h, r > 0 ? incl[r - 1] : 0, 0, w.W, w.share, 0);
}

/**
 * Finds the first and last requests of a CTA's non-empty range [begin, end) of head `w.h`'s own
 * positions by binary search over the head's inclusive prefix `incl` (thread 0), into
 * `w.r_first`, `w.r_last` and `w.pre` (the first request's stream position: `origin` plus its
 * own), and with the merge folded clears the CTA's completed-merge mask. Collective over
 * `Threads` threads; shared memory is free again on return.
 */
template <int Threads, bool Fold>
__device__ __forceinline__ void decode_request_span(decode_args const& a,
                                                    std::int64_t const* incl,
                                                    std::int64_t begin,
                                                    std::int64_t end,
                                                    std::int64_t origin,
                                                    decode_cta_work& w) {
  __shared__ std::int32_t s_first, s_last;
  __shared__ std::int64_t s_pre_first;
  const int tid = static_cast<int>(threadIdx.x);
  if (tid == 0) {
    const int B = a.p.kv.batch_size;
    int lo = 0, hi = B - 1;  // first r with incl[r] > begin
    while (lo < hi) {
      int mid = (lo + hi) / 2;
      if (incl[mid] > begin)
        hi = mid;
      else
        lo = mid + 1;
    }
    s_first     = lo;
    s_pre_first = origin + (lo > 0 ? incl[lo - 1] : 0);
    hi          = B - 1;  // first r with incl[r] >= end
    while (lo < hi) {
      int mid = (lo + hi) / 2;
      if (incl[mid] >= end)
        hi = mid;
      else
        lo = mid + 1;
    }
    s_last = lo;
  }
  __syncthreads();
  w.r_first = s_first;
  w.r_last  = s_last;
  w.pre     = s_pre_first;
  if constexpr (Fold)  // no completed merge counts yet
    for (int i = tid; i * 32 <= w.r_last - w.r_first; i += Threads) decode_merge_mask()[i] = 0;
  __syncthreads();  // shared memory is reused by the caller
}

/**
 * Locates this CTA's work on its head `h` of a per-head map (collective over the CTA of `Threads`
 * threads): the head's inclusive length prefix over the batch by block scan in `smem`
 * (decode_max_batch * 8 bytes, free again on return), the head's exclusive prefix for the merge
 * kernel (local CTA 0 writes it), the head's empty requests when the merge is folded (spread over
 * its CTAs), and the first and last requests of the CTA's stream range by binary search. Waits
 * for the previous kernel (PDL) after the scan.
 */
template <int Threads, bool Fold>
__device__ __forceinline__ decode_cta_work decode_locate_head(decode_args const& a,
                                                              unsigned char* smem,
                                                              int h) {
  decode_params const& p = a.p;
  decode_cta_work w;
  w.h     = h;
  w.share = p.splits.share(p.layer, h);
  w.j     = static_cast<int>(blockIdx.x) - p.splits.begin(p.layer, h);

  // The head's inclusive length prefix over the batch, in shared memory.
  auto* incl = reinterpret_cast<std::int64_t*>(smem);
  w.W        = decode_scan_head<Threads>(a, h, incl);
  decode_wait_previous_kernel();
  if (w.j == 0) decode_write_prefix<Threads>(a, h, incl, 0);
  if constexpr (Fold)  // no merge kernel: the head's empty requests, spread over its CTAs
    decode_merge_empties<Threads>(a, w, incl, static_cast<int>(w.j), static_cast<int>(w.share));
  const stream_range range = split_range(w.j, w.share, w.W);
  w.empty                  = range.empty();  // uniform across the CTA
  if (!w.empty) decode_request_span<Threads, Fold>(a, incl, range.begin, range.end, 0, w);
  return w;
}

/**
 * Locates this CTA's work on head `h` of its layer-stream walk (collective): the head's scan as
 * above; thread 0 then works out, from the walk, the head's origin (its first stream position),
 * the CTA's range in the head's own positions and whether this CTA holds the origin (it writes
 * the head's prefix for the merge kernel, in stream positions, and with the merge folded all of
 * the head's empty requests), and moves the walk past the head (the scan's barriers order every
 * thread's read of the walk before that write; launches have batch >= 1). The walk's first head
 * waits for the previous kernel (PDL).
 */
template <int Threads, bool Fold>
__device__ __forceinline__ decode_cta_work decode_locate_stream_head(decode_args const& a,
                                                                     unsigned char* smem,
                                                                     int h) {
  // What thread 0 works out from the walk (kept in shared memory, out of the registers that the
  // pieces need): the stream's total, the head's origin, the CTA's range in the head's own
  // positions, whether this CTA writes the head's prefix (and folded empties), whether the head
  // is the walk's first.
  struct located {
    std::int64_t W, origin, begin, end;
    bool duty, wait;
  };
  __shared__ located s;

  decode_params const& p = a.p;
  decode_cta_work w;
  w.h     = h;
  w.share = p.splits.num_ctas;
  w.j     = static_cast<int>(blockIdx.x);

  // The head's inclusive length prefix over the batch, in shared memory.
  auto* incl                = reinterpret_cast<std::int64_t*>(smem);
  const std::int64_t tokens = decode_scan_head<Threads>(a, h, incl);
  if (threadIdx.x == 0) {
    decode_cta_heads& walk = decode_walk();
    s.origin               = walk.origin;
    s.wait                 = h == walk.first;
    s.W                    = walk.W;
    s.begin                = (walk.begin > s.origin ? walk.begin : s.origin) - s.origin;
    s.end  = (walk.end < s.origin + tokens ? walk.end : s.origin + tokens) - s.origin;
    s.duty = (s.origin >= walk.begin && s.origin < walk.end) ||
             (s.origin == walk.W && static_cast<int>(blockIdx.x) == p.splits.num_ctas - 1);
    // The walk moves past this head (every thread reads `s` after the barrier below).
    walk.next   = h + 1;
    walk.origin = s.origin + tokens;
  }
  __syncthreads();
  w.W = s.W;
  if (s.wait) decode_wait_previous_kernel();
  if (s.duty) decode_write_prefix<Threads>(a, h, incl, s.origin);
  if constexpr (Fold)  // no merge kernel: the head's empty requests, all by the duty CTA
    if (s.duty) decode_merge_empties<Threads>(a, w, incl, 0, 1);
  w.empty = s.end <= s.begin;  // uniform across the CTA
  if (w.empty)
    __syncthreads();  // shared memory is reused by the caller
  else
    decode_request_span<Threads, Fold>(a, incl, s.begin, s.end, s.origin, w);
  return w;
}

/// Locates this CTA's work on head `h` (decode_locate_head or decode_locate_stream_head).
template <int Threads, bool Fold, bool Stream>
__device__ __forceinline__ decode_cta_work decode_locate_work(decode_args const& a,
                                                              unsigned char* smem,
                                                              int h) {
  if constexpr (Stream)
    return decode_locate_stream_head<Threads, Fold>(a, smem, h);
  else
    return decode_locate_head<Threads, Fold>(a, smem, h);
}

/**
 * Calls `f(piece)` (decode_attention.hpp's decode_piece) for each piece of request `r` (`len`
 * tokens on the CTA's head, stream prefix `pre`) that this CTA processes, in token order.
 * Split-map mode: the request's tokens inside the CTA's stream range, one piece, partial slot
 * (j, r). Batch-invariant mode: every piece of `invariant_piece_tokens(len, K)` tokens whose
 * first token lies in the CTA's range, the whole piece (it may run past the range), slot
 * invariant_slot(h, r, i). Uniform across the CTA.
 */
template <class F>
__device__ __forceinline__ void decode_for_each_piece(decode_args const& a,
                                                      decode_cta_work const& w,
                                                      int r,
                                                      std::int64_t len,
                                                      std::int64_t pre,
                                                      F&& f) {
  decode_params const& p   = a.p;
  const stream_range range = piece_of(w.j, w.share, w.W, pre, len);
  if (range.empty()) return;
  // One loop and one call of `f` for both modes, so the piece body is inlined once (registers):
  // split-map mode is a single step over the range; batch-invariant mode steps by the piece
  // size from the first piece that starts in the range.
  const int K              = p.invariant_pieces;
  const std::int64_t size  = K > 0 ? invariant_piece_tokens(len, K) : range.end - range.begin;
  const std::int64_t first = K > 0 ? (range.begin + size - 1) / size : 0;
  const bool whole         = K > 0 ? len <= size : range.begin == 0 && range.end == len;
  for (std::int64_t i = first, b = K > 0 ? first * size : range.begin; b < range.end;
       ++i, b += size) {
    decode_piece piece;
    piece.begin = b;
    piece.end   = b + size < len ? b + size : len;
    // (split_map_view::partial_slot: the CTA's index in the layer + h * batch + r, either mode)
    piece.slot  = K > 0 ? invariant_slot(w.h, r, i, p.kv.batch_size, K)
                        : static_cast<std::int64_t>(blockIdx.x) +
                             static_cast<std::int64_t>(w.h) * p.kv.batch_size + r;
    piece.whole = whole;
    f(piece);
  }
}

/**
 * Combines the `Z` partial states of `piece` of request `r` (`len` tokens)
 * on the CTA's KV head (the CTA's token groups or warps, in index order z = 0..Z-1: `m_at(z, g)`,
 * `s_at(z, g)` base-2 max and sum of query head g of the group, `o_at(z, g, x)` its unnormalised
 * output) and stores the result: the output (with the sink) when the piece is the whole request,
 * else its partial slot; with merge_counters, the CTA that stores a request's last partial then
 * merges them. Collective over the CTA's `Threads` threads; the states must be visible to all.
 */
template <int D, int Z, int Threads, bool Fold, class M, class S, class O>
__device__ __forceinline__ void decode_store_piece(decode_args const& a,
                                                   decode_cta_work const& w,
                                                   int r,
                                                   std::int64_t len,
                                                   decode_piece const& piece,
                                                   M const& m_at,
                                                   S const& s_at,
                                                   O const& o_at) {
  decode_params const& p  = a.p;
  const int group         = p.group;
  const int h             = w.h;
  const std::int64_t slot = piece.slot;
  for (int e = static_cast<int>(threadIdx.x); e < group * D; e += Threads) {
    const int g = e / D, x = e % D;
    float mm = -INFINITY;
#pragma unroll
    for (int z = 0; z < Z; ++z) mm = fmaxf(mm, m_at(z, g));
    float ss = 0.f, oo = 0.f;
#pragma unroll
    for (int z = 0; z < Z; ++z) {
      float wz = exp2_shifted(m_at(z, g), mm);
      ss += s_at(z, g) * wz;
      oo += o_at(z, g, x) * wz;
    }
    // fp8 V scale (kv_scales.hpp; 1 without scales): sum_i w_i (s_v v_i) = s_v sum_i w_i v_i, and
    // the merge of partials is linear in them, so scaling each piece's output is exact up to
    // rounding (one multiply per output element instead of one per V element).
    oo *= p.scales.v_of(h);
    const std::int64_t qh = static_cast<std::int64_t>(r) * p.num_q_heads() + h * group + g;
    if (piece.whole) {
      float sink2 = p.sinks ? p.sinks[h * group + g] * log2e : -INFINITY;
      finalize_store(a, qh * D + x, qh, mm, ss, oo, sink2, x == 0);
    } else {
      a.partial_o[(slot * group + g) * D + x] = oo / ss;
      if (x == 0) a.partial_lse[slot * group + g] = mm + log2_of(ss);
    }
  }
  if constexpr (!Fold) return;
  if (piece.whole) return;
  // Folded merge: the (request, head) counter sums the tokens of the stored partials; the CTA
  // whose add completes the request's `len` merges it, at the end of the kernel
  // (decode_finish_merges: merging here would keep the merge's state live in the tile loop). The
  // fence orders every thread's partial stores before the add (the last-block pattern).
  std::int32_t* counter = p.merge_counters + static_cast<std::int64_t>(h) * p.kv.batch_size + r;
  const auto tokens     = static_cast<std::int32_t>(piece.end - piece.begin);
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0 && atomicAdd(counter, tokens) + tokens == len)
    decode_merge_mask()[(r - w.r_first) / 32] |= 1u << ((r - w.r_first) % 32);
}

/**
 * The folded merges of this CTA (decode_params::merge_counters): every request of the CTA's
 * range whose count it completed (decode_store_piece) is merged, and its counter reset for the
 * next launch (every add of this launch is in). Called by every thread at the end of a split
 * kernel; nothing in the kernels compiled without the fold (`Fold`: merge_counters is set).
 */
template <int Threads, bool Fold>
__device__ __forceinline__ void decode_finish_merges(decode_args const& a,
                                                     decode_cta_work const& w) {
  if constexpr (Fold) {
    decode_params const& p = a.p;
    __syncthreads();  // the mask is complete
    __threadfence();  // the other CTAs' partials before the reads (through L2)
    const unsigned* mask = decode_merge_mask();
    std::int64_t pre     = w.pre;
    for (int r = w.r_first; r <= w.r_last; ++r) {
      const std::int64_t len = p.kv.head_len(r, p.layer, w.h);
      if (mask[(r - w.r_first) / 32] >> ((r - w.r_first) % 32) & 1u) {
        decode_merge_request<Threads>(
            a, r, w.h, pre, len, w.W, w.share, static_cast<std::int64_t>(blockIdx.x) - w.j);
        if (threadIdx.x == 0)
          p.merge_counters[static_cast<std::int64_t>(w.h) * p.kv.batch_size + r] = 0;
      }
      pre += len;
    }
  }
}

}  // namespace tangram::detail
