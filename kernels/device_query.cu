// SPDX-License-Identifier: Apache-2.0
// Device queries through the CUDA runtime only (no libcuda link), so binaries start everywhere.
#include <cuda_runtime_api.h>

#include "tangram/device/device.hpp"

namespace tangram {

std::int32_t cuda_device_count() noexcept {
  int count = 0;  // the runtime leaves it untouched on failure (e.g. error 35, no driver)
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return count > 0 ? count : 0;
}

std::optional<device_info> query_device(std::int32_t device_id) noexcept {
  if (device_id < 0 || device_id >= cuda_device_count()) return std::nullopt;
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, device_id) != cudaSuccess) {
    (void)cudaGetLastError();
    return std::nullopt;
  }
  try {
    device_info info;
    info.device_id            = device_id;
    info.name                 = prop.name;
    info.sm_count             = prop.multiProcessorCount;
    info.compute_major        = prop.major;
    info.compute_minor        = prop.minor;
    info.total_memory_bytes   = prop.totalGlobalMem;
    info.max_threads_per_sm   = prop.maxThreadsPerMultiProcessor;
    info.shared_memory_per_sm = prop.sharedMemPerMultiprocessor;
    return info;
  } catch (...) {  // std::string allocation
    return std::nullopt;
  }
}

}  // namespace tangram
