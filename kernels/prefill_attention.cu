// SPDX-License-Identifier: Apache-2.0
// Prefill-attention launcher: validation and dispatch to the kernel instantiations
// (f32/f16/bf16/fp8_e4m3/fp8_e5m2 x head dims 64/128/256, all in this file).
#include <cuda_runtime_api.h>

#include <cstdint>

#include "tangram/kernels/detail/prefill_attention.cuh"
#include "tangram/kernels/prefill_attention.hpp"

namespace tangram {
namespace {

bool aligned16(const void* p) {
  return reinterpret_cast<std::uintptr_t>(p) % 16 == 0;
}

}  // namespace

void prefill_attention(prefill_params const& p,
                       void* workspace,
                       std::size_t workspace_bytes,
                       cuda_stream_t stream) {
  p.validate();
  auto const& g = p.kv.geometry;
  expect_kv_shape(g.kv_dtype, g.head_dim, "prefill_attention");
  for (dtype t : {p.q_dtype, p.o_dtype})
    TANGRAM_EXPECTS(t == dtype::f32 || t == dtype::f16 || t == dtype::bf16,
                    invalid_argument,
                    "prefill_params.q_dtype/o_dtype: must be f32, f16 or bf16, got ",
                    to_string(t));
  TANGRAM_EXPECTS(p.kv.num_kv_heads <= 65535,
                  invalid_argument,
                  "prefill_params.kv.num_kv_heads: at most 65535 (grid y), got ",
                  p.kv.num_kv_heads);
  TANGRAM_EXPECTS(
      aligned16(p.kv.pool), invalid_argument, "prefill_params.kv.pool: must be 16-byte aligned");
  TANGRAM_EXPECTS(aligned16(p.chunk_k) && aligned16(p.chunk_v),
                  invalid_argument,
                  "prefill_params.chunk_k/chunk_v: must be 16-byte aligned");
  std::size_t need = prefill_workspace_bytes(p);
  TANGRAM_EXPECTS(workspace_bytes >= need,
                  invalid_argument,
                  "prefill_attention: workspace_bytes ",
                  workspace_bytes,
                  " is smaller than the ",
                  need,
                  " bytes required");
  (void)workspace;
  if (p.kv.batch_size == 0 || p.max_chunk == 0) return;
  const detail::prefill_args a = detail::make_prefill_args(p);
  dispatch_kv_shape(g.kv_dtype, g.head_dim, "prefill_attention", [&](auto shape) {
    using S = decltype(shape);
    detail::launch_prefill_with<typename S::element_type, S::head_dim>(
        a, detail::stream_launch{stream});
  });
  detail::check_launch(cudaGetLastError(), "prefill_attention: kernel launch");
}

}  // namespace tangram
