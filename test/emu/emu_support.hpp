// SPDX-License-Identifier: Apache-2.0
// Runs a kernel_cases.hpp scenario in the emulator under several schedules (Catch2 side).
#pragma once

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdlib>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "../gpu/kernel_cases.hpp"
#include "emu_backend.hpp"

namespace tangram::test {

/// Largest |a - b| over two outputs of the same size; a NaN counts as infinitely far.
inline float worst_difference(std::vector<float> const& a, std::vector<float> const& b) {
  float w = 0.f;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const float diff = std::abs(a[i] - b[i]);
    if (!(diff <= w)) w = std::isnan(diff) ? INFINITY : diff;
  }
  return w;
}

/// The first `count` (1..3) schedules of a scenario: deferred copies (a missing or short wait
/// reads poisoned shared memory), eager copies (a stage refilled while another thread still reads
/// it changes what that thread sees), then deferred again under another seed. Scenarios alternate
/// which mode a single schedule gets (by seed), so both modes see every suite. The environment
/// variable TANGRAM_EMU_MAX_SCHEDULES (a positive integer) lowers `count` to at most that: the
/// sanitizer stage of scripts/run_tests.sh runs one schedule per scenario, the main stage all.
inline std::vector<emu::options> emu_schedules(std::uint64_t seed, int count) {
  if (const char* cap = std::getenv("TANGRAM_EMU_MAX_SCHEDULES")) {
    const int most = std::atoi(cap);
    if (most >= 1 && most < count) count = most;
  }
  std::vector<emu::options> all = {{seed, emu::copy_mode::deferred, 0},
                                   {seed * 104729 + 2, emu::copy_mode::eager, 0},
                                   {seed * 7919 + 1, emu::copy_mode::deferred, 0}};
  if (count == 1 && seed % 2 == 1) std::swap(all[0], all[1]);
  all.resize(static_cast<std::size_t>(count));
  return all;
}

/// The scenarios a run checks: all of them, or with the environment variable
/// TANGRAM_EMU_CASE_STRIDE=k (a positive integer) every k-th from the first. The sanitizer stage
/// of scripts/run_tests.sh samples each grid so (the emulator's memory use is the same code for
/// every case), the main stage and the emu stage run every case.
template <class Case>
std::vector<Case> emu_sample(std::vector<Case> cases) {
  const char* stride_text = std::getenv("TANGRAM_EMU_CASE_STRIDE");
  const int stride        = stride_text ? std::atoi(stride_text) : 1;
  if (stride <= 1) return cases;
  std::vector<Case> kept;
  for (std::size_t i = 0; i < cases.size(); i += static_cast<std::size_t>(stride))
    kept.push_back(std::move(cases[i]));
  return kept;
}

inline const char* to_string(emu::copy_mode m) {
  return m == emu::copy_mode::eager ? "eager" : "deferred";
}

/// check_decode / check_eviction under one emulator schedule.
template <class Case>
std::string emu_check(Case const& c, emu::options o) {
  emu::scoped_options scope(o);
  emu_backend backend;
  if constexpr (std::is_same_v<Case, decode_case>)
    return check_decode(c, backend);
  else
    return check_eviction(c, backend);
}

/// Requires `c` to match the reference under every schedule of emu_schedules(c.seed, count).
template <class Case>
void emu_check_all_schedules(Case const& c, int count) {
  for (auto const& o : emu_schedules(c.seed, count)) {
    INFO(c.describe() << ", schedule seed " << o.seed << ", copies " << to_string(o.copies));
    CHECK(emu_check(c, o) == "");
  }
}

}  // namespace tangram::test
