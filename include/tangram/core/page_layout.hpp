// SPDX-License-Identifier: Apache-2.0
/**
 * @file core/page_layout.hpp
 * @brief Geometry of one KV page: Hp heads x P tokens x (K and V) x d values.
 *
 * In-page layout `[K|V][column 0..Hp-1][token 0..P-1][d]`: each head's tokens are contiguous, so
 * a head's K (or V) slice of a page is one `P * d` block and 16-byte vector loads stay aligned.
 */
#pragma once

#include <cstddef>
#include <cstdint>

#include "tangram/core/config.hpp"
#include "tangram/core/dtype.hpp"
#include "tangram/core/error.hpp"

namespace tangram {

/// @brief Where a head lives: its group and its column in the group's pages. POD, device-usable.
struct head_slot {
  std::int32_t group  = 0;
  std::int32_t column = 0;
};

/// Marks a page dimension that is known only at run time.
inline constexpr std::int32_t dynamic_extent = -1;

/// @brief Runtime page geometry. POD, device-usable.
struct page_geometry {
  std::int32_t page_tokens = 16;   ///< P
  std::int32_t group_size  = 4;    ///< Hp, heads (columns) per page
  std::int32_t head_dim    = 128;  ///< d
  dtype kv_dtype           = dtype::bf16;

  TANGRAM_HOST_DEVICE std::int64_t element_bytes() const {
    return kv_dtype == dtype::f32 ? 4 : (kv_dtype == dtype::f16 || kv_dtype == dtype::bf16) ? 2 : 1;
  }
  /// Elements of one head's K (or V) in one page: P * d.
  TANGRAM_HOST_DEVICE std::int64_t column_elements() const {
    return static_cast<std::int64_t>(page_tokens) * head_dim;
  }
  /// Elements of one page: 2 * Hp * P * d.
  TANGRAM_HOST_DEVICE std::int64_t page_elements() const {
    return 2 * group_size * column_elements();
  }
  /// Bytes of one page: Hp * 2 * P * d * sizeof(dtype).
  TANGRAM_HOST_DEVICE std::int64_t page_bytes() const { return page_elements() * element_bytes(); }
  /// Element offset inside a page of value `x` of token `token` of head column `column`;
  /// `kv` is 0 for K and 1 for V.
  TANGRAM_HOST_DEVICE std::int64_t element_offset(std::int32_t kv,
                                                  std::int32_t column,
                                                  std::int32_t token,
                                                  std::int32_t x = 0) const {
    return ((static_cast<std::int64_t>(kv) * group_size + column) * page_tokens + token) *
               head_dim +
           x;
  }

  /// @throw invalid_argument naming the field and the value.
  void validate() const {
    TANGRAM_EXPECTS(page_tokens >= 1 && page_tokens <= 4096,
                    invalid_argument,
                    "page_geometry.page_tokens: must be in [1, 4096], got ",
                    page_tokens);
    TANGRAM_EXPECTS(group_size >= 1 && group_size <= 1024,
                    invalid_argument,
                    "page_geometry.group_size: must be in [1, 1024], got ",
                    group_size);
    TANGRAM_EXPECTS(head_dim >= 1 && head_dim <= 1024,
                    invalid_argument,
                    "page_geometry.head_dim: must be in [1, 1024], got ",
                    head_dim);
  }

  friend bool operator==(page_geometry const& a, page_geometry const& b) {
    return a.page_tokens == b.page_tokens && a.group_size == b.group_size &&
           a.head_dim == b.head_dim && a.kv_dtype == b.kv_dtype;
  }
};

/**
 * @brief Page geometry with optionally compile-time extents, in the style of `std::extents`.
 *
 * `page_layout<128, 4, 16>` fixes d, Hp and P at compile time (a kernel's view of a page);
 * `page_layout<>` keeps them all dynamic (an engine that learns the model at load time). Both
 * answer the same queries; static extents fold to constants.
 */
template <std::int32_t HeadDim    = dynamic_extent,
          std::int32_t GroupSize  = dynamic_extent,
          std::int32_t PageTokens = dynamic_extent>
class page_layout {
 public:
  static constexpr bool is_static =
      HeadDim != dynamic_extent && GroupSize != dynamic_extent && PageTokens != dynamic_extent;

  page_layout() = default;
  /// @throw invalid_argument when a static extent disagrees with `g`.
  explicit page_layout(page_geometry const& g) : geometry_(g) {
    g.validate();
    TANGRAM_EXPECTS(HeadDim == dynamic_extent || HeadDim == g.head_dim,
                    invalid_argument,
                    "page_layout: head_dim is fixed to ",
                    HeadDim,
                    ", got ",
                    g.head_dim);
    TANGRAM_EXPECTS(GroupSize == dynamic_extent || GroupSize == g.group_size,
                    invalid_argument,
                    "page_layout: group_size is fixed to ",
                    GroupSize,
                    ", got ",
                    g.group_size);
    TANGRAM_EXPECTS(PageTokens == dynamic_extent || PageTokens == g.page_tokens,
                    invalid_argument,
                    "page_layout: page_tokens is fixed to ",
                    PageTokens,
                    ", got ",
                    g.page_tokens);
  }

  TANGRAM_HOST_DEVICE std::int32_t head_dim() const {
    if constexpr (HeadDim != dynamic_extent)
      return HeadDim;
    else
      return geometry_.head_dim;
  }
  TANGRAM_HOST_DEVICE std::int32_t group_size() const {
    if constexpr (GroupSize != dynamic_extent)
      return GroupSize;
    else
      return geometry_.group_size;
  }
  TANGRAM_HOST_DEVICE std::int32_t page_tokens() const {
    if constexpr (PageTokens != dynamic_extent)
      return PageTokens;
    else
      return geometry_.page_tokens;
  }
  TANGRAM_HOST_DEVICE dtype kv_dtype() const { return geometry_.kv_dtype; }
  TANGRAM_HOST_DEVICE page_geometry geometry() const {
    return {page_tokens(), group_size(), head_dim(), geometry_.kv_dtype};
  }
  TANGRAM_HOST_DEVICE std::int64_t page_bytes() const { return geometry().page_bytes(); }
  TANGRAM_HOST_DEVICE std::int64_t element_offset(std::int32_t kv,
                                                  std::int32_t column,
                                                  std::int32_t token,
                                                  std::int32_t x = 0) const {
    return ((static_cast<std::int64_t>(kv) * group_size() + column) * page_tokens() + token) *
               head_dim() +
           x;
  }

 private:
  page_geometry geometry_{};
};

}  // namespace tangram
