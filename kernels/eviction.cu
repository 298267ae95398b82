// SPDX-License-Identifier: Apache-2.0
// Chunk-eviction launcher: validation, workspace carving and dispatch to the per-dtype
// instantiations (kernels/eviction_{f32,f16,bf16,fp8_e4m3,fp8_e5m2}.cu).
#include <cuda_runtime_api.h>

#include <cstdint>

#include "tangram/kernels/detail/eviction.cuh"
#include "tangram/kernels/eviction.hpp"

namespace tangram {
namespace detail {

TANGRAM_KV_SHAPE_TYPES(TANGRAM_EVICTION_INSTANTIATE, extern)

namespace {

bool aligned16(const void* p) {
  return reinterpret_cast<std::uintptr_t>(p) % 16 == 0;
}

}  // namespace
}  // namespace detail

void evict_chunk(eviction_params const& p,
                 void* workspace,
                 std::size_t workspace_bytes,
                 cuda_stream_t stream) {
  p.validate();
  expect_eviction_kernel(p.kv.geometry, "evict_chunk");
  if (p.source == score_source::snapkv)
    TANGRAM_EXPECTS(p.q_dtype == dtype::f32 || p.q_dtype == dtype::f16 || p.q_dtype == dtype::bf16,
                    invalid_argument,
                    "eviction_params.q_dtype: must be f32, f16 or bf16, got ",
                    to_string(p.q_dtype));
  TANGRAM_EXPECTS(
      detail::aligned16(p.kv.pool) && detail::aligned16(p.chunk_k) && detail::aligned16(p.chunk_v),
      invalid_argument,
      "evict_chunk: kv.pool, chunk_k and chunk_v must be 16-byte aligned");
  std::int64_t heads = static_cast<std::int64_t>(p.kv.batch_size) * p.kv.num_kv_heads;
  TANGRAM_EXPECTS(heads <= 65535,
                  invalid_argument,
                  "evict_chunk: batch_size * num_kv_heads = ",
                  heads,
                  " exceeds 65535");
  std::size_t need = eviction_workspace_bytes(p);
  TANGRAM_EXPECTS(workspace_bytes >= need,
                  invalid_argument,
                  "evict_chunk: workspace_bytes ",
                  workspace_bytes,
                  " is smaller than the ",
                  need,
                  " bytes required");
  TANGRAM_EXPECTS(workspace != nullptr && reinterpret_cast<std::uintptr_t>(workspace) % 256 == 0,
                  invalid_argument,
                  "evict_chunk: workspace must be non-null and 256-byte aligned");
  if (heads == 0) return;
  detail::eviction_args a = detail::make_eviction_args(p, workspace);
  cudaError_t err         = cudaSuccess;
  auto const& g           = p.kv.geometry;
  dispatch_kv_shape(g.kv_dtype, g.head_dim, "evict_chunk", [&](auto shape) {
    using S = decltype(shape);
    err     = detail::launch_eviction<typename S::element_type, S::head_dim>(a, stream);
  });
  detail::check_launch(err, "evict_chunk: kernel launch");
}

}  // namespace tangram
