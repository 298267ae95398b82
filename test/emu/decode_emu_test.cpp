// SPDX-License-Identifier: Apache-2.0
// The decode kernels (split + merge) in the host emulator against the CPU reference: the
// scenarios of test/gpu/decode_attention_test.cu, under one to two schedules each (seed x copy
// mode), both cp.async copy modes across the suite.
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include "../gpu/kernel_cases.hpp"
#include "emu_backend.hpp"
#include "emu_support.hpp"

using namespace tangram;
using tangram::test::emu_backend;

TEST_CASE("emulated decode equals the CPU reference: GQA 1..8", "[emu][decode]") {
  for (auto const& c : test::emu_sample(test::decode_cases_gqa()))
    test::emu_check_all_schedules(c, 2);
}

TEST_CASE("emulated decode equals the CPU reference: dtypes x head dims x page sizes",
          "[emu][decode]") {
  for (auto const& c : test::emu_sample(test::decode_cases_shapes()))
    test::emu_check_all_schedules(c, 1);
}

TEST_CASE("emulated decode equals the CPU reference: fp8 e4m3 / e5m2 x head dims",
          "[emu][decode][fp8]") {
  for (auto const& c : test::emu_sample(test::decode_cases_fp8()))
    test::emu_check_all_schedules(c, 1);
}

TEST_CASE("emulated decode equals the CPU reference: per-head pages (Hp 1)",
          "[emu][decode][per_head]") {
  for (auto const& c : test::emu_sample(test::decode_cases_per_head()))
    test::emu_check_all_schedules(c, 1);
}

TEST_CASE("emulated decode equals the CPU reference: fp8 with per-tensor and per-head scales",
          "[emu][decode][fp8][scales]") {
  for (auto const& c : test::emu_sample(test::decode_cases_fp8_scaled()))
    test::emu_check_all_schedules(c, 2);
}

TEST_CASE("emulated decode on fp8 pages read in the other fp8 format differs from the reference",
          "[emu][decode][fp8]") {
  // The comparison can fail on an fp8 misread: the same bytes widened as the other format (what
  // a dispatch or widening slip would do) must be reported.
  for (dtype t : {dtype::fp8_e4m3, dtype::fp8_e5m2}) {
    test::decode_case c;
    c.kv_dtype = t;
    c.d        = 64;
    c.lens     = {40, 7};
    c.layers   = 1;
    c.sliding.clear();
    test::decode_scenario s(c);
    std::vector<std::int32_t> begin = {0, 1, 2, 3, 4};
    std::vector<float> o_ref(s.q.size()), o_run(s.q.size());
    decode_params p;
    p.kv      = s.view;
    p.group   = c.group;
    p.q       = s.q.data();
    p.q_dtype = p.o_dtype = dtype::f32;
    p.splits              = {1, c.heads, c.heads, begin.data()};
    p.o                   = o_ref.data();
    reference::decode_attention(p);
    p.o        = o_run.data();
    auto worst = [&] { return test::worst_difference(o_run, o_ref); };
    emu_backend backend;
    backend.decode(s.cache, p);
    INFO(to_string(t) << ": largest output difference " << worst());
    CHECK(worst() <= 5e-5f);  // the control: the right format agrees (check_decode's tolerance)
    p.kv.geometry.kv_dtype = t == dtype::fp8_e4m3 ? dtype::fp8_e5m2 : dtype::fp8_e4m3;
    backend.decode(s.cache, p);
    INFO("read as " << to_string(p.kv.geometry.kv_dtype) << ": largest difference " << worst());
    CHECK(worst() > 1e-2f);
  }
}

TEST_CASE("emulated decode equals the CPU reference: tensor-core path: 16-bit K/V x GQA 3..8",
          "[emu][decode][mma]") {
  for (auto const& c : test::emu_sample(test::decode_cases_mma()))
    test::emu_check_all_schedules(c, 1);
}

TEST_CASE("emulated decode equals the CPU reference: CUDA-core kernel on the tensor-core instances",
          "[emu][decode]") {
  for (auto const& c : test::emu_sample(test::decode_cases_mma_cuda_core()))
    test::emu_check_all_schedules(c, 1);
}

TEST_CASE("emulated decode with the merge folded into the split kernels equals the reference",
          "[emu][decode][fold]") {
  // Blocks run in a schedule-dependent order (two schedules per case, seeded by the case), so the
  // CTA that completes a request's count (and merges) differs between runs; every counter must be
  // back to zero after each launch.
  for (auto const& c : test::emu_sample(test::decode_cases_folded()))
    test::emu_check_all_schedules(c, 2);
}

TEST_CASE("emulated decode equals the CPU reference: layer-stream split across heads",
          "[emu][decode][layer_stream]") {
  // Two schedules per case: with the merge folded, which CTA completes a request's count (and
  // merges) depends on the block order; a CTA may serve several heads (N_CTA 1 and 3).
  for (auto const& c : test::emu_sample(test::decode_cases_layer_stream()))
    test::emu_check_all_schedules(c, 2);
}

TEST_CASE("emulated decode equals the CPU reference: query dtypes, misaligned query rows",
          "[emu][decode][query]") {
  for (auto const& c : test::decode_cases_query_layout()) test::emu_check_all_schedules(c, 1);
}

TEST_CASE("emulated decode equals the CPU reference: long and batched", "[emu][decode]") {
  for (auto const& c : test::emu_sample(test::decode_cases_long()))
    test::emu_check_all_schedules(c, 1);
}

TEST_CASE("emulated decode equals the CPU reference: batch 1100 and 4096 (multi-tile prefix scan)",
          "[emu][decode]") {
  for (auto const& c : test::emu_sample(test::decode_cases_large_batch()))
    test::emu_check_all_schedules(c, 1);
}

TEST_CASE("emulated decode stops on a split map row that does not end at num_ctas",
          "[emu][decode][errors]") {
  test::decode_case c;
  c.lens   = {40, 7};
  c.layers = 1;
  c.sliding.clear();
  test::decode_scenario s(c);
  std::vector<std::int32_t> begin = {0, 3, 6, 8, 10};  // N_CTA 10: the row is correct
  std::vector<float> o(s.q.size());
  decode_params p;
  p.kv      = s.view;
  p.group   = c.group;
  p.q       = s.q.data();
  p.q_dtype = p.o_dtype = dtype::f32;
  p.o                   = o.data();
  p.splits              = {1, c.heads, 10, begin.data()};
  emu_backend backend;
  CHECK_NOTHROW(backend.decode(s.cache, p));
  begin.back()  = 9;  // the last head's CTAs stop one short of the grid
  bool reported = false;
  try {
    backend.decode(s.cache, p);
  } catch (emu::kernel_fault const& e) {
    INFO(e.what());
    reported = std::string(e.what()).find("split map row must run from 0 to num_ctas") !=
               std::string::npos;
  }
  CHECK(reported);
}
