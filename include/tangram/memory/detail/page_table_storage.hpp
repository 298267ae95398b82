// SPDX-License-Identifier: Apache-2.0
/**
 * @file memory/detail/page_table_storage.hpp
 * @brief The padded page table: one page list per (slot, group), the lists of a slot contiguous
 * in one segment of a shared page-id arena, plus each list's bookkeeping as a struct of arrays.
 */
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "tangram/core/error.hpp"
#include "tangram/memory/detail/turn_footprint.hpp"
#include "tangram/memory/page_pool.hpp"
#include "tangram/memory/segment_arena.hpp"

namespace tangram::detail {

/**
 * @brief Page lists of every (slot, group) in one page-id arena.
 *
 * A slot owns one segment of the arena; its G lists follow one another in it, list g with
 * `capacity(s, g)` entries of which the first `count(s, g)` hold pages. The per-list counters are
 * parallel arrays indexed by s * G + g, reached through named accessors. `offsets()` and `pages()`
 * are the view's `page_offset` and `pages` arrays.
 *
 * Sized at construction; every mutator is noexcept and allocation-free (callers check room with
 * `has_room` first). Writers of list entries get the arena index back, for the view journal.
 */
class page_table_storage {
 public:
  page_table_storage() = default;
  page_table_storage(std::int32_t slots, std::int32_t groups, std::int64_t arena_entries)
      : groups_(groups),
        offset_(cells(slots + 1, groups), 0),  // + the padding slot's row, zero forever
        pinned_(cells(slots + 1, groups), 0),  // the same rows
        count_(cells(slots, groups), 0),
        capacity_(cells(slots, groups), 0),
        target_(cells(slots, groups), 0),
        budget_(cells(slots, groups), 0),
        longest_base_(cells(slots, groups), 0),
        shortest_base_(cells(slots, groups), 0),
        count_before_chunk_(cells(slots, groups), 0),
        pages_(static_cast<std::size_t>(arena_entries), -1),
        segments_(arena_entries, slots),
        segment_begin_(static_cast<std::size_t>(slots), 0),
        segment_size_(static_cast<std::size_t>(slots), 0),
        pooled_budget_(static_cast<std::size_t>(slots), 0),
        pooled_limit_(static_cast<std::size_t>(slots), 0) {
    order_.reserve(static_cast<std::size_t>(slots));
  }

  // ----- per-list counters (s * G + g) -----------------------------------------------------
  /// Entries of the list that hold pages.
  std::int32_t& count(std::int32_t s, std::int32_t g) noexcept { return count_[at(s, g)]; }
  /// Entries the list may hold in its segment.
  std::int32_t& capacity(std::int32_t s, std::int32_t g) noexcept { return capacity_[at(s, g)]; }
  /// Pages the list may hold when the current turn completes.
  std::int32_t& target(std::int32_t s, std::int32_t g) noexcept { return target_[at(s, g)]; }
  /// Pages the list may still draw from the sequence's reservation.
  std::int32_t& budget(std::int32_t s, std::int32_t g) noexcept { return budget_[at(s, g)]; }
  /// Longest / shortest base length (tokens at the last compression) among the group's heads.
  std::int32_t& longest_base(std::int32_t s, std::int32_t g) noexcept {
    return longest_base_[at(s, g)];
  }
  std::int32_t& shortest_base(std::int32_t s, std::int32_t g) noexcept {
    return shortest_base_[at(s, g)];
  }
  /// Leading tokens of every head of the list that lie on read-only pages shared with a pinned
  /// prefix (a multiple of P): the view's `pinned_tokens`; the eviction keeps them in place.
  std::int32_t& pinned(std::int32_t s, std::int32_t g) noexcept { return pinned_[at(s, g)]; }
  /// Groups per slot.
  [[nodiscard]] std::int32_t num_groups() const noexcept { return groups_; }
  /// `count` when the current chunk was prepared (pages drawn by it are the ones after).
  std::int32_t& count_before_chunk(std::int32_t s, std::int32_t g) noexcept {
    return count_before_chunk_[at(s, g)];
  }
  [[nodiscard]] std::int32_t count(std::int32_t s, std::int32_t g) const noexcept {
    return count_[at(s, g)];
  }
  [[nodiscard]] std::int32_t capacity(std::int32_t s, std::int32_t g) const noexcept {
    return capacity_[at(s, g)];
  }
  [[nodiscard]] std::int32_t target(std::int32_t s, std::int32_t g) const noexcept {
    return target_[at(s, g)];
  }
  [[nodiscard]] std::int32_t budget(std::int32_t s, std::int32_t g) const noexcept {
    return budget_[at(s, g)];
  }
  [[nodiscard]] std::int32_t longest_base(std::int32_t s, std::int32_t g) const noexcept {
    return longest_base_[at(s, g)];
  }
  [[nodiscard]] std::int32_t shortest_base(std::int32_t s, std::int32_t g) const noexcept {
    return shortest_base_[at(s, g)];
  }
  [[nodiscard]] std::int32_t pinned(std::int32_t s, std::int32_t g) const noexcept {
    return pinned_[at(s, g)];
  }
  [[nodiscard]] std::int32_t offset(std::int32_t s, std::int32_t g) const noexcept {
    return offset_[at(s, g)];
  }

  // ----- entries ---------------------------------------------------------------------------
  [[nodiscard]] page_id entry(std::int32_t s, std::int32_t g, std::int64_t pos) const noexcept {
    return pages_[static_cast<std::size_t>(offset_[at(s, g)] + pos)];
  }
  /// The list of (s, g): `count(s, g)` page ids.
  [[nodiscard]] page_id const* list(std::int32_t s, std::int32_t g) const noexcept {
    return &pages_[static_cast<std::size_t>(offset_[at(s, g)])];
  }
  /// Writes entry `pos` (< capacity); returns its arena index.
  std::int64_t set_entry(std::int32_t s, std::int32_t g, std::int64_t pos, page_id p) noexcept {
    std::int64_t i                      = offset_[at(s, g)] + pos;
    pages_[static_cast<std::size_t>(i)] = p;
    return i;
  }
  /// Appends p to the list (count < capacity); returns its arena index.
  std::int64_t push(std::int32_t s, std::int32_t g, page_id p) noexcept {
    return set_entry(s, g, count_[at(s, g)]++, p);
  }
  /// Removes and returns the last page of the list (count > 0).
  page_id pop(std::int32_t s, std::int32_t g) noexcept { return entry(s, g, --count_[at(s, g)]); }
  /// Shortens the list to its first `keep` pages (keep <= count); the entries stay in the arena.
  void truncate(std::int32_t s, std::int32_t g, std::int64_t keep) noexcept {
    count_[at(s, g)] = static_cast<std::int32_t>(keep);
  }
  /// The entries after the list's last, where `extend` appends (room: capacity - count).
  page_id* tail(std::int32_t s, std::int32_t g) noexcept {
    auto a = at(s, g);
    return pages_.data() + offset_[a] + count_[a];
  }
  /// Appends the `n` entries already written at `tail(s, g)` (count + n <= capacity); returns the
  /// arena index of the first.
  std::int64_t extend(std::int32_t s, std::int32_t g, std::int32_t n) noexcept {
    auto a         = at(s, g);
    std::int64_t i = std::int64_t{offset_[a]} + count_[a];
    count_[a] += n;
    return i;
  }

  /// Pages slot s's pooled groups (elastic reservation) may still draw, together.
  std::int64_t& pooled_budget(std::int32_t s) noexcept {
    return pooled_budget_[static_cast<std::size_t>(s)];
  }
  [[nodiscard]] std::int64_t pooled_budget(std::int32_t s) const noexcept {
    return pooled_budget_[static_cast<std::size_t>(s)];
  }
  /// The most pages slot s's pooled groups may hold after a chunk's eviction.
  [[nodiscard]] std::int64_t pooled_limit(std::int32_t s) const noexcept {
    return pooled_limit_[static_cast<std::size_t>(s)];
  }
  /// @throw logic_error naming `op` unless slot s's pooled budget covers `need` more pages (an
  /// internal inconsistency: the elastic reservation covers every chunk and decode step).
  void expect_pooled_room(std::int32_t s, std::int64_t need, char const* op) const {
    TANGRAM_EXPECTS(need <= pooled_budget(s),
                    logic_error,
                    op,
                    ": the compressed groups of slot ",
                    s,
                    " need ",
                    need,
                    " more pages but ",
                    pooled_budget(s),
                    " are reserved (internal inconsistency)");
  }

  /// @throw logic_error when list (s, g) has fewer than `need` pages left in its budget (an
  /// internal inconsistency: a page is drawn only where the reservation covers it).
  void expect_budget(std::int32_t s, std::int32_t g, std::int64_t need = 1) const {
    TANGRAM_EXPECTS(need <= budget(s, g),
                    logic_error,
                    "group ",
                    g,
                    " of slot ",
                    s,
                    " needs ",
                    need,
                    " pages but its budget covers ",
                    budget(s, g),
                    ": pages beyond its reservation (internal inconsistency)");
  }
  /// @throw logic_error naming `op` unless list (s, g) can grow to `need` pages within its
  /// capacity and budget (an internal inconsistency: reservations cover every chunk).
  void expect_can_grow(std::int32_t s, std::int32_t g, std::int64_t need, char const* op) const {
    auto held = count(s, g);
    TANGRAM_EXPECTS((need > held ? need - held : 0) <= budget(s, g) && need <= capacity(s, g),
                    logic_error,
                    op,
                    ": group ",
                    g,
                    " of slot ",
                    s,
                    " needs ",
                    need,
                    " pages but holds ",
                    held,
                    " with ",
                    budget(s, g),
                    " reserved (internal inconsistency)");
  }

  // ----- segments --------------------------------------------------------------------------
  /// True when a segment of `size` entries fits (perhaps only after `compact`).
  [[nodiscard]] bool has_room(std::int64_t size) const noexcept {
    return size <= 0 || segments_.free_total() >= size;
  }
  /// True when a segment of `size` entries fits only after `compact`.
  [[nodiscard]] bool needs_compaction(std::int64_t size) const noexcept {
    return !segments_.can_allocate(size);
  }

  /**
   * @brief Gives slot s (which holds no segment) a segment of `fp.capacity_total()` entries
   * (room checked) and empty lists sized by the footprint: capacity = `fp.capacity(g)`,
   * target = `fp.target(g)`, budget = `fp.reserve(g)`, base lengths 0.
   */
  void open(std::int32_t s, turn_footprint const& fp) noexcept {
    pooled_budget_[static_cast<std::size_t>(s)] = fp.pooled_reserve();
    pooled_limit_[static_cast<std::size_t>(s)]  = fp.pooled_limit();
    std::int64_t begin                          = *segments_.allocate(fp.capacity_total());
    segment_begin_[static_cast<std::size_t>(s)] = begin;
    segment_size_[static_cast<std::size_t>(s)]  = fp.capacity_total();
    for (std::int32_t g = 0; g < groups_; ++g) {
      auto i            = at(s, g);
      offset_[i]        = static_cast<std::int32_t>(begin);
      capacity_[i]      = static_cast<std::int32_t>(fp.capacity(g));
      target_[i]        = static_cast<std::int32_t>(fp.target(g));
      budget_[i]        = static_cast<std::int32_t>(fp.reserve(g));
      count_[i]         = 0;
      longest_base_[i]  = 0;
      shortest_base_[i] = 0;
      pinned_[i]        = 0;
      begin += fp.capacity(g);
    }
  }

  /// Moves slot s's lists to a new segment with capacities `fp.capacity(g)` (>= count; room
  /// checked), keeping their entries.
  void relocate(std::int32_t s, turn_footprint const& fp) noexcept {
    std::int64_t begin = *segments_.allocate(fp.capacity_total());
    std::int64_t to    = begin;
    for (std::int32_t g = 0; g < groups_; ++g) {
      auto i = at(s, g);
      std::memmove(&pages_[static_cast<std::size_t>(to)],
                   &pages_[static_cast<std::size_t>(offset_[i])],
                   static_cast<std::size_t>(count_[i]) * sizeof(page_id));
      offset_[i]   = static_cast<std::int32_t>(to);
      capacity_[i] = static_cast<std::int32_t>(fp.capacity(g));
      to += fp.capacity(g);
    }
    segments_.free(segment_begin_[static_cast<std::size_t>(s)],
                   segment_size_[static_cast<std::size_t>(s)]);
    segment_begin_[static_cast<std::size_t>(s)] = begin;
    segment_size_[static_cast<std::size_t>(s)]  = fp.capacity_total();
  }

  /// A new turn sized by `fp` (lists already relocated if they grow): each group's target and
  /// budget, and the counts its first chunk starts from.
  void start_turn(std::int32_t s, turn_footprint const& fp) noexcept {
    pooled_budget_[static_cast<std::size_t>(s)] = fp.pooled_reserve();
    pooled_limit_[static_cast<std::size_t>(s)]  = fp.pooled_limit();
    for (std::int32_t g = 0; g < groups_; ++g) {
      auto i                 = at(s, g);
      target_[i]             = static_cast<std::int32_t>(fp.target(g));
      budget_[i]             = static_cast<std::int32_t>(fp.reserve(g));
      count_before_chunk_[i] = count_[i];
    }
  }

  /// A running turn grows (`try_extend`; lists already relocated if they grow): each group's
  /// target becomes `fp.target(g)` and its budget gains `fp.reserve(g)`; the pooled budget gains
  /// `fp.pooled_reserve()` (its limit is unchanged).
  void extend_turn(std::int32_t s, turn_footprint const& fp) noexcept {
    pooled_budget_[static_cast<std::size_t>(s)] += fp.pooled_reserve();
    for (std::int32_t g = 0; g < groups_; ++g) {
      auto i     = at(s, g);
      target_[i] = static_cast<std::int32_t>(fp.target(g));
      budget_[i] += static_cast<std::int32_t>(fp.reserve(g));
    }
  }

  /// The turn ended (surplus pages released): nothing more may be drawn, the lists are the target.
  void end_turn(std::int32_t s) noexcept {
    pooled_budget_[static_cast<std::size_t>(s)] = 0;
    for (std::int32_t g = 0; g < groups_; ++g) {
      auto i     = at(s, g);
      budget_[i] = 0;
      target_[i] = count_[i];
    }
  }

  /// Empties slot s's lists (their pages were released) and returns its segment to the arena.
  void close(std::int32_t s) noexcept {
    pooled_budget_[static_cast<std::size_t>(s)] = pooled_limit_[static_cast<std::size_t>(s)] = 0;
    for (std::int32_t g = 0; g < groups_; ++g) {
      auto i = at(s, g);
      // offset_ and pinned_ (view rows) keep their values, as the mirror does: a free slot is in
      // no batch, and `open` resets both under a journal note.
      count_[i] = capacity_[i] = target_[i] = budget_[i] = 0;
    }
    segments_.free(segment_begin_[static_cast<std::size_t>(s)],
                   segment_size_[static_cast<std::size_t>(s)]);
    segment_begin_[static_cast<std::size_t>(s)] = segment_size_[static_cast<std::size_t>(s)] = 0;
  }

  /// Moves every segment to the front of the arena, in address order (free space in one block).
  void compact() noexcept {
    order_.clear();
    auto slots = static_cast<std::int32_t>(segment_size_.size());
    for (std::int32_t s = 0; s < slots; ++s)
      if (segment_size_[static_cast<std::size_t>(s)] > 0) order_.push_back(s);
    std::sort(order_.begin(), order_.end(), [&](std::int32_t a, std::int32_t b) {
      return segment_begin_[static_cast<std::size_t>(a)] <
             segment_begin_[static_cast<std::size_t>(b)];
    });
    std::int64_t to = 0;
    for (auto s : order_) {
      auto& begin = segment_begin_[static_cast<std::size_t>(s)];
      auto size   = segment_size_[static_cast<std::size_t>(s)];
      if (begin != to) {
        std::memmove(&pages_[static_cast<std::size_t>(to)],
                     &pages_[static_cast<std::size_t>(begin)],
                     static_cast<std::size_t>(size) * sizeof(page_id));
        auto delta = static_cast<std::int32_t>(to - begin);
        for (std::int32_t g = 0; g < groups_; ++g) offset_[at(s, g)] += delta;
        begin = to;
      }
      to += size;
    }
    segments_.reset(to);
  }

  // ----- view arrays -----------------------------------------------------------------------
  [[nodiscard]] std::int32_t const* offsets() const noexcept { return offset_.data(); }
  [[nodiscard]] std::int32_t const* pinned_tokens() const noexcept { return pinned_.data(); }
  [[nodiscard]] page_id const* pages() const noexcept { return pages_.data(); }
  [[nodiscard]] std::int64_t arena_entries() const noexcept {
    return static_cast<std::int64_t>(pages_.size());
  }

  // ----- checks ----------------------------------------------------------------------------
  /**
   * @brief Checks slot s's lists: contiguous in its segment, count within capacity and at least
   * `in_use(g)`, budgets non-negative, page ids in [0, pool_pages); adds one owner per listed
   * page to `owners`. @return the sum of the slot's budgets. @throw logic_error on the first
   * inconsistency.
   */
  template <class InUse>
  std::int64_t check_slot(std::int32_t s,
                          InUse in_use,
                          std::int64_t pool_pages,
                          std::vector<std::uint32_t>& owners) const {
    std::int64_t budget = pooled_budget(s);
    TANGRAM_EXPECTS(budget >= 0, logic_error, "slot ", s, ": negative pooled budget ", budget);
    std::int64_t expect = segment_begin_[static_cast<std::size_t>(s)];
    for (std::int32_t g = 0; g < groups_; ++g) {
      auto i = at(s, g);
      budget += budget_[i];
      TANGRAM_EXPECTS(offset_[i] == expect,
                      logic_error,
                      "slot ",
                      s,
                      " group ",
                      g,
                      ": page_offset ",
                      offset_[i],
                      " expected ",
                      expect);
      expect += capacity_[i];
      TANGRAM_EXPECTS(count_[i] >= 0 && count_[i] <= capacity_[i],
                      logic_error,
                      "slot ",
                      s,
                      " group ",
                      g,
                      ": ",
                      count_[i],
                      " pages exceed capacity ",
                      capacity_[i]);
      TANGRAM_EXPECTS(count_[i] >= in_use(g),
                      logic_error,
                      "slot ",
                      s,
                      " group ",
                      g,
                      ": ",
                      count_[i],
                      " pages but heads use ",
                      in_use(g));
      TANGRAM_EXPECTS(budget_[i] >= 0, logic_error, "slot ", s, " group ", g, ": negative budget");
      for (std::int32_t p = 0; p < count_[i]; ++p) {
        page_id pg = entry(s, g, p);
        TANGRAM_EXPECTS(
            pg >= 0 && pg < pool_pages, logic_error, "slot ", s, " group ", g, ": bad page ", pg);
        ++owners[static_cast<std::size_t>(pg)];
      }
    }
    TANGRAM_EXPECTS(expect <= segment_begin_[static_cast<std::size_t>(s)] +
                                  segment_size_[static_cast<std::size_t>(s)],
                    logic_error,
                    "slot ",
                    s,
                    ": lists overflow segment");
    return budget;
  }

  /// @throw logic_error when the segments of the slots `live(s)` selects overlap.
  template <class Live>
  void check_segments(Live live) const {
    std::vector<std::pair<std::int64_t, std::int64_t>> segs;
    for (std::size_t s = 0; s < segment_size_.size(); ++s)
      if (live(static_cast<std::int32_t>(s)))
        segs.emplace_back(segment_begin_[s], segment_size_[s]);
    std::sort(segs.begin(), segs.end());
    for (std::size_t k = 1; k < segs.size(); ++k)
      TANGRAM_EXPECTS(
          segs[k - 1].first + segs[k - 1].second <= segs[k].first || segs[k - 1].second == 0,
          logic_error,
          "page-id segments overlap at ",
          segs[k].first);
  }

 private:
  static std::size_t cells(std::int32_t slots, std::int32_t groups) noexcept {
    return static_cast<std::size_t>(slots) * static_cast<std::size_t>(groups);
  }
  [[nodiscard]] std::size_t at(std::int32_t s, std::int32_t g) const noexcept {
    return static_cast<std::size_t>(s) * static_cast<std::size_t>(groups_) +
           static_cast<std::size_t>(g);
  }

  std::int32_t groups_ = 0;
  std::vector<std::int32_t> offset_, pinned_, count_, capacity_, target_, budget_;
  std::vector<std::int32_t> longest_base_, shortest_base_, count_before_chunk_;
  std::vector<page_id> pages_;
  segment_arena segments_;
  std::vector<std::int64_t> segment_begin_, segment_size_;  ///< per slot
  std::vector<std::int64_t> pooled_budget_, pooled_limit_;  ///< per slot
  std::vector<std::int32_t> order_;                         ///< compaction scratch
};

}  // namespace tangram::detail
