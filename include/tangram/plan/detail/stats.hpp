// SPDX-License-Identifier: Apache-2.0
/**
 * @file plan/detail/stats.hpp
 * @brief Small descriptive statistics shared by calibration and the split-map analysis (host
 * only): mean, population standard deviation, empirical quantile, average ranks, Spearman
 * correlation, and a portable pseudo-random stream.
 */
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "tangram/core/error.hpp"

namespace tangram::detail {

/// Arithmetic mean; 0 for an empty range.
inline double mean_of(double const* x, std::size_t n) {
  if (n == 0) return 0.0;
  double s = 0;
  for (std::size_t i = 0; i < n; ++i) s += x[i];
  return s / static_cast<double>(n);
}

/// Population standard deviation sqrt(sum (x - mean)^2 / n) (two passes); 0 for n < 2.
inline double population_stddev(double const* x, std::size_t n) {
  if (n < 2) return 0.0;
  double mu = mean_of(x, n), sq = 0;
  for (std::size_t i = 0; i < n; ++i) sq += (x[i] - mu) * (x[i] - mu);
  return std::sqrt(sq / static_cast<double>(n));
}

/**
 * @brief Empirical quantile with linear interpolation between order statistics (Hyndman and Fan
 * type 7, the default of R and NumPy): with x sorted ascending and h = (n - 1) q, the result is
 * x[floor h] + (h - floor h) (x[floor h + 1] - x[floor h]). q = 0 gives the minimum, q = 1 the
 * maximum. Sorts `values` in place.
 * @throw invalid_argument when `values` is empty or q is outside [0, 1].
 */
inline double linear_quantile(std::vector<double>& values, double q) {
  TANGRAM_EXPECTS(!values.empty(), invalid_argument, "quantile: no values");
  TANGRAM_EXPECTS(q >= 0 && q <= 1, invalid_argument, "quantile: must be in [0, 1], got ", q);
  std::sort(values.begin(), values.end());
  double h       = static_cast<double>(values.size() - 1) * q;
  auto lo        = static_cast<std::size_t>(std::floor(h));
  std::size_t hi = std::min(lo + 1, values.size() - 1);
  return values[lo] + (h - static_cast<double>(lo)) * (values[hi] - values[lo]);
}

/**
 * @brief 1-based ranks of `x`; tied values share the average of the ranks they span.
 * @param order scratch (resized), so repeated calls do not allocate once warm
 */
inline void average_ranks(std::vector<double> const& x,
                          std::vector<double>& ranks,
                          std::vector<std::size_t>& order) {
  order.resize(x.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return x[a] < x[b]; });
  ranks.resize(x.size());
  for (std::size_t i = 0; i < order.size();) {
    std::size_t j = i;
    while (j + 1 < order.size() && x[order[j + 1]] == x[order[i]]) ++j;
    double r = (static_cast<double>(i) + static_cast<double>(j)) / 2.0 + 1.0;
    for (std::size_t k = i; k <= j; ++k) ranks[order[k]] = r;
    i = j + 1;
  }
}

/// Pearson correlation of two equally long sequences; 0 when either is constant.
inline double pearson(std::vector<double> const& a, std::vector<double> const& b) {
  std::size_t n = std::min(a.size(), b.size());
  double ma = mean_of(a.data(), n), mb = mean_of(b.data(), n);
  double sab = 0, saa = 0, sbb = 0;
  for (std::size_t i = 0; i < n; ++i) {
    sab += (a[i] - ma) * (b[i] - mb);
    saa += (a[i] - ma) * (a[i] - ma);
    sbb += (b[i] - mb) * (b[i] - mb);
  }
  return saa > 0 && sbb > 0 ? sab / std::sqrt(saa * sbb) : 0.0;
}

/// Spearman rank correlation: the Pearson correlation of the average ranks.
inline double spearman(std::vector<double> const& a, std::vector<double> const& b) {
  std::vector<double> ra, rb;
  std::vector<std::size_t> order;
  average_ranks(a, ra, order);
  average_ranks(b, rb, order);
  return pearson(ra, rb);
}

/**
 * @brief A uniform double in [0, 1) from a 64-bit Mersenne Twister, with the same bits on every
 * platform (std::uniform_real_distribution is implementation-defined; this is the top 53 bits).
 */
inline double canonical_uniform(std::mt19937_64& rng) {
  return static_cast<double>(rng() >> 11) * (1.0 / 9007199254740992.0);
}

}  // namespace tangram::detail
