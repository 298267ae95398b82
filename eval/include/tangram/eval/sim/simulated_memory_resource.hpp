// SPDX-License-Identifier: Apache-2.0
/**
 * @file eval/sim/simulated_memory_resource.hpp
 * @brief `simulated_memory_resource`: fake, never-dereferenced addresses for pools of any size
 * on a CPU (the simulator, benchmarks and tests). Not installed: an engine has real memory. Its
 * `memory_kind::simulated` (memory/resource_ref.hpp) tells the pool and the mirror that nobody
 * may dereference the arena.
 */
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>

#include "tangram/core/error.hpp"
#include "tangram/memory/memory_resource.hpp"

namespace tangram {

/**
 * @brief Hands out fake, never-dereferenced addresses so that allocator and manager logic can be
 * run for pools of any size (80-141 GB) on a machine without them.
 *
 * Addresses start at 2^40 and grow monotonically (blocks are never reused). `capacity_bytes`
 * bounds the bytes outstanding at once; asking for more is `out_of_memory`, like a real device.
 * Single-threaded object.
 */
class simulated_memory_resource final : public memory_resource {
 public:
  /// @param capacity_bytes bytes that may be outstanding at once (default: effectively unbounded)
  explicit simulated_memory_resource(
      std::size_t capacity_bytes = std::numeric_limits<std::size_t>::max() / 4)
      : capacity_(capacity_bytes) {}

  /// Bytes currently handed out.
  [[nodiscard]] std::size_t allocated_bytes() const noexcept { return allocated_; }
  /// The most bytes ever outstanding at once.
  [[nodiscard]] std::size_t peak_bytes() const noexcept { return peak_; }
  /// The limit given at construction.
  [[nodiscard]] std::size_t capacity_bytes() const noexcept { return capacity_; }

 private:
  void* do_allocate(std::size_t bytes, std::size_t alignment) override {
    TANGRAM_EXPECTS(bytes <= capacity_ - allocated_,
                    out_of_memory,
                    "simulated_memory_resource: cannot allocate ",
                    bytes,
                    " bytes: ",
                    allocated_,
                    " of ",
                    capacity_,
                    " bytes are in use");
    std::uintptr_t at = (next_ + (alignment - 1)) & ~static_cast<std::uintptr_t>(alignment - 1);
    next_             = at + bytes;
    allocated_ += bytes;
    if (allocated_ > peak_) peak_ = allocated_;
    return reinterpret_cast<void*>(at);
  }
  void do_deallocate(void*, std::size_t bytes, std::size_t) noexcept override {
    allocated_ -= bytes <= allocated_ ? bytes : allocated_;
  }
  [[nodiscard]] memory_kind do_kind() const noexcept override { return memory_kind::simulated; }

  std::size_t capacity_;
  std::size_t allocated_ = 0;
  std::size_t peak_      = 0;
  std::uintptr_t next_   = std::uintptr_t{1} << 40;
};

}  // namespace tangram
