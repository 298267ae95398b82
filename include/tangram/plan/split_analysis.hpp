// SPDX-License-Identifier: Apache-2.0
/**
 * @file plan/split_analysis.hpp
 * @brief Per-step use of the static split map, two per-step planners to compare it with, and the
 * load-imbalance measure (pure host arithmetic; the per-head functions are also device-callable).
 *
 * AOT mapping (the library's way). For head h of layer l with S = share(l, h) CTAs, the head's
 * token stream is the concatenation over the batch's requests of the tokens the head holds
 * (`head_tokens`); prefix offsets o[0..batch] cost O(batch). CTA j of the head covers stream
 * positions [floor(j W / S), floor((j + 1) W / S)), W = o[batch], and writes one partial result
 * per request it touches at slot `split_map_view::partial_slot(l, h, j, r, batch)`. Mapping a
 * whole layer is O(H x batch + N_CTA) and writes at most `partial_slots(batch)` pieces into a
 * caller buffer: nothing is allocated and nothing is planned.
 *
 * Baselines (what a serving stack does today, re-planned every step):
 * - equal split, like FlashInfer's decode planner: a request's length is its longest head; one
 *   chunk size c for the whole batch, the smallest c >= min_chunk (binary search) such that
 *   H x sum_r ceil(L_r / c) <= N_CTA; every head of request r gets the same ceil(L_r / c) CTAs
 *   whatever its own length. When batch x H >= N_CTA nothing is split (one CTA per (request,
 *   head)) and the launch runs in waves.
 * - greedy: every (request, head) is cut into ceil(len / c) near-equal chunks,
 *   c = max(min_chunk, ceil(total / (k x N_CTA))), k chunks per slot (1 like FlashInfer's
 *   holistic planner, whose chunk limit is total / CTAs; 4 for a finer, costlier plan); chunks are
 *   sorted longest first and each goes to the least-loaded of the N_CTA slots (a min-heap):
 *   longest-processing-time list scheduling.
 *
 * Load imbalance of a launch = max slot tokens / mean slot tokens over the N_CTA slots. A launch
 * of more than N_CTA CTAs is scheduled in waves: CTAs in launch order (blockIdx.x fastest), each
 * to the least-loaded slot.
 */
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <utility>
#include <vector>

#include "tangram/config.hpp"
#include "tangram/detail/stats.hpp"
#include "tangram/error.hpp"
#include "tangram/plan/retention.hpp"
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

/**
 * @brief Tokens each CTA of one layer's AOT launch attends: loads[c] for c in [0, N_CTA).
 * O(H x batch + N_CTA); allocates nothing.
 * @param offsets scratch of batch + 1 entries; @param loads caller buffer of N_CTA entries
 */
inline void aot_cta_loads(split_map_view const& view,
                          std::int32_t layer,
                          head_rule const* rules,
                          std::int64_t const* contexts,
                          std::int64_t const* decoded,
                          std::int32_t batch,
                          std::int64_t* offsets,
                          std::int64_t* loads) {
  for (std::int32_t h = 0; h < view.num_kv_heads; ++h) {
    std::int64_t total = head_stream_offsets(rules[h], contexts, decoded, batch, offsets);
    std::int64_t share = view.share(layer, h);
    std::int32_t base  = view.begin(layer, h);
    std::int64_t lo    = 0;
    for (std::int64_t j = 0; j < share; ++j) {
      std::int64_t hi = split_bound(j + 1, share, total);
      loads[base + j] = hi - lo;
      lo              = hi;
    }
  }
}

/// Max slot load over mean slot load; 1 when there is no work at all.
inline double load_imbalance(std::int64_t const* loads, std::int32_t num_slots) {
  std::int64_t mx = 0, sum = 0;
  for (std::int32_t i = 0; i < num_slots; ++i) {
    mx = std::max(mx, loads[i]);
    sum += loads[i];
  }
  return sum > 0 ? static_cast<double>(mx) * num_slots / static_cast<double>(sum) : 1.0;
}

/// @brief What the equal-split (FlashInfer-style) planner chose for one launch.
struct equal_split_plan {
  std::int64_t chunk_tokens = 0;      ///< c, the same for every request and head
  std::int64_t num_ctas     = 0;      ///< H x sum_r max(1, ceil(L_r / c))
  bool split                = false;  ///< false when batch x H >= N_CTA (no split, waves)
};

namespace detail {
/// L_r = max over heads of head_lengths[r * num_heads + h].
inline std::int64_t request_length(std::int64_t const* head_lengths,
                                   std::int32_t r,
                                   std::int32_t num_heads) {
  std::int64_t m = 0;
  for (std::int32_t h = 0; h < num_heads; ++h)
    m = std::max(m, head_lengths[static_cast<std::size_t>(r) * num_heads + h]);
  return m;
}
inline std::int64_t equal_split_ctas(std::int64_t const* head_lengths,
                                     std::int32_t batch,
                                     std::int32_t num_heads,
                                     std::int64_t chunk) {
  std::int64_t n = 0;
  for (std::int32_t r = 0; r < batch; ++r)
    n += std::max<std::int64_t>(1, ceil_div(request_length(head_lengths, r, num_heads), chunk));
  return n * num_heads;
}
/// Min-heap of (load, slot): the least-loaded slot first, ties to the lower slot.
using slot_heap = std::vector<std::pair<std::int64_t, std::int32_t>>;
inline void reset_slots(slot_heap& heap, std::int32_t num_slots) {
  heap.clear();
  for (std::int32_t s = 0; s < num_slots; ++s) heap.emplace_back(0, s);  // already a valid min-heap
}
inline std::int32_t assign_to_least_loaded(slot_heap& heap,
                                           std::int64_t tokens,
                                           std::int64_t* loads) {
  std::pop_heap(heap.begin(), heap.end(), std::greater<>());
  auto& top = heap.back();
  top.first += tokens;
  loads[top.second] = top.first;
  std::int32_t slot = top.second;
  std::push_heap(heap.begin(), heap.end(), std::greater<>());
  return slot;
}
}  // namespace detail

/**
 * @brief The equal-split (FlashInfer-style) decode plan of one launch.
 * @param head_lengths [batch * num_heads] tokens of head h of request r at r * num_heads + h
 * @param min_chunk    smallest chunk (FlashInfer: 128 tokens)
 * @throw invalid_argument for batch, num_heads, num_ctas or min_chunk below 1.
 */
inline equal_split_plan plan_equal_split(std::int64_t const* head_lengths,
                                         std::int32_t batch,
                                         std::int32_t num_heads,
                                         std::int32_t num_ctas,
                                         std::int64_t min_chunk = 128) {
  TANGRAM_EXPECTS(batch >= 1 && num_heads >= 1 && num_ctas >= 1 && min_chunk >= 1,
                  invalid_argument,
                  "plan_equal_split: batch, num_heads, num_ctas and min_chunk must be >= 1, got ",
                  batch,
                  ", ",
                  num_heads,
                  ", ",
                  num_ctas,
                  ", ",
                  min_chunk);
  std::int64_t longest = 0;
  for (std::int32_t r = 0; r < batch; ++r)
    longest = std::max(longest, detail::request_length(head_lengths, r, num_heads));
  equal_split_plan p;
  std::int64_t unsplit = static_cast<std::int64_t>(batch) * num_heads;
  if (unsplit >= num_ctas) {
    p.chunk_tokens = std::max<std::int64_t>(longest, 1);
    p.num_ctas     = unsplit;
    return p;
  }
  std::int64_t lo = min_chunk, hi = std::max(longest, min_chunk);  // ctas(hi) == unsplit fits
  while (lo < hi) {
    std::int64_t mid = lo + (hi - lo) / 2;
    if (detail::equal_split_ctas(head_lengths, batch, num_heads, mid) <= num_ctas)
      hi = mid;
    else
      lo = mid + 1;
  }
  p.chunk_tokens = lo;
  p.num_ctas     = detail::equal_split_ctas(head_lengths, batch, num_heads, lo);
  p.split        = p.num_ctas > unsplit;
  return p;
}

/**
 * @brief Slot loads of an equal-split launch: the CTAs in launch order (grid (chunks, heads),
 * chunks of all requests fastest), each to the least-loaded of `num_ctas` slots. CTA (r, i, h)
 * attends max(0, min(len(r,h), (i + 1) c) - i c) tokens.
 * @param loads [num_ctas] output; @param heap scratch
 */
inline void equal_split_loads(std::int64_t const* head_lengths,
                              std::int32_t batch,
                              std::int32_t num_heads,
                              std::int32_t num_ctas,
                              equal_split_plan const& plan,
                              std::int64_t* loads,
                              detail::slot_heap& heap) {
  std::fill(loads, loads + num_ctas, std::int64_t{0});
  detail::reset_slots(heap, num_ctas);
  std::int64_t c = plan.chunk_tokens;
  for (std::int32_t h = 0; h < num_heads; ++h) {
    for (std::int32_t r = 0; r < batch; ++r) {
      std::int64_t chunks = std::max<std::int64_t>(
          1, ceil_div(detail::request_length(head_lengths, r, num_heads), c));
      std::int64_t len = head_lengths[static_cast<std::size_t>(r) * num_heads + h];
      for (std::int64_t i = 0; i < chunks; ++i) {
        std::int64_t t = std::max<std::int64_t>(0, std::min(len, (i + 1) * c) - i * c);
        detail::assign_to_least_loaded(heap, t, loads);
      }
    }
  }
}

/**
 * @brief The per-step greedy (longest-processing-time) planner. Owns its scratch buffers so that
 * repeated plans do not allocate once warm; one object per thread.
 */
class greedy_split_planner {
 public:
  /// One chunk of work and the slot it was given.
  struct item {
    std::int64_t tokens   = 0;
    std::int64_t kv_begin = 0;
    std::int32_t request  = 0;
    std::int32_t head     = 0;
    std::int32_t slot     = 0;
  };

  /// @param min_chunk       smallest chunk the planner cuts (tokens)
  /// @param chunks_per_slot k: the chunk limit is total / (k x N_CTA)
  /// @throw invalid_argument when either is below 1.
  explicit greedy_split_planner(std::int64_t min_chunk = 128, std::int32_t chunks_per_slot = 1)
      : min_chunk_(min_chunk), chunks_per_slot_(chunks_per_slot) {
    TANGRAM_EXPECTS(min_chunk >= 1,
                    invalid_argument,
                    "greedy_split_planner: min_chunk must be >= 1, got ",
                    min_chunk);
    TANGRAM_EXPECTS(chunks_per_slot >= 1,
                    invalid_argument,
                    "greedy_split_planner: chunks_per_slot must be >= 1, got ",
                    chunks_per_slot);
  }

  /**
   * @brief Plans one launch: chunks, sorts longest first, assigns to the least-loaded slot.
   * @param head_lengths [batch * num_heads]; @param loads [num_ctas] output slot loads
   * @throw invalid_argument for batch, num_heads or num_ctas below 1.
   */
  void plan(std::int64_t const* head_lengths,
            std::int32_t batch,
            std::int32_t num_heads,
            std::int32_t num_ctas,
            std::int64_t* loads) {
    TANGRAM_EXPECTS(batch >= 1 && num_heads >= 1 && num_ctas >= 1,
                    invalid_argument,
                    "greedy_split_planner: batch, num_heads and num_ctas must be >= 1, got ",
                    batch,
                    ", ",
                    num_heads,
                    ", ",
                    num_ctas);
    std::int64_t total = 0;
    std::size_t works  = static_cast<std::size_t>(batch) * static_cast<std::size_t>(num_heads);
    for (std::size_t i = 0; i < works; ++i) total += head_lengths[i];
    chunk_ = std::max(min_chunk_,
                      ceil_div(total, static_cast<std::int64_t>(chunks_per_slot_) * num_ctas));
    items_.clear();
    for (std::int32_t r = 0; r < batch; ++r) {
      for (std::int32_t h = 0; h < num_heads; ++h) {
        std::int64_t len = head_lengths[static_cast<std::size_t>(r) * num_heads + h];
        if (len == 0) continue;
        std::int64_t k = ceil_div(len, chunk_);
        for (std::int64_t i = 0; i < k; ++i) {
          std::int64_t b = i * len / k, e = (i + 1) * len / k;
          items_.push_back({e - b, b, r, h, 0});
        }
      }
    }
    std::sort(items_.begin(), items_.end(), [](item const& a, item const& b) {
      if (a.tokens != b.tokens) return a.tokens > b.tokens;
      if (a.request != b.request) return a.request < b.request;
      if (a.head != b.head) return a.head < b.head;
      return a.kv_begin < b.kv_begin;
    });
    std::fill(loads, loads + num_ctas, std::int64_t{0});
    detail::reset_slots(heap_, num_ctas);
    for (auto& it : items_) it.slot = detail::assign_to_least_loaded(heap_, it.tokens, loads);
  }

  /// The chunks of the last plan, longest first, with their slots.
  [[nodiscard]] std::vector<item> const& items() const noexcept { return items_; }
  /// The chunk limit c of the last plan.
  [[nodiscard]] std::int64_t chunk_tokens() const noexcept { return chunk_; }

 private:
  std::int64_t min_chunk_;
  std::int32_t chunks_per_slot_;
  std::int64_t chunk_ = 0;
  std::vector<item> items_;
  detail::slot_heap heap_;
};

/// @brief Load imbalance of the three planners on one launch.
struct planner_imbalance {
  double aot         = 1.0;
  double equal_split = 1.0;
  double greedy      = 1.0;  ///< greedy with 1 chunk per slot
  double greedy_fine = 1.0;  ///< greedy with 4 chunks per slot
};

/**
 * @brief Runs the three planners on the layers of a model for given batches, reusing buffers.
 * Holds copies of the rules and the split map. One object per thread.
 */
class split_evaluator {
 public:
  /// @param rules [map.num_layers * map.num_kv_heads]
  /// @throw invalid_argument when the sizes disagree or the map is invalid.
  split_evaluator(std::vector<head_rule> rules, split_map map, std::int64_t min_chunk = 128)
      : rules_(std::move(rules)),
        map_(std::move(map)),
        greedy_(min_chunk, 1),
        greedy_fine_(min_chunk, 4),
        min_chunk_(min_chunk) {
    map_.validate();
    TANGRAM_EXPECTS(rules_.size() == static_cast<std::size_t>(map_.num_layers) * map_.num_kv_heads,
                    invalid_argument,
                    "split_evaluator: expected ",
                    map_.num_layers * map_.num_kv_heads,
                    " rules, got ",
                    rules_.size());
  }

  [[nodiscard]] std::int32_t num_layers() const noexcept { return map_.num_layers; }
  [[nodiscard]] split_map const& map() const noexcept { return map_; }

  /**
   * @brief Imbalance of each planner on layer `layer` for a batch (decode tokens 0).
   * @throw invalid_argument when batch < 1 or the layer is out of range.
   */
  planner_imbalance evaluate(std::int32_t layer, std::int64_t const* contexts, std::int32_t batch) {
    TANGRAM_EXPECTS(batch >= 1, invalid_argument, "batch: must be >= 1, got ", batch);
    TANGRAM_EXPECTS(layer >= 0 && layer < map_.num_layers,
                    invalid_argument,
                    "layer: must be in [0, ",
                    map_.num_layers - 1,
                    "], got ",
                    layer);
    auto H = map_.num_kv_heads;
    auto N = map_.num_ctas();
    offsets_.resize(static_cast<std::size_t>(batch) + 1);
    loads_.resize(static_cast<std::size_t>(N));
    lengths_.resize(static_cast<std::size_t>(batch) * H);
    head_rule const* rules = rules_.data() + static_cast<std::size_t>(layer) * H;
    for (std::int32_t r = 0; r < batch; ++r)
      for (std::int32_t h = 0; h < H; ++h)
        lengths_[static_cast<std::size_t>(r) * H + h] = head_tokens(rules[h], contexts[r], 0);
    planner_imbalance out;
    aot_cta_loads(
        map_.view(), layer, rules, contexts, nullptr, batch, offsets_.data(), loads_.data());
    out.aot = load_imbalance(loads_.data(), N);
    auto eq = plan_equal_split(lengths_.data(), batch, H, N, min_chunk_);
    equal_split_loads(lengths_.data(), batch, H, N, eq, loads_.data(), heap_);
    out.equal_split = load_imbalance(loads_.data(), N);
    greedy_.plan(lengths_.data(), batch, H, N, loads_.data());
    out.greedy = load_imbalance(loads_.data(), N);
    greedy_fine_.plan(lengths_.data(), batch, H, N, loads_.data());
    out.greedy_fine = load_imbalance(loads_.data(), N);
    return out;
  }

 private:
  std::vector<head_rule> rules_;
  split_map map_;
  greedy_split_planner greedy_, greedy_fine_;
  std::int64_t min_chunk_;
  std::vector<std::int64_t> offsets_, loads_, lengths_;
  detail::slot_heap heap_;
};

/// @brief Mean, 95th percentile (linear interpolation) and maximum of a set of imbalances.
struct imbalance_summary {
  double mean = 0, p95 = 0, max = 0;
  std::size_t count = 0;
};

/// @brief Summarises `values` (copied; empty gives all zeros).
inline imbalance_summary summarize_imbalance(std::vector<double> values) {
  imbalance_summary s;
  s.count = values.size();
  if (values.empty()) return s;
  s.mean = detail::mean_of(values.data(), values.size());
  s.max  = *std::max_element(values.begin(), values.end());
  s.p95  = detail::linear_quantile(values, 0.95);
  return s;
}

/**
 * @brief `count` context lengths drawn log-uniformly in [lo, hi]: round(exp(U(ln lo, ln hi))),
 * U from a 64-bit Mersenne Twister seeded with `seed` (the same numbers on every platform).
 * @throw invalid_argument unless 1 <= lo <= hi and count >= 0.
 */
inline std::vector<std::int64_t> log_uniform_contexts(std::int32_t count,
                                                      std::int64_t lo,
                                                      std::int64_t hi,
                                                      std::uint64_t seed) {
  TANGRAM_EXPECTS(count >= 0, invalid_argument, "count: must be >= 0, got ", count);
  TANGRAM_EXPECTS(lo >= 1 && lo <= hi,
                  invalid_argument,
                  "contexts: need 1 <= lo <= hi, got [",
                  lo,
                  ", ",
                  hi,
                  "]");
  std::mt19937_64 rng(seed);
  double a = std::log(static_cast<double>(lo)), b = std::log(static_cast<double>(hi));
  std::vector<std::int64_t> out(static_cast<std::size_t>(count));
  for (auto& n : out) {
    auto v = static_cast<std::int64_t>(
        std::llround(std::exp(a + (b - a) * detail::canonical_uniform(rng))));
    n = std::clamp(v, lo, hi);
  }
  return out;
}

/// @brief The batch `tangram plan` reports its split imbalance on: 32 requests, contexts
/// log-uniform in [1K, 128K], seed 1.
struct reference_batch {
  std::int32_t requests    = 32;
  std::int64_t min_context = 1024;
  std::int64_t max_context = 131072;
  std::uint64_t seed       = 1;

  [[nodiscard]] std::vector<std::int64_t> contexts() const {
    return log_uniform_contexts(requests, min_context, max_context, seed);
  }
};

/// @brief Per planner, the imbalance summarised over the layers of one batch.
struct batch_imbalance {
  imbalance_summary aot, equal_split, greedy, greedy_fine;
};

/**
 * @brief Imbalance of each planner over every layer of a model for one batch.
 * @param rules [map.num_layers * map.num_kv_heads]
 */
inline batch_imbalance layer_imbalance(std::vector<head_rule> const& rules,
                                       split_map const& map,
                                       std::vector<std::int64_t> const& contexts) {
  TANGRAM_EXPECTS(!contexts.empty(), invalid_argument, "contexts: empty batch");
  split_evaluator ev(rules, map);
  std::vector<double> a, e, g, f;
  for (std::int32_t l = 0; l < map.num_layers; ++l) {
    auto r = ev.evaluate(l, contexts.data(), static_cast<std::int32_t>(contexts.size()));
    a.push_back(r.aot);
    e.push_back(r.equal_split);
    g.push_back(r.greedy);
    f.push_back(r.greedy_fine);
  }
  return {summarize_imbalance(std::move(a)),
          summarize_imbalance(std::move(e)),
          summarize_imbalance(std::move(g)),
          summarize_imbalance(std::move(f))};
}

}  // namespace tangram
