// SPDX-License-Identifier: Apache-2.0
/**
 * @file interop/flash_attn_varlen.hpp
 * @brief A FlashAttention varlen view of one layer's decode batch: `export_flash_attn_varlen`.
 *
 * Each (request b, KV head h) is one varlen sequence `j = b * H + h` with one KV head and the
 * GQA group of query heads `h * G .. h * G + G - 1` (what the paper's reference implementation and
 * Ada-KV feed to stock `flash_attn_varlen_func` / `flash_attn_with_kvcache`). Decode queries
 * `[B, H * G, d]` are then `[B * H, G, d]` with no copy (the same memory, request-major), and so is
 * the output. K/V are the pool itself: `k_cache = as_strided(pool, [num_virtual_pages, P, 1, d],
 * [P * d, d, d, 1])`, `v_cache` the same from `pool + v_offset_elements`
 * (interop/virtual_pages.hpp), indexed by `block_table [B * H, max_pages]` with `seqused_k` /
 * `cu_seqlens_k` keys per sequence.
 *
 * Sliding-window layers: a ring whose oldest token is mid-page is listed from that page, the
 * `skip` slots before the oldest token counted in `seqused_k`, and the layer's `window_left = W -
 * 1` (FlashAttention's `window_size=(W - 1, 0)` with `causal=True`) masks exactly them; a ring that
 * wrapped lists its first page again at the end. Page sizes: FlashAttention 3 and vLLM's
 * flash-attention fork take any page size (P = 16 as vLLM); upstream FlashAttention 2 pages KV
 * only in blocks that are a multiple of 256 tokens.
 */
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "tangram/core/error.hpp"
#include "tangram/core/kv_view.hpp"
#include "tangram/interop/virtual_pages.hpp"
#include "tangram/memory/kv_cache_types.hpp"

namespace tangram {

/// @brief One layer's decode batch as FlashAttention varlen sequences over paged K/V.
struct flash_attn_varlen_paged {
  std::vector<std::int32_t> cu_seqlens_q;  ///< [B * H + 1]: j (one query row per sequence)
  std::vector<std::int32_t> cu_seqlens_k;  ///< [B * H + 1]: prefix sums of `seqused_k`
  std::vector<std::int32_t> seqused_k;    ///< [B * H] keys of sequence j (the masked skip included)
  std::vector<std::int32_t> block_table;  ///< [B * H][max_pages] virtual page ids, unused 0
  std::int32_t num_sequences = 0;         ///< B * H
  std::int32_t max_pages     = 0;         ///< row length: the argument, or the longest row
  std::int32_t max_seqlen_q  = 1;
  std::int32_t max_seqlen_k  = 0;
  /// FlashAttention's `window_size[0]`: W - 1 for a sliding-window layer, -1 (unlimited) else.
  std::int32_t window_left = -1;
  virtual_kv_layout layout;  ///< strides of the K/V tensors over the pool

  /// Entry k of sequence j's block table.
  [[nodiscard]] std::int32_t entry(std::int32_t j, std::int32_t k) const {
    return block_table[static_cast<std::size_t>(j) * static_cast<std::size_t>(max_pages) +
                       static_cast<std::size_t>(k)];
  }
};

/**
 * @brief Exports layer `layer` of the view's batch as FlashAttention varlen sequences (see
 * `flash_attn_varlen_paged`). O(pages of the batch in that layer + B * H * max_pages).
 *
 * @param max_pages row length; 0 takes the longest row (a fixed value keeps the shape for graphs).
 * @param num_pages pool pages, for `out.layout.num_virtual_pages`.
 * @throw invalid_argument when layer is out of range, max_pages is negative or shorter than a
 *        row, the layer's heads disagree on their sliding window (one `window_size` per call), or
 *        a count exceeds int32. `out` is unchanged when it throws (std::bad_alloc aside).
 */
inline void export_flash_attn_varlen(kv_cache_view const& v,
                                     std::int32_t layer,
                                     flash_attn_varlen_paged& out,
                                     std::int32_t max_pages = 0,
                                     std::int64_t num_pages = 0) {
  detail::check_export_layer("export_flash_attn_varlen", v.num_layers, layer);
  std::int32_t const H = v.num_kv_heads, B = v.batch_size;
  std::int32_t const window = v.group_window[v.slot_of(layer, 0).group];
  for (std::int32_t h = 1; h < H; ++h) {
    std::int32_t w = v.group_window[v.slot_of(layer, h).group];
    TANGRAM_EXPECTS(w == window,
                    invalid_argument,
                    "export_flash_attn_varlen: layer ",
                    layer,
                    " head ",
                    h,
                    " has sliding window ",
                    w,
                    " but head 0 has ",
                    window,
                    "; FlashAttention takes one window per call");
  }
  auto layout          = virtual_layout(v.geometry, num_pages);
  std::int32_t longest = 0;
  std::int64_t keys    = 0;
  for (std::int32_t b = 0; b < B; ++b)
    for (std::int32_t h = 0; h < H; ++h) {
      auto list = detail::head_pages(v, b, layer, h);
      longest   = std::max(longest, list.pages);
      keys += list.skip + list.len;
    }
  std::int32_t width = detail::table_width(
      "export_flash_attn_varlen", layer, max_pages, longest, static_cast<std::int64_t>(H) * B);
  auto cells = static_cast<std::int64_t>(H) * B * width;
  TANGRAM_EXPECTS(keys <= std::numeric_limits<std::int32_t>::max(),
                  invalid_argument,
                  "export_flash_attn_varlen: layer ",
                  layer,
                  " lists ",
                  keys,
                  " keys, more than int32 cu_seqlens_k holds (2^31 - 1); export a smaller batch");
  auto J = static_cast<std::size_t>(H) * static_cast<std::size_t>(B);
  out.cu_seqlens_q.resize(J + 1);
  for (std::size_t j = 0; j <= J; ++j) out.cu_seqlens_q[j] = static_cast<std::int32_t>(j);
  out.cu_seqlens_k.assign(J + 1, 0);
  out.seqused_k.assign(J, 0);
  out.block_table.assign(static_cast<std::size_t>(cells), 0);
  out.num_sequences = static_cast<std::int32_t>(J);
  out.max_pages     = width;
  out.max_seqlen_q  = 1;
  out.max_seqlen_k  = 0;
  out.window_left   = window > 0 ? window - 1 : -1;
  out.layout        = layout;
  for (std::int32_t b = 0; b < B; ++b)
    for (std::int32_t h = 0; h < H; ++h) {
      auto j =
          static_cast<std::size_t>(b) * static_cast<std::size_t>(H) + static_cast<std::size_t>(h);
      auto list               = detail::head_pages(v, b, layer, h);
      std::int32_t n          = list.pages > 0 ? list.skip + list.len : 0;
      out.seqused_k[j]        = n;
      out.cu_seqlens_k[j + 1] = out.cu_seqlens_k[j] + n;
      out.max_seqlen_k        = std::max(out.max_seqlen_k, n);
      detail::write_virtual_row(v,
                                b,
                                layer,
                                h,
                                list,
                                list.pages,
                                out.block_table.data() + j * static_cast<std::size_t>(width));
    }
}

/**
 * @brief Exports layer `layer` of a manager's batch of kind `kind` (see the overload over a
 * manager in interop/flashinfer_block_sparse.hpp for the requirements on `Manager`).
 * @throw as the overload over a view; logic_error when a batch member was freed since
 *        `set_batch`.
 */
template <class Manager>
void export_flash_attn_varlen(Manager const& kv,
                              batch_kind kind,
                              std::int32_t layer,
                              flash_attn_varlen_paged& out,
                              std::int32_t max_pages = 0) {
  detail::check_export_layer("export_flash_attn_varlen", kv.plan().num_layers, layer);
  kv.check_batch_live(kind, "export_flash_attn_varlen");
  export_flash_attn_varlen(kv.view(kind), layer, out, max_pages, kv.pool().capacity());
}

}  // namespace tangram
