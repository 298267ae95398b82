// SPDX-License-Identifier: Apache-2.0
/**
 * @file kernels/head_cursor.hpp
 * @brief O(1) addressing of the tokens of one (request, layer, KV head) in a `kv_cache_view`.
 *
 * `kv_cache_view::locate` resolves the sequence slot, group, window and page list on every call.
 * A kernel (and the CPU reference, which must walk the same addresses) resolves them once per
 * (request, head) into a `head_cursor`; each token then costs one page-table read. Host/device.
 */
#pragma once

#include <cstddef>
#include <cstdint>

#include "tangram/core/config.hpp"
#include "tangram/core/kv_view.hpp"

namespace tangram {

/**
 * @brief Resolved location of one head's tokens: its group's page list, its column and, for a
 * sliding-window group, its ring. Trivially copyable; the pointers are those of the view.
 *
 * Token `i` (0 = oldest held) of the head lives at column position `position(i)`: `i` for a
 * growing group, `(start + i) mod ring` for a ring. Position `p` is token `p mod P` of page
 * `pages[p / P]`. This is exactly `kv_cache_view::locate`, resolved ahead of time.
 */
struct head_cursor {
  const std::int32_t* pages = nullptr;  ///< page list of (sequence slot, group)
  std::byte* pool           = nullptr;  ///< the view's page arena
  std::int64_t page_bytes   = 0;        ///< bytes per page
  std::int64_t k_offset     = 0;        ///< elements from a page start to token 0 of the column's K
  std::int64_t v_offset     = 0;        ///< elements from a page start to token 0 of the column's V
  std::int32_t page_tokens  = 1;        ///< P
  std::int32_t head_dim     = 0;        ///< d
  std::int32_t ring         = 0;        ///< ring positions of a sliding-window group, 0 otherwise
  std::int32_t start        = 0;        ///< ring position of held token 0 (0 for growing groups)
  std::int32_t len          = 0;        ///< tokens held
  std::int32_t column       = 0;        ///< the head's column in its group's pages
  std::int32_t group_size   = 1;        ///< Hp: columns per page

  /// Column position of held token `i` (0 <= i < len for reads; any i >= 0 for growing groups).
  TANGRAM_HOST_DEVICE std::int32_t position(std::int32_t i) const {
    return ring > 0 ? (start + i) % ring : i;
  }
  /// Page and in-page token of column position `pos`.
  TANGRAM_HOST_DEVICE token_location at_position(std::int32_t pos) const {
    return {pages[pos / page_tokens], pos % page_tokens};
  }
  /// Page and in-page token of held token `i` (what `kv_cache_view::locate` returns).
  TANGRAM_HOST_DEVICE token_location locate(std::int32_t i) const {
    return at_position(position(i));
  }

  /// Offset of column position `pos` in its group's block of an array laid out like the group's
  /// page list (page index j = pos / P, then the column, then the in-page token):
  /// `((pos / P) * Hp + column) * P + pos % P`. The elastic stage keys (kernels/eviction.hpp).
  TANGRAM_HOST_DEVICE std::int64_t list_offset(std::int32_t pos) const {
    return (static_cast<std::int64_t>(pos / page_tokens) * group_size + column) * page_tokens +
           pos % page_tokens;
  }

  /// First element of K (kv == 0) or V (kv == 1) of the token at column position `pos`.
  template <class T>
  TANGRAM_HOST_DEVICE T* ptr_at_position(std::int32_t pos, std::int32_t kv) const {
    token_location loc = at_position(pos);
    return reinterpret_cast<T*>(pool + static_cast<std::int64_t>(loc.page) * page_bytes) +
           (kv == 0 ? k_offset : v_offset) + static_cast<std::int64_t>(loc.token) * head_dim;
  }
  /// K of held token `i`.
  template <class T>
  TANGRAM_HOST_DEVICE T* k(std::int32_t i) const {
    return ptr_at_position<T>(position(i), 0);
  }
  /// V of held token `i`.
  template <class T>
  TANGRAM_HOST_DEVICE T* v(std::int32_t i) const {
    return ptr_at_position<T>(position(i), 1);
  }
};

/**
 * @brief Resolves head `head` of layer `layer` for request `r` (index into the view's batch).
 * Reads the view's arrays (host or device, wherever they live); performs no checks.
 */
TANGRAM_HOST_DEVICE head_cursor make_head_cursor(kv_cache_view const& view,
                                                 std::int32_t r,
                                                 std::int32_t layer,
                                                 std::int32_t head) {
  head_cursor c;
  std::int32_t s  = view.batch_slots[r];
  head_slot where = view.slot_of(layer, head);
  c.pages =
      view.pages + view.page_offset[static_cast<std::int64_t>(s) * view.num_groups + where.group];
  c.pool        = view.pool;
  c.page_bytes  = view.geometry.page_bytes();
  c.k_offset    = view.geometry.element_offset(0, where.column, 0);
  c.v_offset    = view.geometry.element_offset(1, where.column, 0);
  c.page_tokens = view.geometry.page_tokens;
  c.head_dim    = view.geometry.head_dim;
  c.column      = where.column;
  c.group_size  = view.geometry.group_size;
  c.len         = view.head_len(r, layer, head);
  if (view.group_window[where.group] > 0) {
    c.ring  = view.group_ring_pages[where.group] * view.geometry.page_tokens;
    c.start = (view.seq_tokens[s] - c.len) % c.ring;
  }
  return c;
}

}  // namespace tangram
