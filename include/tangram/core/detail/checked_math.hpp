// SPDX-License-Identifier: Apache-2.0
/**
 * @file core/detail/checked_math.hpp
 * @brief Overflow-checked integer arithmetic for sizes that come from callers (host only).
 *
 * Every sum or product of caller-supplied token, page or byte counts goes through these helpers
 * before it is compared with a limit: `a + b <= limit` with signed operands is undefined once
 * `a + b` overflows, and in practice wraps negative and passes the check.
 */
#pragma once

#include <limits>
#include <optional>
#include <type_traits>

#include "tangram/core/error.hpp"

namespace tangram::detail {

/// `a + b` (Op '+') or `a * b` (Op '*'), or nullopt when the exact result does not fit in `T`.
template <char Op, class T>
[[nodiscard]] constexpr std::optional<T> op_checked(T a, T b) noexcept {
  static_assert(std::is_integral_v<T>, "add_checked/mul_checked: integral types only");
  static_assert(Op == '+' || Op == '*', "op_checked: '+' or '*'");
  T r{};
  if (Op == '+' ? __builtin_add_overflow(a, b, &r) : __builtin_mul_overflow(a, b, &r))
    return std::nullopt;
  return r;
}

/// `a Op b`, throwing `invalid_argument` naming `what` (e.g. "prompt_tokens + max_new_tokens") and
/// both operands when the exact result does not fit in `T`.
template <char Op, class T>
[[nodiscard]] T op_or_throw(T a, T b, char const* what) {
  auto r = op_checked<Op>(a, b);
  TANGRAM_EXPECTS(
      r.has_value(), invalid_argument, what, " overflows: ", a, Op == '+' ? " + " : " * ", b);
  return *r;
}

/// `a + b`, or nullopt when the exact result does not fit in `T`.
template <class T>
[[nodiscard]] constexpr std::optional<T> add_checked(T a, T b) noexcept {
  return op_checked<'+'>(a, b);
}
/// `a * b`, or nullopt when the exact result does not fit in `T`.
template <class T>
[[nodiscard]] constexpr std::optional<T> mul_checked(T a, T b) noexcept {
  return op_checked<'*'>(a, b);
}
/// `a + b`, throwing `invalid_argument` naming `what` and both operands on overflow.
template <class T>
[[nodiscard]] T add_or_throw(T a, T b, char const* what) {
  return op_or_throw<'+'>(a, b, what);
}
/// `a * b`, throwing `invalid_argument` naming `what` and both operands on overflow.
template <class T>
[[nodiscard]] T mul_or_throw(T a, T b, char const* what) {
  return op_or_throw<'*'>(a, b, what);
}

}  // namespace tangram::detail
