// SPDX-License-Identifier: Apache-2.0
/**
 * @file io/retention_samples.hpp
 * @brief Reading `retention-samples/v1` (docs/formats.md) into `retention_samples`
 * (profile/retention_samples.hpp). The library only reads this format; calibration tools write it.
 *
 * Host only; pure functions except `load_retention_samples`, which reads a file.
 */
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "tangram/core/error.hpp"
#include "tangram/io/detail/fields.hpp"
#include "tangram/io/detail/file_io.hpp"
#include "tangram/io/detail/json.hpp"
#include "tangram/model/model_spec.hpp"
#include "tangram/profile/retention_samples.hpp"

namespace tangram {

/**
 * @brief Parses `retention-samples/v1` JSON text and validates every field.
 * @param source name used in error messages (usually the file path)
 * @throw parse_error naming the source, the field path and the value: unknown format version,
 *        missing fields, wrong shapes, kept > context, negative or non-integer counts, layer ids
 *        out of range, sizes over `profile_limits`.
 */
inline retention_samples parse_retention_samples(std::string_view text, std::string_view source) {
  using detail::cat;
  detail::format_document file(text, source, "retention-samples/v1");
  auto const& doc = file.root;

  retention_samples r;
  r.model             = doc["model"].as_string(256);
  r.scorer            = doc["scorer"].as_string(256);
  r.target_keep_ratio = doc["target_keep_ratio"].as_double(0, 1);
  r.sink_tokens       = detail::as_i32(doc["sink_tokens"], 0, profile_limits::max_protected);
  r.window_tokens     = detail::as_i32(doc["window_tokens"], 0, profile_limits::max_protected);
  r.num_model_layers  = detail::as_i32(doc["num_model_layers"], 1, model_limits::max_layers);
  r.layer_ids         = detail::read_layer_ids(doc["layer_ids"], r.num_model_layers);
  r.num_kv_heads      = detail::as_i32(doc["num_kv_heads"], 1, model_limits::max_kv_heads);
  if (auto h = doc.find("hybrid_sliding_window")) r.hybrid_sliding_window = h->as_bool();

  auto samples            = doc["samples"];
  std::size_t num_samples = samples.expect_size_in(1, profile_limits::max_samples);
  std::size_t L = r.layer_ids.size(), H = static_cast<std::size_t>(r.num_kv_heads);
  if (static_cast<std::int64_t>(num_samples * L * H) > profile_limits::max_sample_entries)
    samples.fail(cat(num_samples,
                     " samples x ",
                     L,
                     " layers x ",
                     H,
                     " heads exceeds the limit of ",
                     profile_limits::max_sample_entries,
                     " entries"));
  r.samples.resize(num_samples);
  for (std::size_t s = 0; s < num_samples; ++s) {
    auto smp           = samples[s];
    auto& out          = r.samples[s];
    out.context_tokens = smp["context_tokens"].as_int(1, profile_limits::max_context_tokens);
    detail::read_layer_head_table(smp["kept_tokens"], L, H, out.kept, [&](auto const& cell) {
      std::int64_t k = cell.as_int(0, profile_limits::max_context_tokens);
      if (k > out.context_tokens)
        cell.fail(
            cat("kept tokens must not exceed context_tokens (", out.context_tokens, "), got ", k));
      return k;
    });
  }
  return r;
}

/// @brief Reads and validates a `retention-samples/v1` file.
inline retention_samples load_retention_samples(std::string const& path) {
  return parse_retention_samples(detail::read_file(path), path);
}

}  // namespace tangram
