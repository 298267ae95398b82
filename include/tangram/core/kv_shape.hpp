// SPDX-License-Identifier: Apache-2.0
/**
 * @file core/kv_shape.hpp
 * @brief The compile-time shape of a KV cache that the kernels are instantiated for
 * (`kv_shape<T, HeadDim, QueryGroup>`), the one list of instantiated shapes, and the one dispatch
 * from a runtime (dtype, head_dim, group) to it.
 *
 * Runtime-shaped use stays: an engine that serves many models keeps a `page_geometry` (and a
 * `page_layout<>`) learned at load time; a launcher turns it into a `kv_shape` once, through
 * `dispatch_kv_shape`, and launches the kernel instantiated for the shape's element type, head
 * dim and (decode) query-group bucket.
 *
 * The instantiation list (the X-macros below) is written here and nowhere else: the dispatch,
 * the `*_kernel_supports` queries and the explicit instantiations in kernels/ all expand it.
 */
#pragma once

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <string>
#include <type_traits>
#include <utility>

#include "tangram/core/config.hpp"
#include "tangram/core/dtype.hpp"
#include "tangram/core/error.hpp"
#include "tangram/core/page_layout.hpp"

// clang-format off
/// The compiled K/V element types: `X(args..., T)` for each. One source file per type and kernel
/// family (kernels/<family>_<dtype>.cu) holds its instantiations.
#define TANGRAM_KV_SHAPE_TYPES(X, ...)                                                        \
  X(__VA_ARGS__, float) X(__VA_ARGS__, float16) X(__VA_ARGS__, bfloat16)                      \
  X(__VA_ARGS__, float8_e4m3) X(__VA_ARGS__, float8_e5m2)
/// The compiled head dims: `X(args..., D)` for each.
#define TANGRAM_KV_SHAPE_HEAD_DIMS(X, ...) X(__VA_ARGS__, 64) X(__VA_ARGS__, 128) X(__VA_ARGS__, 256)
/// The compiled GQA query-group buckets, ascending: `X(args..., GB)` for each. A runtime group g
/// runs in the smallest bucket >= g (decode attention; the other kernels read g at run time).
#define TANGRAM_KV_SHAPE_QUERY_GROUPS(X, ...)                                                 \
  X(__VA_ARGS__, 1) X(__VA_ARGS__, 2) X(__VA_ARGS__, 4) X(__VA_ARGS__, 8)
#define TANGRAM_DETAIL_KV_SHAPE_DTYPE(unused, T) ::tangram::dtype_of_v<T>,
#define TANGRAM_DETAIL_KV_SHAPE_VALUE(unused, v) v,
// clang-format on

namespace tangram {

/// The K/V dtypes the kernels are compiled for (TANGRAM_KV_SHAPE_TYPES).
inline constexpr dtype kv_shape_dtypes[] = {
    TANGRAM_KV_SHAPE_TYPES(TANGRAM_DETAIL_KV_SHAPE_DTYPE, ~)};
/// The head dims the kernels are compiled for (TANGRAM_KV_SHAPE_HEAD_DIMS).
inline constexpr std::int32_t kv_shape_head_dims[] = {
    TANGRAM_KV_SHAPE_HEAD_DIMS(TANGRAM_DETAIL_KV_SHAPE_VALUE, ~)};
/// The GQA query-group buckets decode attention is compiled for, ascending
/// (TANGRAM_KV_SHAPE_QUERY_GROUPS).
inline constexpr std::int32_t kv_shape_query_groups[] = {
    TANGRAM_KV_SHAPE_QUERY_GROUPS(TANGRAM_DETAIL_KV_SHAPE_VALUE, ~)};

/**
 * @brief The compile-time shape of one KV head: element type, head dim and (optionally) the GQA
 * query-group bucket. A stateless tag: kernels and launchers read its constants.
 *
 * @tparam T          storage type of one K/V value (float, float16, bfloat16, float8_e4m3,
 *                    float8_e5m2)
 * @tparam HeadDim    d, values per token per head
 * @tparam QueryGroup query heads per KV head the kernel is specialised for (a bucket: a runtime
 *                    group g <= QueryGroup runs in it), or `dynamic_extent` when the kernel reads
 *                    the group at run time
 */
template <class T, std::int32_t HeadDim, std::int32_t QueryGroup = dynamic_extent>
struct kv_shape {
  using element_type                        = T;
  static constexpr dtype kv_dtype           = dtype_of_v<T>;
  static constexpr std::int32_t head_dim    = HeadDim;
  static constexpr std::int32_t query_group = QueryGroup;
  /// Bytes of one K (or V) value.
  static constexpr std::int64_t element_bytes = static_cast<std::int64_t>(sizeof(T));
  /// Bytes of one row: one token of one head's K (or V), d values.
  static constexpr std::int64_t row_bytes = HeadDim * element_bytes;
  /// Bytes of one token of one head, K and V.
  static constexpr std::int64_t token_bytes = 2 * row_bytes;
  /// Values per 16-byte vector load.
  static constexpr std::int32_t vector_elements = static_cast<std::int32_t>(16 / sizeof(T));
  /// 16-byte vector loads per row.
  static constexpr std::int32_t row_vectors = static_cast<std::int32_t>(row_bytes / 16);

  static_assert(size_of(kv_dtype) == sizeof(T), "kv_shape: storage type and dtype disagree");
  static_assert(HeadDim >= 1 && HeadDim <= 1024,
                "kv_shape: head_dim outside page_geometry's [1, 1024]");
  static_assert(row_bytes % 16 == 0, "kv_shape: a row must be whole 16-byte vectors");
  static_assert(QueryGroup == dynamic_extent || QueryGroup >= 1,
                "kv_shape: query_group must be >= 1 or dynamic_extent");

  /// The page layout of this shape with `GroupSize` heads per page and `PageTokens` tokens.
  template <std::int32_t GroupSize = dynamic_extent, std::int32_t PageTokens = dynamic_extent>
  using page_layout_type = page_layout<HeadDim, GroupSize, PageTokens>;

  /// Bytes of one page of Hp = `group_size` heads x P = `page_tokens` tokens: Hp * P * token_bytes.
  static constexpr std::int64_t page_bytes(std::int32_t group_size, std::int32_t page_tokens) {
    return static_cast<std::int64_t>(group_size) * page_tokens * token_bytes;
  }
  /**
   * @brief The page layout of runtime geometry `g`, with this shape's head dim (and `GroupSize`,
   * `PageTokens` where given) fixed at compile time.
   * @throw invalid_argument naming `page_geometry.kv_dtype` (or, from page_layout, the extent)
   *        and the value when `g` is not of this shape.
   */
  template <std::int32_t GroupSize = dynamic_extent, std::int32_t PageTokens = dynamic_extent>
  static page_layout_type<GroupSize, PageTokens> layout(page_geometry const& g) {
    TANGRAM_EXPECTS(g.kv_dtype == kv_dtype,
                    invalid_argument,
                    "page_geometry.kv_dtype: the shape fixes ",
                    to_string(kv_dtype),
                    ", got ",
                    to_string(g.kv_dtype));
    return page_layout_type<GroupSize, PageTokens>(g);
  }
  /// True when a runtime geometry has this shape's dtype and head dim.
  TANGRAM_HOST_DEVICE static constexpr bool matches(page_geometry const& g) {
    return g.kv_dtype == kv_dtype && g.head_dim == HeadDim;
  }
};

// Every listed shape passes kv_shape's checks (rows of whole 16-byte vectors, d in range), and
// the buckets ascend (the dispatch picks the first that holds a group).
#define TANGRAM_DETAIL_KV_SHAPE_CHECK_DIM(T, D) static_assert(kv_shape<T, D>::row_vectors >= 1);
#define TANGRAM_DETAIL_KV_SHAPE_CHECK(unused, T) \
  TANGRAM_KV_SHAPE_HEAD_DIMS(TANGRAM_DETAIL_KV_SHAPE_CHECK_DIM, T)
TANGRAM_KV_SHAPE_TYPES(TANGRAM_DETAIL_KV_SHAPE_CHECK, ~)
#undef TANGRAM_DETAIL_KV_SHAPE_CHECK
#undef TANGRAM_DETAIL_KV_SHAPE_CHECK_DIM
static_assert(
    [] {
      for (std::size_t i = 1; i < std::size(kv_shape_query_groups); ++i)
        if (kv_shape_query_groups[i] <= kv_shape_query_groups[i - 1]) return false;
      return kv_shape_query_groups[0] >= 1;
    }(),
    "kv_shape_query_groups must ascend from >= 1");

/// True when the kernels are compiled for this K/V dtype (any head dim).
constexpr bool kv_shape_supported(dtype kv_dtype) noexcept {
  for (dtype t : kv_shape_dtypes)
    if (t == kv_dtype) return true;
  return false;
}

/// True when the kernels are compiled for this K/V dtype and head dim.
constexpr bool kv_shape_supported(dtype kv_dtype, std::int32_t head_dim) noexcept {
  bool dim = false;
  for (std::int32_t d : kv_shape_head_dims) dim = dim || d == head_dim;
  return dim && kv_shape_supported(kv_dtype);
}

/// The smallest compiled query-group bucket that holds `group` (>= group), or 0 when none does.
constexpr std::int32_t kv_shape_query_bucket(std::int32_t group) noexcept {
  if (group < 1) return 0;
  for (std::int32_t b : kv_shape_query_groups)
    if (b >= group) return b;
  return 0;
}

namespace detail {

/// "a/b/c" of a list of values (messages).
template <class List, class Name>
std::string kv_shape_join(List const& list, Name name) {
  std::string out;
  for (auto const& v : list) {
    if (!out.empty()) out += '/';
    out += name(v);
  }
  return out;
}

/// "f32/f16/bf16/fp8_e4m3/fp8_e5m2 x head_dim 64/128/256" (messages).
inline std::string kv_shape_list() {
  return kv_shape_join(kv_shape_dtypes, [](dtype t) { return std::string(to_string(t)); }) +
         " x head_dim " +
         kv_shape_join(kv_shape_head_dims, [](std::int32_t d) { return std::to_string(d); });
}

/// Calls `f(std::integral_constant<value type, List[i]>{})` for the entry of the constant list
/// `List` equal to `value`; does nothing when none is (the callers check first).
template <auto const& List, std::size_t I = 0, class V, class F>
void dispatch_in(V value, F&& f) {
  if constexpr (I < std::size(List)) {
    if (value == List[I])
      f(std::integral_constant<std::decay_t<decltype(List[I])>, List[I]>{});
    else
      dispatch_in<List, I + 1>(value, f);
  }
}

}  // namespace detail

/**
 * @brief Refuses a (dtype, head dim) the kernels are not compiled for.
 * @param who names the caller in the message, e.g. "evict_chunk"
 * @throw invalid_argument naming `kv.geometry.kv_dtype` and `kv.geometry.head_dim`, their values
 *        and the compiled list.
 */
inline void expect_kv_shape(dtype kv_dtype, std::int32_t head_dim, char const* who) {
  TANGRAM_EXPECTS(kv_shape_supported(kv_dtype),
                  invalid_argument,
                  who,
                  ": no CUDA kernel for kv.geometry.kv_dtype ",
                  to_string(kv_dtype),
                  " (code ",
                  static_cast<int>(kv_dtype),
                  "; compiled: ",
                  detail::kv_shape_list(),
                  ")");
  TANGRAM_EXPECTS(kv_shape_supported(kv_dtype, head_dim),
                  invalid_argument,
                  who,
                  ": no CUDA kernel for kv.geometry.head_dim ",
                  head_dim,
                  " with kv dtype ",
                  to_string(kv_dtype),
                  " (compiled: ",
                  detail::kv_shape_list(),
                  ")");
}

/**
 * @brief The one runtime-to-compile-time dispatch point: calls `f(kv_shape<T, D>{})` for the
 * compiled shape of (`kv_dtype`, `head_dim`), the group left to run time.
 * @param who names the caller in the message, e.g. "evict_chunk"
 * @throw invalid_argument as expect_kv_shape when the kernels are not compiled for it; `f` is not
 *        called.
 */
template <class F>
void dispatch_kv_shape(dtype kv_dtype, std::int32_t head_dim, char const* who, F&& f) {
  expect_kv_shape(kv_dtype, head_dim, who);
  detail::dispatch_in<kv_shape_dtypes>(kv_dtype, [&](auto t) {
    using T = storage_t<decltype(t)::value>;
    detail::dispatch_in<kv_shape_head_dims>(head_dim,
                                            [&](auto d) { f(kv_shape<T, decltype(d)::value>{}); });
  });
}

/**
 * @brief The same dispatch with the GQA group made compile-time too: calls
 * `f(kv_shape<T, D, GB>{})` with GB the smallest compiled query-group bucket >= `group`.
 * @throw invalid_argument naming the field (`kv.geometry.kv_dtype`, `kv.geometry.head_dim` or
 *        `group`) and the value when the kernels are not compiled for it; `f` is not called.
 */
template <class F>
void dispatch_kv_shape(
    dtype kv_dtype, std::int32_t head_dim, std::int32_t group, char const* who, F&& f) {
  const std::int32_t bucket = kv_shape_query_bucket(group);
  TANGRAM_EXPECTS(bucket != 0,
                  invalid_argument,
                  who,
                  ": no CUDA kernel for group ",
                  group,
                  " (compiled query-group buckets: ",
                  detail::kv_shape_join(kv_shape_query_groups,
                                        [](std::int32_t b) { return std::to_string(b); }),
                  "; a group runs in the smallest bucket >= it)");
  dispatch_kv_shape(kv_dtype, head_dim, who, [&](auto shape) {
    using S = decltype(shape);
    detail::dispatch_in<kv_shape_query_groups>(bucket, [&](auto gb) {
      f(kv_shape<typename S::element_type, S::head_dim, decltype(gb)::value>{});
    });
  });
}

}  // namespace tangram
