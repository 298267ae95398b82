// SPDX-License-Identifier: Apache-2.0
/**
 * @file core/detail/str.hpp
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

/// Length of the well-formed UTF-8 sequence starting at `s[i]` (1 to 4) with its code point in
/// `cp`, or 0 when the bytes there are not one (overlong forms, surrogates, > U+10FFFF, cut short).
inline std::size_t utf8_sequence(std::string_view s, std::size_t i, std::uint32_t& cp) {
  auto at = [&](std::size_t k) -> std::uint32_t { return static_cast<unsigned char>(s[k]); };
  std::uint32_t c = at(i);
  std::size_t len = c < 0x80                 ? 1
                    : c >= 0xc2 && c <= 0xdf ? 2
                    : c >= 0xe0 && c <= 0xef ? 3
                    : c >= 0xf0 && c <= 0xf4 ? 4
                                             : 0;
  if (len == 0 || i + len > s.size()) return 0;
  cp = len == 1 ? c : len == 2 ? c & 0x1f : len == 3 ? c & 0x0f : c & 0x07;
  for (std::size_t k = 1; k < len; ++k) {
    if ((at(i + k) & 0xc0) != 0x80) return 0;
    cp = (cp << 6) | (at(i + k) & 0x3f);
  }
  static constexpr std::uint32_t min_of[] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < min_of[len] || (cp >= 0xd800 && cp < 0xe000) || cp > 0x10ffff) return 0;
  return len;
}

/// True for code points a terminal may act on: C0 controls, DEL and C1 controls.
inline bool is_control(std::uint32_t cp) {
  return cp < 0x20 || (cp >= 0x7f && cp < 0xa0);
}

/// Appends `text` with every byte a terminal could act on written as `\xNN` (C0 and C1 controls,
/// DEL, bytes that are not valid UTF-8), backslashes doubled when `backslash` and double quotes
/// escaped when `quote`; other valid UTF-8 text passes unchanged. Stops after `max_chars`
/// characters with "...".
inline void append_escaped(std::string& out,
                           std::string_view text,
                           std::size_t max_chars,
                           bool quote,
                           bool backslash = true) {
  static constexpr char hex[] = "0123456789abcdef";
  auto byte                   = [&](unsigned char u) {
    out += "\\x";
    out += hex[u >> 4];
    out += hex[u & 15];
  };
  std::size_t n = 0;
  for (std::size_t i = 0; i < text.size();) {
    if (n++ == max_chars) {
      out += "...";
      break;
    }
    std::uint32_t cp = 0;
    std::size_t len  = utf8_sequence(text, i, cp);
    if (len == 0) {
      byte(static_cast<unsigned char>(text[i++]));
    } else if (is_control(cp)) {
      for (std::size_t k = 0; k < len; ++k) byte(static_cast<unsigned char>(text[i + k]));
      i += len;
    } else {
      if ((backslash && text[i] == '\\') || (quote && text[i] == '"')) out += '\\';
      out.append(text.substr(i, len));
      i += len;
    }
  }
}

/// Quotes a string for a message, escaping what a terminal could act on (see `append_escaped`)
/// and cutting very long text.
inline std::string quoted(std::string_view text, std::size_t max_chars = 80) {
  std::string out = "\"";
  append_escaped(out, text, max_chars, true);
  out += '"';
  return out;
}

/// A name or path for printing without quotes (tables, "wrote PATH"): escaped like `quoted`, so
/// a name from a file or the command line never sends control sequences to the terminal.
inline std::string printable(std::string_view text, std::size_t max_chars = 4096) {
  std::string out;
  append_escaped(out, text, max_chars, false);
  return out;
}

/// A whole message for the terminal (its quoted parts already escaped): only control characters
/// and invalid bytes are escaped, so the message stays one line and drives no terminal.
inline std::string escape_controls(std::string_view text) {
  std::string out;
  append_escaped(out, text, std::string_view::npos, false, false);
  return out;
}

}  // namespace tangram::detail
