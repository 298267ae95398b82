// SPDX-License-Identifier: Apache-2.0
/**
 * @file memory/host_memory_resource.hpp
 * @brief `host_memory_resource`: aligned host memory from the global `operator new`.
 */
#pragma once

#include <cstddef>
#include <new>

#include "tangram/core/error.hpp"
#include "tangram/memory/memory_resource.hpp"

namespace tangram {

/**
 * @brief Aligned host memory from the global `operator new`. Stateless; may be shared between
 * threads.
 */
class host_memory_resource final : public memory_resource {
 private:
  void* do_allocate(std::size_t bytes, std::size_t alignment) override {
    try {
      return ::operator new (bytes, std::align_val_t{alignment});
    } catch (std::bad_alloc const&) {
      TANGRAM_FAIL(out_of_memory,
                   "host_memory_resource: cannot allocate ",
                   bytes,
                   " bytes (alignment ",
                   alignment,
                   ")");
    }
  }
  void do_deallocate(void* p, std::size_t, std::size_t alignment) noexcept override {
    ::operator delete (p, std::align_val_t{alignment});
  }
  [[nodiscard]] memory_kind do_kind() const noexcept override { return memory_kind::host; }
};

}  // namespace tangram
