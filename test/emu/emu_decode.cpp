// SPDX-License-Identifier: Apache-2.0
// emu_backend::decode: every decode split kernel instantiation, through the launch sequence of
// kernels/decode_attention.cu (the split kernels are instantiated in emu_decode_split_<dtype>.cpp).
#include "tangram/kernels/detail/decode_attention.cuh"

#include <vector>

#include "emu_backend.hpp"
#include "emu_decode_split.hpp"

namespace tangram::test {

void emu_backend::decode(test_cache&, decode_params const& p) {
  p.validate();
  if (p.kv.batch_size == 0) return;
  std::vector<unsigned char> ws(decode_workspace_bytes(p) + 256, 0xff);
  void* aligned = ws.data() + (256 - reinterpret_cast<std::uintptr_t>(ws.data()) % 256) % 256;
  const detail::decode_args a = detail::make_decode_args(p, aligned);
  auto const& g               = p.kv.geometry;
  dispatch_kv_shape(g.kv_dtype, g.head_dim, p.group, "emu decode", [&](auto shape) {
    using S = decltype(shape);
    emu_decode_split<typename S::element_type, S::head_dim, S::query_group>(a);
  });
  detail::launch_decode_merge_with(a, emu::emulated_launch{});
}

}  // namespace tangram::test
