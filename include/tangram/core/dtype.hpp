// SPDX-License-Identifier: Apache-2.0
/**
 * @file core/dtype.hpp
 * @brief Runtime KV-cache element types and their compile-time traits.
 */
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <tuple>
#include <type_traits>

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
  struct names_of {
    dtype type;
    std::string_view names[4];  // the canonical name first; unused slots stay empty
  };
  constexpr names_of table[] = {{dtype::f32, {"f32", "fp32", "float32", "float"}},
                                {dtype::f16, {"f16", "fp16", "float16", "half"}},
                                {dtype::bf16, {"bf16", "bfloat16"}},
                                {dtype::fp8_e4m3, {"fp8_e4m3", "e4m3", "fp8"}},
                                {dtype::fp8_e5m2, {"fp8_e5m2", "e5m2"}}};
  for (auto const& t : table)
    for (auto n : t.names)
      if (!n.empty() && n == name) return t.type;
  TANGRAM_FAIL(invalid_argument,
               field,
               ": unknown dtype ",
               detail::quoted(name),
               " (expected f32, f16, bf16, fp8_e4m3 or fp8_e5m2)");
}

namespace detail {
/// The storage types in `dtype` order: the i-th is the type of `dtype(i)`.
using storage_types = std::tuple<float, float16, bfloat16, float8_e4m3, float8_e5m2>;
static_assert(std::tuple_size_v<storage_types> == sizeof(all_dtypes) / sizeof(all_dtypes[0]));

/// The `dtype` whose storage type is `T`, found at or after index `I` of storage_types.
template <class T, std::size_t I = 0>
constexpr dtype dtype_of_storage() noexcept {
  if constexpr (std::is_same_v<T, std::tuple_element_t<I, storage_types>>)
    return static_cast<dtype>(I);
  else
    return dtype_of_storage<T, I + 1>();
}
}  // namespace detail

/// @brief Maps a storage type to its runtime tag: `dtype_of_v<bfloat16> == dtype::bf16`.
template <class T>
struct dtype_of {
  static constexpr dtype value = detail::dtype_of_storage<T>();
};
template <class T>
inline constexpr dtype dtype_of_v = dtype_of<T>::value;

/// @brief Maps a runtime tag to its storage type: `storage_t<dtype::f16>` is `float16`.
template <dtype D>
struct storage_type {
  using type = std::tuple_element_t<static_cast<std::size_t>(D), detail::storage_types>;
};
template <dtype D>
using storage_t = typename storage_type<D>::type;

static_assert(sizeof(float16) == 2 && sizeof(bfloat16) == 2);
static_assert(sizeof(float8_e4m3) == 1 && sizeof(float8_e5m2) == 1);

}  // namespace tangram
