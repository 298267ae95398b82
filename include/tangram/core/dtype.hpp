// SPDX-License-Identifier: Apache-2.0
/**
 * @file core/dtype.hpp
 * @brief Runtime KV-cache element types and their compile-time traits.
 */
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "tangram/core/error.hpp"
#include "tangram/core/numeric.hpp"

namespace tangram {

/// @brief Element type of K/V values stored in pages.
enum class dtype : std::uint8_t { f32, f16, bf16, fp8_e4m3, fp8_e5m2 };

/// All dtypes, for iteration in tests and option parsing.
inline constexpr dtype all_dtypes[] = {
    dtype::f32, dtype::f16, dtype::bf16, dtype::fp8_e4m3, dtype::fp8_e5m2};

/// @brief Bytes per element.
constexpr std::size_t size_of(dtype t) noexcept {
  switch (t) {
    case dtype::f32:
      return 4;
    case dtype::f16:
    case dtype::bf16:
      return 2;
    case dtype::fp8_e4m3:
    case dtype::fp8_e5m2:
      return 1;
  }
  return 0;
}

/// @brief Canonical lower-case name ("f32", "f16", "bf16", "fp8_e4m3", "fp8_e5m2").
constexpr std::string_view to_string(dtype t) noexcept {
  switch (t) {
    case dtype::f32:
      return "f32";
    case dtype::f16:
      return "f16";
    case dtype::bf16:
      return "bf16";
    case dtype::fp8_e4m3:
      return "fp8_e4m3";
    case dtype::fp8_e5m2:
      return "fp8_e5m2";
  }
  return "?";
}

/// @brief Parses a dtype name; accepts the canonical names and the common aliases
/// ("fp32", "float32", "fp16", "float16", "half", "bfloat16", "e4m3", "e5m2").
/// @throw invalid_argument naming `field` and the value when the name is unknown.
inline dtype parse_dtype(std::string_view name, std::string_view field = "dtype") {
  struct alias {
    std::string_view name;
    dtype type;
  };
  constexpr alias aliases[] = {{"f32", dtype::f32},
                               {"fp32", dtype::f32},
                               {"float32", dtype::f32},
                               {"float", dtype::f32},
                               {"f16", dtype::f16},
                               {"fp16", dtype::f16},
                               {"float16", dtype::f16},
                               {"half", dtype::f16},
                               {"bf16", dtype::bf16},
                               {"bfloat16", dtype::bf16},
                               {"fp8_e4m3", dtype::fp8_e4m3},
                               {"e4m3", dtype::fp8_e4m3},
                               {"fp8", dtype::fp8_e4m3},
                               {"fp8_e5m2", dtype::fp8_e5m2},
                               {"e5m2", dtype::fp8_e5m2}};
  for (auto const& a : aliases)
    if (a.name == name) return a.type;
  TANGRAM_FAIL(invalid_argument,
               field,
               ": unknown dtype ",
               detail::quoted(name),
               " (expected f32, f16, bf16, fp8_e4m3 or fp8_e5m2)");
}

/// @brief Maps a storage type to its runtime tag: `dtype_of_v<bfloat16> == dtype::bf16`.
template <class T>
struct dtype_of;
template <>
struct dtype_of<float> {
  static constexpr dtype value = dtype::f32;
};
template <>
struct dtype_of<float16> {
  static constexpr dtype value = dtype::f16;
};
template <>
struct dtype_of<bfloat16> {
  static constexpr dtype value = dtype::bf16;
};
template <>
struct dtype_of<float8_e4m3> {
  static constexpr dtype value = dtype::fp8_e4m3;
};
template <>
struct dtype_of<float8_e5m2> {
  static constexpr dtype value = dtype::fp8_e5m2;
};
template <class T>
inline constexpr dtype dtype_of_v = dtype_of<T>::value;

/// @brief Maps a runtime tag to its storage type: `storage_t<dtype::f16>` is `float16`.
template <dtype D>
struct storage_type;
template <>
struct storage_type<dtype::f32> {
  using type = float;
};
template <>
struct storage_type<dtype::f16> {
  using type = float16;
};
template <>
struct storage_type<dtype::bf16> {
  using type = bfloat16;
};
template <>
struct storage_type<dtype::fp8_e4m3> {
  using type = float8_e4m3;
};
template <>
struct storage_type<dtype::fp8_e5m2> {
  using type = float8_e5m2;
};
template <dtype D>
using storage_t = typename storage_type<D>::type;

static_assert(sizeof(float16) == 2 && sizeof(bfloat16) == 2);
static_assert(sizeof(float8_e4m3) == 1 && sizeof(float8_e5m2) == 1);

}  // namespace tangram
