// SPDX-License-Identifier: Apache-2.0
// The eviction kernels (SnapKV / key-norm scoring, radix select, compaction) in the host
// emulator against the CPU reference: the scenarios of test/gpu/eviction_test.cu, one schedule
// each (seed x copy mode, alternating between scenarios). Pools must end byte-identical.
#include <catch2/catch.hpp>

#include "../gpu/kernel_cases.hpp"
#include "emu_support.hpp"

using namespace tangram;

TEST_CASE("emulated eviction equals the CPU reference: supplied scores", "[emu][eviction]") {
  for (auto const& c : test::emu_sample(test::eviction_cases_supplied()))
    test::emu_check_all_schedules(c, 1);
}

TEST_CASE("emulated eviction equals the CPU reference: built-in scores", "[emu][eviction]") {
  for (auto const& c : test::emu_sample(test::eviction_cases_builtin()))
    test::emu_check_all_schedules(c, 1);
}

TEST_CASE("emulated eviction equals the CPU reference: fp8 caches with and without scales",
          "[emu][eviction][fp8]") {
  for (auto const& c : test::emu_sample(test::eviction_cases_fp8()))
    test::emu_check_all_schedules(c, 1);
}

TEST_CASE("emulated eviction equals the CPU reference: per-head pages (Hp 1)",
          "[emu][eviction][per_head]") {
  for (auto const& c : test::emu_sample(test::eviction_cases_per_head()))
    test::emu_check_all_schedules(c, 1);
}

TEST_CASE("emulated eviction: long candidate lists (several radix tiles)", "[emu][eviction]") {
  test::emu_check_all_schedules(test::eviction_case_long(), 1);
}

TEST_CASE("emulated eviction equals the CPU reference: SnapKV from the prefill's log-sum-exp",
          "[emu][eviction][lse]") {
  for (auto const& c : test::emu_sample(test::eviction_cases_lse()))
    test::emu_check_all_schedules(c, 1);
}

TEST_CASE("emulated eviction: the top-k's one-slice boundary (4096, 4097, 8192 candidates)",
          "[emu][eviction][select]") {
  for (auto const& c : test::emu_sample(test::eviction_cases_slice_boundary()))
    test::emu_check_all_schedules(c, 1);
}

TEST_CASE("emulated eviction equals the CPU reference: pinned shared-prefix pages kept in place",
          "[emu][eviction][pinned]") {
  for (auto const& c : test::emu_sample(test::eviction_cases_pinned()))
    test::emu_check_all_schedules(c, 1);
}
