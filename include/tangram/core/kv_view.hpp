// SPDX-License-Identifier: Apache-2.0
/**
 * @file core/kv_view.hpp
 * @brief The batch view of the paged KV cache: one non-owning POD that the CUDA kernels and the
 * CPU reference both read, in the spirit of FlashInfer's `paged_kv_t`.
 *
 * Page tables are kept per sequence *slot* (a stable index a sequence holds for its lifetime) and
 * per head group, in a padded CSR: the page list of (slot s, group g) starts at
 * `page_offset[s * G + g]` in `pages`, with room for every page the sequence has reserved. So a
 * decode step changes O(batch) integers (`appended`, `seq_tokens`) plus one entry per new page,
 * never O(all pages); the batch itself is just the list of slots it runs.
 *
 * Lengths: a head of a growing group (compressed or uncompressed layer) holds
 * `head_base_len + appended` tokens (base = what compression left; appended = tokens added to
 * every head since, i.e. decode tokens). A head of a sliding-window group holds
 * `min(seq_tokens, window)` tokens in a ring of `ring_pages` pages: logical token t of the
 * sequence lives at ring position t mod (ring_pages * P).
 *
 * FlashInfer interop: with virtual page ids `page * 2 * Hp + column` (K) and the V base offset by
 * `Hp * P * d` elements, each (request, KV head) is a single-head paged sequence; see
 * `export_flashinfer_layer` in interop/flashinfer.hpp.
 */
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string_view>

#include "tangram/core/config.hpp"
#include "tangram/core/error.hpp"
#include "tangram/core/page_layout.hpp"

namespace tangram {

/// @brief Where one token of one head is stored.
struct token_location {
  std::int32_t page  = 0;  ///< page id in the pool
  std::int32_t token = 0;  ///< token index inside the page, 0..P-1
};

/**
 * @brief Non-owning, trivially copyable view of a batch's KV cache. All pointers are either all
 * host or all device memory. Valid until the owning manager next changes the batch or its
 * sequences; reading it concurrently with such a change is a data race.
 */
struct kv_cache_view {
  std::byte* pool = nullptr;  ///< page arena: page p starts at pool + p * page_bytes
  page_geometry geometry;     ///< P, Hp, d, dtype

  std::int32_t num_layers              = 0;
  std::int32_t num_kv_heads            = 0;        ///< KV heads per layer (this rank)
  std::int32_t num_groups              = 0;        ///< G
  const head_slot* head_slots          = nullptr;  ///< [L * H] -> (group, column)
  const std::int32_t* group_window     = nullptr;  ///< [G] sliding window W, 0 for growing groups
  const std::int32_t* group_ring_pages = nullptr;  ///< [G] ring pages of sliding groups, else 0

  const std::int32_t* page_offset   = nullptr;  ///< [slots * G] start of (slot, group) in `pages`
  const std::int32_t* pages         = nullptr;  ///< page-id arena
  const std::int32_t* head_base_len = nullptr;  ///< [slots * L * H]
  const std::int32_t* appended      = nullptr;  ///< [slots]
  const std::int32_t* seq_tokens    = nullptr;  ///< [slots] tokens the sequence has seen
  /// Optional [slots * G]: leading tokens of every head of (slot, group) that lie on read-only
  /// pages shared with a pinned prefix (memory/detail/manager_prefix.inl). A multiple of P and at
  /// most every head's length (the kernels do not check it: the manager guarantees it); a
  /// compressed head's eviction protects them and never writes them (an uncompressed head
  /// appends after them anyway; a sliding ring has none). Null: none.
  const std::int32_t* pinned_tokens = nullptr;

  std::int32_t batch_size         = 0;
  const std::int32_t* batch_slots = nullptr;  ///< [batch] sequence slot of request r
  /// Slot of padding requests (fixed-capacity batches for CUDA graphs): a slot beyond every real
  /// one whose rows in `page_offset`, `head_base_len`, `appended` and `seq_tokens` are zero. A
  /// request whose `batch_slots` entry is this slot holds no token and owns no page: every kernel
  /// treats it as a no-op (`is_padding`). -1: the view has no padding slot.
  std::int32_t padding_slot = -1;

  /// True when request `r` is a padding request (no tokens, no pages; kernels skip it).
  TANGRAM_HOST_DEVICE bool is_padding(std::int32_t r) const {
    return batch_slots[r] == padding_slot;
  }

  TANGRAM_HOST_DEVICE head_slot slot_of(std::int32_t layer, std::int32_t head) const {
    return head_slots[layer * num_kv_heads + head];
  }
  TANGRAM_HOST_DEVICE std::int32_t seq_slot(std::int32_t r) const { return batch_slots[r]; }

  /// Tokens held by head `head` of layer `layer` for request `r`.
  /// A padding request holds none (0).
  TANGRAM_HOST_DEVICE std::int32_t head_len(std::int32_t r,
                                            std::int32_t layer,
                                            std::int32_t head) const {
    std::int32_t s = batch_slots[r];
    if (s == padding_slot) return 0;
    std::int32_t g = slot_of(layer, head).group;
    std::int32_t w = group_window[g];
    if (w > 0) {
      std::int32_t n = seq_tokens[s];
      return n < w ? n : w;
    }
    return head_base_len[(static_cast<std::int64_t>(s) * num_layers + layer) * num_kv_heads +
                         head] +
           appended[s];
  }

  /// Leading tokens of each head of group `g` of request `r` that must stay where they are
  /// (`pinned_tokens`; 0 without the array and for a padding request).
  TANGRAM_HOST_DEVICE std::int32_t pinned(std::int32_t r, std::int32_t g) const {
    if (pinned_tokens == nullptr) return 0;
    std::int32_t s = batch_slots[r];
    if (s == padding_slot) return 0;
    return pinned_tokens[static_cast<std::int64_t>(s) * num_groups + g];
  }

  /// Location of the i-th held token (0 = oldest) of a head; requires i < head_len(...).
  TANGRAM_HOST_DEVICE token_location locate(std::int32_t r,
                                            std::int32_t layer,
                                            std::int32_t head,
                                            std::int32_t i) const {
    std::int32_t s   = batch_slots[r];
    std::int32_t g   = slot_of(layer, head).group;
    std::int32_t pos = i;
    if (group_window[g] > 0) {
      std::int32_t ring = group_ring_pages[g] * geometry.page_tokens;
      std::int32_t len  = head_len(r, layer, head);
      pos               = (seq_tokens[s] - len + i) % ring;
    }
    std::int32_t p = pages[page_offset[static_cast<std::int64_t>(s) * num_groups + g] +
                           pos / geometry.page_tokens];
    return {p, pos % geometry.page_tokens};
  }

  /// Address of token `loc` of head column `column`: K when kv == 0, V when kv == 1.
  template <class T>
  TANGRAM_HOST_DEVICE T* element_ptr(token_location loc,
                                     std::int32_t column,
                                     std::int32_t kv) const {
    return reinterpret_cast<T*>(pool +
                                static_cast<std::int64_t>(loc.page) * geometry.page_bytes()) +
           geometry.element_offset(kv, column, loc.token);
  }

  /// Pages currently in use by (request r, group g): enough for the group's longest column.
  TANGRAM_HOST_DEVICE std::int32_t group_pages_in_use(std::int32_t r,
                                                      std::int32_t g,
                                                      std::int32_t longest_column) const {
    if (group_window[g] > 0) {
      std::int32_t n           = seq_tokens[batch_slots[r]];
      std::int32_t ring_tokens = group_ring_pages[g] * geometry.page_tokens;
      return n >= ring_tokens ? group_ring_pages[g]
                              : (n + geometry.page_tokens - 1) / geometry.page_tokens;
    }
    return (longest_column + geometry.page_tokens - 1) / geometry.page_tokens;
  }
};

/**
 * @brief Host-side structural checks of a view and a layer index, shared by every operation that
 * takes one (the arrays themselves are not read: they may be device memory).
 * @param owner names the parameter struct in messages, e.g. "decode_params"
 * @throw invalid_argument naming the field and the value.
 */
inline void validate_view(kv_cache_view const& kv,
                          std::string_view owner,
                          std::int32_t layer,
                          std::int32_t max_batch = std::numeric_limits<std::int32_t>::max()) {
  kv.geometry.validate();
  TANGRAM_EXPECTS(kv.pool != nullptr, invalid_argument, owner, ".kv.pool: null");
  TANGRAM_EXPECTS(kv.head_slots && kv.group_window && kv.group_ring_pages && kv.page_offset &&
                      kv.pages && kv.head_base_len && kv.appended && kv.seq_tokens,
                  invalid_argument,
                  owner,
                  ".kv: a page-table array is null");
  TANGRAM_EXPECTS(kv.batch_size >= 0 && kv.batch_size <= max_batch,
                  invalid_argument,
                  owner,
                  ".kv.batch_size: must be in [0, ",
                  max_batch,
                  "], got ",
                  kv.batch_size);
  TANGRAM_EXPECTS(kv.batch_size == 0 || kv.batch_slots != nullptr,
                  invalid_argument,
                  owner,
                  ".kv.batch_slots: null with batch_size ",
                  kv.batch_size);
  TANGRAM_EXPECTS(kv.num_layers >= 1 && kv.num_kv_heads >= 1 && kv.num_groups >= 1,
                  invalid_argument,
                  owner,
                  ".kv: num_layers, num_kv_heads and num_groups must be >= 1, got ",
                  kv.num_layers,
                  ", ",
                  kv.num_kv_heads,
                  ", ",
                  kv.num_groups);
  TANGRAM_EXPECTS(layer >= 0 && layer < kv.num_layers,
                  invalid_argument,
                  owner,
                  ".layer: must be in [0, ",
                  kv.num_layers - 1,
                  "], got ",
                  layer);
}

}  // namespace tangram
