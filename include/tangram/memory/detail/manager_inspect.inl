// SPDX-License-Identifier: Apache-2.0
/**
 * @file memory/detail/manager_inspect.inl
 * @brief Bodies of `basic_kv_cache_manager` (memory/kv_cache_manager.hpp): views and inspection
 * (view, for_each_sequence, sequences, head_len, elastic_wanted_tokens, check_invariants).
 * Included by the facade only.
 */
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "tangram/memory/detail/manager_invariants.hpp"

namespace tangram {

template <class Layout>
kv_cache_view basic_kv_cache_manager<Layout>::view(batch_kind kind) const {
  check_batch_live(kind, "view");
  return detail::assemble_view(
      pool_.base(), plan_.geometry, groups_, page_table_, lengths_, batch_of(kind, "view"));
}

template <class Layout>
template <class F>
void basic_kv_cache_manager<Layout>::for_each_sequence(F&& f) const {
  for (std::int32_t s = 0; s < sequences_.size(); ++s) {
    if (sequences_[s].phase == sequence_phase::free) continue;
    f(detail::assemble_info(
        sequence_id{s, sequences_[s].generation}, s, sequences_, lengths_, page_table_));
  }
}

template <class Layout>
std::vector<sequence_info> basic_kv_cache_manager<Layout>::sequences() const {
  std::vector<sequence_info> out;
  out.reserve(static_cast<std::size_t>(sequences_.live()));
  for_each_sequence([&](sequence_info const& i) { out.push_back(i); });
  return out;
}

template <class Layout>
std::int64_t basic_kv_cache_manager<Layout>::head_len(sequence_id seq,
                                                      std::int32_t layer,
                                                      std::int32_t head) const {
  std::int32_t s = sequences_.find(seq, "head_len");
  groups_.check_head(layer, head, "head_len");
  return usage_.head_tokens(s, layer * groups_.num_kv_heads() + head);
}

template <class Layout>
std::int64_t basic_kv_cache_manager<Layout>::elastic_wanted_tokens(sequence_id seq) const {
  std::int32_t s = sequences_.find(seq, "elastic_wanted_tokens");
  return groups_.pooled_wanted(static_cast<std::int64_t>(lengths_.tokens(s)) +
                               sequences_[s].chunk_pending);
}

/// Leading tokens of every head of group g of `seq` on read-only pages shared with a pinned
/// prefix (`try_admit_with_prefix`): a compressed group's eviction keeps them in place (an
/// uncompressed group's are the prefix tokens it appends after). 0 for a sequence not admitted
/// over a prefix (or a fork of one) and for a sliding group. @throw logic_error for an unknown
/// sequence/group.
template <class Layout>
std::int32_t basic_kv_cache_manager<Layout>::group_pinned_tokens(sequence_id seq,
                                                                 std::int32_t g) const {
  return page_table_.pinned(checked_group(seq, g, "group_pinned_tokens"), g);
}

template <class Layout>
void basic_kv_cache_manager<Layout>::check_invariants() const {
  for (auto const& b : batches_) b.check_invariants();
  detail::check_padding_slot(sequences_.size(), groups_.num_groups(), page_table_, lengths_);
  for (std::int32_t s = 0; s < sequences_.size(); ++s)
    if (sequences_[s].phase != sequence_phase::free) usage_.check_pinned(s);
  detail::check_manager_invariants(
      pool_,
      sequences_,
      page_table_,
      copies_,
      [&](std::int32_t s, std::int32_t g) { return usage_.in_use(s, g); },
      [&](std::int32_t s, auto&& f) { flow_.for_each_spare(s, f); });
}

template <class Layout>
std::int32_t basic_kv_cache_manager<Layout>::checked_group(sequence_id seq,
                                                           std::int32_t g,
                                                           char const* op) const {
  std::int32_t s = sequences_.find(seq, op);
  groups_.check_group(g, op);
  return s;
}

}  // namespace tangram
