// SPDX-License-Identifier: Apache-2.0
// Device tensors handed to tangram.cuda's launchers: any object exporting DLPack (`__dlpack__`:
// PyTorch, CuPy, JAX) or `__cuda_array_interface__` (Numba, CuPy), and the stream argument. The
// launchers see a pointer, an element type and a shape, checked here against what the kernel
// needs; nothing is copied or converted.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "tangram/core/stream.hpp"

namespace tangram::python {

/// What a launcher needs from a device tensor (a borrowed view: `owner` keeps it alive).
struct device_tensor {
  void* data = nullptr;
  nanobind::dlpack::dtype dtype{};
  std::vector<std::int64_t> shape;
  std::int32_t device = -1;  ///< CUDA device; -1: not stated (__cuda_array_interface__)
  bool readonly       = false;
  nanobind::object owner;

  [[nodiscard]] std::int64_t elements() const;
  [[nodiscard]] std::int64_t bytes() const;
  /// "float32[4, 8, 128]"-style description for error messages.
  [[nodiscard]] std::string describe() const;
};

/// Reads `obj` as a C-contiguous CUDA tensor; `name` is the argument named in errors.
/// @throw invalid_argument when it is not a CUDA tensor, not C-contiguous, or masked.
device_tensor device_tensor_from(nanobind::handle obj, char const* name);

/// Checks `t`'s shape: each expected extent, or -1 for any (names the argument and both shapes).
void expect_shape(device_tensor const& t, std::initializer_list<std::int64_t> want, char const* name);

/// Refuses a read-only tensor for an output argument.
void expect_writable(device_tensor const& t, char const* name);

/// The CUDA stream of `obj`: None or 0 (the legacy default stream), an integer handle, an object
/// with `__cuda_stream__()` (CUDA Python's protocol), `cuda_stream` (torch.cuda.Stream) or `ptr`
/// (cupy.cuda.Stream).
cuda_stream_t stream_from(nanobind::handle obj);

}  // namespace tangram::python
