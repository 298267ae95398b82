// SPDX-License-Identifier: Apache-2.0
/**
 * @file model/presets.hpp
 * @brief Model specs of real models (numbers from their published configs; see
 * docs/formats.md#model-presets for sources).
 */
#pragma once

#include <cctype>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tangram/model/model_spec.hpp"

namespace tangram {

namespace detail {

struct preset_row {
  std::string_view key;  ///< normalised lookup key
  std::string_view name;
  std::int32_t layers, q_heads, kv_heads, head_dim;
  double params_billion;         ///< total parameters
  double active_params_billion;  ///< parameters read per decode step
  double bytes_per_param;        ///< checkpoint bytes per parameter (bf16 = 2)
};

// Sources: the models' config.json files (see docs/formats.md). GPT-OSS-20B ships MXFP4 experts,
// about 4.25 bits per expert parameter; 12.8 GiB of checkpoint for 20.9B parameters.
constexpr preset_row preset_rows[] = {
    {"qwen3-4b", "Qwen3-4B", 36, 32, 8, 128, 4.02, 4.02, 2.0},
    {"llama-3.1-8b", "Llama-3.1-8B", 32, 32, 8, 128, 8.03, 8.03, 2.0},
    {"gemma-3-12b", "Gemma-3-12B", 48, 16, 8, 256, 12.19, 12.19, 2.0},
    {"gpt-oss-20b", "GPT-OSS-20B", 24, 64, 8, 64, 20.91, 3.61, 0.657},
    {"qwen3-30b-a3b", "Qwen3-30B-A3B", 48, 32, 4, 128, 30.53, 3.34, 2.0},
    {"qwen2.5-7b", "Qwen2.5-7B", 28, 28, 4, 128, 7.61, 7.61, 2.0},
    {"qwen2.5-32b", "Qwen2.5-32B", 64, 40, 8, 128, 32.76, 32.76, 2.0},
    {"llama-3.1-70b", "Llama-3.1-70B", 80, 64, 8, 128, 70.55, 70.55, 2.0},
};

/// Lower-cases, drops an "org/" prefix and common suffixes so that Hugging Face ids match:
/// "meta-llama/Llama-3.1-8B-Instruct" -> "llama-3.1-8b".
inline std::string normalise_model_name(std::string_view name) {
  auto slash = name.rfind('/');
  if (slash != std::string_view::npos) name = name.substr(slash + 1);
  std::string s;
  for (char c : name) s += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (std::string_view suffix : {"-instruct-2507", "-instruct", "-it", "-base", "-chat"}) {
    if (s.size() > suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0) {
      s.resize(s.size() - suffix.size());
      break;
    }
  }
  return s;
}

inline model_spec spec_from_row(preset_row const& r) {
  model_spec m;
  m.name                = std::string(r.name);
  m.num_layers          = r.layers;
  m.num_query_heads     = r.q_heads;
  m.num_kv_heads        = r.kv_heads;
  m.head_dim            = r.head_dim;
  m.kv_dtype            = dtype::bf16;
  m.weight_bytes        = r.params_billion * 1e9 * r.bytes_per_param;
  m.active_weight_bytes = r.active_params_billion * 1e9 * r.bytes_per_param;
  m.active_parameters   = r.active_params_billion * 1e9;
  m.layers              = uniform_layers(r.layers);
  if (r.key == "gemma-3-12b") {
    // Five sliding-window layers (window 1024) then one global layer: layers 5, 11, ..., 47 are full.
    for (std::int32_t l = 0; l < r.layers; ++l)
      if (l % 6 != 5) m.layers[static_cast<std::size_t>(l)] = {layer_kind::sliding_window, 1024};
  } else if (r.key == "gpt-oss-20b") {
    // Alternating sliding (window 128) and full attention, starting with sliding; learned sinks.
    for (std::int32_t l = 0; l < r.layers; l += 2)
      m.layers[static_cast<std::size_t>(l)] = {layer_kind::sliding_window, 128};
    m.attention_sinks = true;
  }
  return m;
}

}  // namespace detail

/// @brief Names of the built-in model presets.
inline std::vector<std::string> model_preset_names() {
  std::vector<std::string> names;
  for (auto const& r : detail::preset_rows) names.emplace_back(r.key);
  return names;
}

/// @brief Looks up a preset by name ("llama-3.1-8b") or Hugging Face id
/// ("meta-llama/Llama-3.1-8B-Instruct"); case-insensitive.
inline std::optional<model_spec> find_model_preset(std::string_view name) {
  std::string key = detail::normalise_model_name(name);
  for (auto const& r : detail::preset_rows)
    if (r.key == key) return detail::spec_from_row(r);
  return std::nullopt;
}

/// @brief Like find_model_preset, but an unknown name is an error listing the known presets.
/// @throw invalid_argument naming the value.
inline model_spec model_preset(std::string_view name) {
  if (auto m = find_model_preset(name)) return *m;
  std::string known;
  for (auto const& n : model_preset_names()) known += (known.empty() ? "" : ", ") + n;
  TANGRAM_FAIL(invalid_argument, "model: unknown preset ", detail::quoted(name), " (known: ", known, ")");
}

}  // namespace tangram
