// SPDX-License-Identifier: Apache-2.0
/**
 * @file memory/detail/copy_on_write.hpp
 * @brief The page copies a manager recorded (forks, recompressions of shared pages) and the
 * engine has not yet confirmed. Each pending copy holds one reference on both of its pages.
 */
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "tangram/core/error.hpp"
#include "tangram/memory/kv_cache_types.hpp"
#include "tangram/memory/memory_resource.hpp"

namespace tangram::detail {

/**
 * @brief Pending page copies. The only part of the manager whose storage grows after
 * construction: `reserve` (which may throw std::bad_alloc) runs before an operation changes
 * anything, so `record` afterwards is noexcept.
 */
class copy_on_write {
 public:
  /// Room for `extra` more copies (geometric growth). @throw std::bad_alloc; nothing changes then.
  void reserve(std::int64_t extra) {
    auto need = pending_.size() + static_cast<std::size_t>(extra);
    if (need > pending_.capacity()) pending_.reserve(std::max(need, 2 * pending_.capacity()));
  }
  /// Records a copy; the caller reserved room for it and took its page references.
  void record(page_id src, page_id dst) noexcept { pending_.push_back({src, dst}); }

  [[nodiscard]] std::vector<page_copy> const& pending() const noexcept { return pending_; }

  /// The copies were performed: each releases its two references (`pool.release`, which checks
  /// the ids), list cleared.
  template <class Pool>
  void complete(Pool& pool) {
    for (auto const& c : pending_) {
      pool.release(c.src);
      pool.release(c.dst);
    }
    pending_.clear();
  }

  /// For a host pool: performs the pending copies with memcpy, then completes them.
  /// @throw logic_error (nothing done) when the pool is not host memory.
  template <class Pool>
  void execute_host(Pool& pool) {
    TANGRAM_EXPECTS(pool.kind() == memory_kind::host,
                    logic_error,
                    "execute_page_copies_host: the pool is ",
                    to_string(pool.kind()),
                    " memory; the engine must copy the pages itself");
    copy_pages_host(pool.base(), pool.page_bytes(), pending_.data(), pending_.size());
    complete(pool);
  }

  /// Adds the references the pending copies hold to `owners[page]` (for invariant checks).
  void count_references(std::vector<std::uint32_t>& owners) const noexcept {
    for (auto const& c : pending_) {
      ++owners[static_cast<std::size_t>(c.src)];
      ++owners[static_cast<std::size_t>(c.dst)];
    }
  }

 private:
  std::vector<page_copy> pending_;
};

}  // namespace tangram::detail
