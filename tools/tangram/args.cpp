// SPDX-License-Identifier: Apache-2.0
#include "args.hpp"

#include <charconv>
#include <cmath>

namespace tangram::cli {

using detail::cat;

double parse_number(std::string_view text, std::string_view what, double lo, double hi) {
  double v = 0;
  auto res = std::from_chars(text.data(), text.data() + text.size(), v);
  if (res.ec != std::errc{} || res.ptr != text.data() + text.size() || !std::isfinite(v))
    throw usage_error(cat(what, ": expected a number, got ", tangram::detail::quoted(text)));
  if (v < lo || v > hi)
    throw usage_error(cat(what, ": must be in [", lo, ", ", hi, "], got ", text));
  return v;
}

std::int64_t parse_integer(std::string_view text,
                           std::string_view what,
                           std::int64_t lo,
                           std::int64_t hi) {
  std::int64_t v = 0;
  auto res       = std::from_chars(text.data(), text.data() + text.size(), v);
  if (res.ec != std::errc{} || res.ptr != text.data() + text.size())
    throw usage_error(cat(what, ": expected an integer, got ", tangram::detail::quoted(text)));
  if (v < lo || v > hi)
    throw usage_error(cat(what, ": must be in [", lo, ", ", hi, "], got ", text));
  return v;
}

std::optional<std::string> args::value(std::string_view name) {
  std::optional<std::string> found;
  for (std::size_t i = 0; i < tokens_.size(); ++i) {
    if (used_[i]) continue;
    std::string_view t = tokens_[i];
    std::optional<std::string> v;
    if (t == name) {
      if (i + 1 >= tokens_.size()) throw usage_error(cat(name, ": missing value"));
      used_[i] = used_[i + 1] = true;
      v                       = tokens_[i + 1];
      ++i;
    } else if (t.size() > name.size() && t.substr(0, name.size()) == name &&
               t[name.size()] == '=') {
      used_[i] = true;
      v        = std::string(t.substr(name.size() + 1));
    }
    if (v) {
      if (found) throw usage_error(cat(name, ": given more than once"));
      found = std::move(v);
    }
  }
  return found;
}

bool args::flag(std::string_view name) {
  bool found = false;
  for (std::size_t i = 0; i < tokens_.size(); ++i) {
    if (used_[i]) continue;
    std::string_view t = tokens_[i];
    if (t == name) {
      used_[i] = true;
      found    = true;
    } else if (t.size() > name.size() && t.substr(0, name.size()) == name &&
               t[name.size()] == '=') {
      throw usage_error(cat(name, ": takes no value, got ", tangram::detail::quoted(t)));
    }
  }
  return found;
}

double args::number(std::string_view name, double fallback, double lo, double hi) {
  auto v = value(name);
  return v ? parse_number(*v, name, lo, hi) : fallback;
}

std::int64_t args::integer(std::string_view name,
                           std::int64_t fallback,
                           std::int64_t lo,
                           std::int64_t hi) {
  auto v = value(name);
  return v ? parse_integer(*v, name, lo, hi) : fallback;
}

std::vector<std::int64_t> args::integers(std::string_view name,
                                         std::int64_t lo,
                                         std::int64_t hi,
                                         std::size_t max_count) {
  std::vector<std::int64_t> out;
  auto v = value(name);
  if (!v) return out;
  std::string_view rest = *v;
  while (true) {
    auto comma = rest.find(',');
    out.push_back(parse_integer(rest.substr(0, comma), name, lo, hi));
    if (out.size() > max_count) throw usage_error(cat(name, ": at most ", max_count, " values"));
    if (comma == std::string_view::npos) return out;
    rest.remove_prefix(comma + 1);
  }
}

std::string args::choice(std::string_view name,
                         std::string fallback,
                         std::vector<std::string_view> allowed) {
  auto v = value(name);
  if (!v) return fallback;
  std::string list;
  for (auto a : allowed) {
    if (*v == a) return *v;
    list += (list.empty() ? "" : ", ") + std::string(a);
  }
  throw usage_error(cat(name, ": expected one of ", list, ", got ", tangram::detail::quoted(*v)));
}

std::vector<std::string> args::positionals() {
  std::vector<std::string> out;
  for (std::size_t i = 0; i < tokens_.size(); ++i)
    if (!used_[i] &&
        (tokens_[i].size() < 2 || tokens_[i].compare(0, 2, "--") != 0 || tokens_[i] == "--"))
      out.push_back(tokens_[i]);
  return out;
}

void args::finish(std::size_t max_positionals) {
  std::size_t positional = 0;
  for (std::size_t i = 0; i < tokens_.size(); ++i) {
    if (used_[i]) continue;
    std::string_view t = tokens_[i];
    if (t.size() >= 2 && t.substr(0, 2) == "--")
      throw usage_error(cat("unknown option ", tangram::detail::quoted(t)));
    if (++positional > max_positionals)
      throw usage_error(cat("unexpected argument ", tangram::detail::quoted(t)));
  }
}

}  // namespace tangram::cli
