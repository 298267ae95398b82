// SPDX-License-Identifier: Apache-2.0
// emu_backend::evict_elastic: the elastic selection kernels, through the launch sequence of
// kernels/elastic_eviction.cu.
#include "tangram/kernels/detail/elastic_eviction.cuh"

#include <stdexcept>
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
  bool compiled = detail::dispatch_kv_kernel<true>(g.kv_dtype, g.head_dim, [&](auto tag, auto dim) {
    detail::launch_elastic_with<decltype(tag), decltype(dim)::value>(a, emu::emulated_launch{});
  });
  if (!compiled)
    throw std::invalid_argument("emu elastic eviction: no kernel for this dtype / head_dim");
}

}  // namespace tangram::test
