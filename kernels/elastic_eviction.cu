// SPDX-License-Identifier: Apache-2.0
// Elastic chunk-eviction launcher: validation, workspace carving, dispatch and the kernel
// instantiations (copies only: 4-, 2- and 1-byte elements x head dims 64/128/256).
#include <cuda_runtime_api.h>

#include <cstdint>
#include <limits>

#include "tangram/kernels/detail/elastic_eviction.cuh"
#include "tangram/kernels/elastic_eviction.hpp"

namespace tangram {

void evict_elastic(elastic_eviction_params const& p,
                   void* workspace,
                   std::size_t workspace_bytes,
                   cuda_stream_t stream) {
  p.validate();
  expect_eviction_kernel(p.kv.geometry, "evict_elastic");
  TANGRAM_EXPECTS(reinterpret_cast<std::uintptr_t>(p.kv.pool) % 16 == 0,
                  invalid_argument,
                  "evict_elastic: kv.pool must be 16-byte aligned");
  TANGRAM_EXPECTS(p.kv.batch_size <= 65535,
                  invalid_argument,
                  "elastic_eviction_params.kv.batch_size: ",
                  p.kv.batch_size,
                  " exceeds 65535");
  TANGRAM_EXPECTS(p.heads() <= 65535,
                  invalid_argument,
                  "evict_elastic: num_layers * num_kv_heads = ",
                  p.heads(),
                  " exceeds 65535 (the top-k histogram grid's y dimension)");
  auto cells = detail::mul_or_throw(static_cast<std::int64_t>(p.heads()),
                                    static_cast<std::int64_t>(p.max_candidates),
                                    "evict_elastic: heads * max_candidates");
  TANGRAM_EXPECTS(cells <= std::numeric_limits<std::uint32_t>::max(),
                  invalid_argument,
                  "evict_elastic: num_layers * num_kv_heads * max_candidates = ",
                  cells,
                  " exceeds 2^32 - 1 (the radix histogram counts in 32 bits)");
  std::size_t need = elastic_workspace_bytes(p);
  TANGRAM_EXPECTS(workspace_bytes >= need,
                  invalid_argument,
                  "evict_elastic: workspace_bytes ",
                  workspace_bytes,
                  " is smaller than the ",
                  need,
                  " bytes required");
  TANGRAM_EXPECTS(workspace != nullptr && reinterpret_cast<std::uintptr_t>(workspace) % 256 == 0,
                  invalid_argument,
                  "evict_elastic: workspace must be non-null and 256-byte aligned");
  if (p.kv.batch_size == 0) return;
  detail::elastic_args a = detail::make_elastic_args(p, workspace);
  cudaError_t err        = cudaSuccess;
  auto const& g          = p.kv.geometry;
  dispatch_kv_shape(g.kv_dtype, g.head_dim, "evict_elastic", [&](auto shape) {
    using S = decltype(shape);
    err     = detail::launch_elastic<typename S::element_type, S::head_dim>(a, stream);
  });
  detail::check_launch(err, "evict_elastic: kernel launch");
}

}  // namespace tangram
