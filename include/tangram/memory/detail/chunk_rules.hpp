// SPDX-License-Identifier: Apache-2.0
/**
 * @file memory/detail/chunk_rules.hpp
 * @brief What a head may keep after a prefill chunk: the expected count from its static rule,
 * and the check of the count the eviction kernel reports.
 */
#pragma once

#include <algorithm>
#include <cstdint>

#include "tangram/error.hpp"
#include "tangram/plan/retention.hpp"

namespace tangram::detail {

/**
 * @brief Tokens a head with rule `r`, holding `held` tokens, keeps once the history reaches n
 * tokens with a chunk of c: `min(n, W)` sliding, `held + c` uncompressed,
 * `min(retained_tokens(r, n), held + c)` compressed.
 */
[[nodiscard]] inline std::int64_t expected_kept(head_rule const& r,
                                                std::int64_t held,
                                                std::int64_t n,
                                                std::int64_t c) noexcept {
  if (r.kind == layer_kind::sliding_window) return std::min<std::int64_t>(n, r.window);
  if (r.kind == layer_kind::uncompressed) return held + c;
  return std::min<std::int64_t>(retained_tokens(r, n), held + c);
}

/**
 * @brief A compressed head may keep between 0 and `expect` tokens (the reservation assumes the
 * static rule); uncompressed and sliding heads exactly `expect`.
 * @throw logic_error naming the head (layer, head) of slot s, the count and the rule.
 */
inline void check_kept(layer_kind kind,
                       std::int32_t kept,
                       std::int64_t expect,
                       std::int64_t n,
                       std::int32_t s,
                       std::int32_t layer,
                       std::int32_t head) {
  bool ok = kind == layer_kind::compressed ? kept >= 0 && kept <= expect : kept == expect;
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
                  kind == layer_kind::compressed ? "between 0 and " : "exactly ",
                  expect,
                  " after ",
                  n,
                  " tokens");
}

}  // namespace tangram::detail
