// SPDX-License-Identifier: Apache-2.0
/**
 * @file plan/aot_mapping.hpp
 * @brief The per-step use of the static split map: which CTA of a layer's decode launch attends
 * which tokens of which request (pure host arithmetic; the per-head functions are also
 * device-callable). Nothing here allocates or plans: the plan was made ahead of time.
 *
 * For head h of layer l with S = share(l, h) CTAs, the head's token stream is the concatenation
 * over the batch's requests of the tokens the head holds (`head_tokens`); prefix offsets
 * o[0..batch] cost O(batch). CTA j of the head covers stream positions
 * [floor(j W / S), floor((j + 1) W / S)), W = o[batch], and writes one partial result per request
 * it touches at slot `split_map_view::partial_slot(l, h, j, r, batch)`. Mapping a whole layer is
 * O(H x batch + N_CTA) and writes at most `partial_slots(batch)` pieces into a caller buffer.
 *
 * Thread safety: every function is pure (reads its arguments, writes only the caller's buffers).
 * The per-step planners this mapping is compared with live in the evaluation code
 * (eval/include/tangram/eval/split_imbalance.hpp), not in the installed library.
 */
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "tangram/core/config.hpp"
#include "tangram/core/error.hpp"
#include "tangram/core/retention.hpp"
#include "tangram/plan/split_map.hpp"

namespace tangram {

/**
 * @brief Tokens one head holds for a request that has seen `context` tokens and decoded
 * `decoded` more since: retained_tokens(rule, context) + decoded; a sliding-window head holds
 * min(context + decoded, W). Same rule as `group_pages` in plan/footprint.hpp.
 */
TANGRAM_HOST_DEVICE std::int64_t head_tokens(head_rule const& rule,
                                             std::int64_t context,
                                             std::int64_t decoded) {
  if (rule.kind == layer_kind::sliding_window) {
    std::int64_t n = context + decoded;
    return n < rule.window ? n : rule.window;
  }
  return retained_tokens(rule, context) + decoded;
}

/**
 * @brief Prefix offsets of one head's token stream over a batch: offsets[0] = 0,
 * offsets[r + 1] = offsets[r] + head_tokens(rule, contexts[r], decoded[r]). O(batch).
 * @param decoded may be null (no decode tokens yet)
 * @param offsets caller buffer of batch + 1 entries
 * @return the head's total tokens W = offsets[batch]
 */
TANGRAM_HOST_DEVICE std::int64_t head_stream_offsets(head_rule const& rule,
                                                     std::int64_t const* contexts,
                                                     std::int64_t const* decoded,
                                                     std::int32_t batch,
                                                     std::int64_t* offsets) {
  offsets[0] = 0;
  for (std::int32_t r = 0; r < batch; ++r)
    offsets[r + 1] =
        offsets[r] + head_tokens(rule, contexts[r], decoded != nullptr ? decoded[r] : 0);
  return offsets[batch];
}

/// The request whose stream range contains position `pos` (0 <= pos < offsets[batch]): the
/// smallest r with offsets[r + 1] > pos. Binary search, O(log batch).
TANGRAM_HOST_DEVICE std::int32_t request_of_position(std::int64_t pos,
                                                     std::int64_t const* offsets,
                                                     std::int32_t batch) {
  std::int32_t lo = 0, hi = batch - 1;
  while (lo < hi) {
    std::int32_t mid = lo + (hi - lo) / 2;
    if (offsets[mid + 1] > pos)
      hi = mid;
    else
      lo = mid + 1;
  }
  return lo;
}

/**
 * @brief Calls `f(request, kv_begin, kv_end)` for every non-empty piece of local CTA `j` of a
 * head with `share` CTAs; kv_begin/kv_end index the head's tokens of that request. What one CTA
 * does at run time: O(log batch + pieces), no state.
 */
template <class F>
TANGRAM_HOST_DEVICE void for_each_cta_piece(
    std::int64_t j, std::int64_t share, std::int64_t const* offsets, std::int32_t batch, F&& f) {
  std::int64_t total = offsets[batch];
  if (total == 0) return;
  std::int64_t lo = split_bound(j, share, total), hi = split_bound(j + 1, share, total);
  if (lo >= hi) return;
  for (std::int32_t r = request_of_position(lo, offsets, batch); r < batch && offsets[r] < hi;
       ++r) {
    std::int64_t b = lo > offsets[r] ? lo : offsets[r];
    std::int64_t e = hi < offsets[r + 1] ? hi : offsets[r + 1];
    if (b < e) f(r, b - offsets[r], e - offsets[r]);
  }
}

/// @brief One piece of decode work: CTA `cta` attends tokens [kv_begin, kv_end) of local KV head
/// `head` of request `request` and writes its partial result to `partial_slot`. POD.
struct cta_piece {
  std::int32_t cta          = 0;  ///< CTA index in the layer's launch, in [0, N_CTA)
  std::int32_t head         = 0;  ///< local KV head
  std::int32_t request      = 0;  ///< index in the batch
  std::int64_t kv_begin     = 0;
  std::int64_t kv_end       = 0;
  std::int64_t partial_slot = 0;  ///< in [0, split_map_view::partial_slots(batch))

  friend bool operator==(cta_piece const& a, cta_piece const& b) {
    return a.cta == b.cta && a.head == b.head && a.request == b.request &&
           a.kv_begin == b.kv_begin && a.kv_end == b.kv_end && a.partial_slot == b.partial_slot;
  }
};

/**
 * @brief The AOT mapping of one layer's decode launch for a batch: every non-empty piece, in CTA
 * order (and request order within a CTA). O(H x batch + N_CTA); allocates nothing.
 * @param rules    the layer's `view.num_kv_heads` head rules
 * @param contexts [batch] tokens each request has seen (prompt + history)
 * @param decoded  [batch] decode tokens since the last recompression, or null
 * @param offsets  scratch of batch + 1 entries
 * @param out      caller buffer; `capacity >= view.partial_slots(batch)` always suffices
 * @return the number of pieces written
 * @throw invalid_argument (before writing anything) when batch < 1, the layer is out of range or
 *        capacity is below partial_slots(batch).
 */
inline std::size_t map_layer_pieces(split_map_view const& view,
                                    std::int32_t layer,
                                    head_rule const* rules,
                                    std::int64_t const* contexts,
                                    std::int64_t const* decoded,
                                    std::int32_t batch,
                                    std::int64_t* offsets,
                                    cta_piece* out,
                                    std::size_t capacity) {
  TANGRAM_EXPECTS(batch >= 1, invalid_argument, "batch: must be >= 1, got ", batch);
  TANGRAM_EXPECTS(!view.layer_stream,
                  invalid_argument,
                  "view.layer_stream: map_layer_pieces maps a per-head split map; a layer stream "
                  "has no per-head CTAs");
  TANGRAM_EXPECTS(layer >= 0 && layer < view.num_layers,
                  invalid_argument,
                  "layer: must be in [0, ",
                  view.num_layers - 1,
                  "], got ",
                  layer);
  TANGRAM_EXPECTS(capacity >= static_cast<std::size_t>(view.partial_slots(batch)),
                  invalid_argument,
                  "capacity: ",
                  capacity,
                  " pieces is below partial_slots(",
                  batch,
                  ") = ",
                  view.partial_slots(batch));
  std::size_t n = 0;
  for (std::int32_t h = 0; h < view.num_kv_heads; ++h) {
    std::int64_t total = head_stream_offsets(rules[h], contexts, decoded, batch, offsets);
    if (total == 0) continue;
    std::int64_t share = view.share(layer, h);
    std::int32_t base  = view.begin(layer, h);
    std::int32_t r     = 0;  // first request not entirely before the current CTA
    std::int64_t hi    = 0;  // bound(j + 1) becomes bound(j) of the next CTA: one division per CTA
    for (std::int64_t j = 0; j < share; ++j) {
      std::int64_t lo = hi;
      hi              = split_bound(j + 1, share, total);
      if (lo >= hi) continue;
      while (offsets[r + 1] <= lo) ++r;
      for (std::int32_t q = r; q < batch && offsets[q] < hi; ++q) {
        std::int64_t b = std::max(lo, offsets[q]), e = std::min(hi, offsets[q + 1]);
        if (b >= e) continue;
        cta_piece& p   = out[n++];
        p.cta          = base + static_cast<std::int32_t>(j);
        p.head         = h;
        p.request      = q;
        p.kv_begin     = b - offsets[q];
        p.kv_end       = e - offsets[q];
        p.partial_slot = view.partial_slot(layer, h, static_cast<std::int32_t>(j), q, batch);
      }
    }
  }
  return n;
}

}  // namespace tangram
