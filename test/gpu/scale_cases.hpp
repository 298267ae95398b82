// SPDX-License-Identifier: Apache-2.0
/**
 * @file test/gpu/scale_cases.hpp
 * @brief fp8 K/V scales (kernels/kv_scales.hpp) for the kernel scenarios of kernel_cases.hpp and
 * prefill_cases.hpp: none, one per tensor, or one per KV head. Host-only C++; no test framework.
 */
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "tangram/kernels/kv_scales.hpp"

namespace tangram::test {

/// How a scenario passes fp8 scales.
enum class scale_mode : std::uint8_t { none, per_tensor, per_head };

inline const char* to_string(scale_mode m) {
  return m == scale_mode::none         ? "no scales"
         : m == scale_mode::per_tensor ? "per-tensor scales"
                                       : "per-head scales";
}

/// The K and V scale arrays of a scenario (host memory) and their kv_scales.
struct scale_arrays {
  std::vector<float> k, v;

  /// Scales of `mode` for `heads` KV heads: every value distinct and in [0.5, 2] times
  /// `magnitude` (vLLM's fp8 scales are amax / 448, often 1e-3..1e-1), K's and V's drawn
  /// separately, so a scale read for the wrong head or K and V swapped changes results.
  scale_arrays(scale_mode mode, std::int32_t heads, std::uint64_t seed, float magnitude = 1.f) {
    const std::int32_t n = mode == scale_mode::none         ? 0
                           : mode == scale_mode::per_tensor ? 1
                                                            : heads;
    std::mt19937_64 rng(seed * 31 + 5);
    std::uniform_real_distribution<float> u(0.5f * magnitude, 2.f * magnitude);
    for (std::int32_t i = 0; i < n; ++i) {
      k.push_back(u(rng));
      v.push_back(u(rng));
    }
  }

  /// The kv_scales over these arrays (valid while this object lives and is not modified).
  [[nodiscard]] kv_scales view() const {
    kv_scales s;
    s.count = static_cast<std::int32_t>(k.size());
    s.k     = k.empty() ? nullptr : k.data();
    s.v     = v.empty() ? nullptr : v.data();
    return s;
  }
};

}  // namespace tangram::test
