// SPDX-License-Identifier: Apache-2.0
/**
 * @file plan/elastic.hpp
 * @brief Elastic reservation: reserve a request's total compressed footprint (what the scorer
 * keeps over all heads, times 1 + margin) instead of static per-group budgets, and place it per
 * group at eviction (plan/elastic_selection.hpp). This header holds the reservation model,
 * the plan-time groups and the margin calibration; docs/planning.md#elastic-reservation has the
 * measured curves.
 *
 * Why: every scorer of the bundled profiles keeps a fixed total per request (a global top-k; the
 * per-sample total moves by < 0.1%), only its split across heads varies. So the total is known at
 * admission; only its placement is not.
 *
 * Formulas (n context tokens, T decode tokens, protect = sink + window, rho the keep ratio,
 * H_c compressed heads in G_c = H_c / Hp groups, P tokens per page, m the margin):
 * - per-head share of the scorer's total:
 *     all_tokens (rho of every token, protected included; the bundled scorers):
 *         kbar(n) = max(min(n, protect), ceil(rho n))
 *     compressible_tokens (rho of the tokens outside the protected ones, plus those):
 *         kbar(n) = min(n, protect) + ceil(rho (n - min(n, protect)))
 * - the scorer's total K(n) = H_c kbar(n) head-tokens;
 * - compressed pages R(n) = min(G_c ceil(n / P), max(G_c ceil(min(n, protect) / P),
 *                                               ceil(ceil((1 + m) K(n)) / (Hp P))))
 *   (a page holds Hp P head-tokens; the lower clamp is what every group's protected tokens need,
 *   the upper one what holding every token needs). (1 + m) K is the IEEE double product, rounded
 *   up by ceil_budget_tokens like every budget: a margin that is not a binary fraction can add
 *   one token (1.1 x 1536000 is 1689600.0000000002 in double, so 1689601);
 * - decode: every group appends T tokens after its page-granular length: G_c ceil(T / P) pages;
 * - the request's footprint: R(n) + G_c ceil(T / P) + sum over the other groups (sliding,
 *   uncompressed) of their static pages (plan/footprint.hpp).
 *
 * Calibration (`evaluate_elastic`): plan-time groups sort the heads by their mean retained
 * fraction over the calibration samples (descending) and cut Hp at a time; a sample's zero-clip
 * pages are sum_g ceil(max_{h in g} kept_h / P) (a group is as long as its longest head), its
 * required margin m_s = zero-clip pages Hp P / K(n_s) - 1, and the calibrated margin is
 * clamp(mean + alpha sd of m_s over the calibration samples, 0, max_margin) (alpha 2 by default;
 * a fixed margin may be given instead). Figures, in the units of plan/calibration.hpp (ratios
 * r = tokens / n, so every prompt weighs the same):
 * - reserved_over_ideal = mean_s(R(n_s) Hp P / n_s) / mean_s(sum_h r_s(h)): page-granular, so it
 *   includes page rounding and in-group padding (the static figure counts tokens only);
 * - clip fraction = sum_s sum_h clipped_s(h) / n_s over sum_s sum_h kept_s(h) / n_s, clipped the
 *   wanted tokens the optimal placement within R(n_s) pages cannot keep;
 * - held out: folds as in evaluation_options; groups and margin from the training folds only.
 *
 * Host only; every function is pure; safe to call from any thread.
 */
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <optional>
#include <string_view>
#include <vector>

#include "tangram/core/detail/checked_math.hpp"
#include "tangram/core/error.hpp"
#include "tangram/core/retention.hpp"
#include "tangram/plan/calibration.hpp"
#include "tangram/plan/detail/stats.hpp"
#include "tangram/plan/elastic_reservation.hpp"
#include "tangram/plan/elastic_selection.hpp"
#include "tangram/plan/footprint.hpp"
#include "tangram/plan/static_plan.hpp"
#include "tangram/profile/retention_samples.hpp"

namespace tangram {

/// @brief The scorer of retention samples: their keep ratio and protected tokens.
/// @throw invalid_argument when the samples' target_keep_ratio is not in (0, 1].
inline scorer_total scorer_of(retention_samples const& s,
                              keep_ratio_basis basis = keep_ratio_basis::all_tokens) {
  TANGRAM_EXPECTS(s.target_keep_ratio > 0 && s.target_keep_ratio <= 1,
                  invalid_argument,
                  "retention_samples.target_keep_ratio: elastic reservation needs a keep ratio in "
                  "(0, 1], got ",
                  s.target_keep_ratio);
  return {s.target_keep_ratio, s.protected_tokens(), basis};
}

/// @brief Settings of the elastic calibration.
struct elastic_options {
  std::int32_t group_size  = default_group_size;  ///< Hp, in [1, 1024]; must divide the heads
  std::int32_t page_tokens = 16;                  ///< P, in [1, 4096]
  std::optional<double> margin;  ///< fixed margin in [0, max_elastic_margin]; none: calibrated
  double margin_alpha    = 2.0;  ///< calibrated margin = mean + alpha sd of m_s, alpha in [0, 1000]
  /// Least calibrated margin, in [0, max_elastic_margin]: plans calibrate with
  /// default_elastic_margin here (`elastic_plan_margin`), `tangram calibrate --calibrate-margin`
  /// with 0. Not applied to a fixed `margin`.
  double margin_floor    = 0.0;
  keep_ratio_basis basis = keep_ratio_basis::all_tokens;

  /// @throw invalid_argument naming the field and the value.
  void validate() const {
    TANGRAM_EXPECTS(group_size >= 1 && group_size <= 1024,
                    invalid_argument,
                    "elastic_options.group_size: must be in [1, 1024], got ",
                    group_size);
    TANGRAM_EXPECTS(page_tokens >= 1 && page_tokens <= 4096,
                    invalid_argument,
                    "elastic_options.page_tokens: must be in [1, 4096], got ",
                    page_tokens);
    TANGRAM_EXPECTS(!margin || (*margin >= 0 && *margin <= max_elastic_margin),
                    invalid_argument,
                    "elastic_options.margin: must be in [0, ",
                    max_elastic_margin,
                    "], got ",
                    margin.value_or(0));
    TANGRAM_EXPECTS(margin_alpha >= 0 && margin_alpha <= 1000,
                    invalid_argument,
                    "elastic_options.margin_alpha: must be in [0, 1000], got ",
                    margin_alpha);
    TANGRAM_EXPECTS(margin_floor >= 0 && margin_floor <= max_elastic_margin,
                    invalid_argument,
                    "elastic_options.margin_floor: must be in [0, ",
                    max_elastic_margin,
                    "], got ",
                    margin_floor);
  }
};

/**
 * @brief Plan-time groups from calibration samples: heads sorted by mean retained fraction over
 * `sample_ids` (descending, ties by index), cut Hp at a time. `out[g * Hp + c]` is the flat head
 * (layer index * num_kv_heads + head) of column c of group g.
 */
inline std::vector<std::int32_t> elastic_group_members(retention_samples const& s,
                                                       std::vector<std::size_t> const& sample_ids) {
  std::size_t n = s.layer_ids.size() * static_cast<std::size_t>(s.num_kv_heads);
  std::vector<double> mean(n, 0.0);
  for (auto k : sample_ids)
    for (std::size_t i = 0; i < n; ++i) mean[i] += detail::sample_ratio(s, k, i);
  std::vector<std::int32_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](std::int32_t a, std::int32_t b) {
    return mean[static_cast<std::size_t>(a)] > mean[static_cast<std::size_t>(b)];
  });
  return order;
}

/// Per-request groups (report only): the heads sorted by this request's own needs, cut Hp at a
/// time.
inline std::vector<std::int32_t> members_by_need(std::vector<std::int64_t> const& needs) {
  std::vector<std::int32_t> order(needs.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](std::int32_t a, std::int32_t b) {
    return needs[static_cast<std::size_t>(a)] > needs[static_cast<std::size_t>(b)];
  });
  return order;
}

/// Pages that keep every wanted token: sum over groups of ceil(max need of the group / P).
inline std::int64_t zero_clip_pages(std::vector<std::int64_t> const& needs,
                                    std::vector<std::int32_t> const& members,
                                    std::int32_t group_size,
                                    std::int32_t page_tokens) {
  std::int64_t pages = 0;
  for (std::size_t g = 0; g + static_cast<std::size_t>(group_size) <= members.size();
       g += static_cast<std::size_t>(group_size)) {
    std::int64_t longest = 0;
    for (std::size_t c = g; c < g + static_cast<std::size_t>(group_size); ++c)
      longest = std::max(longest, needs[static_cast<std::size_t>(members[c])]);
    pages = detail::add_or_throw(pages, ceil_div(longest, page_tokens), "zero-clip pages");
  }
  return pages;
}

/// @brief One row of the margin sweep (held-out figures at a fixed margin).
struct elastic_sweep_point {
  double margin                            = 0;
  double heldout_reserved_over_ideal       = 0;
  double heldout_clip_fraction             = 0;  ///< plan-time groups
  double heldout_per_request_clip_fraction = 0;  ///< groups sorted per request (report only)
};

/// @brief What elastic reservation reserves and clips on retention samples (file comment).
struct elastic_report {
  std::int32_t num_samples = 0;
  std::int32_t num_heads   = 0;
  std::int32_t group_size  = 0;
  std::int32_t page_tokens = 0;
  keep_ratio_basis basis   = keep_ratio_basis::all_tokens;
  bool margin_calibrated   = true;
  double margin            = 0;  ///< fixed, or calibrated on all samples
  /// sum_h kept_s(h) / K(n_s) - 1: how well K predicts what the scorer kept (mean, max |.|).
  double total_error_mean = 0, total_error_max = 0;
  double mean_dynamic_fraction  = 0;  ///< mean over samples and heads of r_s
  double reserved_over_ideal    = 0;  ///< all samples, groups and margin from all samples
  double insample_clip_fraction = 0;
  double group_padding = 0;  ///< zero-clip pages Hp P / kept - 1 (ratio units), plan-time groups
  double per_request_padding = 0;  ///< the same with groups sorted per request
  std::int32_t folds         = 0;
  std::vector<double> fold_margins;
  std::vector<double> fold_clip_fractions;
  double heldout_clip_fraction             = std::numeric_limits<double>::quiet_NaN();
  double heldout_reserved_over_ideal       = std::numeric_limits<double>::quiet_NaN();
  double heldout_group_padding             = std::numeric_limits<double>::quiet_NaN();
  double heldout_per_request_clip_fraction = std::numeric_limits<double>::quiet_NaN();
  std::vector<elastic_sweep_point> sweep;  ///< filled by evaluate_elastic when asked
  /// The smallest margin on the `suggestion_step` grid whose held-out clipping (the folds'
  /// mean) is at most `clip_target`: filled when evaluate_elastic is given a clip target and
  /// folds; nullopt when even max_elastic_margin clips more. Chosen on the folds it is measured
  /// on, so its held-out figures are optimistic by that selection.
  std::optional<elastic_sweep_point> suggested;
  double clip_target = std::numeric_limits<double>::quiet_NaN();
};

/// Grid of the suggested margin (evaluate_elastic's clip target search).
inline constexpr double suggestion_step = 0.005;

namespace detail {

/// The needs (kept tokens) of one sample.
inline std::vector<std::int64_t> const& sample_needs(retention_samples const& s, std::size_t k) {
  return s.samples[k].kept;
}

/// Sums over a set of samples at one margin and one grouping (ratio units); the per-request
/// figures sort each sample's heads by its own needs instead.
struct elastic_sums {
  double reserved = 0, kept = 0, clipped = 0, clipped_per_request = 0, zero_clip = 0,
         zero_clip_per_request = 0;
  std::size_t count            = 0;
  [[nodiscard]] double clip() const { return kept > 0 ? clipped / kept : 0.0; }
  [[nodiscard]] double clip_per_request() const {
    return kept > 0 ? clipped_per_request / kept : 0.0;
  }
  [[nodiscard]] double reserved_over_ideal() const { return kept > 0 ? reserved / kept : 0.0; }
};

/// Wanted tokens clipped by the optimal placement of `needs` within `pages`.
inline std::int64_t elastic_clipped(std::vector<std::int64_t> const& needs,
                                    std::vector<std::int32_t> const& members,
                                    std::int64_t n,
                                    scorer_total const& t,
                                    elastic_options const& o,
                                    std::int64_t pages) {
  reference::elastic_selection_input in;
  in.needs        = &needs;
  in.members      = &members;
  in.group_size   = o.group_size;
  in.page_tokens  = o.page_tokens;
  in.candidates   = n;
  in.protect      = t.protect;
  in.budget_pages = pages;
  auto sel        = reference::select_group_lengths(in);
  // R(n) always covers the protected floors; a sample that keeps less than them is all clipped.
  return sel.fits ? sel.wanted_clipped() : sel.wanted_total;
}

inline elastic_sums elastic_evaluate(retention_samples const& s,
                                     std::vector<std::size_t> const& ids,
                                     std::vector<std::int32_t> const& members,
                                     double margin,
                                     elastic_options const& o) {
  auto t = scorer_of(s, o.basis);
  elastic_sums out;
  auto heads = static_cast<std::int64_t>(members.size());
  for (auto k : ids) {
    auto const& needs = sample_needs(s, k);
    std::int64_t n    = s.samples[k].context_tokens;
    auto nd           = static_cast<double>(n);
    auto pages        = elastic_compressed_pages(t, heads, o.group_size, o.page_tokens, margin, n);
    double kept = static_cast<double>(std::accumulate(needs.begin(), needs.end(), std::int64_t{0}));
    double cell = static_cast<double>(o.group_size) * o.page_tokens;
    out.reserved += static_cast<double>(pages) * cell / nd;
    out.kept += kept / nd;
    out.clipped += static_cast<double>(elastic_clipped(needs, members, n, t, o, pages)) / nd;
    out.zero_clip +=
        static_cast<double>(zero_clip_pages(needs, members, o.group_size, o.page_tokens)) * cell /
        nd;
    auto own = members_by_need(needs);
    out.clipped_per_request +=
        static_cast<double>(elastic_clipped(needs, own, n, t, o, pages)) / nd;
    out.zero_clip_per_request +=
        static_cast<double>(zero_clip_pages(needs, own, o.group_size, o.page_tokens)) * cell / nd;
    ++out.count;
  }
  return out;
}

/// Checks the samples and the options together; returns the number of profiled heads.
inline std::size_t check_elastic(retention_samples const& s, elastic_options const& o) {
  o.validate();
  check_samples(s);
  (void)scorer_of(s, o.basis);
  std::size_t n = s.layer_ids.size() * static_cast<std::size_t>(s.num_kv_heads);
  TANGRAM_EXPECTS(n % static_cast<std::size_t>(o.group_size) == 0,
                  invalid_argument,
                  "elastic_options.group_size: ",
                  o.group_size,
                  " does not divide the ",
                  n,
                  " profiled heads");
  return n;
}

/// m_s = zero-clip pages Hp P / K(n_s) - 1 of the samples `ids`, `members` (flat sample heads, Hp
/// a group) already checked against `s`; K over the members.
inline std::vector<double> required_margins_of(retention_samples const& s,
                                               std::vector<std::size_t> const& ids,
                                               std::vector<std::int32_t> const& members,
                                               std::int32_t group_size,
                                               std::int32_t page_tokens,
                                               scorer_total const& t) {
  std::vector<double> out;
  out.reserve(ids.size());
  for (auto k : ids) {
    auto const& smp = s.samples[k];
    double K        = static_cast<double>(
        t.tokens(static_cast<std::int64_t>(members.size()), smp.context_tokens));
    double z = static_cast<double>(zero_clip_pages(smp.kept, members, group_size, page_tokens)) *
               group_size * page_tokens;
    out.push_back(K > 0 ? z / K - 1.0 : 0.0);
  }
  return out;
}

/// The calibrated rule over required margins `m`: clamp(max(mean + alpha sd, floor), 0,
/// max_elastic_margin).
inline double calibrated_margin(std::vector<double> const& m, double alpha, double floor) {
  double v = mean_of(m.data(), m.size()) + alpha * population_stddev(m.data(), m.size());
  return std::clamp(std::max(v, floor), 0.0, max_elastic_margin);
}

}  // namespace detail

/**
 * @brief Required margin m_s of every sample in `sample_ids` under `members`: zero-clip pages
 * Hp P / K(n_s) - 1 (negative when the scorer kept less than K predicts and padding is small).
 */
inline std::vector<double> required_margins(retention_samples const& s,
                                            std::vector<std::size_t> const& sample_ids,
                                            std::vector<std::int32_t> const& members,
                                            elastic_options const& o) {
  detail::check_elastic(s, o);
  return detail::required_margins_of(
      s, sample_ids, members, o.group_size, o.page_tokens, scorer_of(s, o.basis));
}

/**
 * @brief The margin for calibration samples `sample_ids` with plan-time groups formed from them:
 * the fixed `o.margin` if set, else clamp(max(mean + alpha sd of required_margins,
 * o.margin_floor), 0, max_elastic_margin).
 * @throw invalid_argument for bad options or samples, or an empty or out-of-range `sample_ids`.
 */
inline double calibrate_elastic_margin(retention_samples const& s,
                                       std::vector<std::size_t> const& sample_ids,
                                       elastic_options const& o) {
  detail::check_elastic(s, o);
  detail::check_sample_ids(s, sample_ids, "calibrate_elastic_margin");
  if (o.margin) return *o.margin;
  return detail::calibrated_margin(
      required_margins(s, sample_ids, elastic_group_members(s, sample_ids), o),
      o.margin_alpha,
      o.margin_floor);
}

/**
 * @brief The margin the elastic plan `plan` (built: groups, stage and rank set) reserves from
 * `samples` unless given a fixed one (`reservation_options::margin` left empty):
 * clamp(max(mean + 2 sd of m_s, default_elastic_margin), 0, max_elastic_margin), with m_s each
 * sample's required margin over the plan's OWN compressed groups and heads (its pipeline stage's
 * layers, its tensor-parallel rank's KV heads): zero-clip pages sum_g ceil(max_{h in g}
 * kept_s(h) / P) times Hp P, over the scorer's total K(n_s) of the plan's compressed heads, less
 * 1. default_elastic_margin when the plan has no compressed group or a compressed head the
 * samples do not profile.
 *
 * Why a floor and a raise: on the bundled profiles the scorer keeps 0.36-0.65% more than K(n)
 * and their kept counts are nearly all whole pages, so mean + 2 sd is 0.004-0.007 at Hp 1 and the
 * default 0.02 also covers per-head page rounding the samples do not show; samples whose scorer
 * keeps more than K(n) predicts (a profile whose keep ratio counts tokens differently), groups of
 * Hp > 1 that pad, and a stage or rank whose heads keep more than their share of the request's
 * total would clip what 0.02 does not cover, and get the margin they need instead
 * (docs/planning.md#elastic-reservation).
 * @throw invalid_argument for samples without a keep ratio in (0, 1] or otherwise invalid.
 */
inline double elastic_plan_margin(retention_samples const& samples, static_plan const& plan) {
  detail::check_samples(samples);
  auto const t  = scorer_of(samples, plan.options.reservation.basis);
  auto const Hp = plan.geometry.group_size;
  auto const P  = plan.geometry.page_tokens;
  std::vector<std::int32_t> members;  // flat sample heads, group after group
  for (auto const& g : plan.grouping.groups) {
    if (g.rule.kind != layer_kind::compressed) continue;
    for (auto m : g.members) {
      auto const& ids   = samples.layer_ids;
      auto it           = std::lower_bound(ids.begin(), ids.end(), plan.first_layer + m.layer);
      std::int32_t head = plan.first_kv_head + m.head;
      if (it == ids.end() || *it != plan.first_layer + m.layer || head >= samples.num_kv_heads)
        return default_elastic_margin;  // a head the samples do not profile
      members.push_back(static_cast<std::int32_t>(it - ids.begin()) * samples.num_kv_heads + head);
    }
  }
  if (members.empty() || Hp < 1 || P < 1 || members.size() % static_cast<std::size_t>(Hp) != 0)
    return default_elastic_margin;
  std::vector<std::size_t> all(samples.samples.size());
  std::iota(all.begin(), all.end(), std::size_t{0});
  elastic_options const rule;  // the calibrated rule's alpha (2), with the plans' floor
  return detail::calibrated_margin(detail::required_margins_of(samples, all, members, Hp, P, t),
                                   rule.margin_alpha,
                                   default_elastic_margin);
}

/// The margins `tangram calibrate --reservation elastic` sweeps.
inline std::vector<double> elastic_margin_grid() {
  return {0.0, 0.02, 0.05, 0.08, 0.10, 0.12, 0.15, 0.20, 0.25};
}

/**
 * @brief Evaluates elastic reservation on retention samples (file comment for every formula):
 * in sample (groups and margin from all samples), held out over the folds of `e` (groups and
 * margin from the training folds), for every margin of `sweep` held out at that fixed margin,
 * and, given `clip_target`, the smallest margin k x suggestion_step whose held-out clipping is at
 * most the target (`suggested`; held-out clipping never rises with the margin, since R(n) never
 * shrinks, so a binary search over k finds it exactly).
 * Cost: O((1 + folds (1 + |sweep| + 12)) x samples x (heads log heads + reserved pages x
 * (Hp + log G))).
 * @throw invalid_argument for bad options or samples (Hp not dividing the heads, no keep ratio),
 *        more folds than samples (distinct context lengths with group_by_context), or a clip
 *        target outside [0, 1].
 */
inline elastic_report evaluate_elastic(retention_samples const& s,
                                       elastic_options const& o          = {},
                                       evaluation_options const& e       = {},
                                       std::vector<double> const& sweep  = {},
                                       std::optional<double> clip_target = std::nullopt) {
  e.validate();
  TANGRAM_EXPECTS(!clip_target || (*clip_target >= 0 && *clip_target <= 1),
                  invalid_argument,
                  "clip_target: must be in [0, 1], got ",
                  clip_target.value_or(0));
  std::size_t n = detail::check_elastic(s, o);
  for (std::size_t i = 0; i < sweep.size(); ++i)
    TANGRAM_EXPECTS(sweep[i] >= 0 && sweep[i] <= max_elastic_margin,
                    invalid_argument,
                    "sweep[",
                    i,
                    "]: margin must be in [0, ",
                    max_elastic_margin,
                    "], got ",
                    sweep[i]);
  auto folds    = detail::assign_folds(s, e);
  std::size_t S = s.samples.size();
  std::vector<std::size_t> all(S);
  std::iota(all.begin(), all.end(), std::size_t{0});
  auto t = scorer_of(s, o.basis);

  elastic_report rep;
  rep.num_samples       = static_cast<std::int32_t>(S);
  rep.num_heads         = static_cast<std::int32_t>(n);
  rep.group_size        = o.group_size;
  rep.page_tokens       = o.page_tokens;
  rep.basis             = o.basis;
  rep.margin_calibrated = !o.margin.has_value();
  rep.margin            = calibrate_elastic_margin(s, all, o);
  double err_sum = 0, ratio_sum = 0;
  for (auto const& smp : s.samples) {
    double K = static_cast<double>(t.tokens(static_cast<std::int64_t>(n), smp.context_tokens));
    double kept =
        static_cast<double>(std::accumulate(smp.kept.begin(), smp.kept.end(), std::int64_t{0}));
    double err = kept / K - 1.0;
    err_sum += err;
    rep.total_error_max = std::max(rep.total_error_max, std::abs(err));
    ratio_sum += kept / static_cast<double>(smp.context_tokens);
  }
  rep.total_error_mean      = err_sum / static_cast<double>(S);
  rep.mean_dynamic_fraction = ratio_sum / static_cast<double>(S * n);

  auto in = detail::elastic_evaluate(s, all, elastic_group_members(s, all), rep.margin, o);
  rep.reserved_over_ideal    = in.reserved_over_ideal();
  rep.insample_clip_fraction = in.clip();
  rep.group_padding          = in.zero_clip / in.kept - 1.0;
  rep.per_request_padding    = in.zero_clip_per_request / in.kept - 1.0;

  rep.folds = e.folds;
  if (e.folds == 0) return rep;
  std::vector<std::vector<std::size_t>> train(static_cast<std::size_t>(e.folds)),
      test(static_cast<std::size_t>(e.folds));
  std::vector<std::vector<std::int32_t>> members(static_cast<std::size_t>(e.folds));
  for (std::int32_t f = 0; f < e.folds; ++f) {
    auto fi = static_cast<std::size_t>(f);
    folds.split(f, train[fi], test[fi]);
    members[fi] = elastic_group_members(s, train[fi]);
  }
  // Held-out figures at one margin per fold: the mean over folds of each fold's figure.
  struct heldout_figures {
    std::vector<double> clips;
    double clip = 0, roi = 0, clip_per_request = 0, padding = 0;
  };
  auto heldout = [&](std::vector<double> const& margins) {
    heldout_figures h;
    for (std::size_t f = 0; f < margins.size(); ++f) {
      auto r = detail::elastic_evaluate(s, test[f], members[f], margins[f], o);
      h.clips.push_back(r.clip());
      h.clip += r.clip();
      h.roi += r.reserved_over_ideal();
      h.clip_per_request += r.clip_per_request();
      h.padding += r.zero_clip / r.kept - 1.0;
    }
    double k = static_cast<double>(margins.size());
    h.clip /= k;
    h.roi /= k;
    h.clip_per_request /= k;
    h.padding /= k;
    return h;
  };
  for (std::size_t f = 0; f < train.size(); ++f)
    rep.fold_margins.push_back(calibrate_elastic_margin(s, train[f], o));
  auto h                                = heldout(rep.fold_margins);
  rep.fold_clip_fractions               = h.clips;
  rep.heldout_clip_fraction             = h.clip;
  rep.heldout_reserved_over_ideal       = h.roi;
  rep.heldout_per_request_clip_fraction = h.clip_per_request;
  rep.heldout_group_padding             = h.padding;
  for (double m : sweep) {
    auto hm = heldout(std::vector<double>(train.size(), m));
    rep.sweep.push_back({m, hm.roi, hm.clip, hm.clip_per_request});
  }
  if (clip_target) {
    rep.clip_target = *clip_target;
    auto at         = [&](std::int64_t k) {
      auto hm =
          heldout(std::vector<double>(train.size(), static_cast<double>(k) * suggestion_step));
      return elastic_sweep_point{
          static_cast<double>(k) * suggestion_step, hm.roi, hm.clip, hm.clip_per_request};
    };
    // Smallest k in [0, kmax] with clip(k) <= target; clip never rises with k.
    auto kmax = static_cast<std::int64_t>(std::floor(max_elastic_margin / suggestion_step));
    auto best = at(kmax);
    if (best.heldout_clip_fraction <= *clip_target) {
      std::int64_t lo = -1, hi = kmax;  // clip(lo) > target (or lo = -1), clip(hi) <= target
      while (hi - lo > 1) {
        std::int64_t mid = lo + (hi - lo) / 2;
        auto p           = at(mid);
        if (p.heldout_clip_fraction <= *clip_target) {
          hi   = mid;
          best = p;
        } else {
          lo = mid;
        }
      }
      rep.suggested = best;
    }
  }
  return rep;
}

}  // namespace tangram
