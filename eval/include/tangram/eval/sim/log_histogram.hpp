// SPDX-License-Identifier: Apache-2.0
/**
 * @file eval/sim/log_histogram.hpp
 * @brief Percentiles of many positive samples in bounded memory: a histogram with bins 1% wide
 * (geometric) from 1 ns to 10^4 s. A percentile is reported as its bin's geometric centre, so
 * within 0.5% of the exact sample; values outside the range fall into the first or last bin.
 * Used for time between tokens, which has one sample per generated token.
 */
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace tangram::sim {

class log_histogram {
 public:
  static constexpr double lowest = 1e-9;  ///< seconds
  static constexpr double ratio  = 1.01;  ///< bin width

  log_histogram() : bins_(static_cast<std::size_t>(std::ceil(std::log(1e13) / std::log(ratio))) + 1, 0) {}

  void add(double x) {
    double i = x > lowest ? std::floor(std::log(x / lowest) / std::log(ratio)) : 0.0;
    auto b   = static_cast<std::size_t>(std::min(i, static_cast<double>(bins_.size() - 1)));
    bins_[b] += 1;
    count_ += 1;
  }
  [[nodiscard]] std::int64_t count() const noexcept { return count_; }

  /// The q-quantile (q in [0, 1]) as the centre of the bin of the sample of rank
  /// floor(q * (count - 1)); 0 when empty.
  [[nodiscard]] double quantile(double q) const {
    if (count_ == 0) return 0;
    auto rank        = static_cast<std::int64_t>(q * static_cast<double>(count_ - 1));
    std::int64_t seen = 0;
    for (std::size_t b = 0; b < bins_.size(); ++b) {
      seen += bins_[b];
      if (seen > rank) return lowest * std::pow(ratio, static_cast<double>(b) + 0.5);
    }
    return lowest * std::pow(ratio, static_cast<double>(bins_.size()) - 0.5);
  }

 private:
  std::vector<std::int64_t> bins_;
  std::int64_t count_ = 0;
};

}  // namespace tangram::sim
