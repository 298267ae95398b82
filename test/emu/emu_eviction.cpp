// SPDX-License-Identifier: Apache-2.0
// emu_backend::evict: every eviction kernel instantiation, through the launch sequence of
// kernels/eviction.cu.
#include "tangram/kernels/detail/eviction.cuh"

#include <stdexcept>
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
  bool compiled = detail::dispatch_kv_kernel<true>(g.kv_dtype, g.head_dim, [&](auto tag, auto dim) {
    detail::launch_eviction_with<decltype(tag), decltype(dim)::value>(a, emu::emulated_launch{});
  });
  if (!compiled) throw std::invalid_argument("emu eviction: no kernel for this dtype / head_dim");
}

}  // namespace tangram::test
