// SPDX-License-Identifier: Apache-2.0
/**
 * @file memory/memory_resource.hpp
 * @brief Upstream memory resources in the RMM style: where a page pool gets its one arena.
 *
 * A resource hands out large, aligned blocks; the page pool (memory/page_pool.hpp) asks once for
 * its arena and carves fixed-size pages out of it. Resources here:
 *
 * | resource | memory | use |
 * |---|---|---|
 * | `host_memory_resource` | aligned host memory | CPU reference, tests that read/write pages |
 * | `simulated_memory_resource` | fake addresses, never dereferenced | plan 80-141 GB pools on a
 * CPU | | `limiting_resource_adaptor` | whatever its upstream gives, up to a byte limit |
 * inject allocation failure | | `cuda_memory_resource` (memory/cuda_memory_resource.hpp) |
 * `cudaMalloc` | GPU engines (needs `tangram::kernels`) |
 *
 * Failure to provide the bytes is `tangram::out_of_memory` (core/error.hpp), never a null pointer.
 *
 * Thread safety: `host_memory_resource` is stateless and may be shared between threads;
 * `simulated_memory_resource` and `limiting_resource_adaptor` keep counters and are
 * single-threaded objects (guard them externally if shared).
 */
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <new>
#include <string_view>

#include "tangram/core/error.hpp"

namespace tangram {

/// @brief Where the bytes a resource hands out live, i.e. who may dereference them.
enum class memory_kind : std::uint8_t {
  host,       ///< host memory: the CPU may read and write it
  device,     ///< device memory: only kernels (and cudaMemcpy) may touch it
  simulated,  ///< fake addresses: nobody may dereference them
};

/// @brief Lower-case name of a memory kind ("host", "device", "simulated").
constexpr std::string_view to_string(memory_kind k) noexcept {
  switch (k) {
    case memory_kind::host:
      return "host";
    case memory_kind::device:
      return "device";
    case memory_kind::simulated:
      return "simulated";
  }
  return "?";
}

/// Alignment of every arena unless asked otherwise (matches cudaMalloc's 256-byte guarantee).
inline constexpr std::size_t default_arena_alignment = 256;

namespace detail {
inline constexpr bool is_power_of_two(std::size_t x) noexcept {
  return x != 0 && (x & (x - 1)) == 0;
}
}  // namespace detail

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
   * @brief Allocates `bytes` (> 0) aligned to `alignment` (a power of two).
   * @throw out_of_memory when the resource cannot provide the bytes (the message names the
   *        resource, the requested bytes and its limit).
   * @throw invalid_argument when `bytes` is 0 or `alignment` is not a power of two.
   */
  [[nodiscard]] void* allocate(std::size_t bytes, std::size_t alignment = default_arena_alignment) {
    TANGRAM_EXPECTS(
        bytes > 0, invalid_argument, "memory_resource::allocate: bytes must be > 0, got 0");
    TANGRAM_EXPECTS(detail::is_power_of_two(alignment),
                    invalid_argument,
                    "memory_resource::allocate: alignment must be a power of two, got ",
                    alignment);
    return do_allocate(bytes, alignment);
  }

  /// @brief Returns a block obtained from `allocate` with the same `bytes` and `alignment`.
  /// Never throws; passing a foreign block is undefined behaviour.
  void deallocate(void* p,
                  std::size_t bytes,
                  std::size_t alignment = default_arena_alignment) noexcept {
    if (p != nullptr) do_deallocate(p, bytes, alignment);
  }

  /// @brief Who may dereference the addresses this resource hands out.
  [[nodiscard]] memory_kind kind() const noexcept { return do_kind(); }

 private:
  virtual void* do_allocate(std::size_t bytes, std::size_t alignment)                    = 0;
  virtual void do_deallocate(void* p, std::size_t bytes, std::size_t alignment) noexcept = 0;
  [[nodiscard]] virtual memory_kind do_kind() const noexcept                             = 0;
};

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

/**
 * @brief Forwards to an upstream resource but refuses (with `out_of_memory`) any allocation that
 * would take the bytes outstanding through this adaptor over `limit_bytes`. With a limit of 0 every
 * allocation fails: the way tests inject an arena failure.
 *
 * The adaptor holds a non-owning pointer to its upstream, which must outlive it.
 * Single-threaded object.
 */
class limiting_resource_adaptor final : public memory_resource {
 public:
  limiting_resource_adaptor(memory_resource& upstream, std::size_t limit_bytes)
      : upstream_(&upstream), limit_(limit_bytes) {}

  [[nodiscard]] std::size_t allocated_bytes() const noexcept { return allocated_; }
  [[nodiscard]] std::size_t limit_bytes() const noexcept { return limit_; }
  /// Allocations refused so far.
  [[nodiscard]] std::int64_t refusals() const noexcept { return refusals_; }
  [[nodiscard]] memory_resource& upstream() const noexcept { return *upstream_; }

 private:
  void* do_allocate(std::size_t bytes, std::size_t alignment) override {
    if (bytes > limit_ - allocated_) {
      ++refusals_;
      TANGRAM_FAIL(out_of_memory,
                   "limiting_resource_adaptor: cannot allocate ",
                   bytes,
                   " bytes: ",
                   allocated_,
                   " of the ",
                   limit_,
                   "-byte limit are in use");
    }
    void* p = upstream_->allocate(bytes, alignment);
    allocated_ += bytes;
    return p;
  }
  void do_deallocate(void* p, std::size_t bytes, std::size_t alignment) noexcept override {
    upstream_->deallocate(p, bytes, alignment);
    allocated_ -= bytes <= allocated_ ? bytes : allocated_;
  }
  [[nodiscard]] memory_kind do_kind() const noexcept override { return upstream_->kind(); }

  memory_resource* upstream_;
  std::size_t limit_;
  std::size_t allocated_ = 0;
  std::int64_t refusals_ = 0;
};

}  // namespace tangram
