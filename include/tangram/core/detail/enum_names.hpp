// SPDX-License-Identifier: Apache-2.0
/**
 * @file core/detail/enum_names.hpp
 * @brief Option enums read from their names: the one lookup and the one refusal that every
 * "a, b or c" option (grouping scope, split weighting, reservation mode, ...) shares (host only).
 */
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include "tangram/core/detail/str.hpp"
#include "tangram/core/error.hpp"

namespace tangram::detail {

/// The value among `all` that `to_string` (found by argument-dependent lookup) spells `name`.
template <class Enum, std::size_t N>
[[nodiscard]] std::optional<Enum> enum_named(std::string_view name, Enum const (&all)[N]) {
  for (Enum e : all)
    if (std::string_view(to_string(e)) == name) return e;
  return std::nullopt;
}

/// "a, b or c": the names of `all`, as a refusal lists what it expected.
template <class Enum, std::size_t N>
[[nodiscard]] std::string enum_choices(Enum const (&all)[N]) {
  std::string out;
  for (std::size_t i = 0; i < N; ++i) {
    if (i > 0) out += i + 1 == N ? " or " : ", ";
    out += to_string(all[i]);
  }
  return out;
}

/// @brief The value among `all` named `name`.
/// @throw invalid_argument "FIELD: unknown WHAT "NAME" (expected a, b or c)".
template <class Enum, std::size_t N>
[[nodiscard]] Enum parse_enum(std::string_view name,
                              Enum const (&all)[N],
                              std::string_view field,
                              std::string_view what) {
  if (auto e = enum_named(name, all)) return *e;
  TANGRAM_FAIL(invalid_argument,
               field,
               ": unknown ",
               what,
               " ",
               quoted(name),
               " (expected ",
               enum_choices(all),
               ")");
}

}  // namespace tangram::detail
