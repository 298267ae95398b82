// SPDX-License-Identifier: Apache-2.0
/**
 * @file core/elastic_lengths.hpp
 * @brief The group-length selection of elastic reservation (plan/elastic_selection.hpp) in a
 * form a GPU block can run: no heap, no allocation, every group independent except for a few
 * block-wide sums. Host/device; the building block of the elastic eviction kernel.
 *
 * The greedy of the reference gives one page at a time to the group whose next page adds the most
 * wanted tokens (ties to the lower group index) and stops at the budget or at the first zero gain.
 * A group's gains d_g(p) = sum_{h in g} clamp(need_h - p P, 0, P) never increase with p, so the
 * greedy takes exactly:
 *
 * - every gain >= t*, where t* is the smallest threshold t >= 1 with C(t) <= B, C(t) = sum_g c_g(t)
 *   and c_g(t) = #{p >= lo_g : d_g(p) >= t} (lo_g = group g's floor: the protected floor, or its
 *   pinned prefix pages when more; B = the pages above the floors);
 * - then B - C(t*) of the gains equal to t* - 1 (when t* > 1), group by group in index order
 *   (a group's equal gains are consecutive pages, and the greedy exhausts a lower group's before it
 *   reaches a higher group with the same gain).
 *
 * c_g(t) is found by binary search over p (d_g is non-increasing), and t* by binary search over
 * [1, Hp P] (C is non-increasing in t): O(G Hp log(max need / P) log(Hp P)) work, and per group
 * only its own members' needs. The result equals the reference's on every input (tested against it
 * on random cases, and it against exhaustive search).
 */
#pragma once

#include <cstdint>

#include "tangram/core/config.hpp"

namespace tangram::elastic {

/// Wanted tokens page p (0-based) of a group adds: sum of clamp(need - p P, 0, P) over its
/// `group_size` members' needs.
TANGRAM_HOST_DEVICE std::int64_t page_gain(std::int64_t const* needs,
                                           std::int32_t group_size,
                                           std::int32_t page_tokens,
                                           std::int64_t p) {
  std::int64_t len = p * page_tokens, gain = 0;
  for (std::int32_t c = 0; c < group_size; ++c) {
    std::int64_t left = needs[c] - len;
    gain += left <= 0 ? 0 : (left >= page_tokens ? page_tokens : left);
  }
  return gain;
}

/// c_g(t): pages p >= lo of the group whose gain is at least t (t >= 1).
TANGRAM_HOST_DEVICE std::int64_t pages_with_gain_at_least(std::int64_t const* needs,
                                                          std::int32_t group_size,
                                                          std::int32_t page_tokens,
                                                          std::int64_t lo,
                                                          std::int64_t t) {
  // Gains are 0 from page ceil(max need / P) on: search [lo, end) for the first gain below t.
  std::int64_t most = 0;
  for (std::int32_t c = 0; c < group_size; ++c) most = needs[c] > most ? needs[c] : most;
  std::int64_t end = (most + page_tokens - 1) / page_tokens;
  std::int64_t a = lo, b = end > lo ? end : lo;  // first p in [a, b) with gain < t, or b
  while (a < b) {
    std::int64_t mid = a + (b - a) / 2;
    if (page_gain(needs, group_size, page_tokens, mid) >= t)
      a = mid + 1;
    else
      b = mid;
  }
  return a - lo;
}

/// C(t): pages above the floors with gain at least t, over all `groups` groups; group g's floor
/// is `floors[g]` pages.
TANGRAM_HOST_DEVICE std::int64_t total_pages_with_gain_at_least(std::int64_t const* needs,
                                                                std::int32_t groups,
                                                                std::int32_t group_size,
                                                                std::int32_t page_tokens,
                                                                std::int64_t const* floors,
                                                                std::int64_t t) {
  std::int64_t sum = 0;
  for (std::int32_t g = 0; g < groups; ++g)
    sum += pages_with_gain_at_least(
        needs + static_cast<std::int64_t>(g) * group_size, group_size, page_tokens, floors[g], t);
  return sum;
}

/**
 * @brief Each group's length in pages: its floor (`pages[g]` on entry: the protected floor, or
 * more for a group with pinned prefix pages) plus the pages the greedy gives it within `extra`
 * pages above the floors (file comment; the greedy takes pages above each group's own floor).
 * Sequential host/device version: one thread, O(G Hp log log) work, no allocation.
 * @param needs      [groups * group_size] wanted tokens, grouped (members of group g at
 *                   needs[g * group_size ...]), each >= 0
 * @param extra      pages available above the floors (>= 0)
 * @param pages      [groups] in: each group's floor (>= 0); out: its length in pages
 * @return pages given above the floors (<= extra)
 */
TANGRAM_HOST_DEVICE std::int64_t select_lengths_above(std::int64_t const* needs,
                                                      std::int32_t groups,
                                                      std::int32_t group_size,
                                                      std::int32_t page_tokens,
                                                      std::int64_t extra,
                                                      std::int64_t* pages) {
  // Smallest t in [1, Hp P + 1] with C(t) <= extra; C(Hp P + 1) = 0 (no gain exceeds Hp P).
  std::int64_t a = 1, b = static_cast<std::int64_t>(group_size) * page_tokens + 1;
  while (a < b) {
    std::int64_t mid = a + (b - a) / 2;
    if (total_pages_with_gain_at_least(needs, groups, group_size, page_tokens, pages, mid) <= extra)
      b = mid;
    else
      a = mid + 1;
  }
  std::int64_t t = a;
  std::int64_t given =
      total_pages_with_gain_at_least(needs, groups, group_size, page_tokens, pages, t);
  // Every gain >= t, then the gains equal to t - 1, group by group, while pages remain (never
  // zero gains): one pass, each group's floor read before its length replaces it.
  for (std::int32_t g = 0; g < groups; ++g) {
    auto const* n     = needs + static_cast<std::int64_t>(g) * group_size;
    auto floor        = pages[g];
    auto c            = pages_with_gain_at_least(n, group_size, page_tokens, floor, t);
    std::int64_t take = 0;
    if (t > 1 && given < extra) {
      auto more = pages_with_gain_at_least(n, group_size, page_tokens, floor, t - 1) - c;
      take      = more < extra - given ? more : extra - given;
      given += take;
    }
    pages[g] = floor + c + take;
  }
  return given;
}

/**
 * @brief `select_lengths_above` with every group's floor `lo` (the protected floor).
 * @param out_pages  [groups] lengths in pages
 */
TANGRAM_HOST_DEVICE std::int64_t select_lengths(std::int64_t const* needs,
                                                std::int32_t groups,
                                                std::int32_t group_size,
                                                std::int32_t page_tokens,
                                                std::int64_t lo,
                                                std::int64_t extra,
                                                std::int64_t* out_pages) {
  for (std::int32_t g = 0; g < groups; ++g) out_pages[g] = lo;
  return select_lengths_above(needs, groups, group_size, page_tokens, extra, out_pages);
}

}  // namespace tangram::elastic
