// SPDX-License-Identifier: Apache-2.0
/**
 * @file io/model_spec.hpp
 * @brief Reading and writing a `model_spec` (model/model_spec.hpp) as JSON (docs/formats.md).
 *
 * Host only; pure functions except `load_model_spec`, which reads a file. Errors name the source,
 * the field path and the value.
 */
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "tangram/core/dtype.hpp"
#include "tangram/core/error.hpp"
#include "tangram/io/detail/file_io.hpp"
#include "tangram/io/detail/json.hpp"
#include "tangram/model/model_spec.hpp"

namespace tangram {

namespace detail {

/// Reads a layer kind by name; an unknown name fails naming the field and the value.
inline layer_kind read_layer_kind(json::node const& n) {
  std::string name = n.as_string(32);
  if (name == "compressed") return layer_kind::compressed;
  if (name == "sliding_window") return layer_kind::sliding_window;
  if (name == "uncompressed") return layer_kind::uncompressed;
  n.fail(cat("unknown layer kind ",
             n.describe(),
             " (expected compressed, sliding_window or uncompressed)"));
}

inline json::value model_to_json(model_spec const& m) {
  auto layers = json::value::array();
  for (auto const& l : m.layers) {
    auto o = json::value::object();
    o.set("kind", to_string(l.kind));
    if (l.kind == layer_kind::sliding_window) o.set("window", l.window);
    layers.push_back(std::move(o));
  }
  auto v = json::value::object();
  v.set("name", m.name);
  v.set("num_layers", m.num_layers);
  v.set("num_query_heads", m.num_query_heads);
  v.set("num_kv_heads", m.num_kv_heads);
  v.set("head_dim", m.head_dim);
  v.set("kv_dtype", to_string(m.kv_dtype));
  v.set("attention_sinks", m.attention_sinks);
  v.set("weight_bytes", m.weight_bytes);
  v.set("active_weight_bytes", m.active_weight_bytes);
  v.set("active_parameters", m.active_parameters);
  v.set("layers", std::move(layers));
  return v;
}

inline model_spec model_from_json(json::node const& n) {
  model_spec m;
  m.name       = n["name"].as_string(256);
  m.num_layers = static_cast<std::int32_t>(n["num_layers"].as_int(1, model_limits::max_layers));
  m.num_query_heads =
      static_cast<std::int32_t>(n["num_query_heads"].as_int(1, model_limits::max_q_heads));
  m.num_kv_heads =
      static_cast<std::int32_t>(n["num_kv_heads"].as_int(1, model_limits::max_kv_heads));
  m.head_dim = static_cast<std::int32_t>(n["head_dim"].as_int(1, model_limits::max_head_dim));
  auto dt    = n["kv_dtype"];
  try {
    m.kv_dtype = parse_dtype(dt.as_string(32), dt.path());
  } catch (invalid_argument const&) {
    dt.fail(
        cat("unknown dtype ", dt.describe(), " (expected f32, f16, bf16, fp8_e4m3 or fp8_e5m2)"));
  }
  if (auto s = n.find("attention_sinks")) m.attention_sinks = s->as_bool();
  if (auto w = n.find("weight_bytes")) m.weight_bytes = w->as_double(0, 1e15);
  if (auto w = n.find("active_weight_bytes")) m.active_weight_bytes = w->as_double(0, 1e15);
  if (auto a = n.find("active_parameters")) m.active_parameters = a->as_double(0, 1e14);
  auto layers = n["layers"];
  (void)layers.expect_size(static_cast<std::size_t>(m.num_layers), "one per layer, num_layers");
  for (std::size_t i = 0; i < layers.size(); ++i) {
    auto l = layers[i];
    layer_spec spec;
    spec.kind = read_layer_kind(l["kind"]);
    if (spec.kind == layer_kind::sliding_window)
      spec.window = static_cast<std::int32_t>(l["window"].as_int(1, model_limits::max_window));
    else if (auto w = l.find("window"))
      w->fail(cat("only sliding_window layers have a window, got ", w->describe()));
    m.layers.push_back(spec);
  }
  if (m.num_query_heads % m.num_kv_heads != 0)
    n["num_query_heads"].fail(
        cat("must be a multiple of num_kv_heads (", m.num_kv_heads, "), got ", m.num_query_heads));
  if (m.active_weight_bytes > m.weight_bytes)
    n["active_weight_bytes"].fail(
        cat("must not exceed weight_bytes (", m.weight_bytes, "), got ", m.active_weight_bytes));
  try {
    m.validate();  // every field was checked above; this keeps a file's errors parse_errors
  } catch (invalid_argument const& e) {  // validate() throws plain invalid_argument
    n.fail(e.what());
  }
  return m;
}

}  // namespace detail

/// @brief Serialises a model spec as JSON (format in docs/formats.md).
inline std::string to_json(model_spec const& m) {
  return detail::json::dump(detail::model_to_json(m));
}

/// @brief Parses a model spec from JSON text.
/// @throw parse_error naming `source`, the field and the value.
inline model_spec parse_model_spec(std::string_view text, std::string_view source) {
  auto doc = detail::json::parse(text, source);
  return detail::model_from_json(detail::json::node(doc, source));
}

/// @brief Reads a model spec from a JSON file.
inline model_spec load_model_spec(std::string const& path) {
  return parse_model_spec(detail::read_file(path), path);
}

}  // namespace tangram
