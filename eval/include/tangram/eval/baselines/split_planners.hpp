// SPDX-License-Identifier: Apache-2.0
/**
 * @file eval/baselines/split_planners.hpp
 * @brief Two per-step decode split planners, what a serving stack does today (re-planned every
 * step), to compare the static split map with. Evaluation code: not installed.
 *
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
 * A launch of more than N_CTA CTAs is scheduled in waves: CTAs in launch order (blockIdx.x
 * fastest), each to the least-loaded slot. The free functions are pure; a planner object owns
 * its scratch (one per thread).
 */
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "tangram/core/error.hpp"
#include "tangram/core/retention.hpp"

namespace tangram {

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

}  // namespace tangram
