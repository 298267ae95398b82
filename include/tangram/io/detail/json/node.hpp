// SPDX-License-Identifier: Apache-2.0
/**
 * @file io/detail/json/node.hpp
 * @brief `json::node`: a read-only cursor over a parsed document that validates fields and names
 * their path in every error. Internal to the I/O layer (`tangram/io/`).
 */
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "tangram/core/error.hpp"
#include "tangram/io/detail/json/value.hpp"

namespace tangram::detail::json {

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
    TANGRAM_FAIL(parse_error,
                 detail::printable(source_),
                 ": ",
                 path_.empty() ? std::string("document") : detail::printable(path_),
                 ": ",
                 what);
  }

  /// Short text of this value for messages (`"abc"`, `-4`, `an array of 3`).
  [[nodiscard]] std::string describe() const {
    switch (type()) {
      case kind::null:
        return "null";
      case kind::boolean:
        return value_->boolean() ? "true" : "false";
      case kind::number: {
        std::string s;
        if (value_->is_integer())
          append_one(s, value_->integer());
        else
          append_number(s, value_->number());
        return s;
      }
      case kind::string:
        return detail::quoted(value_->string());
      case kind::array:
        return cat("an array of ", value_->elements().size());
      case kind::object:
        return "an object";
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
      TANGRAM_FAIL(parse_error,
                   detail::printable(source_),
                   ": ",
                   detail::printable(missing.path_),
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
    if (value_->string().size() > max_len) fail(cat("string longer than ", max_len, " characters"));
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
