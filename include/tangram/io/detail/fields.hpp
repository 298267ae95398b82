// SPDX-License-Identifier: Apache-2.0
/**
 * @file io/detail/fields.hpp
 * @brief Field readers shared by the file formats of the I/O layer: the format tag (and a parsed
 * document checked for it), layer-id
 * lists, 32-bit integers and fields that must equal a value derived from others.
 */
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "tangram/core/error.hpp"
#include "tangram/io/detail/json.hpp"

namespace tangram::detail {

/// Reads `layer_ids`: non-empty, strictly increasing, each in [0, num_model_layers).
inline std::vector<std::int32_t> read_layer_ids(json::node const& n,
                                                std::int32_t num_model_layers) {
  std::size_t count = n.expect_size_in(1, static_cast<std::size_t>(num_model_layers));
  std::vector<std::int32_t> ids;
  ids.reserve(count);
  for (std::size_t i = 0; i < count; ++i) {
    auto e  = n[i];
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
    f.fail(cat("unsupported format ",
               f.describe(),
               " (this library reads ",
               detail::quoted(expected),
               ")"));
}

/// @brief A parsed file of one format: its JSON tree and the root node, checked to be an object
/// whose "format" is `format`. Neither copyable nor movable (`root` points into `tree`).
/// @throw parse_error naming the source (malformed JSON, another format, over `limits`).
struct format_document {
  json::value tree;
  json::node root;

  format_document(std::string_view text,
                  std::string_view source,
                  std::string_view format,
                  json::parse_limits limits = {})
      : tree(json::parse(text, source, limits)), root(tree, source) {
    root.expect(json::kind::object);
    expect_format(root, format);
  }
  format_document(format_document const&)            = delete;
  format_document& operator=(format_document const&) = delete;
};

/// Reads a [layer][head] table: `rows` holds L rows (one per entry of layer_ids) of H cells (one
/// per KV head); cell (li, h) becomes `out[li * H + h] = read_cell(cell)`, which checks it.
template <class T, class ReadCell>
void read_layer_head_table(
    json::node const& rows, std::size_t L, std::size_t H, std::vector<T>& out, ReadCell read_cell) {
  (void)rows.expect_size(L, "one row per entry of layer_ids");
  out.resize(L * H);
  for (std::size_t li = 0; li < L; ++li) {
    auto row = rows[li];
    (void)row.expect_size(H, "one per KV head, num_kv_heads");
    for (std::size_t h = 0; h < H; ++h) out[li * H + h] = read_cell(row[h]);
  }
}

inline std::int32_t as_i32(json::node const& n, std::int64_t lo, std::int64_t hi) {
  return static_cast<std::int32_t>(n.as_int(lo, hi));
}

/// An integer field that must equal a value derived from other fields (`why` says which).
inline std::int32_t expect_derived(json::node const& n,
                                   std::int64_t expected,
                                   std::string_view why) {
  std::int64_t v = n.as_int(-(std::int64_t{1} << 40), std::int64_t{1} << 40);
  if (v != expected) n.fail(cat("must be ", expected, " (", why, "), got ", v));
  return static_cast<std::int32_t>(v);
}

}  // namespace tangram::detail
