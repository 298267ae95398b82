// SPDX-License-Identifier: Apache-2.0
/**
 * @file kernels/math.hpp
 * @brief Base-2 softmax helpers shared by the CUDA kernels and the CPU reference (host/device).
 */
#pragma once

#include <cmath>

#include "tangram/config.hpp"

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

/// log2(x) on host and device.
TANGRAM_HOST_DEVICE float log2_of(float x) {
#if TANGRAM_ON_DEVICE
  return log2f(x);
#else
  return std::log2(x);
#endif
}

}  // namespace tangram
