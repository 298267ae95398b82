// SPDX-License-Identifier: Apache-2.0
/**
 * @file interop/flashinfer_block_sparse.hpp
 * @brief FlashInfer's per-KV-head block tables (block-sparse `trtllm_batch_decode_with_kv_cache`,
 * `enable_block_sparse_attention=True`, FlashInfer PR #3955) from a batch view:
 * `export_flashinfer_block_sparse`.
 *
 * That API takes `block_tables [num_kv_heads, batch, max_pages]` (each row the pages of one
 * (KV head, request), packed at the front, only the last one partial) and `seq_lens
 * [num_kv_heads, batch]`, over a paged cache whose page dimension and head dimension have
 * arbitrary strides (only the head_dim stride must be 1). Tangram's view is exactly such a table
 * once pages are named by virtual ids (interop/virtual_pages.hpp): the K tensor is the pool seen
 * as `[num_virtual_pages, num_kv_heads, P, d]` with strides `[P * d, 0, d, 1]` (a zero head stride:
 * every KV head reads its own virtual pages, which already carry its column), V the same from
 * `pool + v_offset_elements`. No K/V byte is copied; only the tables are computed.
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
#include "tangram/plan/static_plan.hpp"

namespace tangram {

/**
 * @brief One layer's per-KV-head block tables for FlashInfer's block-sparse decode.
 *
 * Mapping of head groups: every (KV head h, request b) row lists the pool pages of h's group in
 * token order, each as the virtual id `page * 2 * Hp + column(h)`; the Hp heads of a group share
 * those pool pages and differ only in the column. The GQA group of query heads `h * G .. h * G + G
 * - 1` reads row h (FlashInfer's `num_qo_heads / num_kv_heads`). Padding requests (CUDA-graph
 * batches) and empty heads have `seq_lens == 0` and a zero row.
 */
struct flashinfer_block_sparse {
  std::vector<std::int32_t> block_tables;  ///< [num_kv_heads][batch][max_pages], unused entries 0
  std::vector<std::int32_t> seq_lens;  ///< [num_kv_heads][batch] tokens held (uint32 in FlashInfer)
  std::int32_t num_kv_heads = 0;
  std::int32_t batch_size   = 0;
  std::int32_t max_pages    = 0;  ///< row length: the argument, or the batch's longest row
  std::int32_t max_seq_len  = 0;  ///< longest row in tokens (FlashInfer's `max_seq_len`)
  virtual_kv_layout layout;       ///< strides of the K/V tensors over the pool

  /// Entry k of row (h, b).
  [[nodiscard]] std::int32_t entry(std::int32_t h, std::int32_t b, std::int32_t k) const {
    return block_tables[(static_cast<std::size_t>(h) * static_cast<std::size_t>(batch_size) +
                         static_cast<std::size_t>(b)) *
                            static_cast<std::size_t>(max_pages) +
                        static_cast<std::size_t>(k)];
  }
  /// Tokens of row (h, b).
  [[nodiscard]] std::int32_t seq_len(std::int32_t h, std::int32_t b) const {
    return seq_lens[static_cast<std::size_t>(h) * static_cast<std::size_t>(batch_size) +
                    static_cast<std::size_t>(b)];
  }
};

/**
 * @brief Whether layer `layer` of `plan` always exports exactly: true unless it is a
 * sliding-window layer whose window is not a multiple of the page size (its ring then holds stale
 * tokens before the window's oldest, which FlashInfer's block-sparse mode cannot mask: it refuses
 * `window_left`). Check once at load; such a layer runs Tangram's decode attention or the CSR
 * export (interop/flashinfer.hpp, masking through `window_left`).
 * @throw invalid_argument when layer is out of range.
 */
inline bool flashinfer_block_sparse_exact(static_plan const& plan, std::int32_t layer) {
  detail::check_export_layer("flashinfer_block_sparse_exact", plan.num_layers, layer);
  for (std::int32_t h = 0; h < plan.num_kv_heads; ++h) {
    auto const& rule = plan.rule(layer, h);
    if (rule.kind == layer_kind::sliding_window && rule.window % plan.geometry.page_tokens != 0)
      return false;
  }
  return true;
}

/**
 * @brief Exports layer `layer` of the view's batch as per-KV-head block tables. O(pages of the
 * batch in that layer + num_kv_heads * batch * max_pages); `out`'s vectors are reused.
 *
 * @param max_pages row length; 0 takes the batch's longest row. A fixed value (e.g. the longest
 *        any head can hold) keeps the tables' shape constant for CUDA graphs.
 * @param num_pages pool pages (`kv.pool().capacity()`), for `out.layout.num_virtual_pages`.
 * @throw invalid_argument when layer is out of range, max_pages is negative or shorter than a
 *        row, the tables would exceed 2^31 - 1 entries, or a sliding-window head's ring wrapped
 *        mid-page with stale slots (a window that is not a multiple of P; see
 *        `flashinfer_block_sparse_exact`). `out` is unchanged when it throws (std::bad_alloc from
 *        growing `out` aside).
 */
inline void export_flashinfer_block_sparse(kv_cache_view const& v,
                                           std::int32_t layer,
                                           flashinfer_block_sparse& out,
                                           std::int32_t max_pages = 0,
                                           std::int64_t num_pages = 0) {
  detail::check_export_layer("export_flashinfer_block_sparse", v.num_layers, layer);
  std::int32_t const H = v.num_kv_heads, B = v.batch_size, P = v.geometry.page_tokens;
  auto layout          = virtual_layout(v.geometry, num_pages);
  std::int32_t longest = 0, longest_len = 0;
  for (std::int32_t b = 0; b < B; ++b)
    for (std::int32_t h = 0; h < H; ++h) {
      auto list = detail::head_pages(v, b, layer, h);
      TANGRAM_EXPECTS(list.packed(v, b, layer, h),
                      invalid_argument,
                      "export_flashinfer_block_sparse: layer ",
                      layer,
                      " head ",
                      h,
                      " of request ",
                      b,
                      " is a sliding window whose ring wrapped mid-page with stale slots (",
                      list.len,
                      " tokens from slot ",
                      list.skip,
                      ", page size ",
                      P,
                      "): FlashInfer's block-sparse decode cannot mask them; use a window that is "
                      "a multiple of the page size, or Tangram's decode attention for this layer");
      longest     = std::max(longest, (list.len + P - 1) / P);
      longest_len = std::max(longest_len, list.len);
    }
  std::int32_t width = detail::table_width("export_flashinfer_block_sparse",
                                           layer,
                                           max_pages,
                                           longest,
                                           static_cast<std::int64_t>(H) * B);
  auto cells         = static_cast<std::int64_t>(H) * B * width;
  out.block_tables.assign(static_cast<std::size_t>(cells), 0);
  out.seq_lens.assign(static_cast<std::size_t>(H) * static_cast<std::size_t>(B), 0);
  out.num_kv_heads = H;
  out.batch_size   = B;
  out.max_pages    = width;
  out.max_seq_len  = longest_len;
  out.layout       = layout;
  for (std::int32_t h = 0; h < H; ++h)
    for (std::int32_t b = 0; b < B; ++b) {
      auto list = detail::head_pages(v, b, layer, h);
      auto row =
          static_cast<std::size_t>(h) * static_cast<std::size_t>(B) + static_cast<std::size_t>(b);
      out.seq_lens[row] = list.len;
      detail::write_virtual_row(v,
                                b,
                                layer,
                                h,
                                list,
                                (list.len + P - 1) / P,
                                out.block_tables.data() + row * static_cast<std::size_t>(width));
    }
}

/**
 * @brief Exports layer `layer` of a manager's batch of kind `kind` (any type with `plan()`,
 * `pool()`, `check_batch_live(kind, op)` and `view(kind)`, e.g. `kv_cache_manager`). Same
 * single-threaded rules as the manager.
 * @throw as the overload over a view; logic_error naming the request when a batch member was
 *        freed since `set_batch`.
 */
template <class Manager>
void export_flashinfer_block_sparse(Manager const& kv,
                                    batch_kind kind,
                                    std::int32_t layer,
                                    flashinfer_block_sparse& out,
                                    std::int32_t max_pages = 0) {
  detail::check_export_layer("export_flashinfer_block_sparse", kv.plan().num_layers, layer);
  kv.check_batch_live(kind, "export_flashinfer_block_sparse");
  export_flashinfer_block_sparse(kv.view(kind), layer, out, max_pages, kv.pool().capacity());
}

}  // namespace tangram
