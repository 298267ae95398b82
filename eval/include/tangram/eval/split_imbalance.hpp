// SPDX-License-Identifier: Apache-2.0
/**
 * @file eval/split_imbalance.hpp
 * @brief Load imbalance of the AOT split map against the per-step planners
 * (eval/baselines/split_planners.hpp): per launch, per layer and summarised over a model, plus the
 * reproducible batches the figures use. Evaluation code: not installed.
 *
 * Load imbalance of a launch = max slot tokens / mean slot tokens over the N_CTA slots. The
 * measures take explicit per-request, per-head lengths (`aot_cta_loads_from_lengths`,
 * `split_evaluator::evaluate_lengths`, `layer_imbalance_from_lengths`), so they apply to any
 * placement. The context-based forms give every head head_tokens(rule, n, 0): `evaluate` and
 * `layer_imbalance` go through the lengths forms; `aot_cta_loads` shares their per-head split.
 * Elastic placements of real samples come from plan/elastic_placement.hpp. The free functions
 * are pure; a `split_evaluator` owns its buffers (one per thread).
 */
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "tangram/core/error.hpp"
#include "tangram/core/retention.hpp"
#include "tangram/eval/balanced_split.hpp"
#include "tangram/eval/baselines/split_planners.hpp"
#include "tangram/kernels/decode_attention.hpp"
#include "tangram/plan/aot_mapping.hpp"
#include "tangram/plan/detail/stats.hpp"
#include "tangram/plan/elastic_placement.hpp"
#include "tangram/plan/split_map.hpp"
#include "tangram/plan/static_plan.hpp"
#include "tangram/profile/retention_samples.hpp"

namespace tangram {

namespace detail {

/// Loads of one head's `share` CTAs splitting `total` tokens at split_bound: loads[0, share).
inline void head_cta_loads(std::int64_t total, std::int64_t share, std::int64_t* loads) {
  std::int64_t lo = 0;
  for (std::int64_t j = 0; j < share; ++j) {
    std::int64_t hi = split_bound(j + 1, share, total);
    loads[j]        = hi - lo;
    lo              = hi;
  }
}

/// Head `h`'s tokens over the batch: the sum of lengths[r * H + h].
inline std::int64_t head_total(std::int64_t const* lengths,
                               std::int32_t batch,
                               std::size_t H,
                               std::int32_t h) {
  std::int64_t total = 0;
  for (std::int32_t r = 0; r < batch; ++r)
    total += lengths[static_cast<std::size_t>(r) * H + static_cast<std::size_t>(h)];
  return total;
}

}  // namespace detail

/**
 * @brief Tokens each CTA of one layer's AOT launch attends, from explicit per-request, per-head
 * lengths: loads[c] for c in [0, N_CTA). The AOT split depends only on each head's total over
 * the batch, so this is the measure for any placement (e.g. elastic group lengths), not only the
 * rules' `head_tokens`. O(H x batch + N_CTA); allocates nothing.
 * @param lengths [batch * num_kv_heads]: lengths[r * H + h] tokens head h holds for request r
 * @param loads   caller buffer of N_CTA entries
 */
inline void aot_cta_loads_from_lengths(split_map_view const& view,
                                       std::int32_t layer,
                                       std::int64_t const* lengths,
                                       std::int32_t batch,
                                       std::int64_t* loads) {
  TANGRAM_EXPECTS(
      !view.layer_stream,
      invalid_argument,
      "aot_cta_loads_from_lengths: view.layer_stream is set; this measures a per-head split map");
  auto H = static_cast<std::size_t>(view.num_kv_heads);
  for (std::int32_t h = 0; h < view.num_kv_heads; ++h)
    detail::head_cta_loads(detail::head_total(lengths, batch, H, h),
                           view.share(layer, h),
                           loads + view.begin(layer, h));
}

/**
 * @brief Tokens each CTA of one layer's decode launch attends in batch-invariant mode
 * (`decode_params::invariant_pieces` = `pieces`): every piece of `invariant_piece_tokens` tokens
 * goes whole to the CTA whose split-map range holds its first token (kernels/detail/
 * decode_common.cuh), so a CTA may run past its range by up to one piece. Same arguments as
 * `aot_cta_loads_from_lengths`. O(H x batch x pieces + N_CTA); allocates nothing.
 */
inline void invariant_cta_loads_from_lengths(split_map_view const& view,
                                             std::int32_t layer,
                                             std::int64_t const* lengths,
                                             std::int32_t batch,
                                             std::int32_t pieces,
                                             std::int64_t* loads) {
  TANGRAM_EXPECTS(!view.layer_stream,
                  invalid_argument,
                  "invariant_cta_loads_from_lengths: view.layer_stream is set; this measures a "
                  "per-head split map");
  TANGRAM_EXPECTS(pieces >= 1 && pieces <= decode_max_invariant_pieces,
                  invalid_argument,
                  "invariant_cta_loads_from_lengths: pieces must be in [1, ",
                  decode_max_invariant_pieces,
                  "], got ",
                  pieces);
  auto H = static_cast<std::size_t>(view.num_kv_heads);
  for (std::int32_t h = 0; h < view.num_kv_heads; ++h) {
    const std::int64_t total = detail::head_total(lengths, batch, H, h);
    const std::int64_t share = view.share(layer, h);
    std::int64_t* head       = loads + view.begin(layer, h);
    std::fill(head, head + share, std::int64_t{0});
    std::int64_t pre = 0;
    for (std::int32_t r = 0; r < batch; ++r) {
      const std::int64_t len =
          lengths[static_cast<std::size_t>(r) * H + static_cast<std::size_t>(h)];
      const std::int64_t size = invariant_piece_tokens(len, pieces);
      for (std::int64_t b = 0; b < len; b += size)
        head[split_cta_of(pre + b, share, total)] += std::min(size, len - b);
      pre += len;
    }
  }
}

/**
 * @brief Tokens each CTA of one layer's AOT launch attends when every head holds what its rule
 * gives (`head_tokens`): loads[c] for c in [0, N_CTA). O(H x batch + N_CTA); allocates nothing.
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
  TANGRAM_EXPECTS(!view.layer_stream,
                  invalid_argument,
                  "aot_cta_loads: view.layer_stream is set; this measures a per-head split map");
  for (std::int32_t h = 0; h < view.num_kv_heads; ++h)
    detail::head_cta_loads(head_stream_offsets(rules[h], contexts, decoded, batch, offsets),
                           view.share(layer, h),
                           loads + view.begin(layer, h));
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

/// @brief Load imbalance of the three planners on one launch.
struct planner_imbalance {
  double aot         = 1.0;
  double equal_split = 1.0;
  double greedy      = 1.0;  ///< greedy with 1 chunk per slot
  double greedy_fine = 1.0;  ///< greedy with 4 chunks per slot
  /// The decode kernels on the map balanced per step on the device (balance_decode_splits,
  /// kernels/balanced_split.hpp; shares from eval/balanced_split.hpp).
  double balanced = 1.0;
  /// The decode kernels on the layer stream (layer_stream_split): CTA j holds the layer's
  /// stream positions [j W / N, (j + 1) W / N), whatever the heads.
  double stream = 1.0;
};

/**
 * @brief Runs the three planners on the layers of a model for given batches, reusing buffers:
 * from contexts (every head holds what its rule gives) or from explicit per-head lengths (any
 * placement). Holds copies of the rules (if given) and the split map. One object per thread.
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

  /// Lengths only (`evaluate_lengths`); `evaluate` from contexts then throws.
  /// @throw invalid_argument when the map is invalid.
  explicit split_evaluator(split_map map, std::int64_t min_chunk = 128)
      : map_(std::move(map)),
        greedy_(min_chunk, 1),
        greedy_fine_(min_chunk, 4),
        min_chunk_(min_chunk) {
    map_.validate();
  }

  [[nodiscard]] std::int32_t num_layers() const noexcept { return map_.num_layers; }
  [[nodiscard]] split_map const& map() const noexcept { return map_; }

  /**
   * @brief Imbalance of each planner on layer `layer` for a batch (decode tokens 0), every head
   * holding head_tokens(rule, context, 0).
   * @throw invalid_argument when batch < 1, the layer is out of range or the evaluator has no
   *        rules.
   */
  planner_imbalance evaluate(std::int32_t layer, std::int64_t const* contexts, std::int32_t batch) {
    check(layer, batch);
    TANGRAM_EXPECTS(!rules_.empty(),
                    invalid_argument,
                    "split_evaluator: built without rules; use evaluate_lengths");
    auto H = map_.num_kv_heads;
    lengths_.resize(static_cast<std::size_t>(batch) * H);
    head_rule const* rules = rules_.data() + static_cast<std::size_t>(layer) * H;
    for (std::int32_t r = 0; r < batch; ++r)
      for (std::int32_t h = 0; h < H; ++h)
        lengths_[static_cast<std::size_t>(r) * H + h] = head_tokens(rules[h], contexts[r], 0);
    return run(layer, lengths_.data(), batch);
  }

  /**
   * @brief Imbalance of each planner on layer `layer` for a batch whose heads hold `lengths`
   * ([batch * num_kv_heads], lengths[r * H + h]): the AOT map splits each head's total evenly
   * over its CTAs (`aot_cta_loads_from_lengths`); the per-step planners see the same lengths.
   * @throw invalid_argument when batch < 1 or the layer is out of range.
   */
  planner_imbalance evaluate_lengths(std::int32_t layer,
                                     std::int64_t const* lengths,
                                     std::int32_t batch) {
    check(layer, batch);
    return run(layer, lengths, batch);
  }

 private:
  void check(std::int32_t layer, std::int32_t batch) const {
    TANGRAM_EXPECTS(batch >= 1, invalid_argument, "batch: must be >= 1, got ", batch);
    TANGRAM_EXPECTS(layer >= 0 && layer < map_.num_layers,
                    invalid_argument,
                    "layer: must be in [0, ",
                    map_.num_layers - 1,
                    "], got ",
                    layer);
  }

  planner_imbalance run(std::int32_t layer, std::int64_t const* lengths, std::int32_t batch) {
    auto H = map_.num_kv_heads;
    auto N = map_.num_ctas();
    loads_.resize(static_cast<std::size_t>(N));
    planner_imbalance out;
    aot_cta_loads_from_lengths(map_.view(), layer, lengths, batch, loads_.data());
    out.aot = load_imbalance(loads_.data(), N);
    auto eq = plan_equal_split(lengths, batch, H, N, min_chunk_);
    equal_split_loads(lengths, batch, H, N, eq, loads_.data(), heap_);
    out.equal_split = load_imbalance(loads_.data(), N);
    greedy_.plan(lengths, batch, H, N, loads_.data());
    out.greedy = load_imbalance(loads_.data(), N);
    greedy_fine_.plan(lengths, batch, H, N, loads_.data());
    out.greedy_fine = load_imbalance(loads_.data(), N);
    totals_.resize(static_cast<std::size_t>(H));
    shares_.resize(static_cast<std::size_t>(H));
    for (std::int32_t h = 0; h < H; ++h)
      totals_[static_cast<std::size_t>(h)] =
          detail::head_total(lengths, batch, static_cast<std::size_t>(H), h);
    balanced_shares(totals_.data(), H, N, shares_.data());
    std::int64_t first = 0;
    for (std::int32_t h = 0; h < H; ++h) {
      detail::head_cta_loads(totals_[static_cast<std::size_t>(h)],
                             shares_[static_cast<std::size_t>(h)],
                             loads_.data() + first);
      first += shares_[static_cast<std::size_t>(h)];
    }
    out.balanced = load_imbalance(loads_.data(), N);
    std::int64_t W = 0;
    for (auto t : totals_) W += t;
    for (std::int32_t j = 0; j < N; ++j)
      loads_[static_cast<std::size_t>(j)] = split_bound(j + 1, N, W) - split_bound(j, N, W);
    out.stream = load_imbalance(loads_.data(), N);
    return out;
  }

  std::vector<head_rule> rules_;
  split_map map_;
  greedy_split_planner greedy_, greedy_fine_;
  std::int64_t min_chunk_;
  std::vector<std::int64_t> loads_, lengths_, totals_, shares_;
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
  imbalance_summary aot, equal_split, greedy, greedy_fine, balanced, stream;
};

namespace detail {

/// Summarises `per_layer(l)` (a planner_imbalance) over the layers [0, num_layers).
template <class F>
batch_imbalance summarize_layers(std::int32_t num_layers, F&& per_layer) {
  std::vector<double> a, e, g, f, b, s;
  for (std::int32_t l = 0; l < num_layers; ++l) {
    planner_imbalance r = per_layer(l);
    a.push_back(r.aot);
    e.push_back(r.equal_split);
    g.push_back(r.greedy);
    f.push_back(r.greedy_fine);
    b.push_back(r.balanced);
    s.push_back(r.stream);
  }
  return {summarize_imbalance(std::move(a)),
          summarize_imbalance(std::move(e)),
          summarize_imbalance(std::move(g)),
          summarize_imbalance(std::move(f)),
          summarize_imbalance(std::move(b)),
          summarize_imbalance(std::move(s))};
}

}  // namespace detail

/**
 * @brief Imbalance of each planner over every layer of a model for one batch.
 * @param rules [map.num_layers * map.num_kv_heads]
 */
inline batch_imbalance layer_imbalance(std::vector<head_rule> const& rules,
                                       split_map const& map,
                                       std::vector<std::int64_t> const& contexts) {
  TANGRAM_EXPECTS(!contexts.empty(), invalid_argument, "contexts: empty batch");
  split_evaluator ev(rules, map);
  auto batch = static_cast<std::int32_t>(contexts.size());
  return detail::summarize_layers(
      map.num_layers, [&](std::int32_t l) { return ev.evaluate(l, contexts.data(), batch); });
}

/**
 * @brief Imbalance of each planner over every layer of a model for one batch given explicit
 * per-head lengths (any placement).
 * @param lengths [num_layers * batch * num_kv_heads]: lengths[(l * batch + r) * H + h]
 * @throw invalid_argument when batch < 1 or lengths has the wrong size.
 */
inline batch_imbalance layer_imbalance_from_lengths(split_map const& map,
                                                    std::vector<std::int64_t> const& lengths,
                                                    std::int32_t batch) {
  TANGRAM_EXPECTS(batch >= 1, invalid_argument, "batch: must be >= 1, got ", batch);
  auto per_layer = static_cast<std::size_t>(batch) * static_cast<std::size_t>(map.num_kv_heads);
  TANGRAM_EXPECTS(lengths.size() == static_cast<std::size_t>(map.num_layers) * per_layer,
                  invalid_argument,
                  "lengths: expected num_layers x batch x num_kv_heads = ",
                  static_cast<std::size_t>(map.num_layers) * per_layer,
                  " entries, got ",
                  lengths.size());
  split_evaluator ev(map);
  return detail::summarize_layers(map.num_layers, [&](std::int32_t l) {
    return ev.evaluate_lengths(l, lengths.data() + static_cast<std::size_t>(l) * per_layer, batch);
  });
}

namespace detail {

/// Mixed into the seed of `sampled_lengths`' sample draws ("samples" in ASCII), so that the
/// draws are independent of contexts drawn with the same seed (`log_uniform_contexts`,
/// `reference_batch`): one stream for both paired the k-th context with the k-th uniform, so
/// the longest contexts always went to the last samples.
inline constexpr std::uint64_t sample_draw_salt = 0x73616d706c6573ULL;

/// Per-head lengths of a batch drawn from retention samples: request r is sample k (drawn
/// uniformly by an mt19937_64 stream seeded with `seed ^ sample_draw_salt`, independent of the
/// contexts' draws) at context contexts[r], and
/// `lengths_of(k, context)` gives its [layer * H + head] lengths; the result is laid out as
/// `layer_imbalance_from_lengths` takes it, [(l * batch + r) * H + h].
template <class LengthsOf>
std::vector<std::int64_t> sampled_lengths(static_plan const& plan,
                                          retention_samples const& samples,
                                          std::vector<std::int64_t> const& contexts,
                                          std::uint64_t seed,
                                          LengthsOf&& lengths_of) {
  TANGRAM_EXPECTS(!contexts.empty(), invalid_argument, "contexts: empty batch");
  TANGRAM_EXPECTS(!samples.samples.empty(), invalid_argument, "sampled lengths: no samples");
  auto batch = contexts.size();
  auto H     = static_cast<std::size_t>(plan.num_kv_heads);
  auto L     = static_cast<std::size_t>(plan.num_layers);
  std::vector<std::int64_t> lengths(L * batch * H);
  std::mt19937_64 pick(seed ^ sample_draw_salt);
  for (std::size_t r = 0; r < batch; ++r) {
    auto k   = std::min(samples.samples.size() - 1,
                      static_cast<std::size_t>(canonical_uniform(pick) *
                                               static_cast<double>(samples.samples.size())));
    auto len = lengths_of(k, contexts[r]);
    for (std::size_t l = 0; l < L; ++l)
      for (std::size_t h = 0; h < H; ++h) lengths[(l * batch + r) * H + h] = len[l * H + h];
  }
  return lengths;
}

}  // namespace detail

/**
 * @brief Imbalance of each planner over every layer of an elastic plan for one batch, on elastic
 * placements of retention samples: request r is sample k (`detail::sampled_lengths`) at context
 * contexts[r], with lengths `elastic_placement_lengths` (modelled away from the sample's own
 * context).
 * @throw invalid_argument when the plan is not elastic, there are no samples or no contexts, or
 *        the samples do not match the plan.
 */
inline batch_imbalance elastic_layer_imbalance(static_plan const& plan,
                                               retention_samples const& samples,
                                               std::vector<std::int64_t> const& contexts,
                                               std::uint64_t seed) {
  auto lengths =
      detail::sampled_lengths(plan, samples, contexts, seed, [&](std::size_t k, std::int64_t n) {
        return elastic_placement_lengths(plan, sample_needs_at(plan, samples, k, n), n);
      });
  return layer_imbalance_from_lengths(
      plan.splits, lengths, static_cast<std::int32_t>(contexts.size()));
}

/**
 * @brief Imbalance of each planner over every layer for one batch whose heads hold each input's
 * OWN retention (what a dynamic compressor keeps; `sample_needs_at`), drawn as
 * `elastic_layer_imbalance` draws its samples. With `padded_to_layer` every head is read up to
 * its layer's longest head (layer-wide pages read whole); else each head at its own length
 * (per-head pages, or a kernel that masks each head). The per-step planners' figures are the
 * dynamic baselines' skew; the AOT figure is the plan's split map on lengths it was not built for.
 * @throw invalid_argument when there are no samples or no contexts, or the samples do not match
 *        the plan.
 */
inline batch_imbalance own_layer_imbalance(static_plan const& plan,
                                           retention_samples const& samples,
                                           std::vector<std::int64_t> const& contexts,
                                           std::uint64_t seed,
                                           bool padded_to_layer) {
  auto H = static_cast<std::size_t>(plan.num_kv_heads);
  auto lengths =
      detail::sampled_lengths(plan, samples, contexts, seed, [&](std::size_t k, std::int64_t n) {
        auto len = sample_needs_at(plan, samples, k, n);
        if (padded_to_layer)
          for (std::size_t l = 0; l * H < len.size(); ++l) {
            auto first = len.begin() + static_cast<std::ptrdiff_t>(l * H);
            std::fill(first,
                      first + static_cast<std::ptrdiff_t>(H),
                      *std::max_element(first, first + static_cast<std::ptrdiff_t>(H)));
          }
        return len;
      });
  return layer_imbalance_from_lengths(
      plan.splits, lengths, static_cast<std::int32_t>(contexts.size()));
}

}  // namespace tangram
