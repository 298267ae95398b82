// SPDX-License-Identifier: Apache-2.0
// Mutation checks: the emulation suite must fail when a needed barrier is deleted or a cp.async
// wait is one stage short. Each weakens one numbered site of the real kernels at run time
// (tangram::detail::sync_site; in nvcc builds the sites are plain __syncthreads() and the given
// wait depth) and requires the scenario, which passes unmutated under the same schedule, to
// differ from the CPU reference (or the emulator to stop the launch).
#include <catch2/catch.hpp>

#include <string>

#include "../gpu/kernel_cases.hpp"
#include "../gpu/prefill_cases.hpp"
#include "emu_support.hpp"
#include "tangram/kernels/decode_attention.hpp"

using namespace tangram;

namespace {

// The sites of include/tangram/kernels/detail/vec.cuh (sync_site), by value: this file does
// not include the device headers.
constexpr int decode_tile_ready = 1, decode_tile_wait = 2, compact_loaded = 3, snapkv_queries = 4,
              prefill_tile_ready = 5, select_counted = 6;

/// The scenario's verdict with `site` weakened ("" when it still matches the reference).
/// check_prefill under one emulator schedule.
std::string emu_check_prefill(test::prefill_case const& c, emu::options o) {
  emu::scoped_options scope(o);
  test::emu_backend backend;
  return test::check_prefill(c, backend);
}

/// The prefill scenario's verdict with `site` weakened; requires the unmutated control to pass.
void require_prefill_detected(test::prefill_case const& c, emu::options o, int site) {
  INFO(c.describe() << ", schedule seed " << o.seed << ", site " << site);
  REQUIRE(emu_check_prefill(c, o) == "");
  o.mutation = site;
  std::string verdict;
  try {
    verdict = emu_check_prefill(c, o);
  } catch (emu::kernel_fault const& e) {
    verdict = e.what();
  }
  INFO("mutated: " << verdict);
  CHECK_FALSE(verdict.empty());
}

template <class Case>
std::string mutated(Case const& c, emu::options o, int site) {
  o.mutation = site;
  try {
    return test::emu_check(c, o);
  } catch (emu::kernel_fault const& e) {
    return e.what();
  }
}

template <class Case>
void require_detected(Case const& c, emu::options o, int site) {
  INFO(c.describe() << ", schedule seed " << o.seed << ", site " << site);
  REQUIRE(test::emu_check(c, o) == "");  // the control: unmutated, the same schedule passes
  std::string verdict = mutated(c, o, site);
  INFO("mutated: " << verdict);
  CHECK_FALSE(verdict.empty());
}

test::decode_case small_decode(dtype t, std::int32_t d) {
  test::decode_case c;
  c.kv_dtype = t;
  c.d        = d;
  c.group    = 3;
  c.layers   = 1;
  c.sliding.clear();
  c.lens = {97, 3, 300, 54};
  c.ctas = {4, 9};
  c.seed = 77;
  return c;
}

}  // namespace

TEST_CASE("mutation: a cp.async wait one stage short is detected (decode)", "[emu][mutation]") {
  // Deferred copies land only when their group is waited for: one group short, the tile being
  // read is still poisoned shared memory. (Group 3 with 16-bit K/V runs the tensor-core kernel:
  // two stages per warp at d 64 and 128, one at d 256; f32 and fp8 run the CUDA-core kernel.)
  struct shape {
    dtype t;
    std::int32_t d;
  };
  for (auto s : {shape{dtype::bf16, 128},
                 shape{dtype::f32, 128},
                 shape{dtype::f16, 64},
                 shape{dtype::bf16, 256},
                 shape{dtype::fp8_e5m2, 128}})
    require_detected(small_decode(s.t, s.d), {3, emu::copy_mode::deferred, 0}, decode_tile_wait);
}

TEST_CASE("mutation: a deleted tile barrier is detected (decode, f32 x 256 and fp8)",
          "[emu][mutation]") {
  // With f32 and head dim 256 a lane reads 32 bytes per token, two chunks of which only one
  // it copied itself: without the barrier it reads the other before its copier's wait. fp8
  // lanes of the CUDA-core kernel (group 2) read 8 bytes of a 16-byte chunk that, by the copy
  // order, another thread copied. (In the configurations where every lane reads exactly the
  // 16-byte chunks it copied, this barrier only orders a thread's own copies, and deleting it is
  // harmless there; so in the tensor-core kernel's fp8 path, whose lanes widen exactly the
  // chunks their row-contiguous copies moved, and whose 16-bit ldmatrix reads are warp
  // collectives in the emulator: docs/kernels.md, "Host emulation".)
  require_detected(
      small_decode(dtype::f32, 256), {5, emu::copy_mode::deferred, 0}, decode_tile_ready);
  test::decode_case fp8 = small_decode(dtype::fp8_e4m3, 64);
  fp8.group             = 2;
  require_detected(fp8, {5, emu::copy_mode::deferred, 0}, decode_tile_ready);
}

TEST_CASE("mutation: a deleted load-to-store barrier in the compaction is detected",
          "[emu][mutation]") {
  // Survivors move to earlier positions of the same column: without the barrier a thread's
  // stores overwrite sources other threads have not loaded yet.
  test::eviction_case c;
  c.seed = 60;
  require_detected(c, {7, emu::copy_mode::deferred, 0}, compact_loaded);
}

TEST_CASE("mutation: a deleted count-to-flush barrier in the top-k histogram is detected",
          "[emu][mutation]") {
  // Without it a thread adds its shared bins to the head's global histogram before other warps
  // have counted into them: counts are lost and the threshold moves. (Only the adds of a warp's
  // last round can still be pending at the flush, so the slices must be full: long lists.)
  test::eviction_case c;
  c.long_len = 20000;
  c.seed     = 63;
  require_detected(c, {13, emu::copy_mode::deferred, 0}, select_counted);
}

TEST_CASE("mutation: a deleted count-to-scan barrier of a one-slice head is detected",
          "[emu][mutation]") {
  // Heads of at most select_slice candidates run all three radix passes in one CTA over its
  // shared histogram: without the barrier a warp scans bins other warps have not counted into.
  // (Only a warp's last round of adds can still be pending, so the longest head's last round
  // must hold keys: 3840 < n <= 4096 candidates.)
  test::eviction_case c;
  c.long_len   = 10;
  c.long_chunk = 4000;
  c.seed       = 64;
  require_detected(c, {13, emu::copy_mode::deferred, 0}, select_counted);
}

TEST_CASE("mutation: a deleted query-tile barrier in SnapKV scoring is detected",
          "[emu][mutation]") {
  test::eviction_case c;
  c.source = score_source::snapkv;
  c.seed   = 61;
  require_detected(c, {9, emu::copy_mode::deferred, 0}, snapkv_queries);
}

TEST_CASE("mutation: a query-tile cp.async wait one short is detected (tensor-core SnapKV)",
          "[emu][mutation]") {
  // bf16 K with exact bf16 queries: the scorer copies each query tile with cp.async a tile ahead
  // into memory that held the K block; a wait that returns early scores stale rows.
  test::eviction_case c = test::eviction_cases_lse()[1];
  REQUIRE(c.q_dtype == dtype::bf16);
  require_detected(c, {9, emu::copy_mode::deferred, 0}, snapkv_queries);
}

TEST_CASE("mutation: a deleted barrier of the prefill K/V tile is detected", "[emu][mutation]") {
  // Without it a thread scores keys (and reads queries) other threads have not stored yet
  // (poisoned shared memory). (The barrier before a refill is not a numbered site: the emulator
  // advances every warp by one shuffle per phase and all warps issue the same shuffles per tile,
  // so no warp can refill a tile another still reads there; on a GPU it can.)
  test::prefill_case c;
  c.kv_dtype = dtype::bf16;
  c.d        = 64;
  c.group    = 4;
  c.layers   = 1;
  c.sliding.clear();
  c.lens   = {90, 7};
  c.chunks = {20, 5};
  c.seed   = 62;
  require_prefill_detected(c, {11, emu::copy_mode::deferred, 0}, prefill_tile_ready);
  c.kv_dtype = dtype::fp8_e4m3;  // one lane per key, 16-byte vectors of 16 values
  require_prefill_detected(c, {11, emu::copy_mode::deferred, 0}, prefill_tile_ready);
}
