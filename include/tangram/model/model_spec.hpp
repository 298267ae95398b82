// SPDX-License-Identifier: Apache-2.0
/**
 * @file model/model_spec.hpp
 * @brief What the KV-cache manager needs to know about a model: layers, heads, head dim, element
 * type and the attention kind of every layer.
 */
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tangram/detail/file_io.hpp"
#include "tangram/detail/json.hpp"
#include "tangram/dtype.hpp"
#include "tangram/error.hpp"

namespace tangram {

/// @brief How a layer's KV cache behaves over time.
enum class layer_kind : std::uint8_t {
  compressed,      ///< full attention whose KV is compressed to a static per-head budget
  sliding_window,  ///< attends to the last `window` tokens only; constant memory per head
  uncompressed,    ///< full attention kept whole (e.g. layers an operator chooses not to compress)
};

constexpr std::string_view to_string(layer_kind k) noexcept {
  switch (k) {
    case layer_kind::compressed: return "compressed";
    case layer_kind::sliding_window: return "sliding_window";
    case layer_kind::uncompressed: return "uncompressed";
  }
  return "?";
}

/// @brief Parses "compressed", "sliding_window" or "uncompressed".
/// @throw invalid_argument naming `field` and the value.
inline layer_kind parse_layer_kind(std::string_view name, std::string_view field = "kind") {
  if (name == "compressed") return layer_kind::compressed;
  if (name == "sliding_window") return layer_kind::sliding_window;
  if (name == "uncompressed") return layer_kind::uncompressed;
  TANGRAM_FAIL(invalid_argument,
               field,
               ": unknown layer kind ",
               detail::quoted(name),
               " (expected compressed, sliding_window or uncompressed)");
}

/// @brief One layer's attention kind.
struct layer_spec {
  layer_kind kind     = layer_kind::compressed;
  std::int32_t window = 0;  ///< tokens attended by a sliding-window layer; 0 otherwise

  friend bool operator==(layer_spec const& a, layer_spec const& b) {
    return a.kind == b.kind && a.window == b.window;
  }
};

/// Upper bounds that keep every size computation far from overflow and refuse absurd files.
struct model_limits {
  static constexpr std::int32_t max_layers     = 1024;
  static constexpr std::int32_t max_kv_heads   = 1024;
  static constexpr std::int32_t max_q_heads    = 8192;
  static constexpr std::int32_t max_head_dim   = 1024;
  static constexpr std::int32_t max_window     = 1 << 30;
};

/**
 * @brief Shape of a model's KV cache.
 *
 * Plain value type; copy freely. `validate()` checks internal consistency and is called by every
 * consumer that receives a spec from outside (files, command line).
 */
struct model_spec {
  std::string name;                  ///< display name, e.g. "Llama-3.1-8B"
  std::int32_t num_layers      = 0;  ///< decoder layers
  std::int32_t num_query_heads = 0;  ///< attention (query) heads per layer
  std::int32_t num_kv_heads    = 0;  ///< KV heads per layer (GQA: divides num_query_heads)
  std::int32_t head_dim        = 0;  ///< elements per head vector
  dtype kv_dtype               = dtype::bf16;  ///< element type of cached K/V
  std::vector<layer_spec> layers;  ///< one entry per layer
  bool attention_sinks = false;    ///< learned per-query-head sink logit (GPT-OSS)
  double weight_bytes  = 0;  ///< bytes of weights resident on the GPU (for capacity planning)
  double active_weight_bytes = 0;  ///< weight bytes read per decode step (MoE: active experts)
  double active_parameters   = 0;  ///< parameters used per token (2 FLOPs each per token)

  /// Query heads sharing one KV head.
  [[nodiscard]] std::int32_t gqa_group() const { return num_query_heads / num_kv_heads; }

  /// Number of layers of one kind.
  [[nodiscard]] std::int32_t count(layer_kind k) const {
    std::int32_t n = 0;
    for (auto const& l : layers) n += l.kind == k;
    return n;
  }

  /// Bytes of K and V for one token of one KV head.
  [[nodiscard]] std::int64_t kv_bytes_per_head_token() const {
    return 2 * static_cast<std::int64_t>(head_dim) * static_cast<std::int64_t>(size_of(kv_dtype));
  }

  /// Bytes of K and V for one token across all layers and KV heads (the uncompressed cost).
  [[nodiscard]] std::int64_t kv_bytes_per_token() const {
    return kv_bytes_per_head_token() * num_layers * num_kv_heads;
  }

  /**
   * @brief Checks consistency.
   * @throw invalid_argument naming the field and the value.
   */
  void validate() const {
    auto in_range = [](char const* field, std::int64_t v, std::int64_t lo, std::int64_t hi) {
      TANGRAM_EXPECTS(v >= lo && v <= hi,
                      invalid_argument,
                      "model_spec.",
                      field,
                      ": must be in [",
                      lo,
                      ", ",
                      hi,
                      "], got ",
                      v);
    };
    in_range("num_layers", num_layers, 1, model_limits::max_layers);
    in_range("num_kv_heads", num_kv_heads, 1, model_limits::max_kv_heads);
    in_range("num_query_heads", num_query_heads, 1, model_limits::max_q_heads);
    in_range("head_dim", head_dim, 1, model_limits::max_head_dim);
    TANGRAM_EXPECTS(num_query_heads % num_kv_heads == 0,
                    invalid_argument,
                    "model_spec.num_query_heads: ",
                    num_query_heads,
                    " is not a multiple of num_kv_heads (",
                    num_kv_heads,
                    ")");
    TANGRAM_EXPECTS(static_cast<std::int32_t>(layers.size()) == num_layers,
                    invalid_argument,
                    "model_spec.layers: expected ",
                    num_layers,
                    " entries (num_layers), got ",
                    layers.size());
    for (std::size_t i = 0; i < layers.size(); ++i) {
      auto const& l = layers[i];
      if (l.kind == layer_kind::sliding_window) {
        TANGRAM_EXPECTS(l.window >= 1 && l.window <= model_limits::max_window,
                        invalid_argument,
                        "model_spec.layers[",
                        i,
                        "].window: must be in [1, ",
                        model_limits::max_window,
                        "] for a sliding_window layer, got ",
                        l.window);
      } else {
        TANGRAM_EXPECTS(l.window == 0,
                        invalid_argument,
                        "model_spec.layers[",
                        i,
                        "].window: only sliding_window layers have a window, got ",
                        l.window);
      }
    }
    TANGRAM_EXPECTS(weight_bytes >= 0 && weight_bytes <= 1e15,
                    invalid_argument,
                    "model_spec.weight_bytes: must be in [0, 1e15], got ",
                    weight_bytes);
    TANGRAM_EXPECTS(active_weight_bytes >= 0 && active_weight_bytes <= weight_bytes,
                    invalid_argument,
                    "model_spec.active_weight_bytes: must be in [0, weight_bytes], got ",
                    active_weight_bytes);
    TANGRAM_EXPECTS(active_parameters >= 0 && active_parameters <= 1e14,
                    invalid_argument,
                    "model_spec.active_parameters: must be in [0, 1e14], got ",
                    active_parameters);
  }
};

/// @brief Builds the per-layer list of a model whose every layer has the same kind.
inline std::vector<layer_spec> uniform_layers(std::int32_t n, layer_spec spec = {}) {
  return std::vector<layer_spec>(static_cast<std::size_t>(n), spec);
}

namespace detail {

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
  m.name            = n["name"].as_string(256);
  m.num_layers      = static_cast<std::int32_t>(n["num_layers"].as_int(1, model_limits::max_layers));
  m.num_query_heads = static_cast<std::int32_t>(n["num_query_heads"].as_int(1, model_limits::max_q_heads));
  m.num_kv_heads    = static_cast<std::int32_t>(n["num_kv_heads"].as_int(1, model_limits::max_kv_heads));
  m.head_dim        = static_cast<std::int32_t>(n["head_dim"].as_int(1, model_limits::max_head_dim));
  auto dt           = n["kv_dtype"];
  try {
    m.kv_dtype = parse_dtype(dt.as_string(32), dt.path());
  } catch (invalid_argument const&) {
    dt.fail(cat("unknown dtype ", dt.describe(), " (expected f32, f16, bf16, fp8_e4m3 or fp8_e5m2)"));
  }
  if (auto s = n.find("attention_sinks")) m.attention_sinks = s->as_bool();
  if (auto w = n.find("weight_bytes")) m.weight_bytes = w->as_double(0, 1e15);
  if (auto w = n.find("active_weight_bytes")) m.active_weight_bytes = w->as_double(0, 1e15);
  if (auto a = n.find("active_parameters")) m.active_parameters = a->as_double(0, 1e14);
  auto layers = n["layers"];
  (void)layers.expect_size(static_cast<std::size_t>(m.num_layers), "one per layer, num_layers");
  for (std::size_t i = 0; i < layers.size(); ++i) {
    auto l    = layers[i];
    auto kind = l["kind"];
    layer_spec spec;
    std::string name = kind.as_string(32);
    if (name == "compressed")
      spec.kind = layer_kind::compressed;
    else if (name == "sliding_window")
      spec.kind = layer_kind::sliding_window;
    else if (name == "uncompressed")
      spec.kind = layer_kind::uncompressed;
    else
      kind.fail(cat("unknown layer kind ", kind.describe(),
                    " (expected compressed, sliding_window or uncompressed)"));
    if (spec.kind == layer_kind::sliding_window)
      spec.window = static_cast<std::int32_t>(l["window"].as_int(1, model_limits::max_window));
    else if (auto w = l.find("window"))
      w->fail(cat("only sliding_window layers have a window, got ", w->describe()));
    m.layers.push_back(spec);
  }
  if (m.num_query_heads % m.num_kv_heads != 0)
    n["num_query_heads"].fail(cat("must be a multiple of num_kv_heads (", m.num_kv_heads, "), got ",
                                  m.num_query_heads));
  if (m.active_weight_bytes > m.weight_bytes)
    n["active_weight_bytes"].fail(cat("must not exceed weight_bytes (", m.weight_bytes, "), got ",
                                      m.active_weight_bytes));
  try {
    m.validate();  // every field was checked above; this keeps a file's errors parse_errors
  } catch (invalid_argument const& e) {  // validate() throws plain invalid_argument
    n.fail(e.what());
  }
  return m;
}

}  // namespace detail

/// @brief Serialises a model spec as JSON (format in docs/formats.md).
inline std::string to_json(model_spec const& m) { return detail::json::dump(detail::model_to_json(m)); }

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
