// SPDX-License-Identifier: Apache-2.0
// append_decode_kv: validation and the launch (device code: kernels/detail/append.cuh).
#include <cuda_runtime_api.h>

#include "tangram/kernels/append.hpp"
#include "tangram/kernels/detail/append.cuh"

namespace tangram {

void append_decode_kv(append_params const& p, cuda_stream_t stream) {
  p.validate();
  TANGRAM_EXPECTS(
      p.src_dtype == dtype::f32 || p.src_dtype == dtype::f16 || p.src_dtype == dtype::bf16,
      invalid_argument,
      "append_params.src_dtype: must be f32, f16 or bf16, got ",
      to_string(p.src_dtype));
  if (p.kv.batch_size == 0) return;
  detail::launch_append_with(p, detail::stream_launch{stream});
  detail::check_launch(cudaGetLastError(), "append_decode_kv: kernel launch");
}

}  // namespace tangram
