// SPDX-License-Identifier: Apache-2.0
/**
 * @file profile/retention_samples.hpp
 * @brief Retention samples: what a dynamic non-uniform compressor kept, per sample, per profiled
 * layer and per KV head. Core type; its reader (`retention-samples/v1`, docs/formats.md) lives in
 * io/retention_samples.hpp.
 */
#pragma once

#include <cstdint>
#include <string>
#include <vector>


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

}  // namespace tangram
