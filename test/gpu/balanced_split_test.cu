// SPDX-License-Identifier: Apache-2.0
// The CUDA per-step balanced split map against the CPU reference (the scenarios of
// balanced_split_cases.hpp, which the host emulation test runs too): identical maps.
#include "gpu_support.cuh"

using namespace tangram;

TANGRAM_GPU_TEST("balance_decode_splits matches the reference", "[gpu][balanced_split]") {
  test::gpu_backend gpu;
  for (auto const& c : test::balanced_split_cases()) {
    auto msg = test::check_balanced_split(c, gpu);
    GPU_CHECK_MSG(msg.empty(), msg);
  }
}
