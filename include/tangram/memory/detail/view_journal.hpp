// SPDX-License-Identifier: Apache-2.0
/**
 * @file memory/detail/view_journal.hpp
 * @brief The change journal of a manager's view: which page-id entries and which slot rows were
 * written since the engine last uploaded them.
 */
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "tangram/memory/kv_cache_types.hpp"

namespace tangram::detail {

/**
 * @brief Bounded journal of view changes. Sized at construction; every mutator is noexcept and
 * allocation-free: when more entries change than it holds, it asks for a full resync instead.
 */
class view_journal {
 public:
  view_journal() = default;
  /// Room for `max_entries` page-id entries and `slots` slot rows.
  view_journal(std::int64_t max_entries, std::int32_t slots)
      : slot_listed_(static_cast<std::size_t>(slots), 0),
        counters_listed_(static_cast<std::size_t>(slots), 0) {
    entries_.reserve(static_cast<std::size_t>(max_entries));
    slots_.reserve(static_cast<std::size_t>(slots));
    counters_.reserve(static_cast<std::size_t>(slots));
  }

  /// Entry `at` of the page-id arena was written.
  void note_entry(std::int64_t at) noexcept {
    if (entries_.size() < entries_.capacity())
      entries_.push_back(static_cast<std::int32_t>(at));
    else
      full_resync_ = true;
  }
  /// Slot s's page_offset / head_base_len rows changed (listed once until `clear`); its
  /// counters are listed too (every caller also changes or resets them).
  void note_slot(std::int32_t s) noexcept {
    note_counters(s);
    if (slot_listed_[static_cast<std::size_t>(s)]) return;
    slot_listed_[static_cast<std::size_t>(s)] = 1;
    slots_.push_back(s);  // capacity: one per slot, so it never reallocates
  }
  /// Slot s's `appended` / `seq_tokens` counters changed (listed once until `clear`).
  void note_counters(std::int32_t s) noexcept {
    if (counters_listed_[static_cast<std::size_t>(s)]) return;
    counters_listed_[static_cast<std::size_t>(s)] = 1;
    counters_.push_back(s);  // capacity: one per slot
  }
  /// Everything moved (the arena was repacked or a segment relocated): upload it all.
  void note_full_resync() noexcept { full_resync_ = true; }

  [[nodiscard]] view_changes changes() const noexcept {
    view_changes c;
    c.page_entries      = entries_.data();
    c.num_page_entries  = entries_.size();
    c.slots             = slots_.data();
    c.num_slots         = slots_.size();
    c.counter_slots     = counters_.data();
    c.num_counter_slots = counters_.size();
    c.full_resync       = full_resync_;
    return c;
  }
  /// Forgets every change (after the engine uploaded them).
  void clear() noexcept {
    for (auto s : slots_) slot_listed_[static_cast<std::size_t>(s)] = 0;
    for (auto s : counters_) counters_listed_[static_cast<std::size_t>(s)] = 0;
    slots_.clear();
    counters_.clear();
    entries_.clear();
    full_resync_ = false;
  }

 private:
  std::vector<std::int32_t> entries_, slots_, counters_;
  std::vector<char> slot_listed_, counters_listed_;
  bool full_resync_ = false;
};

}  // namespace tangram::detail
