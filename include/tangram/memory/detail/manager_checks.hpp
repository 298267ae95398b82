// SPDX-License-Identifier: Apache-2.0
/**
 * @file memory/detail/manager_checks.hpp
 * @brief What the KV-cache manager checks before it builds or starts a turn: the plan, the
 * options (with derived sizes resolved) and the sizes of a turn.
 */
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>

#include "tangram/core/detail/checked_math.hpp"
#include "tangram/core/detail/str.hpp"
#include "tangram/core/error.hpp"
#include "tangram/memory/kv_cache_types.hpp"
#include "tangram/memory/page_pool.hpp"
#include "tangram/plan/plan_checks.hpp"
#include "tangram/plan/static_plan.hpp"

namespace tangram::detail {

/// Tokens a sequence may reach: its lengths are int32 in the view.
inline constexpr std::int64_t max_tokens = std::numeric_limits<std::int32_t>::max();

/// The plan, after the one consistency check every plan consumer runs (`validate_plan`,
/// plan/plan_checks.hpp: the plan file reader runs it too, so the manager accepts exactly the plans
/// a file could hold). A head whose rule exceeds its group's would let eviction keep more tokens
/// than the group's pages hold and write into another sequence's pages.
/// @throw invalid_argument "static_plan.<field>: ..." naming the field and the values.
inline static_plan const& checked_plan(static_plan const& plan) {
  validate_plan(plan);
  return plan;
}
/// The options with every 0 ("derive it") resolved against the plan.
/// @throw invalid_argument naming the field and the value.
inline manager_options checked_options(manager_options o, static_plan const& plan) {
  o.validate();
  bool from_bytes = o.num_pages == 0;
  if (from_bytes) o.num_pages = o.pool_bytes / plan.geometry.page_bytes();
  TANGRAM_EXPECTS(o.num_pages <= page_pool<>::max_pages,
                  invalid_argument,
                  "manager_options.pool_bytes: ",
                  o.pool_bytes,
                  " bytes make ",
                  o.num_pages,
                  " pages of ",
                  plan.geometry.page_bytes(),
                  " bytes, more than a pool holds (2^31 - 1)");
  // export_flashinfer_layer lists virtual page ids `page * 2 * Hp + column` as int32: refuse a
  // pool whose ids would wrap (num_pages <= 2^31 - 1 and Hp <= 1024, so no int64 overflow).
  auto Hp = static_cast<std::int64_t>(plan.geometry.group_size);
  TANGRAM_EXPECTS(o.num_pages * 2 * Hp <= std::numeric_limits<std::int32_t>::max(),
                  invalid_argument,
                  from_bytes ? "manager_options.pool_bytes " : "manager_options.num_pages ",
                  from_bytes ? o.pool_bytes : o.num_pages,
                  ": ",
                  o.num_pages,
                  " pages x 2 x geometry.group_size ",
                  Hp,
                  " = ",
                  o.num_pages * 2 * Hp,
                  " FlashInfer virtual page ids exceed 2^31 - 1; use fewer pages or a smaller "
                  "group_size");
  TANGRAM_EXPECTS(o.num_pages >= 1,
                  invalid_argument,
                  "manager_options: the pool needs at least one page of ",
                  plan.geometry.page_bytes(),
                  " bytes (num_pages ",
                  o.num_pages,
                  ", pool_bytes ",
                  o.pool_bytes,
                  ")");
  if (o.max_batch == 0) o.max_batch = o.max_sequences;
  // Bounded: num_pages <= 2^31 - 1, slots <= 2^20, groups <= 2^20 (layers and heads <= 1024).
  // Under elastic reservation a compressed group's list may hold every token it has seen, so a
  // sequence needs about 1 / keep_ratio entries per page it holds.
  if (o.index_capacity == 0) {
    // Capped at 16 entries per page: below keep ratio 1/8 an engine sizes the arena itself (a
    // full arena makes admission answer "does not fit", never fail).
    double per_page = plan.options.reservation.mode == reservation_mode::elastic
                          ? std::min(2.0 / plan.profile.target_keep_ratio, 16.0)
                          : 2.0;
    double entries  = per_page * static_cast<double>(o.num_pages) +
                     4.0 * static_cast<double>(o.max_sequences) * plan.grouping.num_groups();
    o.index_capacity = static_cast<std::int64_t>(
        std::min(std::ceil(entries), double{std::numeric_limits<std::int32_t>::max()}));
  }
  if (o.max_view_changes == 0)
    o.max_view_changes = 4 * static_cast<std::int64_t>(o.max_batch) + 1024;
  return o;
}

/// N >= 1, T >= 0 and n + N + T <= 2^31 - 1 for a turn that starts after n tokens, computed
/// without overflow (`N + T <= limit` with huge N or T used to wrap negative and pass).
inline void check_turn_sizes(char const* op,
                             std::int64_t n,
                             std::int64_t prompt_tokens,
                             std::int64_t max_new_tokens) {
  TANGRAM_EXPECTS(prompt_tokens >= 1,
                  invalid_argument,
                  op,
                  ".prompt_tokens: must be >= 1, got ",
                  prompt_tokens);
  TANGRAM_EXPECTS(max_new_tokens >= 0,
                  invalid_argument,
                  op,
                  ".max_new_tokens: must be >= 0, got ",
                  max_new_tokens);
  auto turn  = detail::add_checked(prompt_tokens, max_new_tokens);
  auto total = turn ? detail::add_checked(n, *turn) : std::nullopt;
  TANGRAM_EXPECTS(total.has_value(),
                  invalid_argument,
                  op,
                  n > 0 ? ": seq_tokens " : ": ",
                  n > 0 ? detail::cat(n, " + ") : std::string(),
                  "prompt_tokens + max_new_tokens overflows: ",
                  prompt_tokens,
                  " + ",
                  max_new_tokens);
  TANGRAM_EXPECTS(*total <= max_tokens,
                  invalid_argument,
                  op,
                  n > 0 ? ": seq_tokens + prompt_tokens + max_new_tokens = "
                        : ": prompt_tokens + max_new_tokens = ",
                  *total,
                  " exceeds ",
                  max_tokens);
}

/// Why a request of `pages` pages and `entries` page-list entries cannot be admitted now, before
/// the page-id arena is asked for room (the caller checks that last): never_fits (more than the
/// pool's `capacity` pages or the arena's `arena_entries`), no_free_slot, not_enough_pages; none
/// when it may fit. Sets `missing` to the pages lacking (beyond the pool, or beyond `available`).
inline admit_failure admission_failure(std::int64_t pages,
                                       std::int64_t entries,
                                       std::int64_t capacity,
                                       std::int64_t available,
                                       std::int64_t arena_entries,
                                       bool slots_full,
                                       std::int64_t& missing) noexcept {
  missing = 0;
  if (pages > capacity || entries > arena_entries) {
    missing = pages > capacity ? pages - capacity : 0;
    return admit_failure::never_fits;
  }
  if (slots_full) return admit_failure::no_free_slot;
  if (pages > available) {
    missing = pages - available;
    return admit_failure::not_enough_pages;
  }
  return admit_failure::none;
}

/// `admission_failure` with deferred reuse: a request that lacks unreserved pages now but fits
/// with the `retired` pages waiting for release reports pages_awaiting_release instead of
/// not_enough_pages (`missing` unchanged: pages beyond the unreserved free pages now).
inline admit_failure admission_failure(std::int64_t pages,
                                       std::int64_t entries,
                                       std::int64_t capacity,
                                       std::int64_t available,
                                       std::int64_t retired,
                                       std::int64_t arena_entries,
                                       bool slots_full,
                                       std::int64_t& missing) noexcept {
  auto r =
      admission_failure(pages, entries, capacity, available, arena_entries, slots_full, missing);
  if (r == admit_failure::not_enough_pages && missing <= retired)
    r = admit_failure::pages_awaiting_release;
  return r;
}

/// A count of tokens an operation adds or removes (`op.field`): >= 1. @throw invalid_argument
/// naming the field and the value.
inline void check_token_count(char const* op, std::int64_t tokens) {
  TANGRAM_EXPECTS(tokens >= 1, invalid_argument, op, ": must be >= 1, got ", tokens);
}

/// `try_extend`: a turn whose prompt ended at `prompt_end` tokens with `max_new` decode tokens
/// reserved grows by `more` (>= 1) to at most 2^31 - 1 tokens, computed without overflow.
/// @return the turn's new max_new. @throw invalid_argument naming the values.
inline std::int64_t check_extension(std::int64_t prompt_end,
                                    std::int64_t max_new,
                                    std::int64_t more) {
  check_token_count("try_extend.more_tokens", more);
  auto grown = detail::add_checked(max_new, more);
  auto total = grown ? detail::add_checked(prompt_end, *grown) : std::nullopt;
  TANGRAM_EXPECTS(total.has_value() && *total <= max_tokens,
                  invalid_argument,
                  "try_extend.more_tokens: ",
                  more,
                  " more decode tokens after seq_tokens ",
                  prompt_end,
                  " + max_new_tokens ",
                  max_new,
                  " exceed ",
                  max_tokens,
                  " tokens");
  return *grown;
}

/// A chunk has >= 1 token; elastic reservation stages at most `max_chunk_tokens` per chunk.
/// @throw invalid_argument naming the values.
inline void check_chunk_size(bool elastic,
                             std::int64_t chunk_tokens,
                             std::int64_t max_chunk_tokens) {
  TANGRAM_EXPECTS(chunk_tokens >= 1,
                  invalid_argument,
                  "prepare_chunk.chunk_tokens: must be >= 1, got ",
                  chunk_tokens);
  TANGRAM_EXPECTS(!elastic || chunk_tokens <= max_chunk_tokens,
                  invalid_argument,
                  "prepare_chunk.chunk_tokens: ",
                  chunk_tokens,
                  " exceeds manager_options.max_chunk_tokens = ",
                  max_chunk_tokens,
                  " (elastic reservation stages at most that many tokens per chunk)");
}
}  // namespace tangram::detail
