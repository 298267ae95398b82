// SPDX-License-Identifier: Apache-2.0
// The CUDA elastic eviction (stage launches, request-wide selection, compaction) against the CPU
// reference: the scenarios of elastic_cases.hpp, which the host emulation tests in test/emu run
// too. Pools, keys, lengths and pages must end byte-identical.
#include "elastic_cases.hpp"
#include "gpu_support.cuh"

using namespace tangram;

TANGRAM_GPU_TEST("gpu elastic eviction equals the CPU reference: supplied scores",
                 "[gpu][eviction][elastic]") {
  test::gpu_backend gpu;
  for (auto const& c : test::elastic_cases_supplied())
    GPU_REQUIRE_AGREES(test::check_elastic(c, gpu));
}

TANGRAM_GPU_TEST("gpu elastic eviction equals the CPU reference: built-in scores",
                 "[gpu][eviction][elastic]") {
  test::gpu_backend gpu;
  for (auto const& c : test::elastic_cases_builtin())
    GPU_REQUIRE_AGREES(test::check_elastic(c, gpu));
}

TANGRAM_GPU_TEST("gpu elastic eviction equals the CPU reference: fp8 caches",
                 "[gpu][eviction][elastic][fp8]") {
  test::gpu_backend gpu;
  for (auto const& c : test::elastic_cases_fp8()) GPU_REQUIRE_AGREES(test::check_elastic(c, gpu));
}

TANGRAM_GPU_TEST("gpu elastic eviction equals the CPU reference: per-head pages (Hp 1)",
                 "[gpu][eviction][elastic][per_head]") {
  test::gpu_backend gpu;
  for (auto const& c : test::elastic_cases_per_head())
    GPU_REQUIRE_AGREES(test::check_elastic(c, gpu));
}

TANGRAM_GPU_TEST("gpu elastic eviction equals the CPU reference: pinned shared-prefix pages kept",
                 "[gpu][eviction][elastic][pinned]") {
  test::gpu_backend gpu;
  for (auto const& c : test::elastic_cases_pinned())
    GPU_REQUIRE_AGREES(test::check_elastic(c, gpu));
}

TANGRAM_GPU_TEST("gpu elastic eviction: long candidate lists (several compaction tiles)",
                 "[gpu][eviction][elastic]") {
  test::gpu_backend gpu;
  GPU_REQUIRE_AGREES(test::check_elastic(test::elastic_case_long(), gpu));
}

TANGRAM_GPU_TEST("gpu elastic eviction: heads of several top-k slices",
                 "[gpu][eviction][elastic]") {
  test::gpu_backend gpu;
  GPU_REQUIRE_AGREES(test::check_elastic(test::elastic_case_many_slices(), gpu));
}
