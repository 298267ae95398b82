// SPDX-License-Identifier: Apache-2.0
// cuda_memory_resource: cudaMalloc / cudaFree through the runtime only (no libcuda link).
#include <cuda_runtime_api.h>

#include "detail/device_guard.cuh"
#include "tangram/memory/cuda_memory_resource.hpp"

namespace tangram {

void* cuda_memory_resource::do_allocate(std::size_t bytes, std::size_t alignment) {
  TANGRAM_EXPECTS(alignment <= 256,
                  invalid_argument,
                  "cuda_memory_resource: alignment must be <= 256 (cudaMalloc's guarantee), got ",
                  alignment);
  detail::device_guard guard(device_id_);
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
  detail::device_guard guard(device_id_);
  (void)cudaFree(p);
  (void)cudaGetLastError();
}

}  // namespace tangram
