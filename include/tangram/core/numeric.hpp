// SPDX-License-Identifier: Apache-2.0
/**
 * @file core/numeric.hpp
 * @brief Storage types for KV-cache elements and their conversions to and from float.
 *
 * These are plain 8/16-bit containers with portable software conversions, usable on the host (the
 * CPU reference) and on the device. They are bit-compatible with `__half`, `__nv_bfloat16`,
 * `__nv_fp8_e4m3` and `__nv_fp8_e5m2`, so one pool of pages can be read by either side. Rounding
 * to the narrow types is round-to-nearest-even, like the CUDA intrinsics (fp8 saturates to the
 * largest finite value, like `__NV_SATFINITE`).
 */
#pragma once

#include <cstdint>
#include <cstring>

#include "tangram/core/config.hpp"

namespace tangram {

namespace detail {

TANGRAM_HOST_DEVICE std::uint32_t float_bits(float f) {
#if TANGRAM_ON_DEVICE
  return __float_as_uint(f);
#else
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
#endif
}

TANGRAM_HOST_DEVICE float bits_float(std::uint32_t u) {
#if TANGRAM_ON_DEVICE
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
#endif
}

/// Rounds a float to a narrower IEEE-like format with `Exp` exponent bits and `Man` mantissa bits.
/// Returns the bit pattern (sign in the top bit of `Exp + Man + 1` bits). `saturate` maps
/// overflow to the largest finite value (fp8) instead of infinity (fp16).
template <int Exp, int Man, bool HasInf, bool Saturate>
TANGRAM_HOST_DEVICE std::uint32_t round_to_narrow(float f) {
  constexpr int bias              = (1 << (Exp - 1)) - 1;
  constexpr int total             = 1 + Exp + Man;
  constexpr std::uint32_t sgn_bit = 1u << (total - 1);
  // Largest finite encoding: e4m3 (no inf) uses the all-ones exponent with mantissa 110.
  constexpr std::uint32_t max_finite = HasInf ? ((((1u << Exp) - 2u) << Man) | ((1u << Man) - 1u))
                                              : ((((1u << Exp) - 1u) << Man) | ((1u << Man) - 2u));
  constexpr std::uint32_t inf_bits   = ((1u << Exp) - 1u) << Man;
  constexpr std::uint32_t nan_bits =
      HasInf ? (inf_bits | (1u << (Man - 1))) : ((1u << (Exp + Man)) - 1u);

  std::uint32_t u    = float_bits(f);
  std::uint32_t sign = (u >> 31) ? sgn_bit : 0u;
  std::uint32_t absu = u & 0x7fffffffu;
  if (absu > 0x7f800000u) return sign | nan_bits;
  if (absu == 0x7f800000u) return sign | (Saturate ? max_finite : inf_bits);
  int exp32          = static_cast<int>(absu >> 23);
  int e              = exp32 - 127 + bias;  // target biased exponent
  std::uint32_t mant = (absu & 0x7fffffu) | (exp32 ? 0x800000u : 0u);
  if (exp32 == 0) e = 1 - 127 + bias;  // float subnormal: value = mant * 2^-149
  // Shift so the result has `Man` fraction bits; subnormal targets shift further.
  int shift = 23 - Man;
  if (e <= 0) {
    shift += 1 - e;
    e = 0;
  }
  std::uint32_t result;
  if (shift >= 32) {
    result = 0;
  } else {
    std::uint32_t kept      = mant >> shift;
    std::uint32_t remainder = mant & ((1u << shift) - 1u);
    std::uint32_t half      = 1u << (shift - 1);
    if (remainder > half || (remainder == half && (kept & 1u))) ++kept;
    if (e == 0) {
      result = kept;  // subnormal (may round up into the smallest normal, which encodes correctly)
    } else {
      // kept includes the implicit bit at position Man; rounding may carry into the exponent.
      if (kept >> (Man + 1)) {
        kept >>= 1;
        ++e;
      }
      result = (static_cast<std::uint32_t>(e) << Man) | (kept & ((1u << Man) - 1u));
    }
  }
  if (result > max_finite) result = Saturate ? max_finite : inf_bits;
  return sign | result;
}

template <int Exp, int Man, bool HasInf>
TANGRAM_HOST_DEVICE float widen_from_narrow(std::uint32_t bits) {
  constexpr int bias  = (1 << (Exp - 1)) - 1;
  constexpr int total = 1 + Exp + Man;
  std::uint32_t sign  = (bits >> (total - 1)) & 1u;
  std::uint32_t e     = (bits >> Man) & ((1u << Exp) - 1u);
  std::uint32_t m     = bits & ((1u << Man) - 1u);
  std::uint32_t out;
  if (HasInf && e == (1u << Exp) - 1u) {
    out = 0x7f800000u | (m ? 0x400000u : 0u);
  } else if (!HasInf && e == (1u << Exp) - 1u && m == (1u << Man) - 1u) {
    out = 0x7fc00000u;  // e4m3: S.1111.111 is NaN
  } else if (e == 0) {
    if (m == 0) {
      out = 0;
    } else {  // subnormal: normalise
      int shift = 0;
      while (!(m & (1u << Man))) {
        m <<= 1;
        ++shift;
      }
      m &= (1u << Man) - 1u;
      out = (static_cast<std::uint32_t>(127 - bias + 1 - shift) << 23) | (m << (23 - Man));
    }
  } else {
    out = ((e - bias + 127) << 23) | (m << (23 - Man));
  }
  return bits_float(out | (sign << 31));
}

}  // namespace detail

/// @brief IEEE 754 binary16, bit-compatible with `__half`.
struct float16 {
  std::uint16_t bits;
  float16() = default;
  TANGRAM_HOST_DEVICE explicit float16(float f)
      : bits(static_cast<std::uint16_t>(detail::round_to_narrow<5, 10, true, false>(f))) {}
  TANGRAM_HOST_DEVICE explicit operator float() const {
    return detail::widen_from_narrow<5, 10, true>(bits);
  }
};

/// @brief bfloat16 (8 exponent bits), bit-compatible with `__nv_bfloat16`.
struct bfloat16 {
  std::uint16_t bits;
  bfloat16() = default;
  TANGRAM_HOST_DEVICE explicit bfloat16(float f) {
    std::uint32_t u = detail::float_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
      bits = static_cast<std::uint16_t>((u >> 16) | 0x40u);  // quiet NaN
    } else {
      u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
      bits = static_cast<std::uint16_t>(u >> 16);
    }
  }
  TANGRAM_HOST_DEVICE explicit operator float() const {
    return detail::bits_float(static_cast<std::uint32_t>(bits) << 16);
  }
};

/// @brief OCP fp8 E4M3 (no infinities, max 448), bit-compatible with `__nv_fp8_e4m3`.
struct float8_e4m3 {
  std::uint8_t bits;
  float8_e4m3() = default;
  TANGRAM_HOST_DEVICE explicit float8_e4m3(float f)
      : bits(static_cast<std::uint8_t>(detail::round_to_narrow<4, 3, false, true>(f))) {}
  TANGRAM_HOST_DEVICE explicit operator float() const {
    return detail::widen_from_narrow<4, 3, false>(bits);
  }
};

/// @brief OCP fp8 E5M2 (IEEE-like, max 57344), bit-compatible with `__nv_fp8_e5m2`.
struct float8_e5m2 {
  std::uint8_t bits;
  float8_e5m2() = default;
  TANGRAM_HOST_DEVICE explicit float8_e5m2(float f)
      : bits(static_cast<std::uint8_t>(detail::round_to_narrow<5, 2, true, true>(f))) {}
  TANGRAM_HOST_DEVICE explicit operator float() const {
    return detail::widen_from_narrow<5, 2, true>(bits);
  }
};

/// Converts any storage type (or float) to float.
template <class T>
TANGRAM_HOST_DEVICE float to_float(T v) {
  return static_cast<float>(v);
}

/// Converts a float to a storage type, rounding to nearest even.
template <class T>
TANGRAM_HOST_DEVICE T from_float(float f) {
  return T(f);
}

}  // namespace tangram
