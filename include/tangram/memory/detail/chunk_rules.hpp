// SPDX-License-Identifier: Apache-2.0
/**
 * @file memory/detail/chunk_rules.hpp
 * @brief What a head may keep after a prefill chunk: the expected count from its static rule,
 * and the checks of the counts the eviction kernel reports (per head; under elastic reservation
 * also the compressed groups' pages together).
 */
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

#include "tangram/core/error.hpp"
#include "tangram/core/retention.hpp"
#include "tangram/memory/detail/group_lookup.hpp"

namespace tangram::detail {

/**
 * @brief Tokens a head with rule `r`, holding `held` tokens, keeps once the history reaches n
 * tokens with a chunk of c: `min(n, W)` sliding, `held + c` uncompressed,
 * `min(retained_tokens(r, n), held + c)` compressed, but never below its `pinned` leading tokens
 * (a shared prefix's, kept in place: plan_eviction of kernels/eviction.hpp); under elastic
 * reservation (`pooled`) a compressed head may keep all `held + c` candidates
 * (`check_pooled_kept` bounds its group).
 */
[[nodiscard]] inline std::int64_t expected_kept(head_rule const& r,
                                                std::int64_t held,
                                                std::int64_t n,
                                                std::int64_t c,
                                                bool pooled         = false,
                                                std::int64_t pinned = 0) noexcept {
  if (r.kind == layer_kind::sliding_window) return std::min<std::int64_t>(n, r.window);
  if (r.kind == layer_kind::uncompressed || pooled) return held + c;
  return std::max(std::min<std::int64_t>(retained_tokens(r, n), held + c), std::min(pinned, held));
}

/**
 * @brief A compressed head may keep between its `pinned` leading tokens (a shared prefix's,
 * which the eviction never drops) and `expect` tokens (the reservation assumes the static rule);
 * uncompressed and sliding heads exactly `expect`.
 * @throw logic_error naming the head (layer, head) of slot s, the count and the rule.
 */
inline void check_kept(layer_kind kind,
                       std::int32_t kept,
                       std::int64_t expect,
                       std::int64_t n,
                       std::int32_t s,
                       std::int32_t layer,
                       std::int32_t head,
                       std::int64_t pinned = 0) {
  bool ok = kind == layer_kind::compressed ? kept >= pinned && kept <= expect : kept == expect;
  TANGRAM_EXPECTS(ok,
                  logic_error,
                  "commit_chunk: head (layer ",
                  layer,
                  ", head ",
                  head,
                  ") of slot ",
                  s,
                  " kept ",
                  kept,
                  " tokens; a ",
                  to_string(kind),
                  " head must keep ",
                  kind != layer_kind::compressed ? "exactly "
                  : pinned > 0 ? "between " + std::to_string(pinned) + " (pinned) and "
                               : std::string("between 0 and "),
                  expect,
                  " after ",
                  n,
                  " tokens");
}

/**
 * @brief Elastic reservation: the pooled groups' pages after a chunk, each group as long as its
 * longest head (`kept[flat head]`), must fit `limit` pages. Nothing to check without pooled
 * groups. @throw logic_error naming slot s, the pages and the limit.
 */
inline void check_pooled_kept(group_lookup const& groups,
                              std::int32_t const* kept,
                              std::int64_t limit,
                              std::int32_t s) {
  std::int64_t pages = 0;
  for (auto g : groups.pooled_groups()) {
    std::int32_t longest = 0;
    for (auto const* m = groups.members_begin(g); m != groups.members_end(g); ++m)
      longest = std::max(longest, kept[*m]);
    pages += groups.pages_for(longest);
  }
  TANGRAM_EXPECTS(pages <= limit,
                  logic_error,
                  "commit_chunk: the compressed groups of slot ",
                  s,
                  " would hold ",
                  pages,
                  " pages after this chunk (each group as long as its longest head); the "
                  "elastic reservation allows ",
                  limit);
}

}  // namespace tangram::detail
