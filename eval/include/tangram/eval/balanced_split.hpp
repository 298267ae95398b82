// SPDX-License-Identifier: Apache-2.0
/**
 * @file eval/balanced_split.hpp
 * @brief The shares of a decode split map balanced per step on the device, for the split
 * evaluator (`split_evaluator`, `tangram plan --json`: `balanced_split_imbalance`) and the
 * simulator's decode skew.
 *
 * The AOT map gives each KV head of a layer a fixed share of the layer's CTAs, sized ahead of time
 * by the head's expected work; a batch whose heads need other amounts than expected runs its
 * fullest CTA above the mean (the AOT skew, 1.03-1.19 on the bundled profiles). The kernel
 * `balance_decode_splits` (kernels/balanced_split.hpp) instead reads the batch's head lengths on
 * the device before each decode step and gives every head its balanced share
 * (core/balanced_split.hpp); the decode kernels take any valid split map. `balanced_shares` is
 * the same apportionment with the inputs checked, as shares.
 */
#pragma once

#include <cstdint>

#include "tangram/core/balanced_split.hpp"
#include "tangram/core/error.hpp"

namespace tangram {

/**
 * @brief CTAs per head minimising the fullest CTA (core/balanced_split.hpp): S_h >= 1,
 * sum S_h = N, and max_h ceil(W_h / S_h) the least any such shares reach; CTAs left over go
 * round-robin. O(H log max W); allocates nothing; deterministic.
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
  for (std::int32_t h = 0; h < H; ++h)
    TANGRAM_EXPECTS(
        tokens[h] >= 0, invalid_argument, "balanced_shares: tokens[", h, "] = ", tokens[h]);
  std::int64_t bound    = balanced_split_bound(tokens, H, N);
  std::int64_t leftover = N - balanced_split_used(tokens, H, bound);
  for (std::int32_t h = 0; h < H; ++h)
    shares[h] = balanced_head_share(tokens[h], bound, h, H, leftover);
}

}  // namespace tangram
