// SPDX-License-Identifier: Apache-2.0
/**
 * @file detail/str.hpp
 * @brief Small string building helpers for error messages and text output (host only).
 */
#pragma once

#include <charconv>
#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>

namespace tangram::detail {

/// Appends the shortest decimal text that reads back as the same double ("nan", "inf" spelled out).
inline void append_number(std::string& out, double value) {
  if (std::isnan(value)) {
    out += "nan";
    return;
  }
  if (std::isinf(value)) {
    out += value < 0 ? "-inf" : "inf";
    return;
  }
  char buf[32];
  auto res = std::to_chars(buf, buf + sizeof(buf), value);
  out.append(buf, res.ptr);
}

template <class T>
void append_one(std::string& out, T const& value) {
  using U = std::decay_t<T>;
  if constexpr (std::is_same_v<U, bool>) {
    out += value ? "true" : "false";
  } else if constexpr (std::is_same_v<U, char>) {
    out += value;
  } else if constexpr (std::is_integral_v<U>) {
    char buf[24];
    auto res = std::to_chars(buf, buf + sizeof(buf), value);
    out.append(buf, res.ptr);
  } else if constexpr (std::is_floating_point_v<U>) {
    append_number(out, static_cast<double>(value));
  } else if constexpr (std::is_enum_v<U>) {
    append_one(out, static_cast<std::underlying_type_t<U>>(value));
  } else {
    out += std::string_view(value);
  }
}

/// Concatenates strings and numbers into one string: `cat("layer ", 3, " of ", 32)`.
template <class... Args>
std::string cat(Args const&... args) {
  std::string out;
  (append_one(out, args), ...);
  return out;
}

/// Quotes a string for an error message, escaping control characters and cutting very long text.
inline std::string quoted(std::string_view text, std::size_t max_chars = 80) {
  std::string out = "\"";
  std::size_t n = 0;
  for (char c : text) {
    if (n++ == max_chars) {
      out += "...";
      break;
    }
    auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (u < 0x20 || u == 0x7f) {
      static constexpr char hex[] = "0123456789abcdef";
      out += "\\x";
      out += hex[u >> 4];
      out += hex[u & 15];
    } else {
      out += c;
    }
  }
  out += '"';
  return out;
}

}  // namespace tangram::detail
