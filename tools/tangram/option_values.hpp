// SPDX-License-Identifier: Apache-2.0
// Typed options of the `tangram` program, declared on a CLI11 app. Each declaration carries the
// option's default and its allowed range or choices, so `--help` shows them and nothing else
// restates them. Numbers are read whole with std::from_chars: CLI11's own conversion would take
// "010" as octal 8, "0x10" as 16 and let "nan" through a range check.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

namespace tangram::cli {

/// Allowed values of a real option: [lo, hi], or (lo, hi] when `open_low`.
struct number_range {
  double lo;
  double hi;
  bool open_low = false;
};

/// Real option; the value `target` holds now is the default --help shows.
CLI::Option* add_number(CLI::App& app,
                        std::string const& name,
                        double& target,
                        number_range r,
                        std::string const& help);
/// Real option without a default: `target` stays empty unless given.
CLI::Option* add_number(CLI::App& app,
                        std::string const& name,
                        std::optional<double>& target,
                        number_range r,
                        std::string const& help);

/// Integer option in [lo, hi] read into `set`; `shown_default` is what --help shows.
CLI::Option* add_integer(CLI::App& app,
                         std::string const& name,
                         std::function<void(std::int64_t)> set,
                         std::int64_t shown_default,
                         std::int64_t lo,
                         std::int64_t hi,
                         std::string const& help);

/// Integer option in [lo, hi] bound to `target`, whose value now is the default.
template <class Int>
CLI::Option* add_integer(CLI::App& app,
                         std::string const& name,
                         Int& target,
                         std::int64_t lo,
                         std::int64_t hi,
                         std::string const& help) {
  return add_integer(
      app,
      name,
      [&target](std::int64_t v) { target = static_cast<Int>(v); },
      static_cast<std::int64_t>(target),
      lo,
      hi,
      help);
}

/// Comma-separated integers ("N,N,..."), each in [lo, hi], at most `max_count` of them; `target`
/// is left as it is unless the option is given.
CLI::Option* add_integer_list(CLI::App& app,
                              std::string const& name,
                              std::vector<std::int64_t>& target,
                              std::int64_t lo,
                              std::int64_t hi,
                              std::size_t max_count,
                              std::string const& help);

/// Comma-separated layer ranges ("FIRST:LAST,..."): model layers [FIRST, LAST), each bound in
/// [0, hi], at most `max_count` ranges; `target` is left as it is unless the option is given.
/// Whether the ranges fit a model is the caller's check (the model is known later).
CLI::Option* add_layer_ranges(CLI::App& app,
                              std::string const& name,
                              std::vector<std::pair<std::int64_t, std::int64_t>>& target,
                              std::int64_t hi,
                              std::size_t max_count,
                              std::string const& help);

/// Comma-separated reals ("X,X,..."), each in `r`, at most `max_count` of them; `target` is left
/// as it is unless the option is given.
CLI::Option* add_number_list(CLI::App& app,
                             std::string const& name,
                             std::vector<double>& target,
                             number_range r,
                             std::size_t max_count,
                             std::string const& help);

/// One word of `allowed`, passed to `set`; `shown_default` is what --help shows.
CLI::Option* add_choice(CLI::App& app,
                        std::string const& name,
                        std::function<void(std::string const&)> set,
                        std::string const& shown_default,
                        std::vector<std::string> const& allowed,
                        std::string const& help);

/// One word of `choices`, in their order, the first shown as the default: `target` (an E, or a
/// std::optional<E>) gets the value paired with the word given, and is left as it is otherwise.
template <class E, class Target>
CLI::Option* add_enum(CLI::App& app,
                      std::string const& name,
                      Target& target,
                      std::vector<std::pair<std::string, E>> choices,
                      std::string const& help) {
  std::vector<std::string> words;
  for (auto const& c : choices) words.push_back(c.first);
  return add_choice(
      app,
      name,
      [&target, choices](std::string const& v) {
        for (auto const& c : choices)
          if (c.first == v) target = c.second;
      },
      words.front(),
      words,
      help);
}

/// Free text (a path or a name) labelled `label` in --help; empty unless given.
CLI::Option* add_text(CLI::App& app,
                      std::string const& name,
                      std::optional<std::string>& target,
                      std::string const& label,
                      std::string const& help);

/// Free text with a default: the value `target` holds now, shown by --help.
CLI::Option* add_text(CLI::App& app,
                      std::string const& name,
                      std::string& target,
                      std::string const& label,
                      std::string const& help);

/// The raw text given for `opt` (for messages that quote the user's spelling), or `fallback`.
std::string given_text(CLI::Option const* opt, std::string fallback);

}  // namespace tangram::cli
