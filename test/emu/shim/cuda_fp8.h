// SPDX-License-Identifier: Apache-2.0
// Host emulation shim (test/emu): the fp8 -> half conversions the kernels use, through
// tangram::float8_e4m3 / float8_e5m2 and tangram::float16. Exact: every e4m3 and e5m2 value is a
// binary16 value, as on the GPU (cvt.rn.f16x2.e4m3x2 / .e5m2x2); NaN stays NaN.
#pragma once

#include "cuda_fp16.h"
#include "tangram/core/numeric.hpp"

typedef unsigned char __nv_fp8_storage_t;
typedef unsigned short __nv_fp8x2_storage_t;
enum __nv_fp8_interpretation_t { __NV_E4M3, __NV_E5M2 };
struct __half_raw {
  unsigned short x;
};
struct __half2_raw {
  unsigned short x, y;  // x from the low byte, as on the GPU
};

inline __half_raw __nv_cvt_fp8_to_halfraw(__nv_fp8_storage_t x, __nv_fp8_interpretation_t kind) {
  float f = 0.f;
  if (kind == __NV_E4M3) {
    tangram::float8_e4m3 v;
    v.bits = x;
    f      = static_cast<float>(v);
  } else {
    tangram::float8_e5m2 v;
    v.bits = x;
    f      = static_cast<float>(v);
  }
  return {tangram::float16(f).bits};
}
inline __half2_raw __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t x,
                                              __nv_fp8_interpretation_t kind) {
  return {__nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(x & 0xffu), kind).x,
          __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(x >> 8), kind).x};
}
