// SPDX-License-Identifier: Apache-2.0
/**
 * @file interop/virtual_pages.hpp
 * @brief What every export to another attention library shares: virtual page ids (one head's
 * `P x d` block of a pool page), the strided tensors they index, and each head's page list read
 * through the view's accessors (`head_len`, `locate`, `slot_of`).
 *
 * A Tangram page holds `Hp` heads: `[K|V][column][token][d]`. Seen as blocks of `P * d`
 * elements from the pool base, K of column c of pool page p is block `p * 2 * Hp + c` and V is the
 * same block index from a base `Hp * P * d` elements further on. So a library that reads paged
 * K/V of one KV head per sequence (`[num_pages, P, d]`, contiguous rows) reads Tangram's pool
 * with no copy, given these virtual page ids: K tensor `as_strided(pool, [num_virtual_pages, P,
 * d], [P * d, d, 1])`, V the same from `pool + v_offset_elements`. The heads of one head group
 * share pool pages and differ only in their column, hence in their virtual ids.
 */
#pragma once

#include <algorithm>
#include <cstdint>

#include "tangram/core/error.hpp"
#include "tangram/core/kv_view.hpp"

namespace tangram {

/// @brief Strides and extents of the virtual page tensors over a pool (all in elements).
struct virtual_kv_layout {
  std::int32_t page_size            = 0;  ///< P, tokens per virtual page
  std::int32_t head_dim             = 0;  ///< d
  std::int64_t page_stride_elements = 0;  ///< P * d, between consecutive virtual pages
  std::int64_t v_offset_elements    = 0;  ///< Hp * P * d, the V tensor's base past the pool's
  /// Virtual pages of a pool of `num_pages` pages, so that both tensors (V starts Hp blocks later)
  /// stay inside the arena: `2 * Hp * num_pages - Hp` (0 for an empty pool).
  std::int64_t num_virtual_pages = 0;
};

/// @brief The virtual page layout of `geometry` over a pool of `num_pages` pages.
/// @throw invalid_argument for a geometry that `page_geometry::validate` refuses or a negative
///        page count.
inline virtual_kv_layout virtual_layout(page_geometry const& geometry, std::int64_t num_pages) {
  geometry.validate();
  TANGRAM_EXPECTS(
      num_pages >= 0, invalid_argument, "virtual_layout.num_pages: must be >= 0, got ", num_pages);
  virtual_kv_layout out;
  out.page_size            = geometry.page_tokens;
  out.head_dim             = geometry.head_dim;
  out.page_stride_elements = geometry.column_elements();
  out.v_offset_elements = static_cast<std::int64_t>(geometry.group_size) * out.page_stride_elements;
  out.num_virtual_pages =
      num_pages == 0
          ? 0
          : 2 * static_cast<std::int64_t>(geometry.group_size) * num_pages - geometry.group_size;
  return out;
}

/// @brief Virtual page id of K of column `column` of pool page `page` (V: the same id in the V
/// tensor). Fits int32 for every pool the manager builds (it refuses larger ones).
TANGRAM_HOST_DEVICE std::int32_t virtual_page(std::int32_t page,
                                              std::int32_t group_size,
                                              std::int32_t column) {
  return static_cast<std::int32_t>(static_cast<std::int64_t>(page) * 2 * group_size + column);
}

namespace detail {

/**
 * @brief One head's held tokens as a list of pages in token order, from the view's accessors.
 *
 * The oldest held token sits at `skip` inside the first listed page (0 for growing heads; a
 * sliding ring whose oldest token is mid-page has skip > 0). Page k of the list is the page of
 * held token `max(0, k * P - skip)`, for k in [0, pages): a ring that wrapped mid-page lists its
 * first page again at the end (its leading slots then hold the newest tokens).
 */
struct head_page_list {
  std::int32_t len    = 0;  ///< tokens held (head_len)
  std::int32_t skip   = 0;  ///< slots before the oldest held token in the first page
  std::int32_t pages  = 0;  ///< ceil((skip + len) / P), 0 for an empty head
  std::int32_t column = 0;  ///< the head's column in its group's pages

  /// Pool page of list entry k (k < pages).
  [[nodiscard]] TANGRAM_HOST_DEVICE std::int32_t page(kv_cache_view const& v,
                                                      std::int32_t r,
                                                      std::int32_t layer,
                                                      std::int32_t h,
                                                      std::int32_t k) const {
    std::int32_t i = k * v.geometry.page_tokens - skip;
    return v.locate(r, layer, h, i > 0 ? i : 0).page;
  }

  /**
   * True when the first `ceil(len / P)` entries, each read from slot 0 with only the last one
   * partial, hold exactly the head's tokens (what a table without a leading skip can say): always
   * for growing heads; for a ring whose oldest token is mid-page only when every slot of its pages
   * is held (`len` a multiple of P and the list wrapping onto its first page), i.e. a window that
   * is a multiple of P.
   */
  [[nodiscard]] TANGRAM_HOST_DEVICE bool packed(kv_cache_view const& v,
                                                std::int32_t r,
                                                std::int32_t layer,
                                                std::int32_t h) const {
    if (skip == 0) return true;
    std::int32_t P = v.geometry.page_tokens;
    return len % P == 0 && v.locate(r, layer, h, len - skip).page == page(v, r, layer, h, 0);
  }
};

/// The page list of head `h` of layer `layer` for request `r` (a padding request holds none).
[[nodiscard]] TANGRAM_HOST_DEVICE head_page_list head_pages(kv_cache_view const& v,
                                                            std::int32_t r,
                                                            std::int32_t layer,
                                                            std::int32_t h) {
  head_page_list out;
  out.column = v.slot_of(layer, h).column;
  out.len    = v.head_len(r, layer, h);
  if (out.len <= 0) return out;
  std::int32_t P = v.geometry.page_tokens;
  out.skip       = v.locate(r, layer, h, 0).token;
  out.pages      = (out.skip + out.len + P - 1) / P;
  return out;
}

/**
 * The row length of a padded table of `rows` rows whose longest row lists `longest` pages:
 * `max_pages`, or `longest` when it is 0. Checked before any output is touched.
 * @throw invalid_argument naming `who` when max_pages is negative or shorter than `longest`, or
 *        the table would exceed 2^31 - 1 entries (int32 indices).
 */
inline std::int32_t table_width(char const* who,
                                std::int32_t layer,
                                std::int32_t max_pages,
                                std::int32_t longest,
                                std::int64_t rows) {
  TANGRAM_EXPECTS(
      max_pages >= 0, invalid_argument, who, ".max_pages: must be >= 0, got ", max_pages);
  TANGRAM_EXPECTS(max_pages == 0 || max_pages >= longest,
                  invalid_argument,
                  who,
                  ".max_pages: ",
                  max_pages,
                  " is shorter than the longest row of layer ",
                  layer,
                  " (",
                  longest,
                  " pages)");
  std::int32_t width = max_pages > 0 ? max_pages : longest;
  TANGRAM_EXPECTS(rows * width <= 2147483647LL,
                  invalid_argument,
                  who,
                  ": ",
                  rows,
                  " rows x ",
                  width,
                  " pages exceed 2^31 - 1 table entries; export a smaller batch");
  return width;
}

/// Writes the virtual ids of the first `count` entries of head (r, layer, h)'s list to `row`.
inline void write_virtual_row(kv_cache_view const& v,
                              std::int32_t r,
                              std::int32_t layer,
                              std::int32_t h,
                              head_page_list const& list,
                              std::int32_t count,
                              std::int32_t* row) {
  for (std::int32_t k = 0; k < count; ++k)
    row[k] = virtual_page(list.page(v, r, layer, h, k), v.geometry.group_size, list.column);
}

/// Checks a layer index against the view for the export `who`.
inline void check_export_layer(char const* who, std::int32_t num_layers, std::int32_t layer) {
  TANGRAM_EXPECTS(layer >= 0 && layer < num_layers,
                  invalid_argument,
                  who,
                  ".layer: must be in [0, ",
                  num_layers - 1,
                  "], got ",
                  layer);
}

}  // namespace detail
}  // namespace tangram
