// SPDX-License-Identifier: Apache-2.0
/**
 * @file memory/segment_arena.hpp
 * @brief First-fit allocator of contiguous index ranges inside a preallocated arena: how the
 * KV-cache manager places each sequence's page lists (its padded CSR segment) in the `pages`
 * array of the batch view.
 *
 * Only offsets are managed; the caller owns the storage. Free ranges are kept sorted and
 * coalesced in a vector whose capacity is fixed at construction (at most one free range more than
 * there are live segments), so allocate and free never allocate memory.
 */
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "tangram/core/error.hpp"

namespace tangram {

/**
 * @brief Offsets of variable-size segments in `[0, capacity)`. Single-threaded value type.
 *
 * The owner promises at most `max_segments` live segments at once; with that promise no call
 * allocates memory. Fragmentation is handled by the owner: when `allocate` fails although
 * `free_total()` suffices, it moves its live segments to the front and calls `reset(used)`.
 */
class segment_arena {
 public:
  segment_arena() = default;
  /// @throw invalid_argument when capacity < 0 or max_segments < 1.
  segment_arena(std::int64_t capacity, std::int64_t max_segments) : capacity_(capacity) {
    TANGRAM_EXPECTS(
        capacity >= 0, invalid_argument, "segment_arena.capacity: must be >= 0, got ", capacity);
    TANGRAM_EXPECTS(max_segments >= 1,
                    invalid_argument,
                    "segment_arena.max_segments: must be >= 1, got ",
                    max_segments);
    blocks_.reserve(static_cast<std::size_t>(max_segments) + 2);
    reset(0);
  }

  [[nodiscard]] std::int64_t capacity() const noexcept { return capacity_; }
  /// Entries not in any segment.
  [[nodiscard]] std::int64_t free_total() const noexcept { return free_total_; }
  /// Number of disjoint free ranges (1 when unfragmented).
  [[nodiscard]] std::size_t free_ranges() const noexcept { return blocks_.size(); }

  /// @brief True when `allocate(size)` would succeed (some free range holds `size` entries).
  [[nodiscard]] bool can_allocate(std::int64_t size) const noexcept {
    if (size <= 0) return true;
    for (auto const& b : blocks_)
      if (b.size >= size) return true;
    return false;
  }

  /// @brief First-fit: the start of a new segment of `size` entries, or nullopt when no free
  /// range is large enough. A zero-size segment always succeeds (offset 0, nothing consumed).
  [[nodiscard]] std::optional<std::int64_t> allocate(std::int64_t size) noexcept {
    if (size <= 0) return std::int64_t{0};
    for (std::size_t i = 0; i < blocks_.size(); ++i) {
      auto& b = blocks_[i];
      if (b.size < size) continue;
      std::int64_t at = b.begin;
      b.begin += size;
      b.size -= size;
      if (b.size == 0) blocks_.erase(blocks_.begin() + static_cast<std::ptrdiff_t>(i));
      free_total_ -= size;
      return at;
    }
    return std::nullopt;
  }

  /// @brief Returns a segment; neighbouring free ranges merge. Never allocates memory.
  void free(std::int64_t begin, std::int64_t size) noexcept {
    if (size <= 0) return;
    std::size_t i = 0;
    while (i < blocks_.size() && blocks_[i].begin < begin) ++i;
    bool merge_prev = i > 0 && blocks_[i - 1].begin + blocks_[i - 1].size == begin;
    bool merge_next = i < blocks_.size() && begin + size == blocks_[i].begin;
    if (merge_prev && merge_next) {
      blocks_[i - 1].size += size + blocks_[i].size;
      blocks_.erase(blocks_.begin() + static_cast<std::ptrdiff_t>(i));
    } else if (merge_prev) {
      blocks_[i - 1].size += size;
    } else if (merge_next) {
      blocks_[i].begin = begin;
      blocks_[i].size += size;
    } else {
      blocks_.insert(blocks_.begin() + static_cast<std::ptrdiff_t>(i), block{begin, size});
    }
    free_total_ += size;
  }

  /// @brief After the owner packed its live segments into `[0, used)`: one free range remains.
  void reset(std::int64_t used) noexcept {
    blocks_.clear();
    if (used < capacity_) blocks_.push_back({used, capacity_ - used});
    free_total_ = capacity_ - used;
  }

 private:
  struct block {
    std::int64_t begin;
    std::int64_t size;
  };
  std::int64_t capacity_   = 0;
  std::int64_t free_total_ = 0;
  std::vector<block> blocks_;
};

}  // namespace tangram
