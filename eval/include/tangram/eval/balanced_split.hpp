// SPDX-License-Identifier: Apache-2.0
/**
 * @file eval/balanced_split.hpp
 * @brief A design evaluated, not built: a decode split map balanced per step on the device.
 *
 * The AOT map gives each KV head of a layer a fixed share of the layer's CTAs, sized ahead of time
 * by the head's expected work; a batch whose heads need other amounts than expected runs its
 * fullest CTA above the mean (the AOT skew, 1.03-1.19 on the bundled profiles). A tiny kernel
 * launched before a decode step could instead read the batch's head lengths (already on the device
 * in the view), sum each head's tokens W_h and give head h S_h CTAs so that the fullest CTA holds
 * as few tokens as possible: no host planning, no synchronisation, and the decode kernels unchanged
 * (they take any valid split map). `balanced_shares` is that apportionment; `split_evaluator`
 * reports its imbalance beside the AOT map's (`tangram plan --json`: `balanced_split_imbalance`).
 * The kernel, its launch in the engine loop and its cost in `tangram simulate` are not built
 * (docs/planning.md).
 */
#pragma once

#include <algorithm>
#include <cstdint>

#include "tangram/core/error.hpp"

namespace tangram {

/**
 * @brief CTAs per head minimising the fullest CTA: S_h >= 1, sum S_h = N, and
 * max_h ceil(W_h / S_h) the least any such shares reach. The least T with
 * sum_h max(1, ceil(W_h / T)) <= N by bisection, S_h = max(1, ceil(W_h / T)); CTAs left over go
 * one at a time to the head whose CTAs hold the most tokens (the lowest head on a tie).
 * O(H log max W + leftover x H); allocates nothing; deterministic.
 * @param tokens [H] W_h >= 0, each head's tokens over the batch
 * @param shares [H] out: S_h
 * @throw invalid_argument when H < 1, N < H or a W_h is negative.
 */
inline void balanced_shares(std::int64_t const* tokens,
                            std::int32_t H,
                            std::int64_t N,
                            std::int64_t* shares) {
  TANGRAM_EXPECTS(H >= 1, invalid_argument, "balanced_shares: heads must be >= 1, got ", H);
  TANGRAM_EXPECTS(
      N >= H, invalid_argument, "balanced_shares: ", N, " CTAs cannot give ", H, " heads one each");
  std::int64_t most = 0;
  for (std::int32_t h = 0; h < H; ++h) {
    TANGRAM_EXPECTS(
        tokens[h] >= 0, invalid_argument, "balanced_shares: tokens[", h, "] = ", tokens[h]);
    most = std::max(most, tokens[h]);
  }
  auto needed = [&](std::int64_t T) {
    std::int64_t n = 0;
    for (std::int32_t h = 0; h < H; ++h) n += std::max<std::int64_t>(1, (tokens[h] + T - 1) / T);
    return n;
  };
  std::int64_t lo = 1, hi = std::max<std::int64_t>(1, most);  // needed(most) == H <= N
  while (lo < hi) {
    std::int64_t mid = lo + (hi - lo) / 2;
    if (needed(mid) <= N)
      hi = mid;
    else
      lo = mid + 1;
  }
  std::int64_t used = 0;
  for (std::int32_t h = 0; h < H; ++h) {
    shares[h] = std::max<std::int64_t>(1, (tokens[h] + lo - 1) / lo);
    used += shares[h];
  }
  for (; used < N; ++used) {
    std::int32_t fullest = 0;
    std::int64_t load    = -1;
    for (std::int32_t h = 0; h < H; ++h) {
      std::int64_t l = (tokens[h] + shares[h] - 1) / shares[h];
      if (l > load) {
        load    = l;
        fullest = h;
      }
    }
    ++shares[fullest];
  }
}

}  // namespace tangram
