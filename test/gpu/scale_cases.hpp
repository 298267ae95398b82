// SPDX-License-Identifier: Apache-2.0
/**
 * @file test/gpu/scale_cases.hpp
 * @brief fp8 K/V scales (kernels/kv_scales.hpp) for the kernel scenarios of kernel_cases.hpp and
 * prefill_cases.hpp: none, one per tensor, or one per KV head; and the fp8-with-scales sweep the
 * decode and prefill scenarios share. Host-only C++; no test framework.
 */
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "tangram/core/dtype.hpp"
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

/// The fp8-with-scales sweep of the decode and prefill scenarios: e4m3 and e5m2 x per-tensor and
/// per-head scales, each case `base` with, from its seed (`seed` + 1, + 2, ...), a head dim of
/// 64/128/256, pages of 16 or 1 token (ring pages for 40 tokens), a GQA group of 1/2/4/8, sinks
/// and bf16 outputs in some.
template <class Case>
std::vector<Case> fp8_scaled_cases(Case const& base, std::uint64_t seed) {
  std::vector<Case> out;
  for (dtype t : {dtype::fp8_e4m3, dtype::fp8_e5m2})
    for (scale_mode m : {scale_mode::per_tensor, scale_mode::per_head}) {
      Case c       = base;
      c.kv_dtype   = t;
      c.scales     = m;
      c.d          = std::int32_t{64} << (seed % 3);
      c.P          = seed % 2 == 0 ? 16 : 1;
      c.ring_pages = (40 + c.P - 1) / c.P + 1;
      c.group      = std::int32_t{1} << (seed % 4);
      c.sinks      = seed % 2 == 1;
      c.o_dtype    = seed % 3 == 2 ? dtype::bf16 : dtype::f32;
      c.seed       = ++seed;
      out.push_back(c);
    }
  return out;
}

}  // namespace tangram::test
