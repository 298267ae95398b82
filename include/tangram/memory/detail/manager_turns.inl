// SPDX-License-Identifier: Apache-2.0
/**
 * @file memory/detail/manager_turns.inl
 * @brief Bodies of `basic_kv_cache_manager` (memory/kv_cache_manager.hpp): turns and forks
 * (end_turn, continue_turn, fork). Included by the facade only.
 */
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <utility>

#include "tangram/memory/detail/manager_checks.hpp"

namespace tangram {

template <class Layout>
void basic_kv_cache_manager<Layout>::end_turn(sequence_id seq) {
  std::int32_t s = sequences_.find(seq, "end_turn");
  auto& st       = sequences_[s];
  sequences_.expect_phase(s,
                          st.phase == sequence_phase::decode,
                          "end_turn",
                          "; a turn ends after its prompt is prefilled");
  pool_.release_unused(st.reservation);
  flow_.release_spares(s);  // deferred reuse: they retire
  for (std::int32_t g = 0; g < groups_.num_groups(); ++g)
    flow_.release_tail(s, g, usage_.in_use(s, g));
  page_table_.end_turn(s);
  st.phase = sequence_phase::ended;
}

template <class Layout>
bool basic_kv_cache_manager<Layout>::continue_turn(sequence_id seq,
                                                   std::int64_t prompt_tokens,
                                                   std::int64_t max_new_tokens) {
  std::int32_t s = sequences_.find(seq, "continue_turn");
  auto& st       = sequences_[s];
  sequences_.expect_phase(
      s, st.phase == sequence_phase::ended, "continue_turn", "; call end_turn first");
  sequences_.expect_unpinned(s, "continue_turn");
  std::int64_t n = lengths_.tokens(s);
  detail::check_turn_sizes("continue_turn", n, prompt_tokens, max_new_tokens);
  usage_.size_turn(detail::turn_kind::next_turn,
                   s,
                   n + prompt_tokens,
                   prompt_tokens,
                   max_new_tokens,
                   footprint_);
  bool relocate = footprint_.grows_capacity();
  if (!footprint_fits(relocate)) {
    ++stats_.continue_rejected;
    return false;
  }
  copies_.reserve(footprint_.copies_total());  // the only allocation, before any change
  // Checked: nothing below fails.
  if (relocate) {
    page_table_.relocate(s, footprint_);
    journal_.note_full_resync();
  }
  (void)pool_.try_extend(st.reservation, footprint_.reserve_total());
  page_table_.start_turn(s, footprint_);
  for (std::int32_t g = 0; g < groups_.num_groups(); ++g) {
    auto keep   = std::min<std::int64_t>(page_table_.count(s, g), footprint_.target(g));
    auto pinned = std::min(usage_.kept_unwritten(s, g, n + prompt_tokens), keep);
    flow_.copy_shared_head(s, g, pinned, keep);
    if (!groups_.append_only(g))  // a turn never grows the pin; it may only drop pages of it
      page_table_.pinned(s, g) = std::min(
          page_table_.pinned(s, g), static_cast<std::int32_t>(pinned * groups_.page_tokens()));
  }
  st.phase            = sequence_phase::prefill;
  st.prompt_remaining = prompt_tokens;
  st.chunk_pending    = 0;
  st.max_new          = max_new_tokens;
  st.decoded          = 0;
  journal_.note_slot(s);
  ++stats_.turns_continued;
  return true;
}

template <class Layout>
std::optional<sequence_id> basic_kv_cache_manager<Layout>::fork(sequence_id parent) {
  std::int32_t s = sequences_.find(parent, "fork");
  sequences_.expect_phase(
      s,
      sequences_[s].phase == sequence_phase::decode || sequences_[s].phase == sequence_phase::ended,
      "fork",
      "; fork after the prompt is prefilled");
  usage_.size_turn(detail::turn_kind::fork, s, 0, 0, 0, footprint_);
  if (sequences_.full() || !footprint_fits(/*relocates=*/true)) {
    ++stats_.fork_rejected;
    return std::nullopt;
  }
  copies_.reserve(footprint_.copies_total());  // the only allocation, before any change
  // Checked: nothing below fails.
  std::int32_t c = sequences_.take(sequences_[s].phase,
                                   std::move(*pool_.try_reserve(footprint_.reserve_total())));
  auto& ps       = sequences_[s];
  auto& cs       = sequences_[c];
  page_table_.open(c, footprint_);
  for (std::int32_t g = 0; g < groups_.num_groups(); ++g) {
    auto shared = usage_.shareable(s, g);
    flow_.share_into_fork(s, c, g, shared, usage_.in_use(s, g));
    // The parent's pinned prefix pages are among the shared ones: the child keeps them pinned.
    page_table_.pinned(c, g) = std::min(page_table_.pinned(s, g),
                                        static_cast<std::int32_t>(shared * groups_.page_tokens()));
  }
  lengths_.copy(s, c);
  cs.max_new        = ps.max_new;
  cs.decoded        = ps.decoded;
  cs.written_tokens = ps.written_tokens;
  cs.may_share = ps.may_share = true;
  flow_.rebuild_buckets(c);
  journal_.note_slot(c);
  ++stats_.forks;
  return sequence_id{c, cs.generation};
}

}  // namespace tangram
