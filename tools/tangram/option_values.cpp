// SPDX-License-Identifier: Apache-2.0
#include "option_values.hpp"

#include <charconv>
#include <cmath>

#include "tangram/core/detail/str.hpp"

namespace tangram::cli {

namespace {

using tangram::detail::cat;

// Bounds as --help shows them: 1e+06 as 1e6.
std::string bound_text(double v) {
  std::string s = cat(v);
  if (auto e = s.find("e+"); e != std::string::npos) {
    auto digits = s.find_first_not_of('0', e + 2);
    s.erase(e + 1, digits - (e + 1));
  }
  return s;
}

std::string range_text(number_range r) {
  return cat(r.open_low ? "(" : "[", bound_text(r.lo), ", ", bound_text(r.hi), "]");
}

std::string range_text(std::int64_t lo, std::int64_t hi) {
  return cat("[", lo, ", ", hi, "]");
}

// Each *_problem returns why `text` is not a valid value, or "" when it is (then `v` holds it).
// That is CLI11's validator convention; CLI11 prefixes the option's name to the reason
// ("--alpha: must be in [0, 1000], got 5000").
std::string number_problem(std::string_view text, number_range r, double& v) {
  auto res = std::from_chars(text.data(), text.data() + text.size(), v);
  if (res.ec != std::errc{} || res.ptr != text.data() + text.size() || !std::isfinite(v))
    return cat("expected a number, got ", tangram::detail::quoted(text));
  if (v < r.lo || v > r.hi || (r.open_low && !(v > r.lo)))
    return cat("must be in ", range_text(r), ", got ", text);
  if (v == 0) v = 0;  // -0 reads as 0: reports and files never show "-0"
  return "";
}

std::string integer_problem(std::string_view text,
                            std::int64_t lo,
                            std::int64_t hi,
                            std::int64_t& v) {
  auto res = std::from_chars(text.data(), text.data() + text.size(), v);
  if (res.ec != std::errc{} || res.ptr != text.data() + text.size())
    return cat("expected an integer, got ", tangram::detail::quoted(text));
  if (v < lo || v > hi) return cat("must be in ", range_text(lo, hi), ", got ", text);
  return "";
}

// Reads the comma-separated list `text` into `out` (cleared first), each item by `one(item, v)`
// (its problem, or ""): the first item's problem, naming the whole list; more than `max_count`
// items (`noun`); or "".
template <class T, class One>
std::string comma_list_problem(std::string_view text,
                               std::size_t max_count,
                               char const* noun,
                               std::vector<T>& out,
                               One&& one) {
  out.clear();
  auto const whole = text;
  while (true) {
    auto comma = text.find(',');
    T v{};
    if (auto why = one(text.substr(0, comma), v); !why.empty())
      return cat(why, " in ", tangram::detail::quoted(whole));
    out.push_back(v);
    if (out.size() > max_count) return cat("at most ", max_count, " ", noun);
    if (comma == std::string_view::npos) return "";
    text.remove_prefix(comma + 1);
  }
}

// One layer range "FIRST:LAST" into `v`, each bound in [0, hi]: its problem, or "".
std::string layer_range_problem(std::string_view item,
                                std::int64_t hi,
                                std::pair<std::int64_t, std::int64_t>& v) {
  auto colon = item.find(':');
  if (colon == std::string_view::npos)
    return cat("expected FIRST:LAST (model layers FIRST to LAST - 1), got ",
               tangram::detail::quoted(item));
  if (auto why = integer_problem(item.substr(0, colon), 0, hi, v.first); !why.empty()) return why;
  return integer_problem(item.substr(colon + 1), 0, hi, v.second);
}

// An option taking one value, checked by `problem` (described in --help as `check_help`) before
// `set` reads it. `set` gets the user's text as typed: CLI11 converts nothing itself.
CLI::Option* add_checked(CLI::App& app,
                         std::string const& name,
                         std::function<void(std::string const&)> set,
                         std::function<std::string(std::string const&)> problem,
                         std::string const& check_help,
                         std::string const& type,
                         std::string const& help) {
  auto* opt = app.add_option(
      name,
      [set = std::move(set)](CLI::results_t const& res) {
        set(res.front());
        return true;
      },
      help);
  opt->type_name(type);
  opt->check(CLI::Validator(
      [problem = std::move(problem)](std::string& text) { return problem(text); }, check_help));
  return opt;
}

// An option taking one value of type T, read and checked by `parse(text, v)` (its problem, or ""),
// as add_checked does: `set` gets the value read.
template <class T, class Set, class Parse>
CLI::Option* add_parsed(CLI::App& app,
                        std::string const& name,
                        Set set,
                        Parse parse,
                        std::string const& check_help,
                        std::string const& type,
                        std::string const& help) {
  return add_checked(
      app,
      name,
      [set = std::move(set), parse](std::string const& t) {
        T v{};
        parse(t, v);
        set(std::move(v));
      },
      [parse](std::string const& t) {
        T v{};
        return parse(t, v);
      },
      check_help,
      type,
      help);
}

// A comma-separated list into `target` (replaced when the option is given), each item read by
// `one(item, v)`, at most `max_count` items (`noun`), by add_parsed.
template <class T, class One>
CLI::Option* add_list(CLI::App& app,
                      std::string const& name,
                      std::vector<T>& target,
                      std::size_t max_count,
                      char const* noun,
                      One one,
                      std::string const& check_help,
                      std::string const& type,
                      std::string const& help) {
  return add_parsed<std::vector<T>>(
      app,
      name,
      [&target](std::vector<T> v) { target = std::move(v); },
      [max_count, noun, one](std::string const& t, std::vector<T>& out) {
        return comma_list_problem(t, max_count, noun, out, one);
      },
      check_help,
      type,
      help);
}

// A real in `r`, passed to `set`.
template <class Set>
CLI::Option* add_real(
    CLI::App& app, std::string const& name, Set set, number_range r, std::string const& help) {
  return add_parsed<double>(
      app,
      name,
      std::move(set),
      [r](std::string const& t, double& v) { return number_problem(t, r, v); },
      range_text(r),
      "FLOAT",
      help);
}

}  // namespace

CLI::Option* add_number(CLI::App& app,
                        std::string const& name,
                        double& target,
                        number_range r,
                        std::string const& help) {
  std::string shown = cat(target);
  return add_real(
             app, name, [&target](double v) { target = v; }, r, help)
      ->default_str(shown);
}

CLI::Option* add_number(CLI::App& app,
                        std::string const& name,
                        std::optional<double>& target,
                        number_range r,
                        std::string const& help) {
  return add_real(
      app, name, [&target](double v) { target = v; }, r, help);
}

CLI::Option* add_integer(CLI::App& app,
                         std::string const& name,
                         std::function<void(std::int64_t)> set,
                         std::int64_t shown_default,
                         std::int64_t lo,
                         std::int64_t hi,
                         std::string const& help) {
  return add_parsed<std::int64_t>(
             app,
             name,
             std::move(set),
             [lo, hi](std::string const& t, std::int64_t& v) {
               return integer_problem(t, lo, hi, v);
             },
             range_text(lo, hi),
             "INT",
             help)
      ->default_str(cat(shown_default));
}

CLI::Option* add_integer_list(CLI::App& app,
                              std::string const& name,
                              std::vector<std::int64_t>& target,
                              std::int64_t lo,
                              std::int64_t hi,
                              std::size_t max_count,
                              std::string const& help) {
  return add_list(
      app,
      name,
      target,
      max_count,
      "values",
      [lo, hi](std::string_view item, std::int64_t& v) { return integer_problem(item, lo, hi, v); },
      cat("each in ", range_text(lo, hi), ", at most ", max_count),
      "N,N,...",
      help);
}

CLI::Option* add_number_list(CLI::App& app,
                             std::string const& name,
                             std::vector<double>& target,
                             number_range r,
                             std::size_t max_count,
                             std::string const& help) {
  return add_list(
      app,
      name,
      target,
      max_count,
      "values",
      [r](std::string_view item, double& v) { return number_problem(item, r, v); },
      cat("each in ", range_text(r), ", at most ", max_count),
      "X,X,...",
      help);
}

CLI::Option* add_choice(CLI::App& app,
                        std::string const& name,
                        std::function<void(std::string const&)> set,
                        std::string const& shown_default,
                        std::vector<std::string> const& allowed,
                        std::string const& help) {
  // IsMember decides and describes the choices in --help; the refusal keeps the program's
  // wording, with the value quoted (it may be empty or hold spaces).
  CLI::Validator member = CLI::IsMember(allowed);
  std::string list;
  for (auto const& a : allowed) list += (list.empty() ? "" : ", ") + a;
  auto refuse = [member, list](std::string& text) {
    if (member(text).empty()) return std::string();
    return cat("expected one of ", list, ", got ", tangram::detail::quoted(text));
  };
  return app.add_option_function<std::string>(name, std::move(set), help)
      ->check(CLI::Validator(refuse, member.get_description()))
      ->type_name("WORD")
      ->default_str(shown_default);
}

CLI::Option* add_text(CLI::App& app,
                      std::string const& name,
                      std::optional<std::string>& target,
                      std::string const& label,
                      std::string const& help) {
  return app
      .add_option_function<std::string>(
          name, [&target](std::string const& t) { target = t; }, help)
      ->type_name(label);
}

CLI::Option* add_text(CLI::App& app,
                      std::string const& name,
                      std::string& target,
                      std::string const& label,
                      std::string const& help) {
  std::string shown = target;
  return app.add_option(name, target, help)->type_name(label)->default_str(shown);
}

std::string given_text(CLI::Option const* opt, std::string fallback) {
  return opt->count() > 0 ? opt->results().front() : std::move(fallback);
}

CLI::Option* add_layer_ranges(CLI::App& app,
                              std::string const& name,
                              std::vector<std::pair<std::int64_t, std::int64_t>>& target,
                              std::int64_t hi,
                              std::size_t max_count,
                              std::string const& help) {
  return add_list(
      app,
      name,
      target,
      max_count,
      "ranges",
      [hi](std::string_view item, std::pair<std::int64_t, std::int64_t>& v) {
        return layer_range_problem(item, hi, v);
      },
      cat("each bound in ", range_text(0, hi), ", at most ", max_count),
      "FIRST:LAST,...",
      help);
}

}  // namespace tangram::cli
