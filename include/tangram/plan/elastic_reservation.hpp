// SPDX-License-Identifier: Apache-2.0
/**
 * @file plan/elastic_reservation.hpp
 * @brief The reservation a plan asks for: static per-group budgets, or elastic (the request's
 * scorer total times 1 + margin, placed per group at eviction), and the arithmetic of the elastic
 * total. Core layer: no parsing, no files, no samples (calibration lives in plan/elastic.hpp; the
 * footprint of a whole request in plan/footprint.hpp). Formulas: plan/elastic.hpp's file comment
 * and docs/planning.md#elastic-reservation. Pure functions; safe from any thread.
 */
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string_view>

#include "tangram/core/detail/checked_math.hpp"
#include "tangram/core/detail/enum_names.hpp"
#include "tangram/core/error.hpp"
#include "tangram/core/retention.hpp"

namespace tangram {

/// @brief How admission reserves a request's compressed heads.
enum class reservation_mode : std::uint8_t {
  static_budgets,  ///< every group its static budget's pages (the paper; M(r) per group)
  elastic,         ///< the scorer's total times 1 + margin, shared by the compressed groups
};

constexpr std::string_view to_string(reservation_mode m) noexcept {
  return m == reservation_mode::static_budgets ? "static" : "elastic";
}

/// The mode named `name` ("static" or "elastic"), if any.
inline std::optional<reservation_mode> reservation_mode_named(std::string_view name) noexcept {
  static constexpr reservation_mode all[] = {reservation_mode::static_budgets,
                                             reservation_mode::elastic};
  return detail::enum_named(name, all);
}

/// @brief What the scorer's keep ratio applies to.
enum class keep_ratio_basis : std::uint8_t {
  all_tokens,  ///< rho of all n tokens, protected ones included (global top-k; bundled data)
  compressible_tokens,  ///< rho of the n - protect unprotected tokens, plus the protected ones
};

constexpr std::string_view to_string(keep_ratio_basis b) noexcept {
  return b == keep_ratio_basis::all_tokens ? "all_tokens" : "compressible_tokens";
}

/// @brief The scorer's total per request: how many head-tokens it keeps after n tokens.
struct scorer_total {
  double keep_ratio      = 0.3;  ///< rho, in (0, 1]
  std::int64_t protect   = 0;    ///< sink + window tokens every head keeps, >= 0
  keep_ratio_basis basis = keep_ratio_basis::all_tokens;

  /// @throw invalid_argument naming the field and the value.
  void validate() const {
    TANGRAM_EXPECTS(keep_ratio > 0 && keep_ratio <= 1,
                    invalid_argument,
                    "scorer_total.keep_ratio: must be in (0, 1], got ",
                    keep_ratio);
    TANGRAM_EXPECTS(
        protect >= 0, invalid_argument, "scorer_total.protect: must be >= 0, got ", protect);
  }

  /// kbar(n): one head's share of the total (file comment); in [min(n, protect), n].
  /// @throw invalid_argument for bad fields or n < 0.
  [[nodiscard]] std::int64_t per_head(std::int64_t n) const {
    validate();
    TANGRAM_EXPECTS(n >= 0, invalid_argument, "context_tokens: must be >= 0, got ", n);
    std::int64_t p = std::min(n, protect);
    if (basis == keep_ratio_basis::all_tokens)
      return std::max(p, ceil_budget_tokens(keep_ratio, n));
    return p + ceil_budget_tokens(keep_ratio, n - p);
  }

  /// K(n) = heads * kbar(n), overflow-checked.
  [[nodiscard]] std::int64_t tokens(std::int64_t heads, std::int64_t n) const {
    TANGRAM_EXPECTS(heads >= 0, invalid_argument, "heads: must be >= 0, got ", heads);
    return detail::mul_or_throw(heads, per_head(n), "scorer total: heads * per-head tokens");
  }
};

/// The basis named `name` ("all_tokens" or "compressible_tokens"), if any.
inline std::optional<keep_ratio_basis> keep_ratio_basis_named(std::string_view name) noexcept {
  static constexpr keep_ratio_basis all[] = {keep_ratio_basis::all_tokens,
                                             keep_ratio_basis::compressible_tokens};
  return detail::enum_named(name, all);
}

/// Largest margin accepted anywhere (1 + m multiplies a token count held in a double).
inline constexpr double max_elastic_margin = 10.0;

/**
 * @brief R(n): pages reserved for the compressed heads of one request before decode (file
 * comment), at `heads` heads grouped Hp per page, P tokens per page and margin m.
 * @throw invalid_argument naming the field: Hp not dividing heads, P < 1, margin outside
 *        [0, max_elastic_margin], n < 0, or a total that overflows.
 */
inline std::int64_t elastic_compressed_pages(scorer_total const& t,
                                             std::int64_t heads,
                                             std::int32_t group_size,
                                             std::int32_t page_tokens,
                                             double margin,
                                             std::int64_t n) {
  t.validate();
  TANGRAM_EXPECTS(group_size >= 1 && heads >= 0 && heads % group_size == 0,
                  invalid_argument,
                  "group_size: must be >= 1 and divide the ",
                  heads,
                  " compressed heads, got ",
                  group_size);
  TANGRAM_EXPECTS(
      page_tokens >= 1, invalid_argument, "page_tokens: must be >= 1, got ", page_tokens);
  TANGRAM_EXPECTS(margin >= 0 && margin <= max_elastic_margin,
                  invalid_argument,
                  "margin: must be in [0, ",
                  max_elastic_margin,
                  "], got ",
                  margin);
  std::int64_t K      = t.tokens(heads, n);
  std::int64_t groups = heads / group_size;
  // (1 + m) K in a double: exact enough below 2^53 and checked to stay far below 2^63.
  TANGRAM_EXPECTS(static_cast<double>(K) * (1.0 + margin) < 0x1p62,
                  invalid_argument,
                  "scorer total: ",
                  K,
                  " head-tokens times 1 + margin ",
                  margin,
                  " overflows");
  std::int64_t want = ceil_budget_tokens(1.0 + margin, K);
  std::int64_t cell = static_cast<std::int64_t>(group_size) * page_tokens;
  std::int64_t lo   = detail::mul_or_throw(groups,
                                         ceil_div(std::min(n, t.protect), page_tokens),
                                         "protected pages: groups * pages per group");
  std::int64_t hi   = detail::mul_or_throw(
      groups, ceil_div(n, page_tokens), "full pages: groups * pages per group");
  return std::min(hi, std::max(lo, ceil_div(want, cell)));
}

/**
 * @brief The pages a turn's compressed groups reserve together under elastic reservation: the
 * limit of each chunk's eviction (`limit`, R(n) or what the session already holds) plus the
 * larger of one chunk's staging (`staging`) and the answer's growth (`decode`), since a turn
 * stages chunks only before its first decode token; and never more than those groups take
 * uncompressed after the turn (`uncompressed`, G_c ceil((n + T) / P): every group's pages are
 * bounded by its longest head, which never holds more tokens than the turn has seen). So an
 * elastic turn never reserves more than the same turn uncompressed (docs/memory.md).
 * @throw invalid_argument when a value is negative or the sum overflows.
 */
inline std::int64_t elastic_turn_pages(std::int64_t limit,
                                       std::int64_t decode,
                                       std::int64_t staging,
                                       std::int64_t uncompressed) {
  TANGRAM_EXPECTS(limit >= 0 && decode >= 0 && staging >= 0 && uncompressed >= 0,
                  invalid_argument,
                  "elastic_turn_pages: limit ",
                  limit,
                  ", decode ",
                  decode,
                  ", staging ",
                  staging,
                  " and uncompressed ",
                  uncompressed,
                  " pages must be >= 0");
  return std::min(
      detail::add_or_throw(limit, std::max(decode, staging), "elastic turn: limit + growth"),
      uncompressed);
}

/// Margin a plan reserves under elastic reservation unless told otherwise, for the default
/// per-head pages (Hp 1): it covers the scorer's total error (at most 0.65% on every bundled
/// sample) and per-head page rounding (at most P / protect, 0.39% at P 16 and 4128 protected
/// tokens). On folds grouped by prompt: 1.015-1.016x the needs reserved, 0% held out clipped on
/// every bundled profile. Groups of Hp > 1 pad and need more: 0.15 for plan-time groups of 4
/// (docs/planning.md#elastic-reservation).
inline constexpr double default_elastic_margin = 0.02;

/**
 * @brief The reservation part of plan_options. Elastic is the default: on the bundled profiles it
 * reserves about 1.015x the ideal footprint (per-head pages) against 1.19-1.40x for static
 * mu + 2 sigma budgets (docs/memory.md#elastic-reservation). Choose
 * `reservation_mode::static_budgets` for an engine that cannot run one cross-layer eviction per
 * chunk (docs/integration.md).
 */
struct reservation_options {
  reservation_mode mode = reservation_mode::elastic;
  /// Elastic only, in [0, max_elastic_margin]: reserve the scorer's total times 1 + margin.
  /// None (the default): `build_static_plan` decides it, from the retention samples the plan is
  /// built from (`elastic_plan_margin`: mean + 2 sd of their required margins, at least
  /// default_elastic_margin), else default_elastic_margin; a built plan (or one read from a file)
  /// always holds the margin it reserves.
  std::optional<double> margin;
  keep_ratio_basis basis = keep_ratio_basis::all_tokens;  ///< elastic only

  /// The margin reserved: `margin`, or default_elastic_margin where none was decided.
  [[nodiscard]] double margin_or_default() const { return margin.value_or(default_elastic_margin); }

  /// @throw invalid_argument naming the field and the value.
  void validate() const {
    TANGRAM_EXPECTS(!margin || (*margin >= 0 && *margin <= max_elastic_margin),
                    invalid_argument,
                    "plan_options.reservation.margin: must be in [0, ",
                    max_elastic_margin,
                    "], got ",
                    margin.value_or(0));
  }
};

}  // namespace tangram
