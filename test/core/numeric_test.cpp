// SPDX-License-Identifier: Apache-2.0
#include "tangram/core/numeric.hpp"

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "tangram/core/dtype.hpp"
#include "test_support.hpp"

using namespace tangram;

namespace {

template <class T>
std::uint32_t bits_of(T v) {
  std::uint32_t b = 0;
  std::memcpy(&b, &v, sizeof(T));
  return b;
}

template <class T>
T from_bits(std::uint32_t b) {
  T v;
  std::memcpy(&v, &b, sizeof(T));
  return v;
}

// Brute-force nearest value among all finite encodings of an 8-bit type, ties to even mantissa.
template <class T>
float brute_nearest(float x, float max_finite) {
  if (std::fabs(x) > max_finite) return std::copysign(max_finite, x);  // saturating
  float best = 0;
  double best_err = std::numeric_limits<double>::infinity();
  std::uint32_t best_bits = 0;
  for (std::uint32_t b = 0; b < 256; ++b) {
    float v = static_cast<float>(from_bits<T>(b));
    if (!std::isfinite(v)) continue;
    double err = std::fabs(static_cast<double>(v) - x);
    if (err < best_err || (err == best_err && (b & 1u) == 0 && (best_bits & 1u) == 1)) {
      best = v;
      best_err = err;
      best_bits = b;
    }
  }
  return best;
}

}  // namespace

TEST_CASE("float16 matches hand-worked encodings", "[numeric]") {
  CHECK(float16(1.0f).bits == 0x3c00);
  CHECK(float16(-2.0f).bits == 0xc000);
  CHECK(float16(65504.0f).bits == 0x7bff);
  CHECK(float16(65520.0f).bits == 0x7c00);  // rounds to infinity
  CHECK(float16(5.960464477539063e-08f).bits == 0x0001);  // smallest subnormal
  CHECK(float16(1.0f + 1.0f / 2048).bits == 0x3c00);      // tie rounds to even
  CHECK(float16(1.0f + 3.0f / 2048).bits == 0x3c02);      // tie rounds to even (up)
  CHECK(std::isnan(static_cast<float>(float16(std::nanf("")))));
  CHECK(static_cast<float>(float16(0.333333f)) == Approx(0.33325195f).epsilon(0));
}

TEST_CASE("float16 round-trips every finite encoding", "[numeric]") {
  for (std::uint32_t b = 0; b < 0x10000; ++b) {
    auto h = from_bits<float16>(b);
    float f = static_cast<float>(h);
    if (std::isnan(f)) continue;
    REQUIRE(float16(f).bits == b);
  }
}

TEST_CASE("bfloat16 rounds to nearest even", "[numeric]") {
  CHECK(bfloat16(1.0f).bits == 0x3f80);
  CHECK(bfloat16(from_bits<float>(0x3f808000u)).bits == 0x3f80);  // tie, even stays
  CHECK(bfloat16(from_bits<float>(0x3f818000u)).bits == 0x3f82);  // tie, odd rounds up
  CHECK(bfloat16(from_bits<float>(0x3f808001u)).bits == 0x3f81);
  CHECK(std::isnan(static_cast<float>(bfloat16(std::nanf("")))));
  for (std::uint32_t b = 0; b < 0x10000; ++b) {
    float f = static_cast<float>(from_bits<bfloat16>(b));
    if (std::isnan(f)) continue;
    REQUIRE(bfloat16(f).bits == b);
  }
}

TEST_CASE("fp8 conversions equal a brute-force nearest search", "[numeric]") {
  CHECK(static_cast<float>(float8_e4m3(448.0f)) == 448.0f);
  CHECK(static_cast<float>(float8_e4m3(1e6f)) == 448.0f);  // saturates
  CHECK(static_cast<float>(float8_e5m2(57344.0f)) == 57344.0f);
  CHECK(float8_e4m3(1.0f).bits == 0x38);
  CHECK(float8_e5m2(1.0f).bits == 0x3c);
  CHECK(std::isnan(static_cast<float>(from_bits<float8_e4m3>(0x7f))));
  for (std::uint32_t b = 0; b < 256; ++b) {
    float f4 = static_cast<float>(from_bits<float8_e4m3>(b));
    if (!std::isnan(f4)) REQUIRE(float8_e4m3(f4).bits == b);
    float f5 = static_cast<float>(from_bits<float8_e5m2>(b));
    if (std::isfinite(f5)) REQUIRE(float8_e5m2(f5).bits == b);
  }
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> mag(-12.0f, 17.0f);
  for (int i = 0; i < 20000; ++i) {
    float x = std::ldexp(1.0f, static_cast<int>(mag(rng))) * std::uniform_real_distribution<float>(-2, 2)(rng);
    REQUIRE(static_cast<float>(float8_e4m3(x)) == brute_nearest<float8_e4m3>(x, 448.0f));
    REQUIRE(static_cast<float>(float8_e5m2(x)) == brute_nearest<float8_e5m2>(x, 57344.0f));
  }
}

TEST_CASE("dtype names, sizes and traits agree", "[dtype]") {
  CHECK(size_of(dtype::f32) == 4);
  CHECK(size_of(dtype::bf16) == 2);
  CHECK(size_of(dtype::fp8_e5m2) == 1);
  for (auto d : all_dtypes) CHECK(parse_dtype(to_string(d)) == d);
  CHECK(parse_dtype("bfloat16") == dtype::bf16);
  CHECK(parse_dtype("half") == dtype::f16);
  CHECK(dtype_of_v<bfloat16> == dtype::bf16);
  CHECK(dtype_of_v<storage_t<dtype::fp8_e4m3>> == dtype::fp8_e4m3);
  TANGRAM_REQUIRE_THROWS_WITH_ALL(parse_dtype("int4", "--dtype"), invalid_argument, "--dtype", "\"int4\"");
}
