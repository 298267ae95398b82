// SPDX-License-Identifier: Apache-2.0
// The per-step balanced split-map kernel in the host emulator against the CPU reference (the
// scenarios of test/gpu/balanced_split_cases.hpp, which the GPU test runs too): identical maps.
#include <catch2/catch.hpp>

#include "../gpu/kernel_cases.hpp"
#include "emu_backend.hpp"
#include "emu_support.hpp"

using namespace tangram;

TEST_CASE("emulated balance_decode_splits equals the reference", "[emu][balanced_split]") {
  std::uint64_t seed = 300;
  for (auto const& c : test::balanced_split_cases()) {
    auto o = test::emu_schedules(++seed, 1).front();
    INFO("schedule seed " << o.seed);
    emu::scoped_options scope(o);
    test::emu_backend backend;
    CHECK(test::check_balanced_split(c, backend) == "");
  }
}
