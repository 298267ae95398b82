// SPDX-License-Identifier: Apache-2.0
/**
 * @file kernels/detail/append.cuh
 * @brief Device code of append_decode_kv (see kernels/append.hpp): one block per (request, head)
 * writes the decode step's new K/V, converted from the source dtype to the cache dtype.
 */
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "tangram/core/kv_shape.hpp"
#include "tangram/core/numeric.hpp"
#include "tangram/kernels/append.hpp"
#include "tangram/kernels/detail/vec.cuh"

namespace tangram::detail {

template <class Cache, class Src>
TANGRAM_KERNEL void append_kernel(append_params p) {
  std::int32_t r = blockIdx.x, h = blockIdx.y;
  head_cursor c;
  std::int32_t pos = 0;
  if (!append_target(p.kv, r, p.layer, h, c, pos)) return;
  std::int32_t d   = p.kv.geometry.head_dim;
  std::int64_t src = r * p.row_stride() + static_cast<std::int64_t>(h) * d;
  Cache* k_dst     = c.ptr_at_position<Cache>(pos, 0);
  Cache* v_dst     = c.ptr_at_position<Cache>(pos, 1);
  auto const* k    = static_cast<Src const*>(p.k) + src;
  auto const* v    = static_cast<Src const*>(p.v) + src;
  // A true division (not a multiply by 1 / s): the same correctly rounded quotient as the
  // reference's, so both store the same bytes; without scales s is 1 and x / 1 is x.
  const float sk = p.scales.k_of(h), sv = p.scales.v_of(h);
  for (std::int32_t x = threadIdx.x; x < d; x += blockDim.x) {
    k_dst[x] = from_float<Cache>(to_float(k[x]) / sk);
    v_dst[x] = from_float<Cache>(to_float(v[x]) / sv);
  }
}

/// Enqueues the append kernel for cache dtype `Cache` and the runtime source dtype through the
/// launch policy `launch` (vec.cuh): grid batch x heads, 64 threads.
template <class Cache, class Launch>
void launch_append_for_source(append_params const& p, dim3 grid, Launch const& launch) {
  switch (p.src_dtype) {
    case dtype::f32:
      launch(append_kernel<Cache, float>, grid, 64, 0, p);
      break;
    case dtype::f16:
      launch(append_kernel<Cache, float16>, grid, 64, 0, p);
      break;
    default:
      launch(append_kernel<Cache, bfloat16>, grid, 64, 0, p);
      break;
  }
}

/// Enqueues the append kernel for validated parameters (batch > 0) through `launch`.
template <class Launch>
void launch_append_with(append_params const& p, Launch const& launch) {
  dim3 grid(static_cast<unsigned>(p.kv.batch_size), static_cast<unsigned>(p.kv.num_kv_heads));
  dispatch_in<kv_shape_dtypes>(p.kv.geometry.kv_dtype, [&](auto t) {
    launch_append_for_source<storage_t<decltype(t)::value>>(p, grid, launch);
  });
}

}  // namespace tangram::detail
