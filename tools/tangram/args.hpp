// SPDX-License-Identifier: Apache-2.0
// Command-line option handling for the `tangram` program: options are looked up by name, and
// whatever is left when a command finishes reading is an error naming it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tangram/error.hpp"

namespace tangram::cli {

/// Bad command-line usage (exit code 2).
struct usage_error : tangram::invalid_argument {
  using tangram::invalid_argument::invalid_argument;
};

/// The arguments of one subcommand. Options are `--name value`, `--name=value` or `--flag`.
class args {
 public:
  explicit args(std::vector<std::string> tokens)
      : tokens_(std::move(tokens)), used_(tokens_.size()) {}

  /// Value of `--name`, if given. A second occurrence is an error.
  std::optional<std::string> value(std::string_view name);
  /// True when `--name` is present (it takes no value).
  bool flag(std::string_view name);
  /// Number option with bounds, e.g. `number("--alpha", 2.0, 0, 100)`.
  double number(std::string_view name, double fallback, double lo, double hi);
  /// Integer option with bounds.
  std::int64_t integer(std::string_view name,
                       std::int64_t fallback,
                       std::int64_t lo,
                       std::int64_t hi);
  /// Comma-separated integers, each in [lo, hi], at most `max_count` of them; empty when absent.
  std::vector<std::int64_t> integers(std::string_view name,
                                     std::int64_t lo,
                                     std::int64_t hi,
                                     std::size_t max_count);
  /// Value restricted to a fixed set of words.
  std::string choice(std::string_view name,
                     std::string fallback,
                     std::vector<std::string_view> allowed);
  /// The positional arguments, in order (call after reading every option).
  std::vector<std::string> positionals();
  /// Ends parsing: any option not read is an error naming it; more than `max_positionals`
  /// positional arguments too.
  void finish(std::size_t max_positionals);

 private:
  std::vector<std::string> tokens_;
  std::vector<bool> used_;
};

/// Parses a whole token as a double / integer; errors name `what` and the text.
double parse_number(std::string_view text, std::string_view what, double lo, double hi);
std::int64_t parse_integer(std::string_view text,
                           std::string_view what,
                           std::int64_t lo,
                           std::int64_t hi);

}  // namespace tangram::cli
