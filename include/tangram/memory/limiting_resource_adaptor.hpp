// SPDX-License-Identifier: Apache-2.0
/**
 * @file memory/limiting_resource_adaptor.hpp
 * @brief `limiting_resource_adaptor`: caps the bytes any resource hands out through it (RMM's
 * adaptor of the same name); tests inject arena failures with it.
 */
#pragma once

#include <cstddef>
#include <cstdint>

#include "tangram/core/error.hpp"
#include "tangram/memory/memory_resource.hpp"
#include "tangram/memory/resource_ref.hpp"

namespace tangram {

/**
 * @brief Forwards to an upstream resource but refuses (with `out_of_memory`) any allocation that
 * would take the bytes outstanding through this adaptor over `limit_bytes`. With a limit of 0 every
 * allocation fails: the way tests inject an arena failure.
 *
 * The upstream is any resource a `resource_ref` refers to (Tangram's, RMM's, CCCL's), held
 * without ownership: it must outlive the adaptor.
 * Single-threaded object.
 */
class limiting_resource_adaptor final : public memory_resource {
 public:
  limiting_resource_adaptor(resource_ref upstream, std::size_t limit_bytes)
      : upstream_(upstream), limit_(limit_bytes) {}

  [[nodiscard]] std::size_t allocated_bytes() const noexcept { return allocated_; }
  [[nodiscard]] std::size_t limit_bytes() const noexcept { return limit_; }
  /// Allocations refused so far.
  [[nodiscard]] std::int64_t refusals() const noexcept { return refusals_; }
  [[nodiscard]] resource_ref upstream() const noexcept { return upstream_; }

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
    void* p = upstream_.allocate_sync(bytes, alignment);
    allocated_ += bytes;
    return p;
  }
  void do_deallocate(void* p, std::size_t bytes, std::size_t alignment) noexcept override {
    upstream_.deallocate_sync(p, bytes, alignment);
    allocated_ -= bytes <= allocated_ ? bytes : allocated_;
  }
  [[nodiscard]] memory_kind do_kind() const noexcept override { return upstream_.kind(); }

  resource_ref upstream_;
  std::size_t limit_;
  std::size_t allocated_ = 0;
  std::int64_t refusals_ = 0;
};

}  // namespace tangram
