// SPDX-License-Identifier: Apache-2.0
#include "tangram/core/kv_shape.hpp"

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "tangram/core/kv_view.hpp"
#include "test_support.hpp"

using namespace tangram;

// Compile time: the shape's constants, worked by hand for the brief's page (bf16, d = 128).
using brief_shape = kv_shape<bfloat16, 128>;
static_assert(brief_shape::kv_dtype == dtype::bf16);
static_assert(brief_shape::element_bytes == 2 && brief_shape::row_bytes == 256);
static_assert(brief_shape::token_bytes == 512 && brief_shape::vector_elements == 8);
static_assert(brief_shape::row_vectors == 16);
static_assert(brief_shape::page_bytes(4, 16) == 32768);  // the brief: 32 KiB pages
static_assert(brief_shape::query_group == dynamic_extent);
static_assert(kv_shape<float8_e5m2, 64, 8>::row_bytes == 64);
static_assert(kv_shape<float8_e5m2, 64, 8>::vector_elements == 16);
static_assert(kv_shape<float, 256, 2>::token_bytes == 2048);
static_assert(std::is_same_v<brief_shape::page_layout_type<4, 16>, page_layout<128, 4, 16>>);
static_assert(kv_shape_supported(dtype::fp8_e4m3, 256) && !kv_shape_supported(dtype::f16, 96));
static_assert(!kv_shape_supported(static_cast<dtype>(9)));
static_assert(kv_shape_query_bucket(3) == 4 && kv_shape_query_bucket(5) == 8);
static_assert(kv_shape_query_bucket(0) == 0 && kv_shape_query_bucket(9) == 0);

namespace {

struct kv_shape_seen {
  dtype kv_dtype            = dtype::f32;
  std::int32_t head_dim     = 0;
  std::int32_t query_group  = 0;
  std::int64_t element_size = 0;
  int calls                 = 0;
};

// Hand-worked: bytes per value of each dtype; the bucket each group 1..8 runs in.
std::int64_t kv_shape_bytes_of(dtype t) {
  return t == dtype::f32 ? 4 : (t == dtype::f16 || t == dtype::bf16) ? 2 : 1;
}
constexpr std::int32_t kv_shape_bucket_of[9] = {0, 1, 2, 4, 4, 8, 8, 8, 8};

// What dispatch_kv_shape(args..., "test", f) handed to f, and how often it called f.
template <class... Args>
kv_shape_seen kv_shape_dispatched(Args... args) {
  kv_shape_seen seen;
  dispatch_kv_shape(args..., "test", [&](auto shape) {
    using S = decltype(shape);
    seen    = {S::kv_dtype,
               S::head_dim,
               S::query_group,
               static_cast<std::int64_t>(sizeof(typename S::element_type)),
               seen.calls + 1};
  });
  return seen;
}

}  // namespace

TEST_CASE("dispatch_kv_shape: every compiled combination reaches its shape", "[kv_shape]") {
  int combinations = 0;
  for (dtype t : {dtype::f32, dtype::f16, dtype::bf16, dtype::fp8_e4m3, dtype::fp8_e5m2})
    for (std::int32_t d : {64, 128, 256}) {
      kv_shape_seen const seen = kv_shape_dispatched(t, d);
      CHECK(seen.calls == 1);
      CHECK(seen.kv_dtype == t);
      CHECK(seen.head_dim == d);
      CHECK(seen.query_group == dynamic_extent);
      CHECK(seen.element_size == kv_shape_bytes_of(t));
      for (std::int32_t group = 1; group <= 8; ++group) {
        kv_shape_seen const grouped = kv_shape_dispatched(t, d, group);
        CHECK(grouped.calls == 1);
        CHECK(grouped.kv_dtype == t);
        CHECK(grouped.head_dim == d);
        CHECK(grouped.query_group == kv_shape_bucket_of[group]);
        CHECK(grouped.element_size == kv_shape_bytes_of(t));
        ++combinations;
      }
    }
  CHECK(combinations == 5 * 3 * 8);
}

TEST_CASE("dispatch_kv_shape: refuses what is not compiled, naming the field",
          "[kv_shape][errors]") {
  int calls  = 0;
  auto count = [&](auto) { ++calls; };
  for (std::int32_t d : {0, 32, 96, 192, 512, -64}) {
    std::string const value = std::to_string(d);
    TANGRAM_REQUIRE_THROWS_WITH_ALL(
        dispatch_kv_shape(dtype::bf16, d, "evict_chunk", count),
        invalid_argument,
        std::string("evict_chunk"),
        "kv.geometry.head_dim " + value,
        std::string("bf16"),
        std::string("f32/f16/bf16/fp8_e4m3/fp8_e5m2 x head_dim 64/128/256"));
    TANGRAM_REQUIRE_THROWS_WITH_ALL(dispatch_kv_shape(dtype::f16, d, 2, "decode_attention", count),
                                    invalid_argument,
                                    std::string("decode_attention"),
                                    "kv.geometry.head_dim " + value);
  }
  for (std::int32_t group : {0, -1, 9, 16, 64}) {
    TANGRAM_REQUIRE_THROWS_WITH_ALL(
        dispatch_kv_shape(dtype::f32, 128, group, "decode_attention", count),
        invalid_argument,
        std::string("decode_attention"),
        "group " + std::to_string(group),
        std::string("1/2/4/8"));
  }
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      dispatch_kv_shape(static_cast<dtype>(9), 128, "prefill_attention", count),
      invalid_argument,
      "prefill_attention",
      "kv.geometry.kv_dtype",
      "code 9");
  CHECK(calls == 0);  // refused before any work
}

TEST_CASE("kv_shape: constants match page_layout and the view's addresses", "[kv_shape]") {
  for (dtype t : {dtype::f32, dtype::f16, dtype::bf16, dtype::fp8_e4m3, dtype::fp8_e5m2})
    for (std::int32_t d : {64, 128, 256})
      for (std::int32_t hp : {1, 4})
        dispatch_kv_shape(t, d, "test", [&](auto shape) {
          using S = decltype(shape);
          page_geometry const g{16, hp, d, t};
          auto const layout = S::template layout<dynamic_extent, 16>(g);
          CHECK(S::matches(g));
          CHECK(S::page_bytes(hp, 16) == g.page_bytes());
          CHECK(S::page_bytes(hp, 16) == layout.page_bytes());
          // One token further is one row further; V starts half a page in.
          CHECK((layout.element_offset(0, 0, 1) - layout.element_offset(0, 0, 0)) *
                    S::element_bytes ==
                S::row_bytes);
          CHECK(layout.element_offset(1, 0, 0) * S::element_bytes == g.page_bytes() / 2);
          // The view's addresses: tokens row_bytes apart, pages page_bytes apart.
          std::vector<std::byte> pool(static_cast<std::size_t>(2 * g.page_bytes()));
          kv_cache_view view;
          view.pool     = pool.data();
          view.geometry = g;
          using T       = typename S::element_type;
          auto* first   = reinterpret_cast<std::byte*>(view.element_ptr<T>({0, 0}, 0, 0));
          auto* next    = reinterpret_cast<std::byte*>(view.element_ptr<T>({0, 1}, 0, 0));
          auto* page1   = reinterpret_cast<std::byte*>(view.element_ptr<T>({1, 0}, 0, 0));
          CHECK(next - first == S::row_bytes);
          CHECK(page1 - first == S::page_bytes(hp, 16));
        });
  // The shape fixes the dtype and the head dim: a geometry of another refuses, naming the field.
  TANGRAM_REQUIRE_THROWS_WITH_ALL(brief_shape::layout(page_geometry{16, 4, 128, dtype::f16}),
                                  invalid_argument,
                                  "page_geometry.kv_dtype",
                                  "f16");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(brief_shape::layout(page_geometry{16, 4, 64, dtype::bf16}),
                                  invalid_argument,
                                  "head_dim",
                                  "64");
  CHECK_FALSE(brief_shape::matches(page_geometry{16, 4, 128, dtype::f16}));
}
