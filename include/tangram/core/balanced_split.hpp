// SPDX-License-Identifier: Apache-2.0
/**
 * @file core/balanced_split.hpp
 * @brief The arithmetic of a decode split map balanced per step: given each KV head's tokens over
 * the batch (W_h), give head h S_h >= 1 of a layer's N CTAs so that the fullest CTA,
 * max_h ceil(W_h / S_h), is as small as any shares summing to N reach.
 *
 * T* = the least T >= 1 with sum_h max(1, ceil(W_h / T)) <= N (bisection over [1, max W]; N >= H
 * makes T = max W feasible). S_h = max(1, ceil(W_h / T*)) reaches a fullest CTA of at most T*, and
 * no shares reach less: shares whose fullest CTA were T' < T* would need S_h >= ceil(W_h / T'),
 * so sum_h max(1, ceil(W_h / T')) <= N, against the least T* (when every W_h is 0, every map's
 * fullest CTA is 0 and T* = 1 is only a bound). The CTAs left over, N - sum S_h,
 * therefore cannot lower the fullest CTA; they go round-robin (leftover / H to every head, one
 * more to the first leftover % H heads), O(H) and deterministic.
 *
 * Shared by the CPU reference (reference/balanced_split.hpp), the device kernel
 * (kernels/detail/balanced_split.cuh, which sums W_h and counts CTAs with warp reductions) and the
 * split evaluator (eval/balanced_split.hpp). Host/device; allocates nothing; no checks (the callers
 * validate N >= H >= 1 and W_h >= 0).
 */
#pragma once

#include <cstdint>

#include "tangram/core/config.hpp"

namespace tangram {

/// CTAs head of `tokens` tokens needs so that none holds more than `bound` (>= 1): at least one.
TANGRAM_HOST_DEVICE std::int64_t balanced_head_ctas(std::int64_t tokens, std::int64_t bound) {
  std::int64_t c = (tokens + bound - 1) / bound;
  return c > 1 ? c : 1;
}

/// Head `h`'s share: its own CTAs at `bound` plus its round-robin part of the `leftover` CTAs
/// (leftover / heads, one more for the first leftover % heads heads).
TANGRAM_HOST_DEVICE std::int64_t balanced_head_share(std::int64_t tokens,
                                                     std::int64_t bound,
                                                     std::int32_t h,
                                                     std::int32_t heads,
                                                     std::int64_t leftover) {
  return balanced_head_ctas(tokens, bound) + leftover / heads + (h < leftover % heads ? 1 : 0);
}

/// CTAs the heads need at `bound`, before the leftover: sum_h balanced_head_ctas(tokens[h], bound).
TANGRAM_HOST_DEVICE std::int64_t balanced_split_used(std::int64_t const* tokens,
                                                     std::int32_t heads,
                                                     std::int64_t bound) {
  std::int64_t used = 0;
  for (std::int32_t h = 0; h < heads; ++h) used += balanced_head_ctas(tokens[h], bound);
  return used;
}

/// T*: the least bound >= 1 with sum_h balanced_head_ctas(tokens[h], bound) <= ctas. Requires
/// heads >= 1, ctas >= heads and tokens[h] >= 0. O(heads log max W).
TANGRAM_HOST_DEVICE std::int64_t balanced_split_bound(std::int64_t const* tokens,
                                                      std::int32_t heads,
                                                      std::int64_t ctas) {
  std::int64_t hi = 1;
  for (std::int32_t h = 0; h < heads; ++h) hi = tokens[h] > hi ? tokens[h] : hi;
  std::int64_t lo = 1;
  while (lo < hi) {
    std::int64_t mid = lo + (hi - lo) / 2;
    if (balanced_split_used(tokens, heads, mid) <= ctas)
      hi = mid;
    else
      lo = mid + 1;
  }
  return lo;
}

/// Writes one layer's boundaries (the `split_map_view` layout: head h owns CTAs
/// [begin[h], begin[h + 1]), begin[heads] = ctas) from the bound and the CTAs `used` at it.
TANGRAM_HOST_DEVICE void balanced_split_write(std::int64_t const* tokens,
                                              std::int32_t heads,
                                              std::int32_t ctas,
                                              std::int64_t bound,
                                              std::int64_t used,
                                              std::int32_t* begin) {
  std::int64_t next = 0;
  for (std::int32_t h = 0; h < heads; ++h) {
    begin[h] = static_cast<std::int32_t>(next);
    next += balanced_head_share(tokens[h], bound, h, heads, ctas - used);
  }
  begin[heads] = static_cast<std::int32_t>(next);
}

/// One layer's CTA boundaries (`balanced_split_write` at `balanced_split_bound`). Requires
/// heads >= 1, ctas >= heads (ctas < 2^31) and tokens[h] >= 0.
TANGRAM_HOST_DEVICE void balanced_split_begin(std::int64_t const* tokens,
                                              std::int32_t heads,
                                              std::int32_t ctas,
                                              std::int32_t* begin) {
  std::int64_t bound = balanced_split_bound(tokens, heads, ctas);
  balanced_split_write(
      tokens, heads, ctas, bound, balanced_split_used(tokens, heads, bound), begin);
}

}  // namespace tangram
