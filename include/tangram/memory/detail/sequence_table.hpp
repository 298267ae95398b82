// SPDX-License-Identifier: Apache-2.0
/**
 * @file memory/detail/sequence_table.hpp
 * @brief The manager's stable slots: per-slot turn state and generation, and the free-slot list.
 */
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "tangram/core/error.hpp"
#include "tangram/memory/kv_cache_types.hpp"
#include "tangram/memory/page_pool.hpp"

namespace tangram::detail {

struct kv_cache_manager_test_access;

/// @brief Turn state of one slot (the per-(slot, group) page lists live in page_table_storage).
struct sequence_state {
  std::uint32_t generation      = 1;  ///< bumped when the slot is freed: old handles go stale
  sequence_phase phase          = sequence_phase::free;
  std::int64_t prompt_remaining = 0;
  std::int64_t chunk_pending    = 0;
  std::int64_t max_new          = 0;
  std::int64_t decoded          = 0;
  std::int64_t written_tokens   = 0;  ///< most tokens seen since the last chunk: a sliding ring
                                      ///< holds positions from written_tokens - ring on (rollback)
  bool may_share       = false;       ///< forked (parent or child): pages may be shared
  bool parked_mid_turn = false;       ///< parking from decode (cancel_park returns there)
  bool pinned          = false;       ///< a registered prefix: read-only (pin_prefix)
  page_reservation reservation;       ///< pages still promised to the sequence
  /// Deferred reuse: pages returned to this sequence's own reservation (rollback, an elastic
  /// eviction's unneeded staging), kept referenced on a stack (page_flow) instead of going back
  /// through the pool: its group budgets count them beside `reservation`; draws take them first.
  page_id spare_top        = -1;
  std::int64_t spare_pages = 0;
};

/**
 * @brief Slots of live sequences and the list of free ones. `find` validates a handle and throws;
 * `take` and `release` never throw, so the manager calls them only after validating everything.
 * Invariant: the free list holds every free slot exactly once and no live one.
 */
class sequence_table {
 public:
  sequence_table() = default;
  explicit sequence_table(std::int32_t slots) : states_(static_cast<std::size_t>(slots)) {
    free_.reserve(static_cast<std::size_t>(slots));
    // Lowest slot first: the list is a stack.
    for (std::int32_t s = slots - 1; s >= 0; --s) free_.push_back(s);
  }

  [[nodiscard]] std::int32_t size() const noexcept {
    return static_cast<std::int32_t>(states_.size());
  }
  /// Sequences alive (any phase but free).
  [[nodiscard]] std::int32_t live() const noexcept {
    return size() - static_cast<std::int32_t>(free_.size());
  }
  [[nodiscard]] bool full() const noexcept { return free_.empty(); }

  [[nodiscard]] sequence_state& operator[](std::int32_t s) noexcept {
    return states_[static_cast<std::size_t>(s)];
  }
  [[nodiscard]] sequence_state const& operator[](std::int32_t s) const noexcept {
    return states_[static_cast<std::size_t>(s)];
  }

  /// True when `seq` names a live sequence.
  [[nodiscard]] bool contains(sequence_id seq) const noexcept {
    return seq.slot >= 0 && seq.slot < size() && (*this)[seq.slot].phase != sequence_phase::free &&
           (*this)[seq.slot].generation == seq.generation;
  }

  /// The slot of a live sequence. @throw logic_error naming `op` and why the handle is stale.
  std::int32_t find(sequence_id seq, char const* op) const {
    TANGRAM_EXPECTS(seq.slot >= 0 && seq.slot < size(),
                    logic_error,
                    op,
                    ": unknown sequence (slot ",
                    seq.slot,
                    " is out of range [0, ",
                    size(),
                    "))");
    auto const& st = (*this)[seq.slot];
    TANGRAM_EXPECTS(
        st.phase != sequence_phase::free && st.generation == seq.generation,
        logic_error,
        op,
        ": unknown sequence (slot ",
        seq.slot,
        ", generation ",
        seq.generation,
        "): ",
        st.phase == sequence_phase::free ? "the slot is free" : "the slot holds a newer sequence");
    return seq.slot;
  }

  /// @throw logic_error "<op>: sequence in slot s is in phase <phase><why>" unless `allowed`.
  void expect_phase(std::int32_t s, bool allowed, char const* op, char const* why) const {
    TANGRAM_EXPECTS(allowed,
                    logic_error,
                    op,
                    ": sequence in slot ",
                    s,
                    " is in phase ",
                    to_string((*this)[s].phase),
                    why);
  }

  /// @throw logic_error naming `op` when slot s is a pinned prefix (read-only; `free` unpins).
  void expect_unpinned(std::int32_t s, char const* op) const {
    TANGRAM_EXPECTS(!(*this)[s].pinned,
                    logic_error,
                    op,
                    ": sequence in slot ",
                    s,
                    " is a pinned prefix (read-only); admit requests over it with "
                    "try_admit_with_prefix, unregister it with free");
  }

  /// @throw logic_error naming `op` unless slot s is in decode with room for `tokens` more
  /// decode tokens in its turn (decoded + tokens <= max_new; tokens >= 0 checked by the caller).
  void expect_decode_room(std::int32_t s,
                          std::int64_t tokens = 1,
                          char const* op      = "decode_step") const {
    auto const& st = (*this)[s];
    expect_phase(s, st.phase == sequence_phase::decode, op, ", not decode");
    TANGRAM_EXPECTS(tokens <= st.max_new - st.decoded,
                    logic_error,
                    op,
                    ": sequence in slot ",
                    s,
                    " has appended ",
                    st.decoded,
                    " of its max_new_tokens = ",
                    st.max_new,
                    " decode tokens; ",
                    tokens,
                    " more would append past the reservation (try_extend first)");
  }
  /// @throw logic_error when slot s has a prepared, uncommitted chunk.
  void expect_no_prepared_chunk(std::int32_t s) const {
    TANGRAM_EXPECTS((*this)[s].chunk_pending == 0,
                    logic_error,
                    "prepare_chunk: sequence in slot ",
                    s,
                    " already has a prepared chunk of ",
                    (*this)[s].chunk_pending,
                    " tokens; commit it first");
  }
  /// @throw logic_error when slot s has no prepared chunk.
  void expect_prepared_chunk(std::int32_t s) const {
    TANGRAM_EXPECTS((*this)[s].chunk_pending > 0,
                    logic_error,
                    "commit_chunk: sequence in slot ",
                    s,
                    " has no prepared chunk");
  }
  /// @throw logic_error naming `op` when a chunk of `chunk_tokens` exceeds the prompt tokens left.
  void expect_chunk_fits(std::int32_t s, std::int64_t chunk_tokens, char const* op) const {
    TANGRAM_EXPECTS(chunk_tokens <= (*this)[s].prompt_remaining,
                    logic_error,
                    op,
                    ": chunk_tokens ",
                    chunk_tokens,
                    " exceeds the ",
                    (*this)[s].prompt_remaining,
                    " prompt tokens left in the turn of slot ",
                    s);
  }

  /**
   * @brief Takes a free slot for a new sequence in `phase` (precondition: !full()). Its turn
   * counters start at 0 and it holds `reservation`.
   */
  std::int32_t take(sequence_phase phase, page_reservation&& reservation) noexcept {
    std::int32_t s = free_.back();
    free_.pop_back();
    auto& st            = (*this)[s];
    st.phase            = phase;
    st.prompt_remaining = st.chunk_pending = st.max_new = st.decoded = st.written_tokens = 0;
    st.may_share = st.parked_mid_turn = st.pinned = false;
    st.reservation                                = std::move(reservation);
    st.spare_top                                  = -1;
    st.spare_pages                                = 0;
    return s;
  }

  /// Frees slot s (its reservation was returned to the pool): stale handles, slot listed free.
  void release(std::int32_t s) noexcept {
    auto& st            = (*this)[s];
    st.phase            = sequence_phase::free;
    st.prompt_remaining = st.chunk_pending = st.max_new = st.decoded = 0;
    ++st.generation;
    free_.push_back(s);  // capacity: one per slot
  }

  /// @throw logic_error when the free list holds a slot out of range, twice, or a live one, or
  /// misses a free slot (leaked: it could never be admitted again).
  void check_invariants() const {
    std::vector<char> listed(states_.size(), 0);
    for (auto s : free_) {
      TANGRAM_EXPECTS(s >= 0 && s < size(),
                      logic_error,
                      "the free list holds slot ",
                      s,
                      ", out of range [0, ",
                      size(),
                      ")");
      TANGRAM_EXPECTS(!listed[static_cast<std::size_t>(s)],
                      logic_error,
                      "slot ",
                      s,
                      " is on the free list twice");
      listed[static_cast<std::size_t>(s)] = 1;
      TANGRAM_EXPECTS((*this)[s].phase == sequence_phase::free,
                      logic_error,
                      "slot ",
                      s,
                      " is on the free list but holds a sequence in phase ",
                      to_string((*this)[s].phase));
    }
    for (std::int32_t s = 0; s < size(); ++s)
      TANGRAM_EXPECTS(
          (*this)[s].phase != sequence_phase::free || listed[static_cast<std::size_t>(s)],
          logic_error,
          "slot ",
          s,
          " is free but not on the free list (leaked: it can never be admitted again)");
  }

 private:
  friend struct kv_cache_manager_test_access;  // tests corrupt the free list on purpose

  std::vector<sequence_state> states_;
  std::vector<std::int32_t> free_;
};

}  // namespace tangram::detail
