// SPDX-License-Identifier: Apache-2.0
/**
 * @file memory/detail/manager_invariants.hpp
 * @brief The KV-cache manager's full self-check: each part checks its own data, this adds what
 * spans parts (page references, reservations, segments).
 */
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "tangram/core/error.hpp"
#include "tangram/memory/detail/batch_membership.hpp"
#include "tangram/memory/detail/copy_on_write.hpp"
#include "tangram/memory/detail/head_lengths.hpp"
#include "tangram/memory/detail/page_table_storage.hpp"
#include "tangram/memory/detail/sequence_table.hpp"
#include "tangram/memory/kv_cache_types.hpp"

namespace tangram::detail {

/**
 * @brief Checks that the padding slot (slot `slots`, what padding requests name) holds nothing:
 * its `page_offset` row (G entries), `head_base_len` row, `appended` and `seq_tokens` are zero.
 * @throw logic_error naming the array and the value.
 */
inline void check_padding_slot(std::int32_t slots,
                               std::int32_t groups,
                               page_table_storage const& page_table,
                               head_lengths const& lengths) {
  for (std::int32_t g = 0; g < groups; ++g) {
    auto v = page_table.offsets()[static_cast<std::size_t>(slots) * static_cast<std::size_t>(groups) +
                                  static_cast<std::size_t>(g)];
    TANGRAM_EXPECTS(
        v == 0, logic_error, "padding slot ", slots, ": page_offset of group ", g, " is ", v);
    auto q = page_table.pinned_tokens()[static_cast<std::size_t>(slots) *
                                            static_cast<std::size_t>(groups) +
                                        static_cast<std::size_t>(g)];
    TANGRAM_EXPECTS(
        q == 0, logic_error, "padding slot ", slots, ": pinned_tokens of group ", g, " is ", q);
  }
  for (std::int32_t h = 0; h < lengths.heads(); ++h)
    TANGRAM_EXPECTS(lengths.base(slots)[h] == 0,
                    logic_error,
                    "padding slot ",
                    slots,
                    ": head_base_len of head ",
                    h,
                    " is ",
                    lengths.base(slots)[h]);
  TANGRAM_EXPECTS(lengths.appended(slots) == 0 && lengths.tokens(slots) == 0,
                  logic_error,
                  "padding slot ",
                  slots,
                  ": appended ",
                  lengths.appended(slots),
                  " and seq_tokens ",
                  lengths.tokens(slots),
                  " must be 0");
}

/**
 * @brief Checks the free-slot list, that reference counts equal the number of
 * page lists and pending copies holding each page, that reservations add up to the pool's
 * reserved count, that every list fits its capacity and holds what its heads use
 * (`in_use(s, g)` pages), and that segments do not overlap. O(pool + all page lists); allocates.
 * @throw logic_error describing the first inconsistency.
 */
template <class Pool, class InUse, class Spares>
void check_manager_invariants(Pool const& pool,
                              sequence_table const& sequences,
                              page_table_storage const& page_table,
                              copy_on_write const& copies,
                              InUse in_use,
                              Spares for_each_spare) {
  pool.check_invariants();
  sequences.check_invariants();
  std::vector<std::uint32_t> owners(static_cast<std::size_t>(pool.capacity()), 0);
  std::int64_t reserved = 0;
  for (std::int32_t s = 0; s < sequences.size(); ++s) {
    auto const& st = sequences[s];
    if (st.phase == sequence_phase::free) {
      TANGRAM_EXPECTS(st.reservation.empty() && st.spare_pages == 0,
                      logic_error,
                      "free slot ",
                      s,
                      " holds a reservation or spare pages");
      continue;
    }
    // Deferred reuse: each spare holds one reference and backs one unit of the budgets.
    std::int64_t spares = 0;
    for_each_spare(s, [&](page_id p) {
      TANGRAM_EXPECTS(p >= 0 && p < pool.capacity() && spares < pool.capacity(),
                      logic_error,
                      "slot ",
                      s,
                      ": spare page ",
                      p,
                      " out of range, or a cycle in its spare stack");
      ++owners[static_cast<std::size_t>(p)];
      ++spares;
    });
    TANGRAM_EXPECTS(spares == st.spare_pages,
                    logic_error,
                    "slot ",
                    s,
                    ": ",
                    spares,
                    " pages on its spare stack but spare_pages says ",
                    st.spare_pages);
    TANGRAM_EXPECTS(pool.owns(st.reservation), logic_error, "slot ", s, ": foreign reservation");
    reserved += st.reservation.pages();
    auto budget = page_table.check_slot(
        s, [&](std::int32_t g) { return in_use(s, g); }, pool.capacity(), owners);
    TANGRAM_EXPECTS(budget == st.reservation.pages() + spares,
                    logic_error,
                    "slot ",
                    s,
                    ": group budgets sum to ",
                    budget,
                    " but the reservation holds ",
                    st.reservation.pages(),
                    " (and ",
                    spares,
                    " spare pages)");
  }
  copies.count_references(owners);
  for (std::int64_t p = 0; p < pool.capacity(); ++p)
    TANGRAM_EXPECTS(owners[static_cast<std::size_t>(p)] == pool.ref_count(static_cast<page_id>(p)),
                    logic_error,
                    "page ",
                    p,
                    ": reference count ",
                    pool.ref_count(static_cast<page_id>(p)),
                    " but ",
                    owners[static_cast<std::size_t>(p)],
                    " owners");
  TANGRAM_EXPECTS(reserved == pool.reserved_pages(),
                  logic_error,
                  "reservations sum to ",
                  reserved,
                  " but the pool reserved ",
                  pool.reserved_pages());
  TANGRAM_EXPECTS(pool.used_pages() + pool.reserved_pages() <= pool.capacity(),
                  logic_error,
                  "used + reserved exceeds capacity");
  page_table.check_segments(
      [&](std::int32_t s) { return sequences[s].phase != sequence_phase::free; });
}

}  // namespace tangram::detail
