// SPDX-License-Identifier: Apache-2.0
// Host emulation shim (test/emu): the half-precision types and conversions the kernels use,
// exact through tangram::float16 (the GPU's half -> float conversion is exact too).
#pragma once

#include "../simt/simt.hpp"
#include "tangram/core/numeric.hpp"

struct __half {
  unsigned short x;
};
struct __half2 {
  __half x, y;  // x in the low 16 bits, as on the GPU
};
static_assert(sizeof(__half2) == 4, "__half2 packs two halves in 32 bits");

inline __half __ushort_as_half(unsigned short u) {
  return {u};
}
inline float __half2float(__half h) {
  tangram::float16 f;
  f.bits = h.x;
  return static_cast<float>(f);
}
inline __half __float2half_rn(float v) {
  return {tangram::float16(v).bits};
}
inline float2 __half22float2(__half2 h) {
  return {__half2float(h.x), __half2float(h.y)};
}
