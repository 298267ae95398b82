// SPDX-License-Identifier: Apache-2.0
// Private to tangram::kernels' runtime-only sources (async_readback.cu, kv_view_mirror.cu,
// stream_epochs.cu): the one way they turn a CUDA runtime error or a bad device id into a
// cuda_error naming their owner, and create their events.
#pragma once

#include <cuda_runtime_api.h>

#include "tangram/core/error.hpp"

namespace tangram::detail {

/// Throws cuda_error "<owner>: <what> failed: <name> (<text>)" and clears the error.
[[noreturn]] inline void runtime_fail(char const* owner, char const* what, cudaError_t err) {
  (void)cudaGetLastError();
  TANGRAM_FAIL(cuda_error,
               owner,
               ": ",
               what,
               " failed: ",
               cudaGetErrorName(err),
               " (",
               cudaGetErrorString(err),
               ")");
}

/// Throws cuda_error naming `owner` unless `device_id` is one of this process's CUDA devices.
inline void check_device_id(char const* owner, int device_id) {
  int count       = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) runtime_fail(owner, "cudaGetDeviceCount (no usable CUDA device)", err);
  TANGRAM_EXPECTS(device_id >= 0 && device_id < count,
                  cuda_error,
                  owner,
                  ": device_id must be in [0, ",
                  count,
                  ") (the CUDA devices of this process), got ",
                  device_id);
}

/// Creates a timing-free event (cudaEventDisableTiming) in each entry of `events`, in order; stops
/// at the first failure, leaving that entry null (the caller frees the ones made), and returns it.
template <class Events>
cudaError_t create_events(Events& events) {
  for (auto& e : events) {
    cudaEvent_t ev  = nullptr;
    cudaError_t err = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
    e               = err == cudaSuccess ? ev : nullptr;
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

}  // namespace tangram::detail
