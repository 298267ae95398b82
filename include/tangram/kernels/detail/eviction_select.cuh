// SPDX-License-Identifier: Apache-2.0
/**
 * @file kernels/detail/eviction_select.cuh
 * @brief The threshold search of the fused chunk eviction (kernels/detail/eviction.cuh, whose
 * file comment describes it): a multi-CTA radix select of each head's k-th largest key, over
 * 11/11/10-bit digits; also what the elastic compaction (elastic_eviction.cuh) reuses.
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
 * later passes read `key_at(i)`. The slices of a head are ceil(n / select_slice) CTAs; those past
 * `n` return at once. Called by every thread of the CTA.
 */
template <class KeyOf, class KeyAt>
__device__ __forceinline__ void select_histogram_pass(select_slots const& s,
                                                      int pass,
                                                      std::int64_t n,
                                                      std::int64_t k,
                                                      KeyAt key_at,
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
      const std::uint32_t key = pass == 0 ? key_of(i) : key_at(i);
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
  select_scan_pass(
      s, pass, prefix, remaining, sm, [&](int b) { return atomicExch(&s.hist[b], 0u); });
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
      [&](std::int64_t i) { return keys[i]; },
      [&](std::int64_t i) {
        const std::uint32_t key = candidate_key(raw, n, i, pool, x.e.lead, x.e.window);
        keys[i]                 = key;
        if (p.scores_out) p.scores_out[x.rh * p.max_candidates + i] = raw[i];
        return key;
      },
      sm);
}

}  // namespace tangram::detail
