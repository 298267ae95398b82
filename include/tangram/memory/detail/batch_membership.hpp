// SPDX-License-Identifier: Apache-2.0
/**
 * @file memory/detail/batch_membership.hpp
 * @brief The batch a manager's view and decode steps run over: request r is the sequence in
 * slot `slots()[r]`, as it was (its generation) when the batch was set.
 */
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "tangram/error.hpp"
#include "tangram/memory/detail/sequence_table.hpp"

namespace tangram::detail {

/// @brief Batch members, sized once (max_batch requests); `set` and `check_live` are O(batch) and
/// allocation-free.
class batch_membership {
 public:
  batch_membership() = default;
  batch_membership(std::int32_t max_batch, std::int32_t slots)
      : slots_(static_cast<std::size_t>(max_batch), 0),
        generations_(static_cast<std::size_t>(max_batch), 0),
        listed_(static_cast<std::size_t>(slots), 0) {}

  [[nodiscard]] std::int32_t size() const noexcept { return size_; }
  [[nodiscard]] std::int32_t max_size() const noexcept {
    return static_cast<std::int32_t>(slots_.size());
  }
  /// Slot of each request ([size()], the view's batch_slots).
  [[nodiscard]] std::int32_t const* slots() const noexcept { return slots_.data(); }
  [[nodiscard]] std::int32_t slot(std::int32_t r) const noexcept {
    return slots_[static_cast<std::size_t>(r)];
  }
  [[nodiscard]] sequence_id member(std::int32_t r) const noexcept {
    return {slots_[static_cast<std::size_t>(r)], generations_[static_cast<std::size_t>(r)]};
  }

  /**
   * @brief Request r becomes ids[r]. Validates every id first (live in `table`, listed once);
   * the batch is unchanged when it throws.
   * @throw invalid_argument when count exceeds max_size(); logic_error for an unknown sequence or
   *        one listed twice.
   */
  void set(sequence_id const* ids, std::size_t count, sequence_table const& table) {
    TANGRAM_EXPECTS(count <= slots_.size(),
                    invalid_argument,
                    "set_batch: ",
                    count,
                    " sequences exceed max_batch ",
                    slots_.size());
    std::size_t i = 0;
    try {
      for (; i < count; ++i) {
        std::int32_t s = table.find(ids[i], "set_batch");
        TANGRAM_EXPECTS(!listed_[static_cast<std::size_t>(s)],
                        logic_error,
                        "set_batch: sequence in slot ",
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
    size_ = static_cast<std::int32_t>(count);
  }

  /// @throw logic_error naming `op`, the request, slot and generation when a member was freed
  /// (or its slot reused) since `set`.
  void check_live(char const* op, sequence_table const& table) const {
    for (std::int32_t r = 0; r < size_; ++r) {
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

  /// @throw logic_error when `set` left a duplicate mark behind.
  void check_invariants() const {
    for (std::size_t s = 0; s < listed_.size(); ++s)
      TANGRAM_EXPECTS(
          !listed_[s], logic_error, "slot ", s, ": set_batch left its duplicate mark set");
  }

 private:
  std::vector<std::int32_t> slots_;
  std::vector<std::uint32_t> generations_;
  std::vector<char> listed_;  ///< duplicate marks, set only inside `set`
  std::int32_t size_ = 0;
};

}  // namespace tangram::detail
