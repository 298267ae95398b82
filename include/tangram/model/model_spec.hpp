// SPDX-License-Identifier: Apache-2.0
/**
 * @file model/model_spec.hpp
 * @brief What the KV-cache manager needs to know about a model: layers, heads, head dim, element
 * type and the attention kind of every layer.
 *
 * Core type: reading and writing it as JSON lives in io/model_spec.hpp.
 */
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tangram/core/dtype.hpp"
#include "tangram/core/error.hpp"
#include "tangram/core/retention.hpp"

namespace tangram {

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

}  // namespace tangram
