// SPDX-License-Identifier: Apache-2.0
// emu_backend::evict: every eviction kernel instantiation, through the launch sequence of
// kernels/eviction.cu.
#include "tangram/kernels/detail/eviction.cuh"

#include <vector>

#include "emu_backend.hpp"

namespace tangram::test {

void emu_backend::evict(test_cache&, eviction_params const& p) {
  p.validate();
  if (p.kv.batch_size == 0) return;
  std::vector<unsigned char> ws(eviction_workspace_bytes(p) + 256, 0xff);
  void* aligned = ws.data() + (256 - reinterpret_cast<std::uintptr_t>(ws.data()) % 256) % 256;
  const detail::eviction_args a = detail::make_eviction_args(p, aligned);
  auto const& g                 = p.kv.geometry;
  dispatch_kv_shape(g.kv_dtype, g.head_dim, "emu eviction", [&](auto shape) {
    using S = decltype(shape);
    detail::launch_eviction_with<typename S::element_type, S::head_dim>(a, emu::emulated_launch{});
  });
}

}  // namespace tangram::test
