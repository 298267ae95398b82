// SPDX-License-Identifier: Apache-2.0
// The emulator's model of mbarriers and cp.async.bulk (include/tangram/kernels/detail/
// bulk_copy.cuh, test/emu/simt/scheduler.cpp): copies are visible after a wait on their phase and
// not before (deferred mode), phases alternate parity, and protocol errors end the launch with a
// message instead of a hang.
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "emu_support.hpp"
#include "simt/simt.hpp"
#include "tangram/kernels/detail/bulk_copy.cuh"

using namespace tangram;

namespace {

constexpr int lanes = 32, chunk = 16;  // one 16-byte bulk copy per lane and phase

/// Two phases on one barrier: each lane copies its 16 bytes of `src[phase]` into its slot, then
/// reads its neighbour's slot before and after waiting. Returns the bytes read, per phase, lane
/// and before / after.
std::vector<unsigned char> two_phases(std::vector<unsigned char> const& src, emu::options o) {
  emu::scoped_options scope(o);
  std::vector<unsigned char> seen(2 * lanes * 2 * chunk, 0);
  emu::launch(dim3(1), dim3(lanes), 16 + lanes * chunk, [&] {
    TANGRAM_DYNAMIC_SMEM(smem);
    auto* bar        = reinterpret_cast<std::uint64_t*>(smem);
    unsigned char* s = smem + 16;
    const int lane   = static_cast<int>(threadIdx.x);
    if (lane == 0) detail::mbarrier_init(bar, lanes);
    detail::mbarrier_init_fence();
    __syncwarp();
    for (int phase = 0; phase < 2; ++phase) {
      detail::mbarrier_arrive_expect_tx(bar, chunk);
      detail::bulk_copy_g2s(
          s + lane * chunk, src.data() + (phase * lanes + lane) * chunk, chunk, bar);
      const int peer = (lane + 1) % lanes;
      unsigned char* out =
          seen.data() + static_cast<std::size_t>((phase * lanes + lane) * 2 * chunk);
      std::memcpy(out, s + peer * chunk, chunk);  // before the wait
      detail::mbarrier_wait(bar, static_cast<unsigned>(phase));
      std::memcpy(out + chunk, s + peer * chunk, chunk);  // after it
      __syncwarp();  // every lane has read the slots before the next phase refills them
    }
  });
  return seen;
}

std::vector<unsigned char> pattern() {
  std::vector<unsigned char> src(2 * lanes * chunk);
  for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<unsigned char>(i * 7 + 3);
  return src;
}

/// The launch's fault message ("" when it completes).
template <class Body>
std::string fault_of(Body&& body, std::size_t smem = 64) {
  try {
    emu::launch(dim3(1), dim3(lanes), smem, body);
  } catch (emu::kernel_fault const& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("emulator: a bulk copy is visible after the wait on its mbarrier phase",
          "[emu][simt][bulk]") {
  const auto src = pattern();
  for (std::uint64_t seed : {1u, 2u, 3u})
    for (auto mode : {emu::copy_mode::deferred, emu::copy_mode::eager}) {
      INFO("seed " << seed << ", copies " << test::to_string(mode));
      const auto seen = two_phases(src, {seed, mode, 0});
      for (int phase = 0; phase < 2; ++phase)
        for (int lane = 0; lane < lanes; ++lane) {
          const unsigned char* got = seen.data() + (phase * lanes + lane) * 2 * chunk;
          const unsigned char* want =
              src.data() + (phase * lanes + (lane + 1) % lanes) * chunk;  // the neighbour's
          INFO("phase " << phase << ", lane " << lane);
          CHECK(std::memcmp(got + chunk, want, chunk) == 0);
          if (mode == emu::copy_mode::deferred) {
            // Before its wait a lane sees the slot's old bytes: poison, or the last phase's.
            const unsigned char* old =
                phase == 0 ? nullptr : src.data() + ((lane + 1) % lanes) * chunk;
            bool stale = true;
            for (int b = 0; b < chunk; ++b)
              stale &= got[b] == (old ? old[b] : 0xff);
            CHECK(stale);
          }
        }
    }
}

TEST_CASE("emulator: mbarrier protocol errors end the launch with a message",
          "[emu][simt][bulk][errors]") {
  std::vector<unsigned char> src(64, 1);
  auto run = [&](int missing_arrivals, unsigned announce, unsigned copy, bool init) {
    return fault_of([&] {
      TANGRAM_DYNAMIC_SMEM(smem);
      auto* bar      = reinterpret_cast<std::uint64_t*>(smem);
      const int lane = static_cast<int>(threadIdx.x);
      if (lane == 0 && init) detail::mbarrier_init(bar, lanes);
      __syncwarp();
      if (lane >= missing_arrivals) {
        detail::mbarrier_arrive_expect_tx(bar, lane == lanes - 1 ? announce : 0u);
        if (lane == lanes - 1) detail::bulk_copy_g2s(smem + 16, src.data(), copy, bar);
      }
      detail::mbarrier_wait(bar, 0);
    });
  };
  CHECK(run(0, 16, 16, true) == "");  // the control
  CHECK_THAT(run(1, 16, 16, true), Catch::Contains("can never complete") &&
                                       Catch::Contains("1 arrivals and 0 transaction bytes"));
  CHECK_THAT(run(0, 32, 16, true), Catch::Contains("0 arrivals and 16 transaction bytes"));
  CHECK_THAT(run(0, 16, 32, true), Catch::Contains("16 bytes more than"));
  CHECK_THAT(run(0, 16, 16, false), Catch::Contains("before mbarrier_init"));
  CHECK_THAT(run(0, 8, 8, true), Catch::Contains("cp.async.bulk of 8 bytes"));
  // Past the block's shared memory (64 bytes): the destination is checked.
  CHECK_THAT(run(0, 64, 64, true), Catch::Contains("destination outside shared memory"));
}
