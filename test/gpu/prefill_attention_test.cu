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

TANGRAM_GPU_TEST("gpu prefill equals the CPU reference: per-head pages (Hp 1)",
                 "[gpu][prefill][per_head]") {
  test::gpu_backend gpu;
  for (auto const& c : test::prefill_cases_per_head())
    GPU_REQUIRE_AGREES(test::check_prefill(c, gpu));
}

TANGRAM_GPU_TEST("gpu prefill equals the CPU reference: fp8 with per-tensor and per-head scales",
                 "[gpu][prefill][fp8][scales]") {
  test::gpu_backend gpu;
  for (auto const& c : test::prefill_cases_fp8_scaled())
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

TANGRAM_GPU_TEST("gpu prefill launcher names the field for fp8 it cannot run",
                 "[gpu][prefill][fp8][errors]") {
  // Validation throws before any array is read, so host arrays suffice here.
  auto message = [](std::int32_t d, dtype q_dtype) {
    test::prefill_case c;
    c.kv_dtype = dtype::fp8_e4m3;
    c.d        = d;
    c.q_dtype  = q_dtype;
    c.lens     = {10};
    c.chunks   = {5};
    c.layers   = 1;
    c.sliding.clear();
    test::prefill_scenario s(c);
    prefill_params p = s.params(c, 0);
    std::vector<float> o(s.qf.size());
    p.o = o.data();
    try {
      prefill_attention(p, nullptr, 0, nullptr);
    } catch (invalid_argument const& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  // Head dim 96 has no fp8 instantiation: the dtype and the head dim are named.
  GPU_CHECK(message(96, dtype::f32).find("head_dim 96 with kv dtype fp8_e4m3") !=
            std::string::npos);
  // fp8 is a K/V storage type only: fp8 queries are rejected by field and value.
  const std::string q_error = message(64, dtype::fp8_e5m2);
  GPU_CHECK(q_error.find("prefill_params.q_dtype/o_dtype") != std::string::npos);
  GPU_CHECK(q_error.find("fp8_e5m2") != std::string::npos);
}
