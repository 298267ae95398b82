// SPDX-License-Identifier: Apache-2.0
// cuda_memory_resource: cudaMalloc / cudaFree through the runtime only (no libcuda link).
#include <cuda_runtime_api.h>

#include "tangram/memory/cuda_memory_resource.hpp"

namespace tangram {

namespace {

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

}  // namespace

void* cuda_memory_resource::do_allocate(std::size_t bytes, std::size_t alignment) {
  TANGRAM_EXPECTS(alignment <= 256,
                  invalid_argument,
                  "cuda_memory_resource: alignment must be <= 256 (cudaMalloc's guarantee), got ",
                  alignment);
  device_guard guard(device_id_);
  if (guard.status() != cudaSuccess) {
    cudaError_t err = guard.status();
    (void)cudaGetLastError();
    TANGRAM_FAIL(cuda_error,
                 "cuda_memory_resource: cudaSetDevice(",
                 device_id_,
                 ") failed: ",
                 cudaGetErrorName(err),
                 " (",
                 cudaGetErrorString(err),
                 ")");
  }
  void* p         = nullptr;
  cudaError_t err = cudaMalloc(&p, bytes);
  if (err == cudaSuccess) return p;
  (void)cudaGetLastError();
  if (err == cudaErrorMemoryAllocation)
    TANGRAM_FAIL(out_of_memory,
                 "cuda_memory_resource: cudaMalloc of ",
                 bytes,
                 " bytes on device ",
                 device_id_,
                 " failed: out of memory");
  TANGRAM_FAIL(cuda_error,
               "cuda_memory_resource: cudaMalloc of ",
               bytes,
               " bytes on device ",
               device_id_,
               " failed: ",
               cudaGetErrorName(err),
               " (",
               cudaGetErrorString(err),
               ")");
}

void cuda_memory_resource::do_deallocate(void* p, std::size_t, std::size_t) noexcept {
  device_guard guard(device_id_);
  (void)cudaFree(p);
  (void)cudaGetLastError();
}

}  // namespace tangram
