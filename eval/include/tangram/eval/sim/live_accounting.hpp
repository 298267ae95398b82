// SPDX-License-Identifier: Apache-2.0
/**
 * @file eval/sim/live_accounting.hpp
 * @brief What every simulated policy shares: the pool size a KV budget buys (`pool_pages`), the
 * bytes of one head's token, and the live-token accounting (`live_tracker`,
 * `live_accounting_policy`) that sums the held head lengths lazily, out of the timed path.
 */
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "tangram/core/error.hpp"
#include "tangram/eval/sim/replay.hpp"
#include "tangram/memory/page_pool.hpp"
#include "tangram/plan/static_plan.hpp"

namespace tangram::sim {

/// Bytes of K and V one token of one head takes.
inline double head_token_bytes(static_plan const& plan) {
  return static_cast<double>(2 * plan.geometry.head_dim * plan.geometry.element_bytes());
}

/// Whether a page table whose heads follow `rules[0, n)` grows with the context, so that the
/// replay's continuation headroom applies to it: it does unless every head is a sliding-window
/// ring (which never holds more than its window, and is full once a session saw that many).
inline bool grows_with_context(head_rule const* rules, std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i)
    if (rules[i].kind != layer_kind::sliding_window) return true;
  return false;
}

/**
 * @brief Pages of `page_bytes` bytes that `kv_bytes` of KV memory holds (rounded down).
 * @throw invalid_argument naming kv_bytes when it is not finite or the pages are not in
 *        [1, page_pool max_pages] (page ids are 32-bit).
 */
inline std::int64_t pool_pages(double kv_bytes, std::int64_t page_bytes) {
  constexpr auto most = page_pool<>::max_pages;
  double pages        = std::floor(kv_bytes / static_cast<double>(page_bytes));
  TANGRAM_EXPECTS(std::isfinite(kv_bytes) && pages >= 1 && pages <= static_cast<double>(most),
                  invalid_argument,
                  "kv_bytes: ",
                  kv_bytes,
                  " bytes hold ",
                  pages,
                  " pages of ",
                  page_bytes,
                  " bytes; a pool needs between 1 and ",
                  most);
  return static_cast<std::int64_t>(pages);
}

/**
 * @brief Live-token accounting of a policy, kept out of the engine's timed path: sessions touched
 * by a call are marked dirty and their held tokens are summed (over every head) only when a
 * figure is read.
 */
class live_tracker {
 public:
  live_tracker(std::int32_t num_sessions, double token_bytes, std::int64_t heads)
      : live_(static_cast<std::size_t>(num_sessions), 0.0),
        attended_(static_cast<std::size_t>(num_sessions), 0.0),
        dirty_(static_cast<std::size_t>(num_sessions), 0),
        token_bytes_(token_bytes),
        heads_(static_cast<double>(heads)) {}

  void touch(std::int32_t s) {
    if (!dirty_[static_cast<std::size_t>(s)]) {
      dirty_[static_cast<std::size_t>(s)] = 1;
      dirty_list_.push_back(s);
    }
  }
  /// The session holds nothing any more.
  void clear(std::int32_t s) {
    total_ -= live_[static_cast<std::size_t>(s)];
    live_[static_cast<std::size_t>(s)]     = 0;
    attended_[static_cast<std::size_t>(s)] = 0;
    dirty_[static_cast<std::size_t>(s)]    = 0;
  }
  /// Brings dirty sessions up to date; `held_tokens(s)` sums the session's head lengths.
  template <class HeldTokens>
  void update(HeldTokens&& held_tokens) const {
    for (auto s : dirty_list_) {
      if (!dirty_[static_cast<std::size_t>(s)]) continue;
      dirty_[static_cast<std::size_t>(s)] = 0;
      auto tokens                         = static_cast<double>(held_tokens(s));
      total_ += tokens * token_bytes_ - live_[static_cast<std::size_t>(s)];
      live_[static_cast<std::size_t>(s)]     = tokens * token_bytes_;
      attended_[static_cast<std::size_t>(s)] = tokens / heads_;
    }
    dirty_list_.clear();
  }
  [[nodiscard]] double live_bytes(std::int32_t s) const {
    return live_[static_cast<std::size_t>(s)];
  }
  [[nodiscard]] double attended(std::int32_t s) const {
    return attended_[static_cast<std::size_t>(s)];
  }
  [[nodiscard]] double total() const { return total_; }

 private:
  mutable std::vector<double> live_, attended_;
  mutable std::vector<char> dirty_;
  mutable std::vector<std::int32_t> dirty_list_;
  mutable double total_ = 0;
  double token_bytes_   = 0;
  double heads_         = 1;
};

/// @brief A policy whose live bytes come from summing its sequences' head lengths lazily.
class live_accounting_policy : public kv_policy {
 public:
  live_accounting_policy(static_plan const& plan, std::int32_t num_sessions)
      : plan_(plan),
        live_(num_sessions,
              head_token_bytes(plan),
              static_cast<std::int64_t>(plan.num_layers) * plan.num_kv_heads) {}

  [[nodiscard]] double kv_bytes_read(std::int32_t s) const override {
    update();
    return live_.live_bytes(s);
  }
  [[nodiscard]] double attended_tokens(std::int32_t s) const override {
    update();
    return live_.attended(s);
  }

 protected:
  /// Tokens session `s` holds, summed over every (layer, head).
  [[nodiscard]] virtual std::int64_t held_tokens(std::int32_t s) const = 0;
  /// Sum of head lengths given a per-head length function.
  template <class HeadLen>
  [[nodiscard]] std::int64_t sum_heads(HeadLen&& head_len) const {
    std::int64_t sum = 0;
    for (std::int32_t l = 0; l < plan_.num_layers; ++l)
      for (std::int32_t h = 0; h < plan_.num_kv_heads; ++h) sum += head_len(l, h);
    return sum;
  }
  void update() const {
    live_.update([&](std::int32_t s) { return held_tokens(s); });
  }

  static_plan plan_;
  live_tracker live_;
};

}  // namespace tangram::sim
