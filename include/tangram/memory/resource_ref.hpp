// SPDX-License-Identifier: Apache-2.0
/**
 * @file memory/resource_ref.hpp
 * @brief `resource_ref`: a non-owning, type-erased reference to any memory resource of CCCL's
 * `cuda::mr` shape, so an RMM or CCCL resource plugs into a page pool without an adaptor.
 *
 * Tangram asks for memory only at construction (one arena per pool, the mirror's buffers), with
 * no stream at hand, so it needs only the synchronous half of a resource. Accepted shapes:
 *
 * | shape | who has it |
 * |---|---|
 * | `void* allocate_sync(size_t bytes, size_t align)`, `void deallocate_sync(void*, size_t,
 * size_t)` | CCCL >= 3.1 `synchronous_resource` (and its `*_resource_ref`), every RMM 26 resource,
 * Tangram's `memory_resource` | | `void* allocate(size_t bytes, size_t align)`, `void
 * deallocate(void*, size_t, size_t)` | CCCL 3.0 `cuda::mr::resource` (as shipped with nvcc 13.0),
 * `std::pmr`-like classes |
 *
 * A resource with `memory_kind kind() const` (Tangram's own) converts implicitly; any other names
 * its memory kind: `resource_ref(mr, memory_kind::device)`. The kind is the caller's claim (the
 * headers stay host-compiler only, so CCCL's `device_accessible` property is not read): a wrong
 * kind lets the pool `memcpy` device memory on the host.
 *
 * @code
 * rmm::mr::cuda_async_memory_resource mr;                                   // RMM 26
 * tangram::kv_cache_manager m(plan, tangram::resource_ref(mr, tangram::memory_kind::device), o);
 * @endcode
 *
 * Ownership: none. The referenced resource must outlive the ref and everything built on it.
 * Temporaries are refused at compile time. Thread safety: that of the referenced resource.
 */
#pragma once

#include <cstddef>
#include <cstdint>
#include <new>
#include <string_view>
#include <type_traits>
#include <utility>

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

template <class R, class = void>
struct has_sync_shape : std::false_type {};
template <class R>
struct has_sync_shape<R,
                      std::void_t<decltype(static_cast<void*>(std::declval<R&>().allocate_sync(
                                      std::size_t{}, std::size_t{}))),
                                  decltype(std::declval<R&>().deallocate_sync(
                                      static_cast<void*>(nullptr), std::size_t{}, std::size_t{}))>>
    : std::true_type {};

template <class R, class = void>
struct has_plain_shape : std::false_type {};
template <class R>
struct has_plain_shape<R,
                       std::void_t<decltype(static_cast<void*>(
                                       std::declval<R&>().allocate(std::size_t{}, std::size_t{}))),
                                   decltype(std::declval<R&>().deallocate(
                                       static_cast<void*>(nullptr), std::size_t{}, std::size_t{}))>>
    : std::true_type {};

template <class R, class = void>
struct has_kind : std::false_type {};
template <class R>
struct has_kind<
    R,
    std::enable_if_t<std::is_same_v<decltype(std::declval<R const&>().kind()), memory_kind>>>
    : std::true_type {};
}  // namespace detail

class resource_ref;

/// True when `R` is a resource a `resource_ref` can refer to (one of the two shapes above; not a
/// `resource_ref` itself, not const).
template <class R>
inline constexpr bool is_resource_v =
    !std::is_same_v<std::remove_cv_t<R>, resource_ref> && !std::is_const_v<R> &&
    (detail::has_sync_shape<R>::value || detail::has_plain_shape<R>::value);

/**
 * @brief A non-owning reference to a memory resource: an object pointer, two function pointers
 * and the memory kind. Copyable; compares equal when it refers to the same object.
 */
class resource_ref {
 public:
  /// Refers to `r` (Tangram's resources and any with `memory_kind kind() const`).
  template <class R, std::enable_if_t<is_resource_v<R> && detail::has_kind<R>::value, int> = 0>
  resource_ref(R& r) noexcept  // NOLINT(google-explicit-constructor): the point is to convert
      : resource_ref(r, r.kind()) {}

  /// Refers to `r`, whose memory is of `kind` (the caller's claim; see the file comment).
  template <class R, std::enable_if_t<is_resource_v<R>, int> = 0>
  resource_ref(R& r, memory_kind kind) noexcept
      : object_(static_cast<void*>(&r)),
        allocate_(&allocate_hook<R>),
        deallocate_(&deallocate_hook<R>),
        kind_(kind) {}

  /// A temporary would dangle: refused.
  template <class R, std::enable_if_t<!std::is_lvalue_reference_v<R> && is_resource_v<R>, int> = 0>
  resource_ref(R&& r) = delete;
  template <class R, std::enable_if_t<!std::is_lvalue_reference_v<R> && is_resource_v<R>, int> = 0>
  resource_ref(R&& r, memory_kind kind) = delete;

  /**
   * @brief Allocates `bytes` (> 0) aligned to `alignment` (a power of two) from the resource.
   * @throw invalid_argument when `bytes` is 0 or `alignment` is not a power of two.
   * @throw out_of_memory when the resource throws `std::bad_alloc` (RMM's `out_of_memory`
   *        derives from it) or returns null; the message names the bytes. Other exceptions of
   *        the resource propagate unchanged.
   */
  [[nodiscard]] void* allocate_sync(std::size_t bytes,
                                    std::size_t alignment = default_arena_alignment) const {
    TANGRAM_EXPECTS(
        bytes > 0, invalid_argument, "resource_ref::allocate_sync: bytes must be > 0, got 0");
    TANGRAM_EXPECTS(detail::is_power_of_two(alignment),
                    invalid_argument,
                    "resource_ref::allocate_sync: alignment must be a power of two, got ",
                    alignment);
    void* p = nullptr;
    try {
      p = allocate_(object_, bytes, alignment);
    } catch (out_of_memory const&) {
      throw;
    } catch (std::bad_alloc const& e) {
      TANGRAM_FAIL(out_of_memory,
                   "resource_ref: the ",
                   to_string(kind_),
                   " resource cannot allocate ",
                   bytes,
                   " bytes (alignment ",
                   alignment,
                   "): ",
                   e.what());
    }
    TANGRAM_EXPECTS(p != nullptr,
                    out_of_memory,
                    "resource_ref: the ",
                    to_string(kind_),
                    " resource returned null for ",
                    bytes,
                    " bytes (alignment ",
                    alignment,
                    ")");
    return p;
  }

  /// @brief Returns a block of `allocate_sync` with the same `bytes` and `alignment`; null is
  /// ignored. Never throws (an exception of the resource terminates).
  void deallocate_sync(void* p,
                       std::size_t bytes,
                       std::size_t alignment = default_arena_alignment) const noexcept {
    if (p != nullptr) deallocate_(object_, p, bytes, alignment);
  }

  /// @brief Who may dereference the addresses the resource hands out.
  [[nodiscard]] memory_kind kind() const noexcept { return kind_; }
  /// @brief The referenced resource.
  [[nodiscard]] void* object() const noexcept { return object_; }

  friend bool operator==(resource_ref const& a, resource_ref const& b) noexcept {
    return a.object_ == b.object_;
  }
  friend bool operator!=(resource_ref const& a, resource_ref const& b) noexcept {
    return !(a == b);
  }

 private:
  template <class R>
  static void* allocate_hook(void* r, std::size_t bytes, std::size_t alignment) {
    if constexpr (detail::has_sync_shape<R>::value)
      return static_cast<void*>(static_cast<R*>(r)->allocate_sync(bytes, alignment));
    else
      return static_cast<void*>(static_cast<R*>(r)->allocate(bytes, alignment));
  }
  template <class R>
  static void deallocate_hook(void* r, void* p, std::size_t bytes, std::size_t alignment) noexcept {
    if constexpr (detail::has_sync_shape<R>::value)
      static_cast<R*>(r)->deallocate_sync(p, bytes, alignment);
    else
      static_cast<R*>(r)->deallocate(p, bytes, alignment);
  }

  void* object_;
  void* (*allocate_)(void*, std::size_t, std::size_t);
  void (*deallocate_)(void*, void*, std::size_t, std::size_t) noexcept;
  memory_kind kind_;
};

}  // namespace tangram
