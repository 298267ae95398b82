// SPDX-License-Identifier: Apache-2.0
// Which array element types carry which Tangram dtype, shared by the CPU reference bindings
// (NumPy arrays) and the CUDA launchers (DLPack / __cuda_array_interface__ device tensors): one
// rule for every function, elements are never converted by value (bf16 travels as bfloat16 or as
// its uint16 bit patterns).
#pragma once

#include <nanobind/ndarray.h>

#include <cstdint>
#include <optional>
#include <string>

#include "tangram/core/dtype.hpp"

namespace tangram::python {

/// "float32", "uint16", "bfloat16", ... for error messages.
inline std::string dtype_name(nanobind::dlpack::dtype t) {
  using code       = nanobind::dlpack::dtype_code;
  char const* kind = "?";
  switch (static_cast<code>(t.code)) {
    case code::Int:
      kind = "int";
      break;
    case code::UInt:
      kind = "uint";
      break;
    case code::Float:
      kind = "float";
      break;
    case code::Bfloat:
      kind = "bfloat";
      break;
    default:
      break;
  }
  return kind + std::to_string(t.bits) + (t.lanes != 1 ? "x" + std::to_string(t.lanes) : "");
}

/// True when `t` is `code` with `bits` bits and one lane.
inline bool is_element(nanobind::dlpack::dtype t, nanobind::dlpack::dtype_code code, int bits) {
  return t.code == static_cast<std::uint8_t>(code) && t.bits == bits && t.lanes == 1;
}

/// The element types that carry a cache dtype: itself where the framework has it (float32,
/// float16, bfloat16), else its bit patterns (bf16: uint16; fp8: uint8).
inline bool carries(nanobind::dlpack::dtype t, dtype cache) {
  using code = nanobind::dlpack::dtype_code;
  switch (cache) {
    case dtype::f32:
      return is_element(t, code::Float, 32);
    case dtype::f16:
      return is_element(t, code::Float, 16);
    case dtype::bf16:
      return is_element(t, code::UInt, 16) || is_element(t, code::Bfloat, 16);
    case dtype::fp8_e4m3:
    case dtype::fp8_e5m2:
      return is_element(t, code::UInt, 8);
  }
  return false;
}

/// The floating-point dtype of a query / output tensor (float32, float16, bfloat16 or its uint16
/// bit patterns), or nullopt.
inline std::optional<dtype> float_dtype_of(nanobind::dlpack::dtype t) {
  using code = nanobind::dlpack::dtype_code;
  if (is_element(t, code::Float, 32)) return dtype::f32;
  if (is_element(t, code::Float, 16)) return dtype::f16;
  if (is_element(t, code::Bfloat, 16) || is_element(t, code::UInt, 16)) return dtype::bf16;
  return std::nullopt;
}

}  // namespace tangram::python
