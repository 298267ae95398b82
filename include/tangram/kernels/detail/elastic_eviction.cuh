// SPDX-License-Identifier: Apache-2.0
/**
 * @file kernels/detail/elastic_eviction.cuh
 * @brief Device code of the elastic chunk eviction (see kernels/elastic_eviction.hpp).
 *
 * - `elastic_need_kernel`, one CTA of 256 threads per request:
 *   1. every head's plan (`plan_eviction` through `layer_params`, as the stage launches decided):
 *      the candidates of staged heads, -1 for the others (into `need`), and their sum;
 *   2. radix select of the K-th largest key over all staged candidates (4 passes of 8 bits, shared
 *      histogram by atomics, a block scan over the 256 buckets): threshold T and how many keys
 *      equal to T are wanted;
 *   3. one warp per head counts its keys above T (into `need`) and equal to T (into `ties`);
 *   4. thread 0 gives the wanted ties to the heads in (layer, head) order (the position order
 *      within a head is the per-head compaction's tie rule, so a head's wanted ties are its
 *      earliest), then runs `elastic_group_pages` (sequential) and writes `status`.
 * - `elastic_histogram_kernel` (grid: slices x L * H x requests, one launch per radix pass) and
 *   `elastic_compact_kernel`, compact_config::splits CTAs per (layer * H + head, request), each a
 *   byte range of every token: the head's keep count from
 *   its group's pages (`elastic_job`), then the multi-CTA threshold search
 *   (`select_histogram_pass`) and `compact_selected` of eviction.cuh over its stage keys, every
 *   candidate already in the column (the chunk was staged at `[len, len + c)`).
 *   `select_reset_kernel` clears the per-head histograms first.
 */
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <cub/block/block_scan.cuh>

#include "tangram/core/config.hpp"
#include "tangram/kernels/detail/eviction.cuh"
#include "tangram/kernels/elastic_eviction.hpp"
#include "tangram/kernels/eviction.hpp"
#include "tangram/kernels/head_cursor.hpp"

namespace tangram::detail {

/// Everything an elastic launch needs on the device (passed by value); arrays per request.
struct elastic_args {
  elastic_eviction_params p;
  std::int64_t* need          = nullptr;  ///< [batch][L * H]
  std::int64_t* ties          = nullptr;  ///< [batch][L * H]
  std::int64_t* grouped       = nullptr;  ///< [batch][G * Hp]
  std::int64_t* index         = nullptr;  ///< [batch][G]
  std::int64_t* pages         = nullptr;  ///< [batch][G]
  std::int64_t* status        = nullptr;  ///< [batch]
  std::uint32_t* select_hist  = nullptr;  ///< [batch][L * H][select_radix_bins]
  std::uint32_t* select_state = nullptr;  ///< [batch][L * H][select_state_words]
  std::int32_t slices         = 0;        ///< ceil(max_candidates / select_slice)
};

/// Steps 1-4 of the file comment for request blockIdx.x.
template <class Unused = void>
TANGRAM_KERNEL __launch_bounds__(256) void elastic_need_kernel(elastic_args const a) {
  constexpr int threads = 256;
  using scan_t          = cub::BlockScan<std::uint32_t, threads>;
  __shared__ typename scan_t::TempStorage scan;
  __shared__ unsigned int hist[256];
  __shared__ std::uint32_t s_bucket, s_above;
  __shared__ unsigned long long s_total;
  elastic_eviction_params const& p = a.p;
  const int tid = static_cast<int>(threadIdx.x), warp = tid / 32, lane = tid % 32;
  const auto r          = static_cast<std::int32_t>(blockIdx.x);
  const std::int32_t HH = p.heads(), H = p.kv.num_kv_heads;
  std::int64_t* need        = a.need + static_cast<std::int64_t>(r) * HH;
  std::int64_t* ties        = a.ties + static_cast<std::int64_t>(r) * HH;
  const std::uint32_t* keys = p.stage_keys;

  // 1. Candidates of the staged heads (into need) and their protected leads (into ties until
  // step 3 writes the tie counts over them).
  if (tid == 0) s_total = 0;
  __syncthreads();
  unsigned long long mine = 0;
  for (std::int32_t i = tid; i < HH; i += threads) {
    const std::int32_t l = i / H, h = i % H;
    const eviction_plan e = plan_eviction(p.layer_params(l), make_head_cursor(p.kv, r, l, h), r, h);
    need[i]               = e.action == eviction_action::stage ? e.candidates : -1;
    ties[i]               = e.lead;
    if (e.action == eviction_action::stage) mine += static_cast<unsigned long long>(e.candidates);
  }
  atomicAdd(&s_total, mine);
  __syncthreads();
  const auto total = static_cast<std::int64_t>(s_total);
  std::int64_t K   = p.wanted[r];
  K                = K < 0 ? 0 : (K > total ? total : K);

  // 2. Radix select of the K-th largest staged key (K >= 1), 8 bits per pass from the top.
  std::uint32_t prefix = 0, mask = 0, k_rem = static_cast<std::uint32_t>(K);
  for (int pass = 0; K > 0 && pass < 4; ++pass) {
    const int shift = 24 - 8 * pass;
    hist[tid]       = 0;
    __syncthreads();
    for (std::int32_t i = 0; i < HH; ++i) {
      const std::int64_t n = need[i];  // uniform across the block
      if (n <= 0) continue;
      const head_cursor cur   = make_head_cursor(p.kv, r, i / H, i % H);
      const std::int64_t lead = ties[i];
      const std::int64_t at   = stage_key_block(p.stage_key_base, p.kv, r, i / H, i % H);
      for (std::int64_t c = tid; c < n; c += threads) {
        const std::uint32_t key = staged_key(keys, at, cur, lead, c);
        if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 0xffu], 1u);
      }
    }
    __syncthreads();
    const std::uint32_t count = hist[255 - tid];
    std::uint32_t incl;
    scan_t(scan).InclusiveSum(count, incl);
    if (incl - count < k_rem && k_rem <= incl) {
      s_bucket = static_cast<std::uint32_t>(255 - tid);
      s_above  = incl - count;
    }
    __syncthreads();
    k_rem -= s_above;
    prefix |= s_bucket << shift;
    mask |= 0xffu << shift;
    __syncthreads();
  }

  // 3. Per head (one warp each): keys above the threshold and equal to it.
  for (std::int32_t i = warp; i < HH; i += threads / 32) {
    const std::int64_t n     = need[i];
    const std::int64_t lead  = ties[i];
    const head_cursor cur    = make_head_cursor(p.kv, r, i / H, i % H);
    const std::int64_t at    = n > 0 ? stage_key_block(p.stage_key_base, p.kv, r, i / H, i % H) : 0;
    unsigned long long above = 0, equal = 0;
    for (std::int64_t c = lane; K > 0 && c < n; c += 32) {
      const std::uint32_t key = staged_key(keys, at, cur, lead, c);
      above += key > prefix ? 1u : 0u;
      equal += key == prefix ? 1u : 0u;
    }
#pragma unroll
    for (int off = 16; off > 0; off /= 2) {
      above += __shfl_xor_sync(0xffffffffu, above, off);
      equal += __shfl_xor_sync(0xffffffffu, equal, off);
    }
    __syncwarp();  // every lane has read ties[i] (the lead)
    if (lane == 0) {
      need[i] = static_cast<std::int64_t>(above);
      ties[i] = static_cast<std::int64_t>(equal);
    }
  }
  __syncthreads();

  // 4. The wanted ties in (layer, head) order, then the group lengths.
  if (tid == 0) {
    std::int64_t left = K > 0 ? k_rem : 0;
    for (std::int32_t i = 0; i < HH; ++i) {
      const std::int64_t take = ties[i] < left ? ties[i] : left;
      need[i] += take;
      left -= take;
    }
    const std::int64_t G      = p.kv.num_groups;
    const std::int64_t status = elastic_group_pages(
        p, r, need, a.grouped + r * G * p.kv.geometry.group_size, a.index + r * G, a.pages + r * G);
    a.status[r] = status;
    if (p.pages_out) p.pages_out[r] = status;
  }
}

/// A staged head's compaction job: its head, candidates, keep count and selection slots.
struct elastic_head_job {
  eviction_args ea;                ///< the layer's eviction parameters (for copy_tokens)
  eviction_head x;                 ///< the head, every candidate a column position
  std::int64_t keep         = -2;  ///< tokens it keeps; -1: the request failed; -2: not staged
  const std::uint32_t* keys = nullptr;  ///< the head's group's block of the stage keys
  select_slots slots;

  /// Selection key of candidate `c` (staged_key).
  __device__ __forceinline__ std::uint32_t key(std::int64_t c) const {
    return staged_key(keys, 0, x.cur, x.e.lead, c);
  }
};

/// Head i (layer * H + head) of request r: its plan and, for a staged head of a request whose
/// group selection succeeded, its keep count from its group's pages. The histogram and the
/// compaction kernels both take their decision here.
__device__ __forceinline__ elastic_head_job elastic_job(elastic_args const& a,
                                                        std::int32_t r,
                                                        std::int32_t i) {
  elastic_eviction_params const& p = a.p;
  const std::int32_t H = p.kv.num_kv_heads, l = i / H, HH = p.heads();
  elastic_head_job j;
  j.ea.p                  = p.layer_params(l);
  j.x.r                   = r;
  j.x.h                   = i % H;
  j.x.rh                  = static_cast<std::int64_t>(r) * H + j.x.h;
  j.x.cur                 = make_head_cursor(p.kv, r, l, j.x.h);
  j.x.e                   = plan_eviction(j.ea.p, j.x.cur, r, j.x.h);
  const std::int64_t head = static_cast<std::int64_t>(r) * HH + i;
  j.keys                  = p.stage_keys + stage_key_block(p.stage_key_base, p.kv, r, l, j.x.h);
  j.slots = {a.select_hist + head * select_radix_bins, a.select_state + head * select_state_words};
  if (j.x.e.action != eviction_action::stage) return j;
  if (a.status[r] < 0) {
    j.keep = -1;
    return j;
  }
  const std::int64_t G = p.kv.num_groups;
  const std::int64_t g = a.index[r * G + p.kv.slot_of(l, j.x.h).group];
  j.keep = elastic_head_keep(a.pages[r * G + g], p.kv.geometry.page_tokens, j.x.e.candidates);
  return j;
}

/// Radix pass `pass` of slice blockIdx.x of head blockIdx.y (layer * H + head) of request
/// blockIdx.z, for the staged heads that drop candidates.
/// (A template only so that every translation unit may instantiate it.)
template <class Unused = void>
TANGRAM_KERNEL __launch_bounds__(256) void elastic_histogram_kernel(elastic_args const a,
                                                                    int pass) {
  __shared__ select_hist_smem sm;
  const elastic_head_job j =
      elastic_job(a, static_cast<std::int32_t>(blockIdx.z), static_cast<std::int32_t>(blockIdx.y));
  const std::int64_t n = j.x.e.candidates;
  if (j.keep < 0 || j.keep >= n) return;
  const auto key = [&](std::int64_t c) { return j.key(c); };
  select_histogram_pass(j.slots, pass, n, j.keep, key, key, sm);
}

/// Keep count and compaction of head blockIdx.y (layer * H + head) of request blockIdx.z, byte
/// range blockIdx.x of compact_config::splits (copy_split). T only sets the element size
/// (copy_type_t).
template <class T, int D>
TANGRAM_KERNEL __launch_bounds__(256) void elastic_compact_kernel(elastic_args const a) {
  __shared__ select_smem<T, D> sm;
  const int tid          = static_cast<int>(threadIdx.x);
  const copy_split split = {static_cast<int>(blockIdx.x)};
  const auto r           = static_cast<std::int32_t>(blockIdx.z);
  const auto i           = static_cast<std::int32_t>(blockIdx.y);
  elastic_head_job j     = elastic_job(a, r, i);
  std::int32_t* out      = a.p.new_len + static_cast<std::int64_t>(r) * a.p.heads() + i;
  const bool writer      = tid == 0 && split.index == 0;
  if (j.x.e.action != eviction_action::stage) {
    if (writer) *out = static_cast<std::int32_t>(j.x.e.keep);
    return;
  }
  if (writer) *out = static_cast<std::int32_t>(j.keep);  // -1 when the request failed
  const std::int64_t n = j.x.e.candidates;
  if (j.keep < 0 || j.keep >= n) return;  // failed, or every candidate stays where it was staged
  j.x.e.len   = n;  // the chunk is in the column: every candidate is a column position
  j.x.e.chunk = 0;
  compact_selected<T, D>(
      j.ea, j.x, n, j.keep, [&](std::int64_t c) { return j.key(c); }, j.slots, sm, split);
}

/// The kernels' arguments for validated parameters and a workspace of
/// elastic_workspace_bytes(p).
inline elastic_args make_elastic_args(elastic_eviction_params const& p, void* workspace) {
  auto w = elastic_workspace(p.kv.batch_size, p.heads(), p.kv.num_groups, p.kv.geometry.group_size);
  auto* base = static_cast<unsigned char*>(workspace);
  elastic_args a;
  a.p            = p;
  a.need         = reinterpret_cast<std::int64_t*>(base + w.need);
  a.ties         = reinterpret_cast<std::int64_t*>(base + w.ties);
  a.grouped      = reinterpret_cast<std::int64_t*>(base + w.grouped);
  a.index        = reinterpret_cast<std::int64_t*>(base + w.index);
  a.pages        = reinterpret_cast<std::int64_t*>(base + w.pages);
  a.status       = reinterpret_cast<std::int64_t*>(base + w.status);
  a.select_hist  = reinterpret_cast<std::uint32_t*>(base + w.hist);
  a.select_state = reinterpret_cast<std::uint32_t*>(base + w.state);
  a.slices       = static_cast<std::int32_t>(  // in int64: max_candidates may be near INT32_MAX
      (std::int64_t{p.max_candidates} + select_slice - 1) / select_slice);
  return a;
}

/// Enqueues the elastic kernels for (T, D) through the launch policy `launch` (vec.cuh).
template <class T, int D, class Launch>
void launch_elastic_with(elastic_args const& a, Launch const& launch) {
  using copy_t  = copy_type_t<T>;
  const auto B  = static_cast<unsigned>(a.p.kv.batch_size);
  const auto HH = static_cast<unsigned>(a.p.heads());
  launch(select_reset_kernel<>, dim3(HH, B), 256, 0, a.select_hist, a.select_state);
  launch(elastic_need_kernel<>, dim3(B), 256, 0, a);
  for (int pass = 0; pass < select_radix_passes; ++pass)
    launch(
        elastic_histogram_kernel<>, dim3(static_cast<unsigned>(a.slices), HH, B), 256, 0, a, pass);
  launch(elastic_compact_kernel<copy_t, D>,
         dim3(static_cast<unsigned>(compact_config<copy_t, D>::splits), HH, B),
         256,
         0,
         a);
}

#if !defined(TANGRAM_EMULATION)
/// Launches the elastic kernels for (T, D) (instantiated in kernels/elastic_eviction.cu).
template <class T, int D>
cudaError_t launch_elastic(elastic_args const& a, cudaStream_t stream) {
  launch_elastic_with<T, D>(a, stream_launch{stream});
  return cudaGetLastError();
}
#endif  // !TANGRAM_EMULATION

}  // namespace tangram::detail
