// SPDX-License-Identifier: Apache-2.0
/**
 * @file reference/balanced_split.hpp
 * @brief CPU reference of `balance_decode_splits` (kernels/balanced_split.hpp), over host memory.
 */
#pragma once

#include <cstdint>
#include <vector>

#include "tangram/core/balanced_split.hpp"
#include "tangram/kernels/balanced_split.hpp"

namespace tangram::reference {

/**
 * @brief Writes `p.cta_begin` for every layer (host memory): each KV head's tokens summed over the
 * batch (`kv_cache_view::head_len`; padding requests hold none), then the balanced boundaries of
 * core/balanced_split.hpp. Allocates one [num_kv_heads] buffer.
 * @throw invalid_argument for invalid parameters.
 */
inline void balance_decode_splits(balanced_split_params const& p) {
  p.validate();
  auto const H = p.kv.num_kv_heads;
  std::vector<std::int64_t> tokens(static_cast<std::size_t>(H));
  for (std::int32_t l = 0; l < p.kv.num_layers; ++l) {
    for (std::int32_t h = 0; h < H; ++h) {
      std::int64_t sum = 0;
      for (std::int32_t r = 0; r < p.kv.batch_size; ++r) sum += p.kv.head_len(r, l, h);
      tokens[static_cast<std::size_t>(h)] = sum;
    }
    balanced_split_begin(
        tokens.data(), H, p.num_ctas, p.cta_begin + static_cast<std::int64_t>(l) * (H + 1));
  }
}

}  // namespace tangram::reference
