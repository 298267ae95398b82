// SPDX-License-Identifier: Apache-2.0
// Brute force for the balanced split map (core/balanced_split.hpp): the least fullest CTA,
// max_h ceil(W_h / S_h), over every way to give H heads S_h >= 1 of N CTAs. Exponential: small H
// and N only.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <limits>
#include <vector>

namespace tangram::test {

/// Tokens of the fullest CTA when head h holds W[h] tokens on shares[h] CTAs.
inline std::int64_t fullest_cta(std::vector<std::int64_t> const& W,
                                std::vector<std::int64_t> const& shares) {
  std::int64_t m = 0;
  for (std::size_t h = 0; h < W.size(); ++h) m = std::max(m, (W[h] + shares[h] - 1) / shares[h]);
  return m;
}

/// The least `fullest_cta` over every composition of N into W.size() parts >= 1.
inline std::int64_t least_fullest_cta(std::vector<std::int64_t> const& W, std::int64_t N) {
  std::int64_t best = std::numeric_limits<std::int64_t>::max();
  std::vector<std::int64_t> c(W.size(), 1);
  std::function<void(std::size_t, std::int64_t)> walk = [&](std::size_t h, std::int64_t left) {
    if (h + 1 == c.size()) {
      c[h] = left;
      best = std::min(best, fullest_cta(W, c));
      return;
    }
    for (std::int64_t k = 1; k <= left - static_cast<std::int64_t>(c.size() - h - 1); ++k) {
      c[h] = k;
      walk(h + 1, left - k);
    }
  };
  walk(0, N);
  return best;
}

}  // namespace tangram::test
