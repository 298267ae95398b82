// SPDX-License-Identifier: Apache-2.0
// emu_backend::append: every append kernel instantiation, through the launch sequence of
// kernels/append.cu.
#include "tangram/kernels/detail/append.cuh"

#include "emu_backend.hpp"

namespace tangram::test {

void emu_backend::append(test_cache&, append_params const& p) {
  p.validate();
  if (p.kv.batch_size == 0) return;
  detail::launch_append_with(p, emu::emulated_launch{});
}

}  // namespace tangram::test
