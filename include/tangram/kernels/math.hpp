// SPDX-License-Identifier: Apache-2.0
/**
 * @file kernels/math.hpp
 * @brief Base-2 softmax helpers shared by the CUDA kernels and the CPU reference (host/device).
 */
#pragma once

#include <cmath>

#include "tangram/core/config.hpp"

namespace tangram {

/// log2(e): logits are kept in base 2 (exp2 is the hardware's native exponential).
inline constexpr float log2e = 1.4426950408889634f;
/// ln(2), to report a natural-log sum-exp.
inline constexpr float ln2 = 0.6931471805599453f;

/// exp2(x - m), exactly 0 for x == -inf (also when m == -inf, where x - m would be NaN).
TANGRAM_HOST_DEVICE float exp2_shifted(float x, float m) {
#if TANGRAM_ON_DEVICE
  return x == -INFINITY ? 0.f : exp2f(x - m);
#else
  return x == -INFINITY ? 0.f : std::exp2(x - m);
#endif
}

/// exp2(x), where a result below 2^-126 may be flushed to 0: one `ex2.approx.ftz.f32` on the
/// device (relative error about 2^-22, as exp2f's, which adds a range check and two multiplies to
/// keep subnormal results), std::exp2 on the host. For sums of probabilities, where subnormal
/// terms do not matter. exp2(-inf) is 0.
TANGRAM_HOST_DEVICE float exp2_flush(float x) {
#if TANGRAM_ON_DEVICE
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#else
  return std::exp2(x);
#endif
}

/// log2(x) on host and device.
TANGRAM_HOST_DEVICE float log2_of(float x) {
#if TANGRAM_ON_DEVICE
  return log2f(x);
#else
  return std::log2(x);
#endif
}

}  // namespace tangram
