// SPDX-License-Identifier: Apache-2.0
/**
 * @file profile/retention_samples.hpp
 * @brief Reader for `retention-samples/v1`: what a dynamic non-uniform compressor kept, per sample,
 * per profiled layer and per KV head (format in docs/formats.md).
 */
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tangram/detail/file_io.hpp"
#include "tangram/detail/json.hpp"
#include "tangram/error.hpp"
#include "tangram/model/model_spec.hpp"

namespace tangram {

/// Caps on sizes read from files, so hostile input cannot allocate without bound.
struct profile_limits {
  static constexpr std::int64_t max_samples        = 100000;
  static constexpr std::int64_t max_sample_entries = std::int64_t{1} << 26;  ///< samples*layers*heads
  static constexpr std::int64_t max_context_tokens = (std::int64_t{1} << 31) - 1;
  static constexpr std::int64_t max_protected      = std::int64_t{1} << 30;
};

/// @brief One pilot prompt: its length and the tokens each profiled head kept.
struct retention_sample {
  std::int64_t context_tokens = 0;  ///< prompt length
  std::vector<std::int64_t> kept;   ///< [profiled layer index * num_kv_heads + head]
};

/**
 * @brief Per-head retention measured on pilot prompts (`retention-samples/v1`).
 *
 * Plain value type. `kept` counts include the protected sink and window tokens.
 */
struct retention_samples {
  std::string model;
  std::string scorer;
  double target_keep_ratio        = 0;
  std::int32_t sink_tokens        = 0;
  std::int32_t window_tokens      = 0;
  std::int32_t num_model_layers   = 0;
  std::vector<std::int32_t> layer_ids;  ///< model layers profiled, strictly increasing
  std::int32_t num_kv_heads       = 0;
  bool hybrid_sliding_window      = false;
  std::vector<retention_sample> samples;

  [[nodiscard]] std::size_t num_profiled_layers() const { return layer_ids.size(); }
  /// Tokens the scorer always keeps (sink + recent window).
  [[nodiscard]] std::int64_t protected_tokens() const {
    return static_cast<std::int64_t>(sink_tokens) + window_tokens;
  }
  /// Retained fraction kept/context of head `h` of profiled layer index `li` on sample `s`.
  [[nodiscard]] double ratio(std::size_t s, std::size_t li, std::size_t h) const {
    auto const& smp = samples[s];
    return static_cast<double>(smp.kept[li * static_cast<std::size_t>(num_kv_heads) + h]) /
           static_cast<double>(smp.context_tokens);
  }
};

namespace detail {

/// Reads `layer_ids`: non-empty, strictly increasing, each in [0, num_model_layers).
inline std::vector<std::int32_t> read_layer_ids(json::node const& n, std::int32_t num_model_layers) {
  std::size_t count = n.expect_size_in(1, static_cast<std::size_t>(num_model_layers));
  std::vector<std::int32_t> ids;
  ids.reserve(count);
  for (std::size_t i = 0; i < count; ++i) {
    auto e = n[i];
    auto id = static_cast<std::int32_t>(e.as_int(0, num_model_layers - 1));
    if (!ids.empty() && id <= ids.back())
      e.fail(cat("layer ids must be strictly increasing, got ", id, " after ", ids.back()));
    ids.push_back(id);
  }
  return ids;
}

inline void expect_format(json::node const& doc, std::string_view expected) {
  auto f = doc["format"];
  if (f.type() != json::kind::string || f.raw().string() != expected)
    f.fail(cat("unsupported format ", f.describe(), " (this library reads ", detail::quoted(expected), ")"));
}

}  // namespace detail

/**
 * @brief Parses `retention-samples/v1` JSON text and validates every field.
 * @param source name used in error messages (usually the file path)
 * @throw parse_error naming the source, the field path and the value: unknown format version,
 *        missing fields, wrong shapes, kept > context, negative or non-integer counts, layer ids
 *        out of range, sizes over `profile_limits`.
 */
inline retention_samples parse_retention_samples(std::string_view text, std::string_view source) {
  using detail::cat;
  auto doc_value = detail::json::parse(text, source);
  detail::json::node doc(doc_value, source);
  doc.expect(detail::json::kind::object);
  detail::expect_format(doc, "retention-samples/v1");

  retention_samples r;
  r.model             = doc["model"].as_string(256);
  r.scorer            = doc["scorer"].as_string(256);
  r.target_keep_ratio = doc["target_keep_ratio"].as_double(0, 1);
  r.sink_tokens   = static_cast<std::int32_t>(doc["sink_tokens"].as_int(0, profile_limits::max_protected));
  r.window_tokens = static_cast<std::int32_t>(doc["window_tokens"].as_int(0, profile_limits::max_protected));
  r.num_model_layers =
      static_cast<std::int32_t>(doc["num_model_layers"].as_int(1, model_limits::max_layers));
  r.layer_ids    = detail::read_layer_ids(doc["layer_ids"], r.num_model_layers);
  r.num_kv_heads = static_cast<std::int32_t>(doc["num_kv_heads"].as_int(1, model_limits::max_kv_heads));
  if (auto h = doc.find("hybrid_sliding_window")) r.hybrid_sliding_window = h->as_bool();

  auto samples = doc["samples"];
  std::size_t num_samples = samples.expect_size_in(1, profile_limits::max_samples);
  std::size_t L = r.layer_ids.size(), H = static_cast<std::size_t>(r.num_kv_heads);
  if (static_cast<std::int64_t>(num_samples * L * H) > profile_limits::max_sample_entries)
    samples.fail(cat(num_samples, " samples x ", L, " layers x ", H, " heads exceeds the limit of ",
                     profile_limits::max_sample_entries, " entries"));
  r.samples.resize(num_samples);
  for (std::size_t s = 0; s < num_samples; ++s) {
    auto smp            = samples[s];
    auto& out           = r.samples[s];
    out.context_tokens  = smp["context_tokens"].as_int(1, profile_limits::max_context_tokens);
    auto kept           = smp["kept_tokens"];
    (void)kept.expect_size(L, "one row per entry of layer_ids");
    out.kept.resize(L * H);
    for (std::size_t li = 0; li < L; ++li) {
      auto row = kept[li];
      (void)row.expect_size(H, "one per KV head, num_kv_heads");
      for (std::size_t h = 0; h < H; ++h) {
        auto cell = row[h];
        std::int64_t k = cell.as_int(0, profile_limits::max_context_tokens);
        if (k > out.context_tokens)
          cell.fail(cat("kept tokens must not exceed context_tokens (", out.context_tokens, "), got ", k));
        out.kept[li * H + h] = k;
      }
    }
  }
  return r;
}

/// @brief Reads and validates a `retention-samples/v1` file.
inline retention_samples load_retention_samples(std::string const& path) {
  return parse_retention_samples(detail::read_file(path), path);
}

}  // namespace tangram
