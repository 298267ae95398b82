// SPDX-License-Identifier: Apache-2.0
/**
 * @file plan/calibration.hpp
 * @brief Calibration: static per-head budgets B[l][h] from retention samples, and the figures that
 * say whether those budgets are any good (reserved memory, held-out clipping, rank stability).
 *
 * Notation: r_s(l,h) = kept_tokens / context_tokens of head (l, h) on sample s.
 *
 * - musigma:  B = clamp(mu + alpha * sigma, floor, 1), mu and sigma the mean and the population
 *             standard deviation of r_s over the calibration samples (alpha 2 in the paper).
 * - quantile: B = clamp(Q_q(r_s), floor, 1), Q_q the empirical quantile with linear interpolation
 *             between order statistics (type 7, see detail::linear_quantile).
 *
 * Report (evaluate_calibration):
 * - reserved_over_ideal = sum over heads of B / (mean over samples of sum over heads of r_s):
 *   what static budgets reserve relative to the mean dynamic footprint (tokens, not pages).
 * - heldout_clip_fraction: k-fold; fold i holds the samples whose index mod k == i; budgets are
 *   calibrated on the other folds; the fold's figure is sum over its samples and heads of
 *   max(0, r_s - B) divided by sum of r_s; the report gives the mean over folds. With
 *   `group_by_context`, samples of equal context_tokens (most likely one long prompt asked
 *   several questions) share a fold: fold i holds the samples whose context length is the c-th
 *   smallest distinct length with c mod k == i, so no prompt is both trained on and tested.
 * - rank stability: Spearman correlation (average ranks for ties) between each sample's r_s over
 *   all heads and the budgets (mean and min over samples); narrow_band_share = share of heads
 *   whose ratio spread max_s r_s - min_s r_s is at most `band` (default 0.05).
 *
 * Host only; every function is pure (no state), safe to call from any thread.
 */
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <vector>

#include "tangram/core/error.hpp"
#include "tangram/plan/detail/stats.hpp"
#include "tangram/profile/budget_profile.hpp"
#include "tangram/profile/retention_samples.hpp"

namespace tangram {

/// @brief How budgets are estimated from samples.
struct calibration_options {
  budget_estimator estimator = budget_estimator::musigma;
  double alpha               = 2.0;   ///< musigma safety coefficient, in [0, 1000]
  double quantile            = 0.95;  ///< q of the quantile estimator, in [0, 1]
  double floor               = 0.01;  ///< lower clamp of every budget, in (0, 1]: B is in (0, 1]

  /// @throw invalid_argument naming the field and the value.
  void validate() const {
    TANGRAM_EXPECTS(estimator != budget_estimator::external,
                    invalid_argument,
                    "calibration_options.estimator: \"external\" budgets are not calibrated from "
                    "samples (expected musigma or quantile)");
    TANGRAM_EXPECTS(alpha >= 0 && alpha <= 1000,
                    invalid_argument,
                    "calibration_options.alpha: must be in [0, 1000], got ",
                    alpha);
    TANGRAM_EXPECTS(quantile >= 0 && quantile <= 1,
                    invalid_argument,
                    "calibration_options.quantile: must be in [0, 1], got ",
                    quantile);
    TANGRAM_EXPECTS(floor > 0 && floor <= 1,
                    invalid_argument,
                    "calibration_options.floor: must be in (0, 1], got ",
                    floor);
  }
};

/// @brief How a calibration is evaluated.
struct evaluation_options {
  std::int32_t folds    = 2;      ///< k of the held-out evaluation; 0 skips it
  double band           = 0.05;   ///< narrow band: max - min of a head's ratios across samples
  bool group_by_context = false;  ///< folds by distinct context length instead of sample index

  /// @throw invalid_argument naming the field and the value.
  void validate() const {
    TANGRAM_EXPECTS(folds == 0 || folds >= 2,
                    invalid_argument,
                    "evaluation_options.folds: must be 0 (skip) or >= 2, got ",
                    folds);
    TANGRAM_EXPECTS(band >= 0 && band <= 1,
                    invalid_argument,
                    "evaluation_options.band: must be in [0, 1], got ",
                    band);
  }
};

/// @brief What a calibration reserves and how well it predicts unseen samples.
struct calibration_report {
  std::int32_t num_samples = 0;
  std::int32_t num_heads   = 0;  ///< profiled heads: layers x KV heads
  double min_budget = 0, mean_budget = 0, max_budget = 0;
  std::int32_t heads_at_floor   = 0;  ///< budgets clamped up to the floor
  std::int32_t heads_at_one     = 0;  ///< budgets clamped down to 1
  double mean_dynamic_fraction  = 0;  ///< mean over samples and heads of r_s
  double reserved_over_ideal    = 0;  ///< sum B / mean over samples of sum r_s
  double insample_clip_fraction = 0;  ///< the clip formula on the calibration samples themselves
  std::int32_t folds            = 0;  ///< 0 when held-out evaluation was skipped
  std::vector<double> fold_clip_fractions;
  double heldout_clip_fraction = std::numeric_limits<double>::quiet_NaN();  ///< mean over folds
  /// Mean over folds of (sum of the fold's training budgets) / (mean held-out sum r_s).
  double heldout_reserved_over_ideal = std::numeric_limits<double>::quiet_NaN();
  std::vector<double> spearman;  ///< per sample: Spearman(r_s over heads, B)
  double rank_spearman_mean = 0;
  double rank_spearman_min  = 0;
  double band               = 0.05;
  double narrow_band_share  = 0;  ///< share of heads with max_s r_s - min_s r_s <= band
  double mean_spread        = 0;  ///< mean over heads of max_s r_s - min_s r_s
};

namespace detail {

/// Checks that `sample_ids` names at least one sample of `s` and only samples of `s`; `who` (the
/// calling function) opens the message.
inline void check_sample_ids(retention_samples const& s,
                             std::vector<std::size_t> const& sample_ids,
                             char const* who) {
  TANGRAM_EXPECTS(!sample_ids.empty(), invalid_argument, who, ": no calibration samples");
  for (auto k : sample_ids)
    TANGRAM_EXPECTS(k < s.samples.size(),
                    invalid_argument,
                    who,
                    ": sample index ",
                    k,
                    " out of range (",
                    s.samples.size(),
                    " samples)");
}

/// Checks that `s` is usable for calibration (non-empty, consistent shapes, positive contexts).
inline void check_samples(retention_samples const& s) {
  TANGRAM_EXPECTS(s.num_kv_heads >= 1,
                  invalid_argument,
                  "retention_samples.num_kv_heads: must be >= 1, got ",
                  s.num_kv_heads);
  TANGRAM_EXPECTS(!s.layer_ids.empty(), invalid_argument, "retention_samples.layer_ids: empty");
  TANGRAM_EXPECTS(!s.samples.empty(), invalid_argument, "retention_samples.samples: empty");
  std::size_t n = s.layer_ids.size() * static_cast<std::size_t>(s.num_kv_heads);
  for (std::size_t i = 0; i < s.samples.size(); ++i) {
    TANGRAM_EXPECTS(s.samples[i].context_tokens >= 1,
                    invalid_argument,
                    "retention_samples.samples[",
                    i,
                    "].context_tokens: must be >= 1, got ",
                    s.samples[i].context_tokens);
    TANGRAM_EXPECTS(s.samples[i].kept.size() == n,
                    invalid_argument,
                    "retention_samples.samples[",
                    i,
                    "].kept: expected ",
                    n,
                    " entries (layers x KV heads), got ",
                    s.samples[i].kept.size());
  }
}

/// r_s of head i (flat index li * H + h) on sample s.
inline double sample_ratio(retention_samples const& s, std::size_t sample, std::size_t head) {
  return static_cast<double>(s.samples[sample].kept[head]) /
         static_cast<double>(s.samples[sample].context_tokens);
}

/// max(0, r - B) summed, and r summed, over the given samples and all heads.
inline void clip_sums(retention_samples const& s,
                      std::vector<double> const& budgets,
                      std::vector<std::size_t> const& sample_ids,
                      double& clipped,
                      double& total) {
  clipped = total = 0;
  for (auto k : sample_ids)
    for (std::size_t i = 0; i < budgets.size(); ++i) {
      double r = sample_ratio(s, k, i);
      total += r;
      clipped += std::max(0.0, r - budgets[i]);
    }
}

/// @brief Which fold every sample belongs to (see evaluation_options).
struct fold_assignment {
  std::vector<std::size_t> key;  ///< sample index, or rank of its context length among the distinct
  std::int32_t folds = 0;

  /// Training and held-out samples of fold f: held out when key mod folds == f.
  void split(std::int32_t f,
             std::vector<std::size_t>& train,
             std::vector<std::size_t>& test) const {
    train.clear();
    test.clear();
    for (std::size_t k = 0; k < key.size(); ++k)
      (key[k] % static_cast<std::size_t>(folds) == static_cast<std::size_t>(f) ? test : train)
          .push_back(k);
  }
};

/// Fold keys of `s` under `e`.
/// @throw invalid_argument when there are more folds than samples (or distinct context lengths).
inline fold_assignment assign_folds(retention_samples const& s, evaluation_options const& e) {
  std::size_t S = s.samples.size();
  fold_assignment out;
  out.folds = e.folds;
  out.key.resize(S);
  std::iota(out.key.begin(), out.key.end(), std::size_t{0});
  std::size_t distinct = S;
  if (e.group_by_context) {
    std::vector<std::int64_t> lengths;
    for (auto const& smp : s.samples) lengths.push_back(smp.context_tokens);
    std::sort(lengths.begin(), lengths.end());
    lengths.erase(std::unique(lengths.begin(), lengths.end()), lengths.end());
    distinct = lengths.size();
    for (std::size_t k = 0; k < S; ++k)
      out.key[k] = static_cast<std::size_t>(
          std::lower_bound(lengths.begin(), lengths.end(), s.samples[k].context_tokens) -
          lengths.begin());
  }
  TANGRAM_EXPECTS(e.folds == 0 || static_cast<std::size_t>(e.folds) <= distinct,
                  invalid_argument,
                  "folds: ",
                  e.folds,
                  " folds need at least ",
                  e.folds,
                  e.group_by_context ? " distinct context lengths, got " : " samples, got ",
                  distinct);
  return out;
}

}  // namespace detail

/**
 * @brief Budgets [layer index * num_kv_heads + head] calibrated on a subset of the samples.
 * @param sample_ids indices into `s.samples` (non-empty, each in range)
 * @throw invalid_argument for bad options, bad samples or bad indices, naming the field and value.
 */
inline std::vector<double> calibrate_budgets(retention_samples const& s,
                                             calibration_options const& o,
                                             std::vector<std::size_t> const& sample_ids) {
  o.validate();
  detail::check_samples(s);
  detail::check_sample_ids(s, sample_ids, "calibrate");
  std::size_t n = s.layer_ids.size() * static_cast<std::size_t>(s.num_kv_heads);
  std::vector<double> budgets(n), r(sample_ids.size());
  for (std::size_t i = 0; i < n; ++i) {
    for (std::size_t k = 0; k < sample_ids.size(); ++k)
      r[k] = detail::sample_ratio(s, sample_ids[k], i);
    double b = 0;
    if (o.estimator == budget_estimator::musigma)
      b = detail::mean_of(r.data(), r.size()) +
          o.alpha * detail::population_stddev(r.data(), r.size());
    else
      b = detail::linear_quantile(r, o.quantile);
    budgets[i] = std::clamp(b, o.floor, 1.0);
  }
  return budgets;
}

/**
 * @brief Calibrates a budget profile on all samples of `s`.
 *
 * The profile copies the model, scorer, layer ids, keep ratio and the protected tokens (sink and
 * window) from the samples, and records the estimator settings.
 * @throw invalid_argument for bad options or samples, naming the field and the value.
 */
inline budget_profile calibrate(retention_samples const& s, calibration_options const& o = {}) {
  std::vector<std::size_t> all(s.samples.size());
  std::iota(all.begin(), all.end(), std::size_t{0});
  budget_profile p;
  p.budgets                 = calibrate_budgets(s, o, all);
  p.model                   = s.model;
  p.scorer                  = s.scorer;
  p.num_model_layers        = s.num_model_layers;
  p.num_kv_heads            = s.num_kv_heads;
  p.layer_ids               = s.layer_ids;
  p.sink_tokens             = s.sink_tokens;
  p.window_tokens           = s.window_tokens;
  p.target_keep_ratio       = s.target_keep_ratio;
  p.calibration.estimator   = o.estimator;
  p.calibration.alpha       = o.alpha;
  p.calibration.quantile    = o.quantile;
  p.calibration.floor       = o.floor;
  p.calibration.num_samples = static_cast<std::int32_t>(s.samples.size());
  p.validate();
  return p;
}

/**
 * @brief Calibrates on all samples and evaluates the result (see the file comment for every
 * formula). Cost: O(folds x samples x heads) plus one sort per head for the quantile estimator.
 * @throw invalid_argument for bad options or samples, or more folds than samples.
 */
inline calibration_report evaluate_calibration(retention_samples const& s,
                                               calibration_options const& o = {},
                                               evaluation_options const& e  = {}) {
  e.validate();
  detail::check_samples(s);
  std::size_t S = s.samples.size();
  auto folds    = detail::assign_folds(s, e);
  std::vector<std::size_t> all(S);
  std::iota(all.begin(), all.end(), std::size_t{0});
  auto budgets  = calibrate_budgets(s, o, all);
  std::size_t n = budgets.size();

  calibration_report rep;
  rep.num_samples = static_cast<std::int32_t>(S);
  rep.num_heads   = static_cast<std::int32_t>(n);
  rep.min_budget  = *std::min_element(budgets.begin(), budgets.end());
  rep.max_budget  = *std::max_element(budgets.begin(), budgets.end());
  double sum_b    = std::accumulate(budgets.begin(), budgets.end(), 0.0);
  rep.mean_budget = sum_b / static_cast<double>(n);
  for (double b : budgets) {
    rep.heads_at_floor += b == o.floor;
    rep.heads_at_one += b == 1.0;
  }

  double clipped = 0, total = 0;
  detail::clip_sums(s, budgets, all, clipped, total);
  rep.mean_dynamic_fraction  = total / static_cast<double>(S * n);
  rep.reserved_over_ideal    = sum_b / (total / static_cast<double>(S));
  rep.insample_clip_fraction = total > 0 ? clipped / total : 0.0;

  rep.folds = e.folds;
  if (e.folds > 0) {
    double clip_sum = 0, roi_sum = 0;
    for (std::int32_t f = 0; f < e.folds; ++f) {
      std::vector<std::size_t> train, test;
      folds.split(f, train, test);
      auto fb = calibrate_budgets(s, o, train);
      detail::clip_sums(s, fb, test, clipped, total);
      double c = total > 0 ? clipped / total : 0.0;
      rep.fold_clip_fractions.push_back(c);
      clip_sum += c;
      roi_sum +=
          std::accumulate(fb.begin(), fb.end(), 0.0) / (total / static_cast<double>(test.size()));
    }
    rep.heldout_clip_fraction       = clip_sum / e.folds;
    rep.heldout_reserved_over_ideal = roi_sum / e.folds;
  }

  std::vector<double> ratios(n);
  rep.spearman.reserve(S);
  for (std::size_t k = 0; k < S; ++k) {
    for (std::size_t i = 0; i < n; ++i) ratios[i] = detail::sample_ratio(s, k, i);
    rep.spearman.push_back(detail::spearman(ratios, budgets));
  }
  rep.rank_spearman_mean = detail::mean_of(rep.spearman.data(), S);
  rep.rank_spearman_min  = *std::min_element(rep.spearman.begin(), rep.spearman.end());

  rep.band           = e.band;
  std::size_t narrow = 0;
  double spread_sum  = 0;
  for (std::size_t i = 0; i < n; ++i) {
    double lo = 1e300, hi = -1e300;
    for (std::size_t k = 0; k < S; ++k) {
      double r = detail::sample_ratio(s, k, i);
      lo       = std::min(lo, r);
      hi       = std::max(hi, r);
    }
    spread_sum += hi - lo;
    narrow += hi - lo <= e.band;
  }
  rep.narrow_band_share = static_cast<double>(narrow) / static_cast<double>(n);
  rep.mean_spread       = spread_sum / static_cast<double>(n);
  return rep;
}

/**
 * @brief The estimator settings `tangram calibrate --compare` evaluates side by side: musigma
 * with alpha 0, 0.5, ..., 3 and quantile with q 0.5, 0.75, 0.9, 0.95, 1 (all with `floor`).
 */
inline std::vector<calibration_options> estimator_grid(double floor = calibration_options{}.floor) {
  std::vector<calibration_options> out;
  for (double a : {0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0})
    out.push_back({budget_estimator::musigma, a, 0.95, floor});
  for (double q : {0.5, 0.75, 0.9, 0.95, 1.0})
    out.push_back({budget_estimator::quantile, 2.0, q, floor});
  return out;
}

}  // namespace tangram
