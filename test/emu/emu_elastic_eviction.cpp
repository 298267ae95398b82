// SPDX-License-Identifier: Apache-2.0
// emu_backend::evict_elastic: the elastic selection kernels, through the launch sequence of
// kernels/elastic_eviction.cu.
#include "tangram/kernels/detail/elastic_eviction.cuh"

#include <vector>

#include "emu_backend.hpp"

namespace tangram::test {

void emu_backend::evict_elastic(test_cache&, elastic_eviction_params const& p) {
  p.validate();
  if (p.kv.batch_size == 0) return;
  std::vector<unsigned char> ws(elastic_workspace_bytes(p) + 256, 0xff);
  void* aligned = ws.data() + (256 - reinterpret_cast<std::uintptr_t>(ws.data()) % 256) % 256;
  const detail::elastic_args a = detail::make_elastic_args(p, aligned);
  auto const& g                = p.kv.geometry;
  dispatch_kv_shape(g.kv_dtype, g.head_dim, "emu elastic eviction", [&](auto shape) {
    using S = decltype(shape);
    detail::launch_elastic_with<typename S::element_type, S::head_dim>(a, emu::emulated_launch{});
  });
}

}  // namespace tangram::test
