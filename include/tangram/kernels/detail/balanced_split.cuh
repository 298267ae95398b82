// SPDX-License-Identifier: Apache-2.0
/**
 * @file kernels/detail/balanced_split.cuh
 * @brief Device code of balance_decode_splits (see kernels/balanced_split.hpp): one block per
 * layer sums each KV head's tokens over the batch (a warp per head, lanes over the requests),
 * then its first warp runs core/balanced_split.hpp's bisection with the CTA counts summed across
 * the lanes and writes the layer's boundaries.
 */
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "tangram/core/balanced_split.hpp"
#include "tangram/kernels/balanced_split.hpp"
#include "tangram/kernels/detail/vec.cuh"

namespace tangram::detail {

/// Threads of a balance_decode_splits block: eight warps summing heads.
inline constexpr int balanced_split_threads = 256;

__device__ __forceinline__ std::int64_t balanced_warp_sum(std::int64_t v) {
#pragma unroll
  for (int off = 16; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}
__device__ __forceinline__ std::int64_t balanced_warp_max(std::int64_t v) {
#pragma unroll
  for (int off = 16; off > 0; off /= 2) {
    std::int64_t o = __shfl_xor_sync(0xffffffffu, v, off);
    v              = o > v ? o : v;
  }
  return v;
}

TANGRAM_KERNEL void balanced_split_kernel(balanced_split_params p) {
  TANGRAM_DYNAMIC_SMEM(smem);
  auto* tokens         = reinterpret_cast<std::int64_t*>(smem);  // [H]
  const std::int32_t l = static_cast<std::int32_t>(blockIdx.x);
  const std::int32_t H = p.kv.num_kv_heads;
  const int lane       = static_cast<int>(threadIdx.x) % 32;
  const int warp       = static_cast<int>(threadIdx.x) / 32;
  const int warps      = static_cast<int>(blockDim.x) / 32;
  for (std::int32_t h = warp; h < H; h += warps) {
    std::int64_t sum = 0;
    for (std::int32_t r = lane; r < p.kv.batch_size; r += 32) sum += p.kv.head_len(r, l, h);
    sum = balanced_warp_sum(sum);
    if (lane == 0) tokens[h] = sum;
  }
  __syncthreads();
  if (warp != 0) return;
  // core/balanced_split.hpp's balanced_split_bound and balanced_split_used with the sums over
  // heads across the lanes; every lane holds the same lo / hi, so the loop is warp-uniform.
  std::int64_t most = 1;
  for (std::int32_t h = lane; h < H; h += 32) most = tokens[h] > most ? tokens[h] : most;
  std::int64_t lo = 1, hi = balanced_warp_max(most);
  while (lo < hi) {
    std::int64_t mid    = lo + (hi - lo) / 2;
    std::int64_t needed = 0;
    for (std::int32_t h = lane; h < H; h += 32) needed += balanced_head_ctas(tokens[h], mid);
    if (balanced_warp_sum(needed) <= p.num_ctas)
      hi = mid;
    else
      lo = mid + 1;
  }
  std::int64_t used = 0;
  for (std::int32_t h = lane; h < H; h += 32) used += balanced_head_ctas(tokens[h], lo);
  used = balanced_warp_sum(used);
  if (lane == 0)
    balanced_split_write(
        tokens, H, p.num_ctas, lo, used, p.cta_begin + static_cast<std::int64_t>(l) * (H + 1));
}

/// Enqueues the kernel for validated parameters through the launch policy `launch` (vec.cuh):
/// one block per layer, 8 bytes of dynamic shared memory per KV head.
template <class Launch>
void launch_balanced_split_with(balanced_split_params const& p, Launch const& launch) {
  launch(balanced_split_kernel,
         dim3(static_cast<unsigned>(p.kv.num_layers)),
         balanced_split_threads,
         static_cast<int>(sizeof(std::int64_t)) * p.kv.num_kv_heads,
         p);
}

}  // namespace tangram::detail
