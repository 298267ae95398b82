// SPDX-License-Identifier: Apache-2.0
/**
 * @file io/detail/json/dump.hpp
 * @brief The JSON writer: `json::value` to text. It only writes JSON: non-finite numbers as
 * `null`, strings as valid UTF-8 with control characters escaped. Internal to the I/O layer.
 */
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "tangram/core/detail/str.hpp"
#include "tangram/io/detail/json/value.hpp"

namespace tangram::detail::json {

namespace detail_writer {

/// Writes a JSON string. Valid UTF-8 passes unchanged; each byte that is not part of a valid
/// UTF-8 sequence becomes U+FFFD, so the output is always valid UTF-8 (RFC 8259). Control
/// characters (C0, DEL, C1) are escaped, so printed JSON never drives a terminal.
inline void write_string(std::string& out, std::string_view s) {
  static constexpr char hex[] = "0123456789abcdef";
  out += '"';
  for (std::size_t i = 0; i < s.size();) {
    std::uint32_t cp = 0;
    std::size_t len  = detail::utf8_sequence(s, i, cp);
    if (len == 0) {
      out += "\xef\xbf\xbd";  // U+FFFD REPLACEMENT CHARACTER
      ++i;
      continue;
    }
    switch (cp) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (detail::is_control(cp)) {
          out += "\\u00";
          out += hex[cp >> 4];
          out += hex[cp & 15];
        } else {
          out.append(s.substr(i, len));
        }
    }
    i += len;
  }
  out += '"';
}

inline bool is_flat(value const& v) {
  for (auto const& e : v.elements())
    if (e.type() == kind::array || e.type() == kind::object) return false;
  return true;
}

inline void write(std::string& out, value const& v, int indent, int level) {
  auto newline = [&](int lvl) {
    if (indent < 0) return;
    out += '\n';
    out.append(static_cast<std::size_t>(indent * lvl), ' ');
  };
  switch (v.type()) {
    case kind::null:
      out += "null";
      break;
    case kind::boolean:
      out += v.boolean() ? "true" : "false";
      break;
    case kind::number:
      if (v.is_integer()) {
        append_one(out, v.integer());
      } else if (!std::isfinite(v.number())) {
        out += "null";  // JSON has no NaN or infinity; readers of a field decide what null means
      } else {
        // Keep a non-integer number non-integer when read back ("3.0", "-0.0"), so a
        // document survives dump -> parse -> dump unchanged.
        std::size_t start = out.size();
        append_number(out, v.number());
        if (out.find_first_of(".e", start) == std::string::npos) out += ".0";
      }
      break;
    case kind::string:
      write_string(out, v.string());
      break;
    case kind::array: {
      out += '[';
      // Arrays of scalars stay on one line: budget tables remain readable.
      bool flat  = is_flat(v);
      bool first = true;
      for (auto const& e : v.elements()) {
        if (!first) out += flat && indent >= 0 ? ", " : ",";
        first = false;
        if (!flat) newline(level + 1);
        write(out, e, indent, level + 1);
      }
      if (!flat && !v.elements().empty()) newline(level);
      out += ']';
      break;
    }
    case kind::object: {
      out += '{';
      bool first = true;
      for (auto const& m : v.members()) {
        if (!first) out += ',';
        first = false;
        newline(level + 1);
        write_string(out, m.first);
        out += indent >= 0 ? ": " : ":";
        write(out, m.second, indent, level + 1);
      }
      if (!v.members().empty()) newline(level);
      out += '}';
      break;
    }
  }
}

}  // namespace detail_writer

/// @brief Serialises a value; `indent < 0` gives one compact line, otherwise pretty printing with
/// arrays of scalars kept on one line. Numbers round-trip exactly.
inline std::string dump(value const& v, int indent = 2) {
  std::string out;
  detail_writer::write(out, v, indent, 0);
  if (indent >= 0) out += '\n';
  return out;
}

}  // namespace tangram::detail::json
