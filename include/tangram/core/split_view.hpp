// SPDX-License-Identifier: Apache-2.0
/**
 * @file core/split_view.hpp
 * @brief The view of a static Workload Split Map (the paper's Algorithm 1) and the O(1) arithmetic
 * that maps a decode CTA to its work at run time. The owning map and its builder:
 * plan/split_map.hpp, plan/split_planner.hpp.
 *
 * Static part (computed once per plan): for every layer l, the N_CTA CTAs of one decode launch are
 * divided among the layer's KV heads: head h owns CTAs [begin(l,h), begin(l,h+1)), at least one,
 * in proportion to its expected work. (A CTA serves one KV head and all query heads of its GQA
 * group, so each head is one work unit; per-group shares are sums of their members' shares.)
 *
 * Per step (no planning, no allocation, fixed grid): the S CTAs of head h split the concatenation
 * of that head's KV tokens over the batch's requests evenly. CTA j covers stream positions
 * [bound(j), bound(j+1)) with bound(j) = floor(j * W / S), W the head's total tokens. A CTA may
 * cover pieces of several requests; each piece is one partial result (o, max, sum) stored at
 * partial slot `j + r` of the head, which is unique because j + r grows along the stream. The
 * merge of request r reads slots j + r for j in [first_cta(r), last_cta(r)].
 *
 * Layer stream (`split_map_view::layer_stream`, no boundaries): the N_CTA CTAs cut the whole
 * layer's stream, every head's tokens in head order (each head's requests in batch order), into
 * N_CTA ranges of W / N_CTA tokens, W the layer's total; a CTA whose range crosses a head boundary
 * serves both heads (a piece per (head, request) it reaches). No per-head rounding of CTAs, so
 * the fullest CTA holds ceil(W / N_CTA) tokens whatever the heads' lengths, and nothing is planned
 * per step: the kernels find each head's origin from the view's lengths. In this mode every CTA
 * may reach every head (head_first_cta 0, head_ctas N_CTA), head h's tokens at stream positions
 * [O_h, O_h + W_h);
 * the piece of CTA j for request r of head h goes to slot `j + h * batch + r`, unique because
 * along the layer stream j + r grows within a head and heads are batch slots apart. `begin` and
 * `share` read a per-head map's boundaries; `head_first_cta` and `head_ctas` answer for both.
 *
 * Every function here is host/device: the CPU reference and the CUDA kernels share them.
 */
#pragma once

#include <cstdint>

#include "tangram/core/config.hpp"

namespace tangram {

/// @brief Non-owning view of a split map's CTA boundaries. POD; pointers may be host or device.
struct split_map_view {
  std::int32_t num_layers       = 0;
  std::int32_t num_kv_heads     = 0;        ///< work units per layer
  std::int32_t num_ctas         = 0;        ///< N_CTA, the grid size of one layer's decode launch
  const std::int32_t* cta_begin = nullptr;  ///< [num_layers * (num_kv_heads + 1)]; unused (may
                                            ///< be null) when layer_stream
  /// The layer-stream split (file comment): CTAs cut the layer's concatenated stream, crossing
  /// head boundaries; no boundaries are read.
  bool layer_stream = false;

  /// First CTA of head `h` of layer `l` (h == num_kv_heads gives num_ctas).
  /// (Per-head maps: reads the boundaries.)
  TANGRAM_HOST_DEVICE std::int32_t begin(std::int32_t l, std::int32_t h) const {
    return cta_begin[l * (num_kv_heads + 1) + h];
  }
  /// CTAs owned by head `h` of layer `l` (per-head maps).
  TANGRAM_HOST_DEVICE std::int32_t share(std::int32_t l, std::int32_t h) const {
    return begin(l, h + 1) - begin(l, h);
  }
  /// First CTA of head `h`'s stream in either mode: begin(l, h), or 0 with a layer stream (the
  /// stream is the layer's, every CTA may reach every head).
  TANGRAM_HOST_DEVICE std::int32_t head_first_cta(std::int32_t l, std::int32_t h) const {
    return layer_stream ? 0 : begin(l, h);
  }
  /// CTAs of head `h`'s stream in either mode: share(l, h), or num_ctas with a layer stream.
  TANGRAM_HOST_DEVICE std::int32_t head_ctas(std::int32_t l, std::int32_t h) const {
    return layer_stream ? num_ctas : share(l, h);
  }
  /// The head that CTA `cta` of layer `l` serves (binary search over the layer's boundaries;
  /// per-head maps only: a layer-stream CTA's heads depend on the batch's lengths).
  TANGRAM_HOST_DEVICE std::int32_t head_of_cta(std::int32_t l, std::int32_t cta) const {
    std::int32_t lo = 0, hi = num_kv_heads - 1;
    while (lo < hi) {
      std::int32_t mid = (lo + hi + 1) / 2;
      if (begin(l, mid) <= cta)
        lo = mid;
      else
        hi = mid - 1;
    }
    return lo;
  }
  /// Partial-result slots one layer's launch needs for a batch of `batch` requests.
  TANGRAM_HOST_DEVICE std::int64_t partial_slots(std::int32_t batch) const {
    return static_cast<std::int64_t>(num_ctas) + static_cast<std::int64_t>(num_kv_heads) * batch;
  }
  /// Slot of the partial result of CTA `j` (local to head h; the CTA's index in the layer with a
  /// layer stream) for request `r`: in either mode the CTA's index in the layer + h * batch + r.
  TANGRAM_HOST_DEVICE std::int64_t partial_slot(
      std::int32_t l, std::int32_t h, std::int32_t j, std::int32_t r, std::int32_t batch) const {
    return static_cast<std::int64_t>(head_first_cta(l, h)) + static_cast<std::int64_t>(h) * batch +
           j + r;
  }
};

/// The layer-stream split of `num_ctas` CTAs for a plan of `num_layers` x `num_kv_heads` (no
/// arrays: valid on host and device alike).
TANGRAM_HOST_DEVICE split_map_view layer_stream_split(std::int32_t num_layers,
                                                      std::int32_t num_kv_heads,
                                                      std::int32_t num_ctas) {
  split_map_view v;
  v.num_layers   = num_layers;
  v.num_kv_heads = num_kv_heads;
  v.num_ctas     = num_ctas;
  v.layer_stream = true;
  return v;
}

/// Start of CTA `j`'s range in a head's token stream of `total` tokens split over `share` CTAs.
TANGRAM_HOST_DEVICE std::int64_t split_bound(std::int64_t j,
                                             std::int64_t share,
                                             std::int64_t total) {
  return j * total / share;
}

/// The first CTA (local index) whose range contains stream position `pos` (0 <= pos < total).
TANGRAM_HOST_DEVICE std::int64_t split_cta_of(std::int64_t pos,
                                              std::int64_t share,
                                              std::int64_t total) {
  // max{ j : floor(j * total / share) <= pos } = ceil((pos + 1) * share / total) - 1
  return ((pos + 1) * share + total - 1) / total - 1;
}

}  // namespace tangram
