// SPDX-License-Identifier: Apache-2.0
// emu_backend::prefill: every prefill-attention kernel instantiation, through the launch sequence
// of kernels/prefill_attention.cu (the kernels are instantiated in emu_prefill_kernel_<dtype>.cpp).
#include "tangram/kernels/detail/prefill_attention.cuh"

#include "emu_backend.hpp"
#include "emu_prefill_kernel.hpp"

namespace tangram::test {

void emu_backend::prefill(test_cache&, prefill_params const& p) {
  p.validate();
  if (p.kv.batch_size == 0 || p.max_chunk == 0) return;
  const detail::prefill_args a = detail::make_prefill_args(p);
  auto const& g                = p.kv.geometry;
  dispatch_kv_shape(g.kv_dtype, g.head_dim, "emu prefill", [&](auto shape) {
    using S = decltype(shape);
    emu_prefill_kernel<typename S::element_type, S::head_dim>(a);
  });
}

}  // namespace tangram::test
