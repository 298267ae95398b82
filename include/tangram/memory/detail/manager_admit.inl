// SPDX-License-Identifier: Apache-2.0
/**
 * @file memory/detail/manager_admit.inl
 * @brief Bodies of `basic_kv_cache_manager` (memory/kv_cache_manager.hpp): construction,
 * admission, whether a sized turn fits, and releasing a sequence. Included by the facade only.
 */
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>

#include "tangram/memory/detail/manager_checks.hpp"
#include "tangram/memory/detail/parking.hpp"

namespace tangram {

template <class Layout>
basic_kv_cache_manager<Layout>::basic_kv_cache_manager(static_plan const& plan,
                                                       resource_ref upstream,
                                                       manager_options const& options)
    : plan_(detail::checked_plan(plan)),
      fingerprint_(plan_fingerprint(plan_)),
      options_(detail::checked_options(options, plan)),
      pool_(upstream, Layout(plan.geometry), options_.num_pages, options_.deferred_reuse),
      groups_(plan_),
      sequences_(options_.max_sequences),
      page_table_(options_.max_sequences, groups_.num_groups(), options_.index_capacity),
      // + the padding slot's row (slot max_sequences): zero forever, read by padding requests
      lengths_(options_.max_sequences + 1, groups_.num_heads()),
      buckets_(options_.max_sequences, groups_.page_tokens(), groups_.growing_groups()),
      batches_{detail::batch_membership(options_.max_batch, options_.max_sequences),
               detail::batch_membership(options_.max_batch, options_.max_sequences)},
      journal_(options_.max_view_changes, options_.max_sequences),
      footprint_(groups_.num_groups()),
      usage_(groups_,
             sequences_,
             page_table_,
             lengths_,
             pool_,
             options_.max_chunk_tokens,
             options_.share_compressed_prefix),
      flow_(groups_, sequences_, page_table_, lengths_, buckets_, journal_, copies_, pool_, stats_),
      chunk_need_(static_cast<std::size_t>(groups_.num_groups()), 0) {}

template <class Layout>
admit_result basic_kv_cache_manager<Layout>::admit_checked(char const* op,
                                                           std::int64_t prompt_tokens,
                                                           std::int64_t max_new_tokens) {
  detail::check_turn_sizes(op, 0, prompt_tokens, max_new_tokens);
  usage_.size_turn(
      detail::turn_kind::admit, -1, prompt_tokens, prompt_tokens, max_new_tokens, footprint_);
  admit_result r;
  std::int64_t pages = footprint_.reserve_total();
  r.pages_needed     = pages;
  r.pages_retired    = pool_.retired_pages();
  r.reason           = detail::admission_failure(pages,
                                       footprint_.capacity_total(),
                                       pool_.capacity(),
                                       pool_.available_pages(),
                                       r.pages_retired,
                                       page_table_.arena_entries(),
                                       sequences_.full(),
                                       r.pages_missing);
  if (r.reason == admit_failure::none && !flow_.make_index_room(footprint_.capacity_total()))
    r.reason = admit_failure::page_table_arena_full;
  if (r.reason != admit_failure::none) {
    ++stats_.rejected;
    return r;
  }
  // Checked: nothing below fails.
  std::int32_t s = sequences_.take(sequence_phase::prefill, std::move(*pool_.try_reserve(pages)));
  auto& st       = sequences_[s];
  st.prompt_remaining = prompt_tokens;
  st.max_new          = max_new_tokens;
  page_table_.open(s, footprint_);
  lengths_.reset(s);
  buckets_.reset(s);
  journal_.note_slot(s);
  ++stats_.admitted;
  r.id = sequence_id{s, st.generation};
  return r;
}

template <class Layout>
bool basic_kv_cache_manager<Layout>::footprint_fits(bool relocates) {
  return footprint_.reserve_total() <= pool_.available_pages() &&
         (!relocates || flow_.make_index_room(footprint_.capacity_total()));
}

template <class Layout>
void basic_kv_cache_manager<Layout>::release_sequence(std::int32_t s) {
  flow_.release_all(s);
  page_table_.close(s);
  pool_.release_unused(sequences_[s].reservation);
  lengths_.appended(s) = lengths_.tokens(s) = 0;
  journal_.note_counters(s);
  sequences_.release(s);
}

}  // namespace tangram
