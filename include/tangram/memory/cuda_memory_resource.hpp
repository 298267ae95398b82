// SPDX-License-Identifier: Apache-2.0
/**
 * @file memory/cuda_memory_resource.hpp
 * @brief Device memory from `cudaMalloc` / `cudaFree`, for page pools that live on a GPU.
 *
 * Declared here (host-compilable, no CUDA headers), defined in `kernels/cuda_memory_resource.cu`,
 * so it is usable only when the program links `tangram::kernels`. Only the CUDA runtime is used
 * (never libcuda), so a program that links it still starts on a machine without a driver; the
 * allocation then fails with `cuda_error`.
 */
#pragma once

#include <cstddef>
#include <cstdint>

#include "tangram/memory/memory_resource.hpp"

namespace tangram {

/**
 * @brief `cudaMalloc` on a fixed device. Blocks are 256-byte aligned; larger alignments are
 * refused with `invalid_argument`.
 *
 * Synchronisation: `cudaMalloc` and `cudaFree` synchronise the device as the CUDA runtime
 * documents; a pool asks for its arena once, at construction, and returns it at destruction, so
 * no per-page call ever reaches CUDA. Thread safety: stateless apart from the device id; may be
 * shared between threads.
 */
class cuda_memory_resource final : public memory_resource {
 public:
  /// @param device_id the CUDA device every allocation is made on (the current device is restored)
  explicit cuda_memory_resource(std::int32_t device_id = 0) noexcept : device_id_(device_id) {}

  [[nodiscard]] std::int32_t device_id() const noexcept { return device_id_; }

 private:
  /// @throw out_of_memory on `cudaErrorMemoryAllocation`; cuda_error for any other failure
  ///        (no driver, bad device); the sticky error is cleared either way.
  void* do_allocate(std::size_t bytes, std::size_t alignment) override;
  void do_deallocate(void* p, std::size_t bytes, std::size_t alignment) noexcept override;
  [[nodiscard]] memory_kind do_kind() const noexcept override { return memory_kind::device; }

  std::int32_t device_id_;
};

}  // namespace tangram
