// SPDX-License-Identifier: Apache-2.0
// fp8 K/V scales (kernels/kv_scales.hpp) in the CPU references, worked by hand: the append
// stores the fp8 encoding of x / s (saturating), decode and prefill read stored * s for K and V
// apart, per tensor or per KV head; and the host validation names the field and the value.
#include "tangram/kernels/kv_scales.hpp"

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "kv_test_cache.hpp"
#include "tangram/reference/append.hpp"
#include "tangram/reference/decode_attention.hpp"
#include "tangram/reference/prefill_attention.hpp"
#include "test_support.hpp"

using namespace tangram;

namespace {

constexpr std::int32_t d = 4;

/// One sequence over one layer of `heads` KV heads (head dim 4) holding `held` tokens.
test::test_cache one_sequence(dtype t, std::int32_t heads, std::int32_t held) {
  test::sequence_spec s;
  s.seq_tokens = held;
  s.appended   = held;
  s.base_len.assign(static_cast<std::size_t>(heads), 0);
  s.reserve = 1;  // a page even when nothing is held (the view's page table must not be empty)
  return test::test_cache(test::adjacent_layout(page_geometry{16, 2, d, t}, 1, heads), {s}, 5);
}

/// The bytes of token 0's K (kv 0) or V (kv 1) row of head h.
std::vector<std::uint8_t> row_bytes(kv_cache_view const& view, std::int32_t h, std::int32_t kv) {
  head_cursor c          = make_head_cursor(view, 0, 0, h);
  const std::uint8_t* at = c.ptr_at_position<std::uint8_t>(c.position(0), kv);
  return {at, at + d};
}

void set_row_bytes(kv_cache_view const& view,
                   std::int32_t h,
                   std::int32_t kv,
                   std::vector<std::uint8_t> const& bytes) {
  head_cursor c    = make_head_cursor(view, 0, 0, h);
  std::uint8_t* at = c.ptr_at_position<std::uint8_t>(c.position(0), kv);
  for (std::int32_t x = 0; x < d; ++x) at[x] = bytes[static_cast<std::size_t>(x)];
}

using bytes = std::vector<std::uint8_t>;

}  // namespace

TEST_CASE("append stores the fp8 encoding of x / s, saturating, per tensor", "[append][scales]") {
  auto cache = one_sequence(dtype::fp8_e4m3, 2, 1);
  auto view  = cache.view({0});
  // Head 0 then head 1 (rows of H * d).
  std::vector<float> k = {1.f, -1.f, 1000.f, 0.0015f, 3.f, 0.f, 0.f, 0.f};
  std::vector<float> v = {3.f, 1000.f, -2000.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  const float sk = 0.5f, sv = 4.f;
  append_params p;
  p.kv        = view;
  p.k         = k.data();
  p.v         = v.data();
  p.src_dtype = dtype::f32;
  p.scales    = {&sk, &sv, 1};
  reference::append_decode_kv(p);
  // e4m3 (bias 7): K / 0.5 = 2 -> 0 1000 000; -2 -> 1 1000 000; 2000 saturates to 448 =
  // 1.75 * 2^8 -> 0 1111 110; 0.003 is a subnormal: 0.003 / 2^-9 = 1.54 -> mantissa 010.
  CHECK(row_bytes(view, 0, 0) == bytes{0x40, 0xC0, 0x7E, 0x02});
  // V / 4: 0.75 = 1.5 * 2^-1 -> 0 0110 100; 250 rounds to 256 (steps of 16 in [128, 256)) ->
  // 0 1111 000; -500 saturates to -448 -> 1 1111 110; 0 -> 0.
  CHECK(row_bytes(view, 0, 1) == bytes{0x34, 0x78, 0xFE, 0x00});
  // Head 1: K 3 / 0.5 = 6 = 1.5 * 2^2 -> 0 1001 100.
  CHECK(row_bytes(view, 1, 0) == bytes{0x4C, 0x00, 0x00, 0x00});
  // The same K without a scale: 1 -> 0 0111 000, 1000 saturates to 448, and 0.0015 / 2^-9 =
  // 0.77 -> mantissa 001 (half the precision the scale kept).
  p.scales = {};
  reference::append_decode_kv(p);
  CHECK(row_bytes(view, 0, 0) == bytes{0x38, 0xB8, 0x7E, 0x01});
}

TEST_CASE("append stores the fp8 encoding of x / s_h per KV head, K and V apart",
          "[append][scales]") {
  auto cache            = one_sequence(dtype::fp8_e5m2, 2, 1);
  auto view             = cache.view({0});
  std::vector<float> k  = {1.f, 0.f, 0.f, 0.f, 1.f, 0.f, 0.f, 0.f};
  std::vector<float> v  = {3.f, 0.f, 0.f, 0.f, 3e5f, 0.f, 0.f, 0.f};
  std::vector<float> sk = {0.5f, 8.f}, sv = {2.f, 1024.f};
  append_params p;
  p.kv        = view;
  p.k         = k.data();
  p.v         = v.data();
  p.src_dtype = dtype::f32;
  p.scales    = {sk.data(), sv.data(), 2};
  reference::append_decode_kv(p);
  // e5m2 (bias 15): head 0 K 1 / 0.5 = 2 -> 0 10000 00; head 1 K 1 / 8 = 2^-3 -> 0 01100 00.
  CHECK(row_bytes(view, 0, 0)[0] == 0x40);
  CHECK(row_bytes(view, 1, 0)[0] == 0x30);
  // Head 0 V 3 / 2 = 1.5 -> 0 01111 10; head 1 V 3e5 / 1024 = 292.97 rounds to 320 (steps of
  // 64 in [256, 512)) = 1.25 * 2^8 -> 0 10111 01 (without the scale it would saturate).
  CHECK(row_bytes(view, 0, 1)[0] == 0x3E);
  CHECK(row_bytes(view, 1, 1)[0] == 0x5D);
}

TEST_CASE("decode and prefill read stored fp8 times the head's scale, K and V apart",
          "[decode][prefill][scales]") {
  // e4m3 bytes: K 0x40 = 2 in dim 0; V 0x34 = 0.75, 0x40 = 2, 0xC0 = -2, 0.
  const bytes k_row = {0x40, 0x00, 0x00, 0x00}, v_row = {0x34, 0x40, 0xC0, 0x00};
  std::vector<float> sk = {3.f, 0.25f}, sv = {4.f, 10.f};
  std::vector<float> q = {1.f, 0.f, 0.f, 0.f, 1.f, 0.f, 0.f, 0.f};  // [H][d], group 1
  // One token: o = s_v * V, lse = logit = sm_scale * q . (s_k * K) = 1 * 2 * s_k.
  const std::vector<float> o_want   = {3.f, 8.f, -8.f, 0.f, 7.5f, 20.f, -20.f, 0.f};
  const std::vector<float> lse_want = {6.f, 0.5f};

  SECTION("decode over one held token") {
    auto cache = one_sequence(dtype::fp8_e4m3, 2, 1);
    auto view  = cache.view({0});
    for (std::int32_t h = 0; h < 2; ++h) {
      set_row_bytes(view, h, 0, k_row);
      set_row_bytes(view, h, 1, v_row);
    }
    std::vector<float> o(8), lse(2);
    decode_params p;
    p.kv       = view;
    p.q        = q.data();
    p.q_dtype  = dtype::f32;
    p.o        = o.data();
    p.o_dtype  = dtype::f32;
    p.lse      = lse.data();
    p.sm_scale = 1.f;
    p.scales   = {sk.data(), sv.data(), 2};
    reference::decode_attention(p, reference::split_mode::unsplit);
    CHECK(o == o_want);
    CHECK(lse[0] == Approx(lse_want[0]));
    CHECK(lse[1] == Approx(lse_want[1]));
    // Per tensor: head 1 reads head 0's scales.
    p.scales = {sk.data(), sv.data(), 1};
    reference::decode_attention(p, reference::split_mode::unsplit);
    CHECK(o == std::vector<float>{3.f, 8.f, -8.f, 0.f, 3.f, 8.f, -8.f, 0.f});
    CHECK(lse[0] == Approx(6.f));
    CHECK(lse[1] == Approx(6.f));
  }

  SECTION("prefill over a one-row chunk") {
    auto cache = one_sequence(dtype::fp8_e4m3, 2, 0);
    std::vector<std::uint8_t> chunk_k, chunk_v;  // [1 row][H][d]
    for (std::int32_t h = 0; h < 2; ++h) {
      chunk_k.insert(chunk_k.end(), k_row.begin(), k_row.end());
      chunk_v.insert(chunk_v.end(), v_row.begin(), v_row.end());
    }
    std::vector<std::int32_t> indptr = {0, 1};
    std::vector<float> o(8), lse(2);
    prefill_params p;
    p.kv           = cache.view({0});
    p.chunk_indptr = indptr.data();
    p.max_chunk    = 1;
    p.q            = q.data();
    p.q_dtype      = dtype::f32;
    p.chunk_k      = chunk_k.data();
    p.chunk_v      = chunk_v.data();
    p.o            = o.data();
    p.o_dtype      = dtype::f32;
    p.lse          = lse.data();
    p.sm_scale     = 1.f;
    p.scales       = {sk.data(), sv.data(), 2};
    reference::prefill_attention(p);
    CHECK(o == o_want);
    CHECK(lse[0] == Approx(lse_want[0]));
    CHECK(lse[1] == Approx(lse_want[1]));
  }
}

TEST_CASE("kv_scales are validated naming the field and the value", "[scales][errors]") {
  auto cache = one_sequence(dtype::fp8_e4m3, 8, 1);
  auto bf16  = one_sequence(dtype::bf16, 8, 1);
  auto view  = cache.view({0});
  auto bview = bf16.view({0});
  std::vector<float> ones(8, 1.f), q(8 * d, 0.f), o(8 * d), kv_row(8 * d, 0.f);
  std::vector<std::int32_t> indptr = {0, 0};
  std::vector<std::uint8_t> chunk(8 * d);

  // Runs each reference with `s` on `v`; returns nothing, throws what validation throws.
  auto decode = [&](kv_cache_view const& v, kv_scales s) {
    decode_params p;
    p.kv      = v;
    p.q       = q.data();
    p.q_dtype = p.o_dtype = dtype::f32;
    p.o                   = o.data();
    p.scales              = s;
    reference::decode_attention(p, reference::split_mode::unsplit);
  };
  auto append = [&](kv_cache_view const& v, kv_scales s) {
    append_params p;
    p.kv = v;
    p.k = p.v   = kv_row.data();
    p.src_dtype = dtype::f32;
    p.scales    = s;
    reference::append_decode_kv(p);
  };
  auto prefill = [&](kv_cache_view const& v, kv_scales s) {
    prefill_params p;
    p.kv           = v;
    p.chunk_indptr = indptr.data();
    p.q            = q.data();
    p.q_dtype = p.o_dtype = dtype::f32;
    p.chunk_k = p.chunk_v = chunk.data();
    p.o                   = o.data();
    p.scales              = s;
    reference::prefill_attention(p);
  };

  CHECK_NOTHROW(decode(view, {ones.data(), ones.data(), 8}));
  CHECK_NOTHROW(decode(view, {ones.data(), ones.data(), 1}));
  CHECK_NOTHROW(decode(view, {}));
  CHECK_NOTHROW(decode(bview, {}));
  CHECK_NOTHROW(append(view, {ones.data(), ones.data(), 8}));
  CHECK_NOTHROW(prefill(view, {ones.data(), ones.data(), 8}));

  // count 2 with 8 KV heads
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      decode(view, {ones.data(), ones.data(), 2}),
      invalid_argument,
      "decode_params.scales.count: must be 0, 1 or num_kv_heads (8), got 2");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      append(view, {ones.data(), ones.data(), 2}),
      invalid_argument,
      "append_params.scales.count: must be 0, 1 or num_kv_heads (8), got 2");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      prefill(view, {ones.data(), ones.data(), -1}),
      invalid_argument,
      "prefill_params.scales.count: must be 0, 1 or num_kv_heads (8), got -1");
  // null arrays with count > 0
  TANGRAM_REQUIRE_THROWS_WITH_ALL(decode(view, {nullptr, ones.data(), 8}),
                                  invalid_argument,
                                  "decode_params.scales.k: null with count 8");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(append(view, {ones.data(), nullptr, 1}),
                                  invalid_argument,
                                  "append_params.scales.v: null with count 1");
  // scales with a non-fp8 KV dtype
  TANGRAM_REQUIRE_THROWS_WITH_ALL(decode(bview, {ones.data(), ones.data(), 1}),
                                  invalid_argument,
                                  "decode_params.scales: only for fp8 KV dtypes, kv dtype is bf16");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      prefill(bview, {ones.data(), ones.data(), 8}),
      invalid_argument,
      "prefill_params.scales: only for fp8 KV dtypes, kv dtype is bf16");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(append(bview, {ones.data(), ones.data(), 8}),
                                  invalid_argument,
                                  "append_params.scales: only for fp8 KV dtypes, kv dtype is bf16");
  // values (the references read them; the launchers cannot)
  std::vector<float> bad = ones;
  bad[3]                 = 0.f;
  TANGRAM_REQUIRE_THROWS_WITH_ALL(decode(view, {bad.data(), ones.data(), 8}),
                                  invalid_argument,
                                  "decode_params.scales.k[3]: must be finite and > 0, got 0");
  bad[3] = -2.f;
  TANGRAM_REQUIRE_THROWS_WITH_ALL(append(view, {ones.data(), bad.data(), 8}),
                                  invalid_argument,
                                  "append_params.scales.v[3]: must be finite and > 0, got -2");
  bad[3] = std::numeric_limits<float>::infinity();
  TANGRAM_REQUIRE_THROWS_WITH_ALL(prefill(view, {bad.data(), ones.data(), 8}),
                                  invalid_argument,
                                  "prefill_params.scales.k[3]: must be finite and > 0, got inf");
  bad[3] = std::numeric_limits<float>::quiet_NaN();
  TANGRAM_REQUIRE_THROWS_WITH_ALL(decode(view, {ones.data(), bad.data(), 8}),
                                  invalid_argument,
                                  "decode_params.scales.v[3]: must be finite and > 0, got nan");
}
