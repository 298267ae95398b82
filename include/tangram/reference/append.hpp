// SPDX-License-Identifier: Apache-2.0
/**
 * @file reference/append.hpp
 * @brief CPU reference of `append_decode_kv` (kernels/append.hpp), over host memory.
 */
#pragma once

#include "tangram/kernels/append.hpp"
#include "tangram/reference/storage.hpp"

namespace tangram::reference {

/**
 * @brief Writes the new token's K/V of layer `p.layer` for every request of the batch (host
 * memory). Values are divided by their head's scale (`p.scales`, fp8 caches) and converted to
 * the cache dtype with round-to-nearest-even (fp8 saturating), like the kernel.
 * @throw invalid_argument for invalid parameters or a scale that is not finite and > 0.
 */
inline void append_decode_kv(append_params const& p) {
  p.validate();
  p.scales.validate_values("append_params");
  auto const H = p.kv.num_kv_heads, d = p.kv.geometry.head_dim;
  auto const cache = p.kv.geometry.kv_dtype;
  for (std::int32_t r = 0; r < p.kv.batch_size; ++r) {
    for (std::int32_t h = 0; h < H; ++h) {
      head_cursor c;
      std::int32_t pos = 0;
      if (!append_target(p.kv, r, p.layer, h, c, pos)) continue;
      std::int64_t src = r * p.row_stride() + static_cast<std::int64_t>(h) * d;
      for (std::int32_t kv = 0; kv < 2; ++kv) {
        const void* from = kv == 0 ? p.k : p.v;
        const float s    = kv == 0 ? p.scales.k_of(h) : p.scales.v_of(h);
        detail::visit_storage(cache, [&](auto tag) {
          using T = decltype(tag);
          T* dst  = c.ptr_at_position<T>(pos, kv);
          for (std::int32_t x = 0; x < d; ++x)
            dst[x] = from_float<T>(detail::load_as_float(from, p.src_dtype, src + x) / s);
        });
      }
    }
  }
}

}  // namespace tangram::reference
