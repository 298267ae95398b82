// SPDX-License-Identifier: Apache-2.0
// emu_backend::prefill: every prefill-attention kernel instantiation, through the launch sequence
// of kernels/prefill_attention.cu.
#include "tangram/kernels/detail/prefill_attention.cuh"

#include <stdexcept>

#include "emu_backend.hpp"

namespace tangram::test {

void emu_backend::prefill(test_cache&, prefill_params const& p) {
  p.validate();
  if (p.kv.batch_size == 0 || p.max_chunk == 0) return;
  const detail::prefill_args a = detail::make_prefill_args(p);
  auto const& g                = p.kv.geometry;
  bool compiled = detail::dispatch_kv_kernel<true>(g.kv_dtype, g.head_dim, [&](auto tag, auto dim) {
    detail::launch_prefill_with<decltype(tag), decltype(dim)::value>(a, emu::emulated_launch{});
  });
  if (!compiled) throw std::invalid_argument("emu prefill: no kernel for this dtype / head_dim");
}

}  // namespace tangram::test
