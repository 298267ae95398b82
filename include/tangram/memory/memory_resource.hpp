// SPDX-License-Identifier: Apache-2.0
/**
 * @file memory/memory_resource.hpp
 * @brief The polymorphic base of Tangram's memory resources (RMM's `device_memory_resource`
 * style): where a page pool gets its one arena.
 *
 * A resource hands out large, aligned blocks; the page pool (memory/page_pool.hpp) asks once for
 * its arena through a `resource_ref` (memory/resource_ref.hpp), which refers to this base or to
 * any RMM or CCCL resource. Resources, one per header:
 *
 * | resource | memory | use |
 * |---|---|---|
 * | `host_memory_resource` (memory/host_memory_resource.hpp) | aligned host memory | CPU reference,
 * tests that read/write pages | | `limiting_resource_adaptor`
 * (memory/limiting_resource_adaptor.hpp) | its upstream's, up to a byte limit | inject allocation
 * failure | | `cuda_memory_resource` (memory/cuda_memory_resource.hpp) | `cudaMalloc` | GPU engines
 * (needs `tangram::kernels`) | | `simulated_memory_resource` (eval:
 * tangram/eval/sim/simulated_memory_resource.hpp) | fake addresses, never dereferenced | plan
 * 80-141 GB pools on a CPU |
 *
 * Failure to provide the bytes is `tangram::out_of_memory` (core/error.hpp), never a null pointer.
 */
#pragma once

#include <cstddef>

#include "tangram/core/error.hpp"
#include "tangram/memory/resource_ref.hpp"

namespace tangram {

/**
 * @brief Polymorphic base of all resources (non-virtual public interface, private virtual hooks,
 * as in RMM's `device_memory_resource`).
 *
 * Ownership: the caller of `allocate` owns the block until it passes it back to `deallocate` of the
 * same resource with the same size and alignment. A resource must outlive every block it handed
 * out (and every pool built on it).
 */
class memory_resource {
 public:
  memory_resource()                                  = default;
  memory_resource(memory_resource const&)            = delete;
  memory_resource& operator=(memory_resource const&) = delete;
  virtual ~memory_resource()                         = default;

  /**
   * @brief Allocates `bytes` (> 0) aligned to `alignment` (a power of two): CCCL's
   * `synchronous_resource` name, the one `resource_ref` calls. `allocate` is the same call.
   * @throw out_of_memory when the resource cannot provide the bytes (the message names the
   *        resource, the requested bytes and its limit).
   * @throw invalid_argument when `bytes` is 0 or `alignment` is not a power of two.
   */
  [[nodiscard]] void* allocate_sync(std::size_t bytes,
                                    std::size_t alignment = default_arena_alignment) {
    TANGRAM_EXPECTS(
        bytes > 0, invalid_argument, "memory_resource::allocate: bytes must be > 0, got 0");
    TANGRAM_EXPECTS(detail::is_power_of_two(alignment),
                    invalid_argument,
                    "memory_resource::allocate: alignment must be a power of two, got ",
                    alignment);
    return do_allocate(bytes, alignment);
  }
  /// @brief The same as `allocate_sync` (the name before CCCL 3.1; kept).
  [[nodiscard]] void* allocate(std::size_t bytes, std::size_t alignment = default_arena_alignment) {
    return allocate_sync(bytes, alignment);
  }

  /// @brief Returns a block obtained from `allocate_sync` with the same `bytes` and `alignment`.
  /// Never throws; passing a foreign block is undefined behaviour.
  void deallocate_sync(void* p,
                       std::size_t bytes,
                       std::size_t alignment = default_arena_alignment) noexcept {
    if (p != nullptr) do_deallocate(p, bytes, alignment);
  }
  /// @brief The same as `deallocate_sync` (the name before CCCL 3.1; kept).
  void deallocate(void* p,
                  std::size_t bytes,
                  std::size_t alignment = default_arena_alignment) noexcept {
    deallocate_sync(p, bytes, alignment);
  }

  /// @brief Who may dereference the addresses this resource hands out.
  [[nodiscard]] memory_kind kind() const noexcept { return do_kind(); }

 private:
  virtual void* do_allocate(std::size_t bytes, std::size_t alignment)                    = 0;
  virtual void do_deallocate(void* p, std::size_t bytes, std::size_t alignment) noexcept = 0;
  [[nodiscard]] virtual memory_kind do_kind() const noexcept                             = 0;
};

}  // namespace tangram
