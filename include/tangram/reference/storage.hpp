// SPDX-License-Identifier: Apache-2.0
/**
 * @file reference/storage.hpp
 * @brief Runtime-dtype helpers for the CPU reference: element reads and writes, dtype dispatch.
 */
#pragma once

#include <cstdint>
#include <type_traits>

#include "tangram/core/dtype.hpp"
#include "tangram/core/error.hpp"
#include "tangram/core/numeric.hpp"

namespace tangram::reference::detail {

/// Calls `f(T{})` with the storage type of `t` (float, float16, bfloat16, float8_e4m3,
/// float8_e5m2).
template <class F>
decltype(auto) visit_storage(dtype t, F&& f) {
  switch (t) {
    case dtype::f32:
      return f(float{});
    case dtype::f16:
      return f(float16{});
    case dtype::bf16:
      return f(bfloat16{});
    case dtype::fp8_e4m3:
      return f(float8_e4m3{});
    case dtype::fp8_e5m2:
      return f(float8_e5m2{});
  }
  TANGRAM_FAIL(invalid_argument, "dtype: unknown value ", static_cast<int>(t));
}

/// Element `i` of an array of runtime dtype `t`, as float.
inline float load_as_float(const void* base, dtype t, std::int64_t i) {
  return visit_storage(t, [&](auto tag) {
    using T = decltype(tag);
    return to_float(static_cast<const T*>(base)[i]);
  });
}

/// Stores `value` (rounded to nearest even) as element `i` of an array of runtime dtype `t`.
inline void store_from_float(void* base, dtype t, std::int64_t i, float value) {
  visit_storage(t, [&](auto tag) {
    using T                  = decltype(tag);
    static_cast<T*>(base)[i] = from_float<T>(value);
  });
}

}  // namespace tangram::reference::detail
