// SPDX-License-Identifier: Apache-2.0
/**
 * @file memory/detail/turn_footprint.hpp
 * @brief What a turn (admission, next turn, fork) needs, group by group: computed once, before
 * the manager changes anything, then read back when it applies the turn. Under elastic
 * reservation the pooled (compressed) groups share one target instead of one each.
 */
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace tangram::detail {

/**
 * @brief Per-group pages of one turn and their totals. Sized once (one entry per head group);
 * `clear` and `add` never allocate, so sizing a turn on the admission path is allocation-free.
 */
class turn_footprint {
 public:
  turn_footprint() = default;
  explicit turn_footprint(std::int32_t groups)
      : target_(static_cast<std::size_t>(groups), 0),
        reserve_(static_cast<std::size_t>(groups), 0),
        capacity_(static_cast<std::size_t>(groups), 0) {}

  /// Forgets the previous turn (the per-group entries are overwritten by `add`).
  void clear() noexcept {
    reserve_total_ = capacity_total_ = copies_total_ = 0;
    pooled_target_ = pooled_held_ = pooled_limit_ = 0;
    grows_capacity_                               = false;
  }

  /**
   * @brief Records group g: it may hold `target` pages when the turn completes, of which
   * `already_held` need no reservation (pages it keeps exclusively, or pages a fork shares);
   * `copies` pages must be copied on write; its page list needs `capacity` entries where it now
   * has `current_capacity`.
   */
  void add(std::int32_t g,
           std::int64_t target,
           std::int64_t already_held,
           std::int64_t copies,
           std::int64_t capacity,
           std::int64_t current_capacity) noexcept {
    record(g, target, target - already_held, copies, capacity, current_capacity);
  }

  /**
   * @brief Records pooled group g: no target of its own (its `target` is its list capacity, a
   * bound that never binds); `already_held` pages count against the shared target without a
   * reservation, `copies` are copied on write, its list needs `capacity` entries.
   */
  void add_pooled(std::int32_t g,
                  std::int64_t already_held,
                  std::int64_t copies,
                  std::int64_t capacity,
                  std::int64_t current_capacity) noexcept {
    pooled_held_ += already_held;
    record(g, capacity, 0, copies, capacity, current_capacity);
  }
  /// The pages all pooled groups together may hold during the turn, and at most after each
  /// chunk's eviction (`limit`; the target adds decode and staging pages). Call after add_pooled.
  void set_pooled_target(std::int64_t pages, std::int64_t limit) noexcept {
    pooled_target_ = pages;
    pooled_limit_  = limit;
  }
  /// The most pages the pooled groups may hold after a chunk's eviction.
  [[nodiscard]] std::int64_t pooled_limit() const noexcept { return pooled_limit_; }

  /// The pooled groups' shared target.
  [[nodiscard]] std::int64_t pooled_target() const noexcept { return pooled_target_; }
  /// Pages the pooled groups draw from the turn's reservation: their target less what they hold.
  [[nodiscard]] std::int64_t pooled_reserve() const noexcept {
    return pooled_target_ > pooled_held_ ? pooled_target_ - pooled_held_ : 0;
  }

  /// Pages group g may hold when the turn completes.
  [[nodiscard]] std::int64_t target(std::int32_t g) const noexcept {
    return target_[static_cast<std::size_t>(g)];
  }
  /// Pages group g draws from the turn's reservation.
  [[nodiscard]] std::int64_t reserve(std::int32_t g) const noexcept {
    return reserve_[static_cast<std::size_t>(g)];
  }
  /// Page-list entries group g needs.
  [[nodiscard]] std::int64_t capacity(std::int32_t g) const noexcept {
    return capacity_[static_cast<std::size_t>(g)];
  }
  /// Pages to reserve from the pool for the whole turn.
  [[nodiscard]] std::int64_t reserve_total() const noexcept {
    return reserve_total_ + pooled_reserve();
  }
  /// Page-id arena entries of the sequence's segment.
  [[nodiscard]] std::int64_t capacity_total() const noexcept { return capacity_total_; }
  /// Copy-on-write copies the turn records.
  [[nodiscard]] std::int64_t copies_total() const noexcept { return copies_total_; }
  /// True when some group needs more entries than its page list has (the segment must move).
  [[nodiscard]] bool grows_capacity() const noexcept { return grows_capacity_; }

 private:
  /// Group g's target, reservation and list capacity, added to the totals (add, add_pooled).
  void record(std::int32_t g,
              std::int64_t target,
              std::int64_t reserve,
              std::int64_t copies,
              std::int64_t capacity,
              std::int64_t current_capacity) noexcept {
    auto i       = static_cast<std::size_t>(g);
    target_[i]   = target;
    reserve_[i]  = reserve;
    capacity_[i] = capacity;
    reserve_total_ += reserve;
    capacity_total_ += capacity;
    copies_total_ += copies;
    grows_capacity_ |= capacity > current_capacity;
  }

  std::vector<std::int64_t> target_, reserve_, capacity_;
  std::int64_t reserve_total_ = 0, capacity_total_ = 0, copies_total_ = 0;
  std::int64_t pooled_target_ = 0, pooled_held_ = 0, pooled_limit_ = 0;
  bool grows_capacity_ = false;
};

}  // namespace tangram::detail
