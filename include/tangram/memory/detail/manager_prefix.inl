// SPDX-License-Identifier: Apache-2.0
/**
 * @file memory/detail/manager_prefix.inl
 * @brief Bodies of `basic_kv_cache_manager` (memory/kv_cache_manager.hpp): shared prefixes
 * (pin_prefix, try_admit_with_prefix). Included by the facade only.
 *
 * A prefix is an ended sequence (a system prompt prefilled as a normal request, then `end_turn`)
 * that `pin_prefix` makes read-only. `try_admit_with_prefix(prefix, N, T)` admits a request whose
 * first N prompt tokens follow the prefix: its page lists start with the prefix's pages by
 * reference count. Pages every head of a growing group has filled stay shared for the request's
 * whole life: an append-only (uncompressed) group never writes them again, and a compressed
 * group's eviction keeps them in place as pinned tokens (kv_cache_view::pinned_tokens; at most
 * every head's budget over n + N, `page_usage::pin_cap`; none when
 * `manager_options::share_compressed_prefix` is off). The other kept pages (sliding rings, a
 * partly filled last page) are copied on write exactly as `continue_turn` on a fork copies them.
 * The request's budgets charge every prefix token it attends (its targets are those of a turn over
 * n + N tokens), the shared pages held without a reservation; the pool counts a shared page once.
 * `free(prefix)` unregisters it: its references go, and each page returns to the pool when its last
 * request frees or parks it.
 */
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <utility>

#include "tangram/memory/detail/manager_checks.hpp"

namespace tangram {

/// Makes ended `seq` a read-only prefix (again: no change). O(1).
/// @throw logic_error (nothing changed) for an unknown sequence or one not ended.
template <class Layout>
void basic_kv_cache_manager<Layout>::pin_prefix(sequence_id seq) {
  std::int32_t s = sequences_.find(seq, "pin_prefix");
  auto& st       = sequences_[s];
  sequences_.expect_phase(
      s, st.phase == sequence_phase::ended, "pin_prefix", "; pin a prefix after end_turn");
  st.pinned = true;
}

/// A new sequence in prefill over pinned `prefix` (n tokens) with N prompt and T decode tokens,
/// all or nothing. O(groups + prefix pages). Copies are recorded in `pending_copies`.
/// @return the sequence, or nullopt ("does not fit": pages, a slot or page-id arena room; only
///         `stats().prefix_rejected` changes, the arena may have been repacked).
/// @throw logic_error for an unknown prefix; invalid_argument naming `prefix` when it is not
///        pinned, or the sizes (N < 1, T < 0, n + N + T past 2^31 - 1); std::bad_alloc when the
///        pending-copy list cannot grow. Nothing changes when it throws.
template <class Layout>
std::optional<sequence_id> basic_kv_cache_manager<Layout>::try_admit_with_prefix(
    sequence_id prefix, std::int64_t prompt_tokens, std::int64_t max_new_tokens) {
  char const* op = "try_admit_with_prefix";
  std::int32_t s = sequences_.find(prefix, op);
  TANGRAM_EXPECTS(sequences_[s].pinned,
                  invalid_argument,
                  op,
                  ": prefix (slot ",
                  s,
                  ", phase ",
                  to_string(sequences_[s].phase),
                  ") is not pinned; call pin_prefix on an ended sequence first");
  std::int64_t n = lengths_.tokens(s);
  detail::check_turn_sizes(op, n, prompt_tokens, max_new_tokens);
  usage_.size_turn(
      detail::turn_kind::prefix, s, n + prompt_tokens, prompt_tokens, max_new_tokens, footprint_);
  if (sequences_.full() || !footprint_fits(/*relocates=*/true)) {
    ++stats_.prefix_rejected;
    return std::nullopt;
  }
  copies_.reserve(footprint_.copies_total());  // the only allocation, before any change
  // Checked: nothing below fails.
  std::int32_t c = sequences_.take(sequence_phase::prefill,
                                   std::move(*pool_.try_reserve(footprint_.reserve_total())));
  auto& ps       = sequences_[s];
  auto& cs       = sequences_[c];
  page_table_.open(c, footprint_);
  for (std::int32_t g = 0; g < groups_.num_groups(); ++g) {
    auto held = page_table_.count(s, g);
    flow_.share_into_fork(s, c, g, held, held);  // every page by reference
  }
  lengths_.copy(s, c);
  cs.may_share = ps.may_share = true;
  cs.written_tokens           = ps.written_tokens;
  page_table_.start_turn(c, footprint_);
  std::int64_t kept_shared = 0;
  for (std::int32_t g = 0; g < groups_.num_groups(); ++g) {
    auto keep   = std::min<std::int64_t>(page_table_.count(c, g), footprint_.target(g));
    auto pinned = std::min(usage_.prefix_shared(s, g, n + prompt_tokens), keep);
    flow_.copy_shared_head(c, g, pinned, keep);
    page_table_.pinned(c, g) = static_cast<std::int32_t>(pinned * groups_.page_tokens());
    kept_shared += pinned;
  }
  cs.prompt_remaining = prompt_tokens;
  cs.max_new          = max_new_tokens;
  flow_.rebuild_buckets(c);
  journal_.note_slot(c);
  ++stats_.prefix_admits;
  stats_.prefix_pages_shared += kept_shared;
  return sequence_id{c, cs.generation};
}

}  // namespace tangram
