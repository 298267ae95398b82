// SPDX-License-Identifier: Apache-2.0
/**
 * @file detail/json.hpp
 * @brief A small, strict JSON reader and writer used by every file format of the library.
 *
 * Why our own: the library has no third-party dependency, and every error must name the source,
 * the line and column (syntax) or the field path (validation) together with the offending value.
 * The reader enforces limits (input size, nesting depth, element count) so hostile input cannot
 * exhaust memory or the stack. It accepts Python's `NaN`/`Infinity` extensions as numbers so that
 * validation, not the syntax check, reports them by field name. The writer only writes JSON:
 * non-finite numbers as `null`, strings as valid UTF-8 with control characters escaped.
 */
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <type_traits>
#include <charconv>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tangram/error.hpp"

namespace tangram::detail::json {

/// Kinds of JSON values.
enum class kind : std::uint8_t { null, boolean, number, string, array, object };

inline std::string_view kind_name(kind k) {
  switch (k) {
    case kind::null: return "null";
    case kind::boolean: return "a boolean";
    case kind::number: return "a number";
    case kind::string: return "a string";
    case kind::array: return "an array";
    case kind::object: return "an object";
  }
  return "?";
}

/// A JSON document node. Objects keep their members in input order.
class value {
 public:
  using array_type  = std::vector<value>;
  using member      = std::pair<std::string, value>;
  using object_type = std::vector<member>;

  value() = default;
  value(std::nullptr_t) {}
  value(bool b) : kind_(kind::boolean), bool_(b) {}
  value(double d) : kind_(kind::number), number_(d) {}
  template <class I,
            std::enable_if_t<std::is_integral_v<I> && !std::is_same_v<I, bool>, int> = 0>
  value(I i)
      : kind_(kind::number),
        number_(static_cast<double>(i)),
        is_integer_(true),
        integer_(static_cast<std::int64_t>(i)) {}
  value(std::string s) : kind_(kind::string), string_(std::move(s)) {}
  value(std::string_view s) : value(std::string(s)) {}
  value(const char* s) : value(std::string(s)) {}
  value(array_type a) : kind_(kind::array), array_(std::move(a)) {}
  value(object_type o) : kind_(kind::object), object_(std::move(o)) {}

  static value array() { return value(array_type{}); }
  static value object() { return value(object_type{}); }

  [[nodiscard]] kind type() const noexcept { return kind_; }
  [[nodiscard]] bool is_null() const noexcept { return kind_ == kind::null; }
  [[nodiscard]] bool boolean() const noexcept { return bool_; }
  [[nodiscard]] double number() const noexcept { return number_; }
  /// True when the literal was written without fraction or exponent and fits in int64.
  [[nodiscard]] bool is_integer() const noexcept { return is_integer_; }
  [[nodiscard]] std::int64_t integer() const noexcept { return integer_; }
  [[nodiscard]] std::string const& string() const noexcept { return string_; }
  [[nodiscard]] array_type const& elements() const noexcept { return array_; }
  [[nodiscard]] object_type const& members() const noexcept { return object_; }
  array_type& elements() noexcept { return array_; }
  object_type& members() noexcept { return object_; }

  /// Appends to an array value.
  value& push_back(value v) {
    array_.push_back(std::move(v));
    return array_.back();
  }
  /// Sets (or replaces) an object member, keeping insertion order.
  value& set(std::string key, value v) {
    for (auto& m : object_)
      if (m.first == key) return m.second = std::move(v);
    object_.emplace_back(std::move(key), std::move(v));
    return object_.back().second;
  }
  /// Looks up an object member; nullptr when absent.
  [[nodiscard]] value const* find(std::string_view key) const noexcept {
    for (auto const& m : object_)
      if (m.first == key) return &m.second;
    return nullptr;
  }

 private:
  kind kind_          = kind::null;
  bool bool_          = false;
  double number_      = 0;
  bool is_integer_    = false;
  std::int64_t integer_ = 0;
  std::string string_;
  array_type array_;
  object_type object_;
};

/// Resource limits for parsing untrusted text.
struct parse_limits {
  std::size_t max_bytes    = std::size_t{64} << 20;  ///< input size
  int max_depth            = 64;                     ///< nesting of arrays/objects
  std::size_t max_elements = std::size_t{16} << 20;  ///< values in the whole document
};

namespace detail_parser {

class parser {
 public:
  parser(std::string_view text, std::string_view source, parse_limits limits)
      : text_(text), source_(source), limits_(limits) {}

  value run() {
    if (text_.size() > limits_.max_bytes)
      TANGRAM_FAIL(parse_error, detail::printable(source_), ": input is ", text_.size(),
                   " bytes, larger than the limit of ", limits_.max_bytes, " bytes");
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
    TANGRAM_FAIL(parse_error, detail::printable(source_), ":", line, ":", col, ": invalid JSON: ", what);
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
      case '{': return parse_object(depth + 1);
      case '[': return parse_array(depth + 1);
      case '"': return value(parse_string());
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
    if (text_[int_start] == '0' && pos_ - int_start > 1) fail_at(int_start, "leading zeros are not allowed");
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
    auto digit = [&](std::size_t k) { return k < lit.size() && lit[k] >= '0' && lit[k] <= '9'; };
    std::size_t i            = lit.front() == '-' ? 1 : 0;
    std::int64_t int_digits  = 0;  // integer digits from the first non-zero one
    std::int64_t frac_zeros  = 0;  // zeros after the point before the first non-zero digit
    bool nonzero             = false;
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
      for (; digit(i); ++i) exp = std::min<std::int64_t>(exp * 10 + (lit[i] - '0'), std::int64_t{1} << 40);
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
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
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
        default: fail_at(pos_ - 1, detail::cat("unknown escape \\", e));
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
    skip_ws();
    if (pos_ < text_.size() && text_[pos_] == '}') {
      ++pos_;
      return v;
    }
    while (true) {
      skip_ws();
      if (pos_ >= text_.size() || text_[pos_] != '"') fail("expected a quoted member name");
      std::size_t key_at = pos_;
      std::string key    = parse_string();
      if (v.find(key) != nullptr) fail_at(key_at, detail::cat("duplicate member ", detail::quoted(key)));
      skip_ws();
      if (pos_ >= text_.size() || text_[pos_] != ':') fail("expected ':' after member name");
      ++pos_;
      skip_ws();
      v.members().emplace_back(std::move(key), parse_value(depth));
      skip_ws();
      if (pos_ >= text_.size()) fail("unterminated object");
      char c = text_[pos_++];
      if (c == '}') return v;
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
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
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
    case kind::null: out += "null"; break;
    case kind::boolean: out += v.boolean() ? "true" : "false"; break;
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
    case kind::string: write_string(out, v.string()); break;
    case kind::array: {
      out += '[';
      // Arrays of scalars stay on one line: budget tables remain readable.
      bool flat = is_flat(v);
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

/**
 * @brief A read-only cursor over a parsed document that remembers its field path, so every
 * validation error can say exactly which field is wrong and what value it holds.
 */
class node {
 public:
  node(value const& v, std::string_view source) : value_(&v), source_(source) {}

  [[nodiscard]] value const& raw() const noexcept { return *value_; }
  [[nodiscard]] std::string const& path() const noexcept { return path_; }
  [[nodiscard]] std::string_view source() const noexcept { return source_; }
  [[nodiscard]] kind type() const noexcept { return value_->type(); }

  /// Throws a parse_error "source: path: what".
  [[noreturn]] void fail(std::string const& what) const {
    TANGRAM_FAIL(parse_error, detail::printable(source_), ": ",
                 path_.empty() ? std::string("document") : detail::printable(path_), ": ", what);
  }

  /// Short text of this value for messages (`"abc"`, `-4`, `an array of 3`).
  [[nodiscard]] std::string describe() const {
    switch (type()) {
      case kind::null: return "null";
      case kind::boolean: return value_->boolean() ? "true" : "false";
      case kind::number: {
        std::string s;
        if (value_->is_integer())
          append_one(s, value_->integer());
        else
          append_number(s, value_->number());
        return s;
      }
      case kind::string: return detail::quoted(value_->string());
      case kind::array: return cat("an array of ", value_->elements().size());
      case kind::object: return "an object";
    }
    return "?";
  }

  void expect(kind k) const {
    if (type() != k) fail(cat("expected ", kind_name(k), ", got ", describe()));
  }

  /// Required member of an object.
  [[nodiscard]] node operator[](std::string_view key) const {
    expect(kind::object);
    value const* m = value_->find(key);
    if (m == nullptr) {
      node missing = child(*value_, key);
      TANGRAM_FAIL(parse_error, detail::printable(source_), ": ", detail::printable(missing.path_),
                   ": missing required field");
    }
    return child(*m, key);
  }
  /// Optional member of an object (absent or null both read as "not given").
  [[nodiscard]] std::optional<node> find(std::string_view key) const {
    expect(kind::object);
    value const* m = value_->find(key);
    if (m == nullptr || m->is_null()) return std::nullopt;
    return child(*m, key);
  }
  /// Element of an array.
  [[nodiscard]] node operator[](std::size_t i) const {
    expect(kind::array);
    node n(value_->elements().at(i), source_);
    n.path_ = cat(path_, "[", i, "]");
    return n;
  }
  /// Number of elements of an array.
  [[nodiscard]] std::size_t size() const {
    expect(kind::array);
    return value_->elements().size();
  }
  /// Array with exactly `n` elements.
  [[nodiscard]] std::size_t expect_size(std::size_t n, std::string_view why) const {
    std::size_t s = size();
    if (s != n) fail(cat("expected ", n, " elements (", why, "), got ", s));
    return s;
  }
  /// Array with between `lo` and `hi` elements.
  [[nodiscard]] std::size_t expect_size_in(std::size_t lo, std::size_t hi) const {
    std::size_t s = size();
    if (s < lo || s > hi) fail(cat("expected ", lo, " to ", hi, " elements, got ", s));
    return s;
  }

  [[nodiscard]] std::string as_string(std::size_t max_len = 4096) const {
    expect(kind::string);
    if (value_->string().size() > max_len)
      fail(cat("string longer than ", max_len, " characters"));
    return value_->string();
  }
  [[nodiscard]] bool as_bool() const {
    expect(kind::boolean);
    return value_->boolean();
  }
  /// An integer in [lo, hi]; fractions, NaN and out-of-range values are errors naming the value.
  [[nodiscard]] std::int64_t as_int(std::int64_t lo, std::int64_t hi) const {
    if (type() != kind::number) fail(cat("expected an integer, got ", describe()));
    if (!value_->is_integer()) {
      double d = value_->number();
      if (!(std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.0e15))
        fail(cat("expected an integer, got ", describe()));
      return check_range(static_cast<std::int64_t>(d), lo, hi);
    }
    return check_range(value_->integer(), lo, hi);
  }
  /// A finite number in [lo, hi]; NaN and infinities are errors naming the value.
  [[nodiscard]] double as_double(double lo, double hi) const {
    if (type() != kind::number) fail(cat("expected a number, got ", describe()));
    double d = value_->number();
    if (std::isnan(d)) fail("expected a number, got NaN");
    if (!std::isfinite(d)) fail(cat("expected a finite number, got ", describe()));
    if (d < lo || d > hi) fail(cat("must be in [", lo, ", ", hi, "], got ", describe()));
    return d;
  }

 private:
  node child(value const& v, std::string_view key) const {
    node n(v, source_);
    n.path_ = path_.empty() ? std::string(key) : cat(path_, ".", key);
    return n;
  }
  std::int64_t check_range(std::int64_t i, std::int64_t lo, std::int64_t hi) const {
    if (i < lo || i > hi) fail(cat("must be in [", lo, ", ", hi, "], got ", i));
    return i;
  }

  value const* value_;
  std::string_view source_;
  std::string path_;
};

}  // namespace tangram::detail::json
