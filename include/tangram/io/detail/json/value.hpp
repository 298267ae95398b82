// SPDX-License-Identifier: Apache-2.0
/**
 * @file io/detail/json/value.hpp
 * @brief The JSON document tree (`json::value`) that the reader builds and the writer prints.
 * Internal to the I/O layer (`tangram/io/`).
 */
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace tangram::detail::json {

/// Kinds of JSON values.
enum class kind : std::uint8_t { null, boolean, number, string, array, object };

inline std::string_view kind_name(kind k) {
  switch (k) {
    case kind::null:
      return "null";
    case kind::boolean:
      return "a boolean";
    case kind::number:
      return "a number";
    case kind::string:
      return "a string";
    case kind::array:
      return "an array";
    case kind::object:
      return "an object";
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
  template <class I, std::enable_if_t<std::is_integral_v<I> && !std::is_same_v<I, bool>, int> = 0>
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
  kind kind_            = kind::null;
  bool bool_            = false;
  double number_        = 0;
  bool is_integer_      = false;
  std::int64_t integer_ = 0;
  std::string string_;
  array_type array_;
  object_type object_;
};

}  // namespace tangram::detail::json
