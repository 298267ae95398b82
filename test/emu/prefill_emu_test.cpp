// SPDX-License-Identifier: Apache-2.0
// The prefill-attention kernel in the host emulator against the CPU reference: the scenarios of
// test/gpu/prefill_cases.hpp (which test/gpu/prefill_attention_test.cu runs on a GPU), each under
// one or two block orders.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "../gpu/prefill_cases.hpp"
#include "emu_backend.hpp"
#include "emu_support.hpp"

using namespace tangram;
using tangram::test::emu_backend;

namespace {

void emu_check_prefill(test::prefill_case const& c, int schedules) {
  for (int i = 0; i < schedules; ++i) {
    emu::options o{c.seed * 7919 + static_cast<std::uint64_t>(i), emu::copy_mode::deferred, 0};
    emu::scoped_options scope(o);
    emu_backend backend;
    INFO(c.describe() << ", schedule seed " << o.seed);
    CHECK(test::check_prefill(c, backend) == "");
  }
}

}  // namespace

TEST_CASE("emulated prefill equals the CPU reference: GQA 1/4, P 1/16, sinks, sliding window",
          "[emu][prefill]") {
  for (auto const& c : test::emu_sample(test::prefill_cases_basic())) emu_check_prefill(c, 2);
}

TEST_CASE("emulated prefill equals the CPU reference: dtypes x head dims", "[emu][prefill]") {
  for (auto const& c : test::emu_sample(test::prefill_cases_shapes())) emu_check_prefill(c, 1);
}

TEST_CASE("emulated prefill equals the CPU reference: per-head pages (Hp 1)",
          "[emu][prefill][per_head]") {
  for (auto const& c : test::emu_sample(test::prefill_cases_per_head())) emu_check_prefill(c, 1);
}

TEST_CASE("emulated prefill equals the CPU reference: fp8 with per-tensor and per-head scales",
          "[emu][prefill][fp8][scales]") {
  for (auto const& c : test::emu_sample(test::prefill_cases_fp8_scaled())) emu_check_prefill(c, 1);
}

TEST_CASE("emulated prefill equals the CPU reference: fp8 e4m3 / e5m2 x head dims",
          "[emu][prefill][fp8]") {
  for (auto const& c : test::emu_sample(test::prefill_cases_fp8())) emu_check_prefill(c, 1);
}

TEST_CASE(
    "emulated prefill equals the CPU reference: a chunk over several query tiles and a "
    "held context over many key tiles",
    "[emu][prefill]") {
  test::prefill_case c;
  c.kv_dtype   = dtype::bf16;
  c.d          = 128;
  c.group      = 4;
  c.layers     = 2;
  c.heads      = 2;
  c.lens       = {700, 1};
  c.chunks     = {45, 70};
  c.window     = 64;
  c.ring_pages = 5;
  c.sinks      = true;
  c.seed       = 91;
  emu_check_prefill(c, 1);
}

TEST_CASE("emulated prefill stops on a chunk longer than max_chunk", "[emu][prefill][errors]") {
  test::prefill_case c;
  c.kv_dtype = dtype::f32;
  c.lens     = {10};
  c.chunks   = {5};
  c.layers   = 1;
  c.sliding.clear();
  test::prefill_scenario s(c);
  prefill_params p = s.params(c, 0);
  std::vector<float> o(s.qf.size()), lse(s.qf.size() / static_cast<std::size_t>(c.d));
  p.o         = o.data();
  p.lse       = lse.data();
  p.max_chunk = 4;  // the reference rejects this on the host; the kernel checks it on the device
  emu_backend backend;
  bool reported = false;
  try {
    backend.prefill(s.cache, p);
  } catch (emu::kernel_fault const& e) {
    INFO(e.what());
    reported = std::string(e.what()).find("longer than max_chunk") != std::string::npos;
  }
  CHECK(reported);
}
