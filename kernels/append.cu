// SPDX-License-Identifier: Apache-2.0
// append_decode_kv: one block per (request, head) writes the decode step's new K/V.
#include <cuda_runtime_api.h>

#include "tangram/kernels/append.hpp"
#include "tangram/kernels/detail/vec.cuh"
#include "tangram/numeric.hpp"

namespace tangram {
namespace detail {

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
  for (std::int32_t x = threadIdx.x; x < d; x += blockDim.x) {
    k_dst[x] = from_float<Cache>(to_float(k[x]));
    v_dst[x] = from_float<Cache>(to_float(v[x]));
  }
}

template <class Cache>
cudaError_t launch_for_source(append_params const& p, dim3 grid, cudaStream_t stream) {
  switch (p.src_dtype) {
    case dtype::f32: append_kernel<Cache, float><<<grid, 64, 0, stream>>>(p); break;
    case dtype::f16: append_kernel<Cache, float16><<<grid, 64, 0, stream>>>(p); break;
    default: append_kernel<Cache, bfloat16><<<grid, 64, 0, stream>>>(p); break;
  }
  return cudaGetLastError();
}

}  // namespace detail

void append_decode_kv(append_params const& p, cuda_stream_t stream) {
  p.validate();
  TANGRAM_EXPECTS(p.src_dtype == dtype::f32 || p.src_dtype == dtype::f16 || p.src_dtype == dtype::bf16,
                  invalid_argument, "append_params.src_dtype: must be f32, f16 or bf16, got ",
                  to_string(p.src_dtype));
  if (p.kv.batch_size == 0) return;
  dim3 grid(static_cast<unsigned>(p.kv.batch_size), static_cast<unsigned>(p.kv.num_kv_heads));
  cudaError_t err = cudaSuccess;
  switch (p.kv.geometry.kv_dtype) {
    case dtype::f32: err = detail::launch_for_source<float>(p, grid, stream); break;
    case dtype::f16: err = detail::launch_for_source<float16>(p, grid, stream); break;
    case dtype::bf16: err = detail::launch_for_source<bfloat16>(p, grid, stream); break;
    case dtype::fp8_e4m3: err = detail::launch_for_source<float8_e4m3>(p, grid, stream); break;
    case dtype::fp8_e5m2: err = detail::launch_for_source<float8_e5m2>(p, grid, stream); break;
  }
  detail::check_launch(err, "append_decode_kv: kernel launch");
}

}  // namespace tangram
