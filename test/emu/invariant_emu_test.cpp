// SPDX-License-Identifier: Apache-2.0
// Batch-invariant decode (decode_params::invariant_pieces) in the host emulator: both split
// kernels and the merge against the CPU reference, and a request's output bits compared across
// batch compositions and split maps (test/gpu/invariant_cases.hpp).
#include <catch2/catch.hpp>

#include "../gpu/invariant_cases.hpp"
#include "emu_backend.hpp"
#include "emu_support.hpp"

using namespace tangram;
using tangram::test::emu_backend;

TEST_CASE("emulated batch-invariant decode equals the CPU reference: both kernels x K 1, 3, 16",
          "[emu][decode][invariant]") {
  for (auto const& c : test::emu_sample(test::decode_cases_invariant()))
    test::emu_check_all_schedules(c, 1);
}

TEST_CASE(
    "emulated batch-invariant decode: a request's bits do not depend on the batch or split map",
    "[emu][decode][invariant]") {
  emu_backend backend;
  for (auto const& c : test::decode_cases_invariant()) {
    if (c.invariant_pieces == 1) continue;  // one piece per request: covered by K 3 and 16
    INFO(c.describe());
    CHECK(test::check_decode_batch_invariance(c, c.invariant_pieces, backend) == "");
  }
}

TEST_CASE(
    "emulated batch-invariant decode: empty requests between others, folded merge, N_CTA 2000",
    "[emu][decode][invariant][fold]") {
  // From the adversarial review: fp8 on the tensor-core kernel and f32 on the CUDA-core one,
  // requests without tokens among the others, a split map of more CTAs than tokens per head, and
  // the folded merge, whose bits must equal the merge kernel's.
  emu_backend backend;
  std::uint64_t seed = 9100;
  for (dtype t : {dtype::fp8_e5m2, dtype::f32}) {
    test::decode_case c;
    c.kv_dtype = t;
    c.d        = t == dtype::f32 ? 64 : 128;
    c.group    = t == dtype::f32 ? 1 : 8;
    c.scales   = t == dtype::fp8_e5m2 ? test::scale_mode::per_head : test::scale_mode::none;
    c.lens     = {0, 700, 0, 3000, 257, 0, 1500};
    c.sinks    = true;
    c.layers   = 1;
    c.sliding.clear();
    c.ctas = {c.heads, 2 * 132 + 1, 2000};
    c.seed = seed++;
    INFO(c.describe());
    CHECK(test::check_decode_batch_invariance(c, 5, backend, true) == "");
  }
}

TEST_CASE("the batch-invariance check finds the split map's mode batch-dependent",
          "[emu][decode][invariant]") {
  // The control that shows the check can fail: without invariant pieces a long request's pieces
  // follow the batch and the split map, so its rounding (and bits) change with them.
  emu_backend backend;
  for (auto const& c : test::decode_cases_invariant()) {
    if (c.invariant_pieces != 16) continue;
    INFO(c.describe());
    CHECK(test::check_decode_batch_invariance(c, 0, backend) != "");
  }
}
