// SPDX-License-Identifier: Apache-2.0
/**
 * @file memory/detail/view_assembly.hpp
 * @brief The batch view, its array extents and a sequence's summary, assembled from the manager's
 * parts. Pure and
 * allocation-free: a view is a set of pointers into arrays the parts own.
 */
#pragma once

#include <cstddef>
#include <cstdint>

#include "tangram/core/kv_view.hpp"
#include "tangram/core/page_layout.hpp"
#include "tangram/memory/detail/batch_membership.hpp"
#include "tangram/memory/detail/group_lookup.hpp"
#include "tangram/memory/detail/head_lengths.hpp"
#include "tangram/memory/detail/page_table_storage.hpp"
#include "tangram/memory/detail/sequence_table.hpp"
#include "tangram/memory/kv_cache_types.hpp"

namespace tangram::detail {

/// The view over the parts' arrays and the arena at `pool_base`; valid while they are unchanged.
[[nodiscard]] inline kv_cache_view assemble_view(std::byte* pool_base,
                                                 page_geometry const& geometry,
                                                 group_lookup const& groups,
                                                 page_table_storage const& page_table,
                                                 head_lengths const& lengths,
                                                 batch_membership const& batch) noexcept {
  kv_cache_view v;
  v.pool             = pool_base;
  v.geometry         = geometry;
  v.num_layers       = groups.num_layers();
  v.num_kv_heads     = groups.num_kv_heads();
  v.num_groups       = groups.num_groups();
  v.head_slots       = groups.head_slots();
  v.group_window     = groups.windows();
  v.group_ring_pages = groups.ring_page_counts();
  v.page_offset      = page_table.offsets();
  v.pinned_tokens    = page_table.pinned_tokens();
  v.pages            = page_table.pages();
  v.head_base_len    = lengths.base_array();
  v.appended         = lengths.appended_array();
  v.seq_tokens       = lengths.tokens_array();
  v.batch_size       = batch.size();
  v.batch_slots      = batch.slots();
  v.padding_slot     = batch.padding_slot();
  return v;
}

/// Element counts of the arrays behind `assemble_view` for `slots` sequence slots plus the
/// padding slot (its zero rows are part of every per-slot array); `batch` is each batch's
/// capacity (max_batch), not its current size.
[[nodiscard]] inline kv_view_extents assemble_extents(std::int64_t sequence_slots,
                                                      group_lookup const& groups,
                                                      page_table_storage const& page_table,
                                                      batch_membership const& batch) noexcept {
  std::int64_t heads = groups.num_heads();
  std::int64_t slots = sequence_slots + 1;  // the padding slot's row
  kv_view_extents e;
  e.head_slots    = heads;
  e.groups        = groups.num_groups();
  e.page_offset   = slots * groups.num_groups();
  e.pages         = page_table.arena_entries();
  e.head_base_len = slots * heads;
  e.slots         = slots;
  e.batch         = batch.max_size();
  return e;
}

/// What `info` reports for sequence `id` in slot s.
[[nodiscard]] inline sequence_info assemble_info(sequence_id id,
                                                 std::int32_t s,
                                                 sequence_table const& sequences,
                                                 head_lengths const& lengths,
                                                 page_table_storage const& page_table) noexcept {
  auto const& st = sequences[s];
  sequence_info i;
  i.id               = id;
  i.phase            = st.phase;
  i.pinned           = st.pinned;
  i.seq_tokens       = lengths.tokens(s);
  i.appended         = lengths.appended(s);
  i.prompt_remaining = st.prompt_remaining;
  i.chunk_pending    = st.chunk_pending;
  i.max_new          = st.max_new;
  i.decoded          = st.decoded;
  i.reserved_pages   = st.reservation.pages() + st.spare_pages;  // spares: deferred reuse
  for (std::int32_t g = 0; g < page_table.num_groups(); ++g) i.held_pages += page_table.count(s, g);
  return i;
}

}  // namespace tangram::detail
