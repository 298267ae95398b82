// SPDX-License-Identifier: Apache-2.0
/**
 * @file io/detail/json/parse.hpp
 * @brief The strict JSON reader: text to `json::value`, with resource limits, and errors that
 * name the source, the line and the column. Internal to the I/O layer (`tangram/io/`).
 *
 * It accepts Python's `NaN`/`Infinity` extensions as numbers so that validation, not the syntax
 * check, reports them by field name.
 */
#pragma once

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "tangram/core/error.hpp"
#include "tangram/io/detail/json/value.hpp"

namespace tangram::detail::json {

/// Resource limits for parsing untrusted text.
struct parse_limits {
  std::size_t max_bytes    = std::size_t{64} << 20;  ///< input size
  int max_depth            = 64;                     ///< nesting of arrays/objects
  std::size_t max_elements = std::size_t{16} << 20;  ///< values in the whole document
};

/**
 * @brief The first of `n` names (in order) equal to an earlier one, or nullopt: the indices sorted
 * by (name, index), then adjacent equal names compared. O(n log n) comparisons of names, whatever
 * the names (an object's duplicate-member check: a scan of the earlier names per member was
 * quadratic, hours on a 64 MiB object). `less` orders the names; the tests count its calls.
 */
template <class NameOf, class Less = std::less<>>
std::optional<std::size_t> first_repeated_name(std::size_t n, NameOf name_of, Less less = {}) {
  if (n < 2) return std::nullopt;
  std::vector<std::size_t> order(n);
  for (std::size_t i = 0; i < n; ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    if (less(name_of(a), name_of(b))) return true;
    if (less(name_of(b), name_of(a))) return false;
    return a < b;
  });
  std::optional<std::size_t> first;
  for (std::size_t k = 1; k < n; ++k) {
    std::size_t a = order[k - 1], b = order[k];
    if (!less(name_of(a), name_of(b)) && (!first || b < *first)) first = b;
  }
  return first;
}

namespace detail_parser {

class parser {
 public:
  parser(std::string_view text, std::string_view source, parse_limits limits)
      : text_(text), source_(source), limits_(limits) {}

  value run() {
    if (text_.size() > limits_.max_bytes)
      TANGRAM_FAIL(parse_error,
                   detail::printable(source_),
                   ": input is ",
                   text_.size(),
                   " bytes, larger than the limit of ",
                   limits_.max_bytes,
                   " bytes");
    skip_ws();
    value v = parse_value(0);
    skip_ws();
    if (pos_ != text_.size()) fail("unexpected text after the JSON value");
    return v;
  }

 private:
  [[noreturn]] void fail_at(std::size_t at, std::string const& what) const {
    std::size_t line = 1, col = 1;
    for (std::size_t i = 0; i < at && i < text_.size(); ++i) {
      if (text_[i] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    TANGRAM_FAIL(
        parse_error, detail::printable(source_), ":", line, ":", col, ": invalid JSON: ", what);
  }
  [[noreturn]] void fail(std::string const& what) const { fail_at(pos_, what); }

  void skip_ws() {
    while (pos_ < text_.size()) {
      char c = text_[pos_];
      if (c == ' ' || c == '\t' || c == '\n' || c == '\r')
        ++pos_;
      else
        break;
    }
  }

  bool consume_literal(std::string_view lit) {
    if (text_.substr(pos_, lit.size()) == lit) {
      pos_ += lit.size();
      return true;
    }
    return false;
  }

  void count_element() {
    if (++elements_ > limits_.max_elements)
      fail(detail::cat("more than ", limits_.max_elements, " values"));
  }

  value parse_value(int depth) {
    if (pos_ >= text_.size()) fail("unexpected end of input, expected a value");
    count_element();
    char c = text_[pos_];
    switch (c) {
      case '{':
        return parse_object(depth + 1);
      case '[':
        return parse_array(depth + 1);
      case '"':
        return value(parse_string());
      case 't':
        if (consume_literal("true")) return value(true);
        break;
      case 'f':
        if (consume_literal("false")) return value(false);
        break;
      case 'n':
        if (consume_literal("null")) return value(nullptr);
        break;
      case 'N':
        if (consume_literal("NaN")) return value(std::nan(""));
        break;
      case 'I':
        if (consume_literal("Infinity")) return value(HUGE_VAL);
        break;
      default:
        if (c == '-' || (c >= '0' && c <= '9')) return parse_number();
    }
    fail(detail::cat("unexpected character ", detail::quoted(text_.substr(pos_, 1))));
  }

  value parse_number() {
    std::size_t start = pos_;
    if (text_[pos_] == '-') {
      ++pos_;
      if (consume_literal("Infinity")) return value(-HUGE_VAL);
    }
    auto digits = [&] {
      std::size_t d = pos_;
      while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') ++pos_;
      return pos_ - d;
    };
    std::size_t int_start = pos_;
    if (digits() == 0) fail("a number needs digits");
    if (text_[int_start] == '0' && pos_ - int_start > 1)
      fail_at(int_start, "leading zeros are not allowed");
    bool integral = true;
    if (pos_ < text_.size() && text_[pos_] == '.') {
      ++pos_;
      integral = false;
      if (digits() == 0) fail("digits expected after the decimal point");
    }
    if (pos_ < text_.size() && (text_[pos_] == 'e' || text_[pos_] == 'E')) {
      ++pos_;
      integral = false;
      if (pos_ < text_.size() && (text_[pos_] == '+' || text_[pos_] == '-')) ++pos_;
      if (digits() == 0) fail("digits expected in the exponent");
    }
    std::string_view lit = text_.substr(start, pos_ - start);
    if (integral) {
      std::int64_t i = 0;
      auto res       = std::from_chars(lit.data(), lit.data() + lit.size(), i);
      if (res.ec == std::errc{} && res.ptr == lit.data() + lit.size()) return value(i);
    }
    double d = 0;
    auto res = std::from_chars(lit.data(), lit.data() + lit.size(), d);
    if (res.ec == std::errc::result_out_of_range) {
      // Overflow reads as infinity and underflow as zero; validation reports infinities by field.
      bool neg = lit.front() == '-';
      d        = decimal_exponent(lit) > 0 ? (neg ? -HUGE_VAL : HUGE_VAL) : (neg ? -0.0 : 0.0);
    } else if (res.ec != std::errc{}) {
      fail_at(start, detail::cat("bad number ", detail::quoted(lit)));
    }
    return value(d);
  }

  /// The power of ten of a number literal's first significant digit (saturated): positive when a
  /// literal out of double's range overflows, not when it underflows. The exponent's sign alone
  /// does not say which ("1000...0e-10" overflows).
  static std::int64_t decimal_exponent(std::string_view lit) {
    auto digit    = [&](std::size_t k) { return k < lit.size() && lit[k] >= '0' && lit[k] <= '9'; };
    std::size_t i = lit.front() == '-' ? 1 : 0;
    std::int64_t int_digits = 0;  // integer digits from the first non-zero one
    std::int64_t frac_zeros = 0;  // zeros after the point before the first non-zero digit
    bool nonzero            = false;
    for (; digit(i); ++i)
      if (nonzero || lit[i] != '0') {
        nonzero = true;
        ++int_digits;
      }
    if (i < lit.size() && lit[i] == '.')
      for (++i; digit(i); ++i)
        if (!nonzero) {
          if (lit[i] == '0')
            ++frac_zeros;
          else
            nonzero = true;
        }
    if (!nonzero) return 0;  // zero neither overflows nor underflows
    std::int64_t exp = 0;
    if (i < lit.size()) {  // 'e' or 'E'
      bool neg = lit[++i] == '-';
      if (lit[i] == '+' || lit[i] == '-') ++i;
      for (; digit(i); ++i)
        exp = std::min<std::int64_t>(exp * 10 + (lit[i] - '0'), std::int64_t{1} << 40);
      if (neg) exp = -exp;
    }
    return (int_digits > 0 ? int_digits - 1 : -(frac_zeros + 1)) + exp;
  }

  static void append_utf8(std::string& out, std::uint32_t cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xc0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3f));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xe0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
      out += static_cast<char>(0x80 | (cp & 0x3f));
    } else {
      out += static_cast<char>(0xf0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
      out += static_cast<char>(0x80 | (cp & 0x3f));
    }
  }

  std::uint32_t parse_hex4() {
    if (pos_ + 4 > text_.size()) fail("truncated \\u escape");
    std::uint32_t cp = 0;
    for (int i = 0; i < 4; ++i) {
      char c = text_[pos_++];
      cp <<= 4;
      if (c >= '0' && c <= '9')
        cp |= static_cast<std::uint32_t>(c - '0');
      else if (c >= 'a' && c <= 'f')
        cp |= static_cast<std::uint32_t>(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F')
        cp |= static_cast<std::uint32_t>(c - 'A' + 10);
      else
        fail("bad hex digit in \\u escape");
    }
    return cp;
  }

  std::string parse_string() {
    ++pos_;  // opening quote
    std::string out;
    while (true) {
      if (pos_ >= text_.size()) fail("unterminated string");
      char c = text_[pos_++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) fail_at(pos_ - 1, "control character in string");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (pos_ >= text_.size()) fail("unterminated escape");
      char e = text_[pos_++];
      switch (e) {
        case '"':
          out += '"';
          break;
        case '\\':
          out += '\\';
          break;
        case '/':
          out += '/';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'u': {
          std::uint32_t cp = parse_hex4();
          if (cp >= 0xd800 && cp < 0xdc00) {
            if (!consume_literal("\\u")) fail("unpaired surrogate in \\u escape");
            std::uint32_t lo = parse_hex4();
            if (lo < 0xdc00 || lo >= 0xe000) fail("unpaired surrogate in \\u escape");
            cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
          } else if (cp >= 0xdc00 && cp < 0xe000) {
            fail("unpaired surrogate in \\u escape");
          }
          append_utf8(out, cp);
          break;
        }
        default:
          fail_at(pos_ - 1, detail::cat("unknown escape \\", e));
      }
    }
  }

  void check_depth(int depth) {
    if (depth > limits_.max_depth)
      fail(detail::cat("nesting deeper than ", limits_.max_depth, " levels"));
  }

  value parse_array(int depth) {
    check_depth(depth);
    ++pos_;
    value v = value::array();
    skip_ws();
    if (pos_ < text_.size() && text_[pos_] == ']') {
      ++pos_;
      return v;
    }
    while (true) {
      skip_ws();
      v.push_back(parse_value(depth));
      skip_ws();
      if (pos_ >= text_.size()) fail("unterminated array");
      char c = text_[pos_++];
      if (c == ']') return v;
      if (c != ',') fail_at(pos_ - 1, "expected ',' or ']' in array");
    }
  }

  value parse_object(int depth) {
    check_depth(depth);
    ++pos_;
    value v = value::object();
    std::vector<std::size_t> key_at;  // where each member's name starts (a duplicate's error)
    skip_ws();
    if (pos_ < text_.size() && text_[pos_] == '}') {
      ++pos_;
      return v;
    }
    while (true) {
      skip_ws();
      if (pos_ >= text_.size() || text_[pos_] != '"') fail("expected a quoted member name");
      key_at.push_back(pos_);
      std::string key = parse_string();
      skip_ws();
      if (pos_ >= text_.size() || text_[pos_] != ':') fail("expected ':' after member name");
      ++pos_;
      skip_ws();
      v.members().emplace_back(std::move(key), parse_value(depth));
      skip_ws();
      if (pos_ >= text_.size()) fail("unterminated object");
      char c = text_[pos_++];
      if (c == '}') {
        auto const& m = v.members();
        if (auto i = first_repeated_name(
                m.size(), [&](std::size_t k) -> std::string const& { return m[k].first; }))
          fail_at(key_at[*i], detail::cat("duplicate member ", detail::quoted(m[*i].first)));
        return v;
      }
      if (c != ',') fail_at(pos_ - 1, "expected ',' or '}' in object");
    }
  }

  std::string_view text_;
  std::string_view source_;
  parse_limits limits_;
  std::size_t pos_      = 0;
  std::size_t elements_ = 0;
};

}  // namespace detail_parser

/**
 * @brief Parses one JSON document.
 * @param text   the document
 * @param source a name for error messages (usually the file path)
 * @throw parse_error "source:line:col: invalid JSON: ..." on malformed input or exceeded limits.
 */
inline value parse(std::string_view text, std::string_view source, parse_limits limits = {}) {
  return detail_parser::parser(text, source, limits).run();
}

}  // namespace tangram::detail::json
