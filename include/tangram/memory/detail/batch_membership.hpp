// SPDX-License-Identifier: Apache-2.0
/**
 * @file memory/detail/batch_membership.hpp
 * @brief One batch of a manager (it keeps one per `batch_kind`): request r is the sequence in
 * slot `slots()[r]`, as it was (its generation) when the batch was set; requests
 * [members(), size()) are padding requests, in the padding slot.
 */
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "tangram/core/error.hpp"
#include "tangram/memory/detail/sequence_table.hpp"

namespace tangram::detail {

/// @brief Batch members, sized once (max_batch requests); `set` and `check_live` are O(batch) and
/// allocation-free.
class batch_membership {
 public:
  batch_membership() = default;
  /// Padding requests name slot `slots` (one past the real slots, the view's `padding_slot`).
  batch_membership(std::int32_t max_batch, std::int32_t slots)
      : slots_(static_cast<std::size_t>(max_batch), slots),
        generations_(static_cast<std::size_t>(max_batch), 0),
        listed_(static_cast<std::size_t>(slots), 0),
        padding_slot_(slots) {}

  /// Requests, padding included (the view's batch_size).
  [[nodiscard]] std::int32_t size() const noexcept { return size_; }
  /// Real requests: requests [members(), size()) are padding.
  [[nodiscard]] std::int32_t members() const noexcept { return members_; }
  [[nodiscard]] std::int32_t max_size() const noexcept {
    return static_cast<std::int32_t>(slots_.size());
  }
  [[nodiscard]] std::int32_t padding_slot() const noexcept { return padding_slot_; }
  /// Slot of each request ([size()], the view's batch_slots).
  [[nodiscard]] std::int32_t const* slots() const noexcept { return slots_.data(); }
  [[nodiscard]] std::int32_t slot(std::int32_t r) const noexcept {
    return slots_[static_cast<std::size_t>(r)];
  }
  [[nodiscard]] sequence_id member(std::int32_t r) const noexcept {
    return {slots_[static_cast<std::size_t>(r)], generations_[static_cast<std::size_t>(r)]};
  }

  /**
   * @brief Request r becomes ids[r] for r < count, and a padding request for count <= r <
   * padded (padded 0: no padding). Validates everything first (sizes, every id live in `table`
   * and listed once); the batch is unchanged when it throws. `op` names the call in errors.
   * @throw invalid_argument when count or padded exceeds max_size(), ids is null with count > 0,
   *        or padded is neither 0 nor >= count; logic_error for an unknown sequence or one listed twice.
   */
  void set(sequence_id const* ids,
           std::size_t count,
           sequence_table const& table,
           std::size_t padded = 0,
           char const* op     = "set_batch") {
    TANGRAM_EXPECTS(count <= slots_.size(),
                    invalid_argument,
                    op,
                    ": ",
                    count,
                    " sequences exceed max_batch ",
                    slots_.size());
    TANGRAM_EXPECTS(ids != nullptr || count == 0,
                    invalid_argument,
                    op,
                    ".ids: null with count ",
                    count);
    TANGRAM_EXPECTS(padded == 0 || (padded >= count && padded <= slots_.size()),
                    invalid_argument,
                    op,
                    ".padded_size: must be 0 (no padding) or in [count = ",
                    count,
                    ", max_batch = ",
                    slots_.size(),
                    "], got ",
                    padded);
    std::size_t i = 0;
    try {
      for (; i < count; ++i) {
        std::int32_t s = table.find(ids[i], op);
        TANGRAM_EXPECTS(!listed_[static_cast<std::size_t>(s)],
                        logic_error,
                        op,
                        ": sequence in slot ",
                        s,
                        " is listed twice");
        listed_[static_cast<std::size_t>(s)] = 1;
      }
    } catch (...) {
      for (std::size_t j = 0; j < i; ++j) listed_[static_cast<std::size_t>(ids[j].slot)] = 0;
      throw;
    }
    for (std::size_t j = 0; j < count; ++j) {
      listed_[static_cast<std::size_t>(ids[j].slot)] = 0;
      slots_[j]                                      = ids[j].slot;
      generations_[j]                                = ids[j].generation;
    }
    std::size_t size = padded == 0 ? count : padded;
    for (std::size_t j = count; j < size; ++j) {
      slots_[j]       = padding_slot_;
      generations_[j] = 0;
    }
    members_ = static_cast<std::int32_t>(count);
    size_    = static_cast<std::int32_t>(size);
  }

  /// @throw logic_error naming `op`, the request, slot and generation when a member was freed
  /// (or its slot reused) since `set`.
  /// Padding requests are not checked.
  void check_live(char const* op, sequence_table const& table) const {
    for (std::int32_t r = 0; r < members_; ++r) {
      std::int32_t s = slots_[static_cast<std::size_t>(r)];
      auto const& st = table[s];
      auto gen       = generations_[static_cast<std::size_t>(r)];
      TANGRAM_EXPECTS(
          st.phase != sequence_phase::free && st.generation == gen,
          logic_error,
          op,
          ": batch request ",
          r,
          " (slot ",
          s,
          ", generation ",
          gen,
          ") is no longer a live sequence (",
          st.phase == sequence_phase::free ? "freed" : "its slot holds a newer sequence",
          "); call set_batch again");
    }
  }

  /// @throw logic_error when `set` left a duplicate mark behind, a real request names the
  /// padding slot (or a slot outside the table), or a padding request names another slot.
  void check_invariants() const {
    for (std::size_t s = 0; s < listed_.size(); ++s)
      TANGRAM_EXPECTS(
          !listed_[s], logic_error, "slot ", s, ": set_batch left its duplicate mark set");
    TANGRAM_EXPECTS(0 <= members_ && members_ <= size_ && size_ <= max_size(),
                    logic_error,
                    "batch: ",
                    members_,
                    " members and ",
                    size_,
                    " requests with max_batch ",
                    max_size());
    for (std::int32_t r = 0; r < size_; ++r) {
      auto s = slots_[static_cast<std::size_t>(r)];
      TANGRAM_EXPECTS(r < members_ ? (s >= 0 && s < static_cast<std::int32_t>(listed_.size()))
                                   : s == padding_slot_,
                      logic_error,
                      "batch request ",
                      r,
                      r < members_ ? " (a member) names slot " : " (padding) names slot ",
                      s,
                      "; padding slot ",
                      padding_slot_);
    }
  }

 private:
  std::vector<std::int32_t> slots_;
  std::vector<std::uint32_t> generations_;
  std::vector<char> listed_;  ///< duplicate marks, set only inside `set`
  std::int32_t padding_slot_ = 0;
  std::int32_t size_         = 0;  ///< requests, padding included
  std::int32_t members_      = 0;  ///< real requests (the first members_)
};

}  // namespace tangram::detail
