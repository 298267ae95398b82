// SPDX-License-Identifier: Apache-2.0
// Decode-attention launcher: validation, workspace carving, dispatch to the split kernel
// instantiations (kernels/decode_attention_{f32,f16,bf16,fp8_e4m3,fp8_e5m2}.cu), the merge kernel,
// occupancy.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "tangram/kernels/decode_attention.hpp"
#include "tangram/kernels/detail/decode_attention.cuh"

namespace tangram {
namespace detail {

TANGRAM_KV_SHAPE_TYPES(TANGRAM_DECODE_INSTANTIATE, extern)

namespace {

bool aligned(const void* p, std::uintptr_t a) {
  return reinterpret_cast<std::uintptr_t>(p) % a == 0;
}

}  // namespace
}  // namespace detail

void decode_attention(decode_params const& p,
                      void* workspace,
                      std::size_t workspace_bytes,
                      cuda_stream_t stream) {
  p.validate();
  auto const& g = p.kv.geometry;
  expect_kv_shape(g.kv_dtype, g.head_dim, "decode_attention");
  for (dtype t : {p.q_dtype, p.o_dtype})
    TANGRAM_EXPECTS(t == dtype::f32 || t == dtype::f16 || t == dtype::bf16,
                    invalid_argument,
                    "decode_params.q_dtype/o_dtype: must be f32, f16 or bf16, got ",
                    to_string(t));
  TANGRAM_EXPECTS(detail::aligned(p.kv.pool, 16),
                  invalid_argument,
                  "decode_params.kv.pool: must be 16-byte aligned");
  std::size_t need = decode_workspace_bytes(p);
  TANGRAM_EXPECTS(workspace_bytes >= need,
                  invalid_argument,
                  "decode_attention: workspace_bytes ",
                  workspace_bytes,
                  " is smaller than the ",
                  need,
                  " bytes required");
  TANGRAM_EXPECTS(workspace != nullptr && detail::aligned(workspace, 256),
                  invalid_argument,
                  "decode_attention: workspace must be non-null and 256-byte aligned");
  if (p.kv.batch_size == 0) return;
  detail::decode_args a = detail::make_decode_args(p, workspace);
  cudaError_t err       = cudaSuccess;
  dispatch_kv_shape(g.kv_dtype, g.head_dim, p.group, "decode_attention", [&](auto shape) {
    using S = decltype(shape);
    err     = detail::launch_decode_split<typename S::element_type, S::head_dim, S::query_group>(
        a, stream);
  });
  detail::check_launch(err, "decode_attention: split kernel launch");
  detail::launch_decode_merge_with(a, detail::stream_launch{stream, p.pdl});
  detail::check_launch(cudaGetLastError(), "decode_attention: merge kernel launch");
}

std::optional<device_limits> decode_device_limits(
    dtype kv_dtype,
    std::int32_t head_dim,
    std::int32_t group,
    std::int32_t device,
    bool tensor_cores,
    bool /*folded_merge: both variants count*/) noexcept {
  if (!decode_kernel_supports(kv_dtype, head_dim) || group < 1 || group > decode_max_group)
    return std::nullopt;
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || device < 0 || device >= count) {
    (void)cudaGetLastError();
    return std::nullopt;
  }
  int previous = 0, sms = 0, per_sm = 0;
  cudaError_t err = cudaGetDevice(&previous);
  if (err == cudaSuccess) err = cudaSetDevice(device);
  if (err == cudaSuccess)
    err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (err == cudaSuccess)
    dispatch_kv_shape(kv_dtype, head_dim, group, "decode_device_limits", [&](auto shape) {
      using S = decltype(shape);
      err = detail::decode_split_occupancy<typename S::element_type, S::head_dim, S::query_group>(
          &per_sm, tensor_cores);
    });
  (void)cudaSetDevice(previous);
  if (err != cudaSuccess || sms <= 0 || per_sm <= 0) {  // a zero occupancy is an error, not a plan
    (void)cudaGetLastError();
    return std::nullopt;
  }
  return device_limits{sms, per_sm};
}

}  // namespace tangram
