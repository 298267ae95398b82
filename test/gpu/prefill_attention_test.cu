// SPDX-License-Identifier: Apache-2.0
// The CUDA prefill-attention kernel against the CPU reference (the scenarios of prefill_cases.hpp,
// which the host emulation tests in test/emu run too).
#include "gpu_support.cuh"

using namespace tangram;

TANGRAM_GPU_TEST("gpu prefill equals the CPU reference: GQA 1/4, P 1/16, sinks, sliding window",
                 "[gpu][prefill]") {
  test::gpu_backend gpu;
  for (auto const& c : test::prefill_cases_basic()) GPU_REQUIRE_AGREES(test::check_prefill(c, gpu));
}

TANGRAM_GPU_TEST("gpu prefill equals the CPU reference: dtypes x head dims", "[gpu][prefill]") {
  test::gpu_backend gpu;
  for (auto const& c : test::prefill_cases_shapes())
    GPU_REQUIRE_AGREES(test::check_prefill(c, gpu));
}

TANGRAM_GPU_TEST("gpu prefill equals the CPU reference: fp8 e4m3 / e5m2 x head dims",
                 "[gpu][prefill][fp8]") {
  test::gpu_backend gpu;
  for (auto const& c : test::prefill_cases_fp8()) GPU_REQUIRE_AGREES(test::check_prefill(c, gpu));
}

TANGRAM_GPU_TEST("gpu prefill equals the CPU reference: a long held context and chunk",
                 "[gpu][prefill]") {
  test::gpu_backend gpu;
  test::prefill_case c;
  c.kv_dtype   = dtype::bf16;
  c.d          = 128;
  c.group      = 4;
  c.heads      = 2;
  c.lens       = {5000, 700, 1};
  c.chunks     = {300, 129, 64};
  c.window     = 128;
  c.ring_pages = 9;
  c.sinks      = true;
  c.seed       = 92;
  GPU_REQUIRE_AGREES(test::check_prefill(c, gpu));
}
