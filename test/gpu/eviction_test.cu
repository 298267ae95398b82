// SPDX-License-Identifier: Apache-2.0
// The CUDA eviction kernels against the CPU reference (the scenarios of kernel_cases.hpp, which
// the host emulation tests in test/emu run too): the whole page pool must end up byte-identical.
// Built-in scores are compared with a tolerance, then the selection is checked exactly by
// replaying the reference with the GPU's own scores as supplied scores.
#include "gpu_support.cuh"

using namespace tangram;

TANGRAM_GPU_TEST("gpu eviction equals the CPU reference: supplied scores", "[gpu][eviction]") {
  test::gpu_backend gpu;
  for (auto const& c : test::eviction_cases_supplied())
    GPU_REQUIRE_AGREES(test::check_eviction(c, gpu));
}

TANGRAM_GPU_TEST("gpu eviction equals the CPU reference: built-in scores", "[gpu][eviction]") {
  test::gpu_backend gpu;
  for (auto const& c : test::eviction_cases_builtin())
    GPU_REQUIRE_AGREES(test::check_eviction(c, gpu));
}

TANGRAM_GPU_TEST("gpu eviction equals the CPU reference: fp8 caches with and without scales",
                 "[gpu][eviction][fp8]") {
  test::gpu_backend gpu;
  for (auto const& c : test::eviction_cases_fp8()) GPU_REQUIRE_AGREES(test::check_eviction(c, gpu));
}

TANGRAM_GPU_TEST("gpu eviction equals the CPU reference: per-head pages (Hp 1)",
                 "[gpu][eviction][per_head]") {
  test::gpu_backend gpu;
  for (auto const& c : test::eviction_cases_per_head())
    GPU_REQUIRE_AGREES(test::check_eviction(c, gpu));
}

TANGRAM_GPU_TEST("gpu eviction equals the CPU reference: pinned shared-prefix pages kept in place",
                 "[gpu][eviction][pinned]") {
  test::gpu_backend gpu;
  for (auto const& c : test::eviction_cases_pinned())
    GPU_REQUIRE_AGREES(test::check_eviction(c, gpu));
}

TANGRAM_GPU_TEST("gpu eviction equals the CPU reference: SnapKV from the prefill's log-sum-exp",
                 "[gpu][eviction][lse]") {
  test::gpu_backend gpu;
  for (auto const& c : test::eviction_cases_lse()) GPU_REQUIRE_AGREES(test::check_eviction(c, gpu));
}

TANGRAM_GPU_TEST("gpu eviction: the top-k's one-slice boundary (4096, 4097, 8192 candidates)",
                 "[gpu][eviction][select]") {
  test::gpu_backend gpu;
  for (auto const& c : test::eviction_cases_slice_boundary())
    GPU_REQUIRE_AGREES(test::check_eviction(c, gpu));
}

TANGRAM_GPU_TEST("gpu eviction: long candidate lists (several radix tiles)", "[gpu][eviction]") {
  test::gpu_backend gpu;
  GPU_REQUIRE_AGREES(test::check_eviction(test::eviction_case_long(), gpu));
}

TANGRAM_GPU_TEST("gpu eviction replays from a CUDA graph (multi-CTA top-k included)",
                 "[gpu][eviction][graph]") {
  // The reset, the three histogram passes and the compaction are captured and replayed as one
  // graph on a poisoned workspace: the pool must still equal the reference.
  test::gpu_backend gpu;
  gpu.evict_through_graph = true;
  GPU_REQUIRE_AGREES(test::check_eviction(test::eviction_case_long(), gpu));
  GPU_REQUIRE_AGREES(test::check_eviction(test::eviction_cases_builtin().front(), gpu));
}
