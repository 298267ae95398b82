// SPDX-License-Identifier: Apache-2.0
/**
 * @file core/retention.hpp
 * @brief The retention rule of one KV head (how many tokens it keeps after seeing n tokens) and
 * the attention kind of a layer it switches on (`layer_kind`; parsed by model/model_spec.hpp).
 *
 * Host/device: the CPU reference, the memory planner and the kernels all call this one function,
 * so a footprint computed at admission is exactly what eviction later produces.
 */
#pragma once

#include <cstdint>
#include <string_view>

#include "tangram/core/config.hpp"

namespace tangram {

/// @brief How a layer's KV cache behaves over time.
enum class layer_kind : std::uint8_t {
  compressed,      ///< full attention whose KV is compressed to a static per-head budget
  sliding_window,  ///< attends to the last `window` tokens only; constant memory per head
  uncompressed,    ///< full attention kept whole (e.g. layers an operator chooses not to compress)
};

constexpr std::string_view to_string(layer_kind k) noexcept {
  switch (k) {
    case layer_kind::compressed:
      return "compressed";
    case layer_kind::sliding_window:
      return "sliding_window";
    case layer_kind::uncompressed:
      return "uncompressed";
  }
  return "?";
}

/**
 * @brief Static rule of one KV head (or of a head group: the rule of its largest member).
 *
 * - compressed:   k(n) = n if n <= protect, else min(n, max(protect, ceil(budget * n)))
 * - sliding:      k(n) = min(n, window)
 * - uncompressed: k(n) = n
 */
struct head_rule {
  layer_kind kind      = layer_kind::compressed;
  double budget        = 1.0;  ///< B in (0, 1] (compressed); 1 for the other kinds
  std::int64_t protect = 0;    ///< sink + recent-window tokens always kept (compressed)
  std::int32_t window  = 0;    ///< attended tokens (sliding_window)

  friend bool operator==(head_rule const& a, head_rule const& b) {
    return a.kind == b.kind && a.budget == b.budget && a.protect == b.protect &&
           a.window == b.window;
  }
};

/// ceil(budget * n) computed identically on host and device (IEEE double multiply, no FMA).
TANGRAM_HOST_DEVICE std::int64_t ceil_budget_tokens(double budget, std::int64_t n) {
  double x = budget * static_cast<double>(n);
  auto t   = static_cast<std::int64_t>(x);
  return static_cast<double>(t) < x ? t + 1 : t;
}

/// Tokens a head following `rule` holds after its history reached `n` tokens (n >= 0).
TANGRAM_HOST_DEVICE std::int64_t retained_tokens(head_rule const& rule, std::int64_t n) {
  switch (rule.kind) {
    case layer_kind::sliding_window:
      return n < rule.window ? n : rule.window;
    case layer_kind::uncompressed:
      return n;
    case layer_kind::compressed:
    default: {
      if (n <= rule.protect) return n;
      std::int64_t k = ceil_budget_tokens(rule.budget, n);
      if (k < rule.protect) k = rule.protect;
      return k < n ? k : n;
    }
  }
}

/// Integer ceil(a / b) for a >= 0, b > 0.
TANGRAM_HOST_DEVICE constexpr std::int64_t ceil_div(std::int64_t a, std::int64_t b) {
  return (a + b - 1) / b;
}

}  // namespace tangram
