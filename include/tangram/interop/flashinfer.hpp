// SPDX-License-Identifier: Apache-2.0
/**
 * @file interop/flashinfer.hpp
 * @brief FlashInfer's paged-KV CSR from a batch view: `export_flashinfer_layer`.
 *
 * A free function over `kv_cache_view` (what the manager's `view()` returns), so the manager
 * knows nothing about FlashInfer; the overload over a manager checks the batch first.
 */
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "tangram/core/error.hpp"
#include "tangram/core/kv_view.hpp"
#include "tangram/interop/virtual_pages.hpp"

namespace tangram {

/**
 * @brief FlashInfer's paged-KV CSR for one layer of a batch, one single-head "request" per
 * (batch request r, KV head h) at index `r * num_kv_heads + h`.
 *
 * A virtual page is one head's `P x d` block: K of head column c of pool page p is virtual page
 * `p * 2 * Hp + c` of a tensor `[num_virtual_pages, P, d]` starting at the pool base; V uses the
 * same indices with the base offset by `v_offset_elements = Hp * P * d` elements. So
 * `k_data = pool`, `v_data = pool + v_offset_elements`, `stride_page = P * d`, `num_heads = 1`.
 *
 * Sliding-window heads: the list starts at the page holding the oldest held token; the first
 * `first_page_skip[j]` tokens of that page are not part of the window (mask them, e.g. through
 * the kernel's window_left), and a ring whose oldest token is mid-page lists that page again at
 * the end. Growing heads always have `first_page_skip == 0`. A head with no tokens has no pages
 * and `last_page_len == 0`.
 */
struct flashinfer_paged_kv {
  std::vector<std::int32_t> indptr;           ///< [requests + 1]
  std::vector<std::int32_t> indices;          ///< [indptr.back()] virtual page ids
  std::vector<std::int32_t> last_page_len;    ///< [requests], in [1, P] for non-empty heads
  std::vector<std::int32_t> first_page_skip;  ///< [requests] leading tokens to mask
  std::int32_t page_size            = 0;      ///< P
  std::int64_t v_offset_elements    = 0;      ///< Hp * P * d
  std::int64_t page_stride_elements = 0;      ///< P * d, the stride between virtual pages

  /// Tokens FlashInfer will see for request j (including the masked skip).
  [[nodiscard]] std::int64_t kv_len(std::size_t j) const {
    std::int64_t pages = indptr[j + 1] - indptr[j];
    return pages == 0 ? 0 : (pages - 1) * page_size + last_page_len[j];
  }
};

/**
 * @brief Exports layer `layer` of the view's batch as FlashInfer paged-KV CSR (see
 * `flashinfer_paged_kv`). O(pages of the batch in that layer); `out`'s vectors are reused.
 *
 * The view must come from a live batch (the manager's `view()` checks that). Virtual page ids
 * `page * 2 * Hp + column` fit int32 because the manager refuses, when it is built, a pool whose
 * ids would not.
 * @throw invalid_argument when layer is out of range, or when the layer lists more than
 *        2^31 - 1 page ids (FlashInfer's int32 indptr). `out` is unchanged when it throws
 *        (std::bad_alloc from growing `out` aside).
 */
inline void export_flashinfer_layer(kv_cache_view const& v,
                                    std::int32_t layer,
                                    flashinfer_paged_kv& out) {
  detail::check_export_layer("export_flashinfer_layer", v.num_layers, layer);
  std::int32_t const H = v.num_kv_heads, P = v.geometry.page_tokens;
  // Count first: indptr is int32, and `out` stays as it was when the batch is too large.
  std::int64_t total = 0;
  for (std::int32_t r = 0; r < v.batch_size; ++r)
    for (std::int32_t h = 0; h < H; ++h) total += detail::head_pages(v, r, layer, h).pages;
  TANGRAM_EXPECTS(total <= std::numeric_limits<std::int32_t>::max(),
                  invalid_argument,
                  "export_flashinfer_layer: layer ",
                  layer,
                  " of this batch lists ",
                  total,
                  " page ids, more than FlashInfer's int32 indptr holds (2^31 - 1); export a "
                  "smaller batch");
  auto const layout = virtual_layout(v.geometry, 0);
  auto req          = static_cast<std::size_t>(v.batch_size) * static_cast<std::size_t>(H);
  out.indptr.assign(req + 1, 0);
  out.last_page_len.assign(req, 0);
  out.first_page_skip.assign(req, 0);
  out.indices.clear();
  out.indices.reserve(static_cast<std::size_t>(total));
  out.page_size            = P;
  out.page_stride_elements = layout.page_stride_elements;
  out.v_offset_elements    = layout.v_offset_elements;
  for (std::int32_t r = 0; r < v.batch_size; ++r) {
    for (std::int32_t h = 0; h < H; ++h) {
      auto j =
          static_cast<std::size_t>(r) * static_cast<std::size_t>(H) + static_cast<std::size_t>(h);
      auto list = detail::head_pages(v, r, layer, h);
      for (std::int32_t k = 0; k < list.pages; ++k)
        out.indices.push_back(
            virtual_page(list.page(v, r, layer, h, k), v.geometry.group_size, list.column));
      if (list.pages > 0) {
        out.first_page_skip[j] = list.skip;
        out.last_page_len[j]   = list.skip + list.len - (list.pages - 1) * P;
      }
      out.indptr[j + 1] = static_cast<std::int32_t>(out.indices.size());
    }
  }
}

/**
 * @brief Exports layer `layer` of a manager's current (decode) batch (any type with `plan()`,
 * `check_batch_live(op)` and `view()`, e.g. `kv_cache_manager`; for its prefill batch export
 * `kv.view(batch_kind::prefill)` with the overload over a view). Same single-threaded rules as
 * the manager: no mutating call may run meanwhile.
 * @throw invalid_argument when layer is out of range or the layer lists more than 2^31 - 1 page
 *        ids; logic_error naming the request, slot and generation when a batch member was freed
 *        (or its slot reused) since `set_batch`. `out` is unchanged when it throws (std::bad_alloc
 *        from growing `out` aside).
 */
template <class Manager>
void export_flashinfer_layer(Manager const& kv, std::int32_t layer, flashinfer_paged_kv& out) {
  detail::check_export_layer("export_flashinfer_layer", kv.plan().num_layers, layer);
  kv.check_batch_live("export_flashinfer_layer");
  export_flashinfer_layer(kv.view(), layer, out);
}

}  // namespace tangram
