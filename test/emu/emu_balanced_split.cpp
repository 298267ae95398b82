// SPDX-License-Identifier: Apache-2.0
// emu_backend::balance: the balanced split-map kernel, through the launch sequence of
// kernels/balanced_split.cu.
#include "tangram/kernels/detail/balanced_split.cuh"

#include "emu_backend.hpp"

namespace tangram::test {

void emu_backend::balance(test_cache&, balanced_split_params const& p) {
  p.validate();
  detail::launch_balanced_split_with(p, emu::emulated_launch{});
}

}  // namespace tangram::test
