// SPDX-License-Identifier: Apache-2.0
// The elastic eviction kernels (the stage mode of the per-layer kernels, the request-wide radix
// select and group selection, the per-head compaction) in the host emulator against the CPU
// reference: the scenarios of test/gpu/elastic_cases.hpp, under two schedules each. Pools, keys,
// lengths and pages must end byte-identical.
#include <catch2/catch.hpp>

#include <string>

#include "../gpu/elastic_cases.hpp"
#include "emu_backend.hpp"
#include "emu_support.hpp"

using namespace tangram;

namespace {

void check_all_schedules(test::elastic_case const& c) {
  for (auto const& o : test::emu_schedules(c.seed, 2)) {
    INFO(c.describe() << ", schedule seed " << o.seed << ", copies " << test::to_string(o.copies));
    emu::scoped_options scope(o);
    test::emu_backend backend;
    CHECK(test::check_elastic(c, backend) == "");
  }
}

}  // namespace

TEST_CASE("emulated elastic eviction equals the CPU reference: supplied scores",
          "[emu][eviction][elastic]") {
  for (auto const& c : test::emu_sample(test::elastic_cases_supplied())) check_all_schedules(c);
}

TEST_CASE("emulated elastic eviction equals the CPU reference: built-in scores",
          "[emu][eviction][elastic]") {
  for (auto const& c : test::emu_sample(test::elastic_cases_builtin())) check_all_schedules(c);
}

TEST_CASE("emulated elastic eviction equals the CPU reference: fp8 caches",
          "[emu][eviction][elastic][fp8]") {
  for (auto const& c : test::emu_sample(test::elastic_cases_fp8())) check_all_schedules(c);
}

TEST_CASE("emulated elastic eviction equals the CPU reference: per-head pages (Hp 1)",
          "[emu][eviction][elastic][per_head]") {
  for (auto const& c : test::emu_sample(test::elastic_cases_per_head())) check_all_schedules(c);
}

TEST_CASE("emulated elastic eviction equals the CPU reference: pinned shared-prefix pages kept",
          "[emu][eviction][elastic][pinned]") {
  for (auto const& c : test::emu_sample(test::elastic_cases_pinned())) check_all_schedules(c);
}

TEST_CASE("emulated elastic eviction: long candidate lists (several compaction tiles)",
          "[emu][eviction][elastic]") {
  check_all_schedules(test::elastic_case_long());
}

TEST_CASE("emulated elastic eviction: heads of several top-k slices", "[emu][eviction][elastic]") {
  check_all_schedules(test::elastic_case_many_slices());
}

TEST_CASE(
    "emulated elastic eviction: a deleted load-to-store barrier in its compaction is detected",
    "[emu][mutation][elastic]") {
  // The elastic compaction moves staged survivors to earlier positions of the same column:
  // without the barrier (vec.cuh sync_site::compact_loaded = 3) stores overwrite unread sources.
  constexpr int compact_loaded = 3;
  test::elastic_case c;
  c.seed = 160;
  emu::options o{7, emu::copy_mode::deferred, 0};
  {
    emu::scoped_options scope(o);
    test::emu_backend backend;
    REQUIRE(test::check_elastic(c, backend) == "");  // the control
  }
  o.mutation = compact_loaded;
  std::string verdict;
  try {
    emu::scoped_options scope(o);
    test::emu_backend backend;
    verdict = test::check_elastic(c, backend);
  } catch (emu::kernel_fault const& e) {
    verdict = e.what();
  }
  INFO("mutated: " << verdict);
  CHECK_FALSE(verdict.empty());
}
