// SPDX-License-Identifier: Apache-2.0
// Private to tangram::kernels' runtime-only sources (cuda_memory_resource.cu, kv_view_mirror.cu,
// stream_epochs.cu).
#pragma once

#include <cuda_runtime_api.h>

namespace tangram::detail {

/// Makes `device` current for the lifetime of the object and restores the previous device.
class device_guard {
 public:
  explicit device_guard(int device) noexcept {
    if (cudaGetDevice(&previous_) != cudaSuccess) {
      (void)cudaGetLastError();
      previous_ = -1;
    }
    if (previous_ != device) status_ = cudaSetDevice(device);
  }
  ~device_guard() {
    if (previous_ >= 0) (void)cudaSetDevice(previous_);
    (void)cudaGetLastError();
  }
  device_guard(device_guard const&)            = delete;
  device_guard& operator=(device_guard const&) = delete;
  [[nodiscard]] cudaError_t status() const noexcept { return status_; }

 private:
  int previous_       = -1;
  cudaError_t status_ = cudaSuccess;
};

}  // namespace tangram::detail
