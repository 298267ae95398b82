// SPDX-License-Identifier: Apache-2.0
// CPU reference of chunked-prefill attention against hand-worked cases and a brute force written
// here: for every query, the list of keys it sees is materialised from sequence positions (held
// tokens of a ring at seq_tokens - len + i, chunk row u at seq_tokens + u; held tokens of growing
// heads are all in the past), and a dense softmax in double precision runs over it.
#include "tangram/reference/prefill_attention.hpp"

#include <cmath>
#include <random>
#include <vector>

#include "../gpu/prefill_cases.hpp"
#include "kv_test_cache.hpp"
#include "tangram/kernels/head_cursor.hpp"
#include "test_support.hpp"

using namespace tangram;
using tangram::test::prefill_case;
using tangram::test::prefill_scenario;
using tangram::test::test_cache;

namespace {

/// Brute force: o [rows * Hq * d] and natural-log lse [rows * Hq] of one layer, in double.
void brute_force(prefill_case const& c,
                 prefill_scenario& s,
                 std::int32_t layer,
                 std::vector<double>& o,
                 std::vector<double>& lse) {
  const std::int32_t d = c.d, H = c.heads, G = c.group, Hq = H * G;
  const std::int64_t rows = s.chunk_indptr.back();
  o.assign(static_cast<std::size_t>(rows * Hq * d), 0.0);
  lse.assign(static_cast<std::size_t>(rows * Hq), 0.0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  for (std::size_t r = 0; r < s.batch.size(); ++r) {
    const std::int32_t slot  = s.batch[r];
    const std::int64_t row0  = s.chunk_indptr[r];
    const std::int64_t chunk = s.chunk_indptr[r + 1] - row0;
    const std::int64_t seen  = s.cache.seq_tokens()[static_cast<std::size_t>(slot)];
    for (std::int32_t h = 0; h < H; ++h) {
      const std::int32_t grp = c.layers > 0 ? s.view.slot_of(layer, h).group : 0;
      const std::int64_t W   = s.cache.layout().group_window[static_cast<std::size_t>(grp)];
      const std::int64_t len = s.cache.len(slot, layer, h);
      auto const& hk         = s.cache.dense(0, slot, layer, h);
      auto const& hv         = s.cache.dense(1, slot, layer, h);
      for (std::int64_t t = 0; t < chunk; ++t) {
        const std::int64_t pos_q = seen + t;
        // The keys this query sees, as explicit (k, v) rows.
        std::vector<const float*> keys, values;
        for (std::int64_t i = 0; i < len; ++i) {
          bool visible = W == 0 || seen - len + i > pos_q - W;
          if (visible) {
            keys.push_back(hk.data() + i * d);
            values.push_back(hv.data() + i * d);
          }
        }
        for (std::int64_t u = 0; u <= t; ++u) {
          if (W > 0 && !(seen + u > pos_q - W)) continue;
          keys.push_back(s.kf.data() + ((row0 + u) * H + h) * d);
          values.push_back(s.vf.data() + ((row0 + u) * H + h) * d);
        }
        for (std::int32_t g = 0; g < G; ++g) {
          const std::int64_t qh = (row0 + t) * Hq + h * G + g;
          const float* q        = s.qf.data() + qh * d;
          std::vector<double> logit;
          double m = c.sinks ? s.sinks[static_cast<std::size_t>(h * G + g)] : -INFINITY;
          for (const float* k : keys) {
            double dot = 0;
            for (std::int32_t x = 0; x < d; ++x) dot += static_cast<double>(q[x]) * k[x];
            logit.push_back(dot * scale);
            m = std::max(m, logit.back());
          }
          double den = c.sinks ? std::exp(s.sinks[static_cast<std::size_t>(h * G + g)] - m) : 0;
          for (std::size_t i = 0; i < keys.size(); ++i) {
            double w = std::exp(logit[i] - m);
            den += w;
            for (std::int32_t x = 0; x < d; ++x)
              o[static_cast<std::size_t>(qh * d + x)] += w * values[i][x];
          }
          for (std::int32_t x = 0; x < d; ++x) o[static_cast<std::size_t>(qh * d + x)] /= den;
          lse[static_cast<std::size_t>(qh)] = m + std::log(den);
        }
      }
    }
  }
}

void run_case(prefill_case const& c) {
  INFO(c.describe());
  prefill_scenario s(c);
  const std::int64_t rows = s.chunk_indptr.back(), Hq = c.heads * c.group;
  const double tol = c.o_dtype == dtype::f32 ? 2e-5 : 1e-2;
  for (std::int32_t layer = 0; layer < c.layers; ++layer) {
    INFO("layer " << layer);
    prefill_params p = s.params(c, layer);
    std::vector<std::byte> o(static_cast<std::size_t>(std::max<std::int64_t>(rows * Hq * c.d, 1)) *
                             size_of(c.o_dtype));
    std::vector<float> lse(static_cast<std::size_t>(std::max<std::int64_t>(rows * Hq, 1)), 777.f);
    p.o   = o.data();
    p.lse = lse.data();
    reference::prefill_attention(p);
    std::vector<double> o_ref, lse_ref;
    brute_force(c, s, layer, o_ref, lse_ref);
    std::int64_t bad = 0;
    for (std::size_t i = 0; i < o_ref.size(); ++i) {
      double a =
          reference::detail::load_as_float(o.data(), c.o_dtype, static_cast<std::int64_t>(i));
      if (!(std::abs(a - o_ref[i]) <= tol * std::max(1.0, std::abs(o_ref[i])))) {
        if (bad++ < 3) FAIL_CHECK("o[" << i << "] = " << a << ", brute force " << o_ref[i]);
      }
    }
    for (std::size_t i = 0; i < lse_ref.size(); ++i)
      if (!(std::abs(lse[i] - lse_ref[i]) <= 1e-5 * std::max(1.0, std::abs(lse_ref[i])))) {
        if (bad++ < 6)
          FAIL_CHECK("lse[" << i << "] = " << lse[i] << ", brute force " << lse_ref[i]);
      }
    CHECK(bad == 0);
  }
}

/// One request, one KV head, d 4, P 4: layer 0 growing (holds 1 token), layer 1 a sliding window
/// W = 2 (seq_tokens 3: holds positions 1 and 2 in a 4-slot ring). Values set by hand.
struct hand_case {
  test_cache cache;
  kv_cache_view view;
  std::vector<float> q, k, v, o, lse;
  std::vector<std::int32_t> indptr = {0, 2};
  float sink                       = std::log(5.f);

  hand_case()
      : cache(test::adjacent_layout(page_geometry{4, 1, 4, dtype::f32}, 2, 1, {1}, 2, 1),
              {test::sequence_spec{3, 0, {1, 0}, 0}},
              1) {
    view = cache.view({0});
    // Held tokens: K rows (ln 3, 0, 0, 0); V of layer 0: e0; of layer 1: e0 (position 1), e3.
    const float ln3 = std::log(3.f);
    for (std::int32_t layer = 0; layer < 2; ++layer) {
      head_cursor cur = make_head_cursor(view, 0, layer, 0);
      REQUIRE(cur.len == (layer == 0 ? 1 : 2));
      for (std::int32_t i = 0; i < cur.len; ++i)
        for (std::int32_t x = 0; x < 4; ++x) {
          cur.k<float>(i)[x] = x == 0 ? ln3 : 0.f;
          cur.v<float>(i)[x] = x == (i == 0 ? 0 : 3) ? 1.f : 0.f;
        }
    }
    q = {1, 0, 0, 0, 1, 0, 0, 0};  // both rows
    k.assign(8, 0.f);              // chunk keys: logit 0
    v = {0, 1, 0, 0, 0, 0, 1, 0};  // chunk row 0: e1, row 1: e2
    o.assign(8, -1.f);
    lse.assign(2, -1.f);
  }
  prefill_params params(std::int32_t layer, bool with_sink) {
    prefill_params p;
    p.kv           = view;
    p.layer        = layer;
    p.chunk_indptr = indptr.data();
    p.max_chunk    = 2;
    p.q            = q.data();
    p.q_dtype = p.o_dtype = dtype::f32;
    p.chunk_k             = k.data();
    p.chunk_v             = v.data();
    p.o                   = o.data();
    p.lse                 = lse.data();
    p.sinks               = with_sink ? &sink : nullptr;
    p.sm_scale            = 1.f;
    return p;
  }
};

void check_row(std::vector<float> const& o,
               std::vector<float> const& lse,
               int row,
               std::vector<double> const& want,
               double want_lse) {
  INFO("row " << row);
  for (int x = 0; x < 4; ++x)
    CHECK(o[static_cast<std::size_t>(row * 4 + x)] ==
          Approx(want[static_cast<std::size_t>(x)]).margin(1e-6));
  CHECK(lse[static_cast<std::size_t>(row)] == Approx(want_lse).epsilon(1e-6));
}

}  // namespace

TEST_CASE("prefill reference: hand-worked growing head (held part + causal chunk)",
          "[reference][prefill]") {
  hand_case h;
  reference::prefill_attention(h.params(0, false));
  // Row 0 sees the held token (weight 3) and chunk row 0 (weight 1).
  check_row(h.o, h.lse, 0, {0.75, 0.25, 0, 0}, std::log(4.0));
  // Row 1 also sees chunk row 1: weights 3, 1, 1.
  check_row(h.o, h.lse, 1, {0.6, 0.2, 0.2, 0}, std::log(5.0));
}

TEST_CASE("prefill reference: hand-worked sink in the denominator", "[reference][prefill]") {
  hand_case h;
  reference::prefill_attention(h.params(0, true));  // e^z = 5
  check_row(h.o, h.lse, 0, {3.0 / 9, 1.0 / 9, 0, 0}, std::log(9.0));
  check_row(h.o, h.lse, 1, {0.3, 0.1, 0.1, 0}, std::log(10.0));
}

TEST_CASE("prefill reference: hand-worked sliding window (W = 2 over ring and chunk)",
          "[reference][prefill]") {
  hand_case h;
  reference::prefill_attention(h.params(1, false));
  // Row 0 (position 3) sees positions 2 (held, weight 3, e3) and 3 (chunk row 0, e1).
  check_row(h.o, h.lse, 0, {0, 0.25, 0, 0.75}, std::log(4.0));
  // Row 1 (position 4) sees only the chunk rows 0 and 1.
  check_row(h.o, h.lse, 1, {0, 0.5, 0.5, 0}, std::log(2.0));
}

TEST_CASE("prefill reference equals the brute force: GQA 1/4, P 1/16, sinks, sliding window",
          "[reference][prefill]") {
  for (auto const& c : test::prefill_cases_basic()) run_case(c);
}

TEST_CASE("prefill reference equals the brute force: dtypes x head dims", "[reference][prefill]") {
  for (auto const& c : test::prefill_cases_shapes()) run_case(c);
}

TEST_CASE("prefill reference equals the brute force: fp8 KV and a long chunk",
          "[reference][prefill]") {
  prefill_case c;
  c.kv_dtype = dtype::fp8_e4m3;
  c.lens     = {300, 12};
  c.chunks   = {130, 64};
  c.group    = 2;
  c.sinks    = true;
  c.seed     = 77;
  run_case(c);
}

TEST_CASE("prefill reference rejects bad parameters, naming the field and value",
          "[reference][prefill][errors]") {
  hand_case h;
  auto p  = h.params(0, false);
  p.group = 0;
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      reference::prefill_attention(p), invalid_argument, "prefill_params.group", "got 0");
  p           = h.params(0, false);
  p.max_chunk = -1;
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      reference::prefill_attention(p), invalid_argument, "prefill_params.max_chunk", "got -1");
  p           = h.params(0, false);
  p.max_chunk = 1;  // the chunk has 2 rows
  TANGRAM_REQUIRE_THROWS_WITH_ALL(reference::prefill_attention(p),
                                  invalid_argument,
                                  "prefill_params.chunk_indptr",
                                  "chunk of 2 rows",
                                  "max_chunk = 1");
  p          = h.params(0, false);
  p.q_stride = 3;
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      reference::prefill_attention(p), invalid_argument, "prefill_params.q_stride", "got 3");
  p         = h.params(0, false);
  p.chunk_v = nullptr;
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      reference::prefill_attention(p), invalid_argument, "prefill_params.chunk_k/chunk_v");
  p          = h.params(0, false);
  p.sm_scale = -1.f;
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      reference::prefill_attention(p), invalid_argument, "prefill_params.sm_scale");
  p           = h.params(0, false);
  p.max_chunk = 1 << 30;
  p.group     = 4;  // max_chunk * group overflows int32
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      reference::prefill_attention(p), invalid_argument, "max_chunk * group", "overflows");
  p                                   = h.params(0, false);
  std::vector<std::int32_t> bad_start = {1, 2};
  p.chunk_indptr                      = bad_start.data();
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      reference::prefill_attention(p), invalid_argument, "chunk_indptr[0]", "got 1");
}

TEST_CASE("prefill visibility: the first key is the smallest visible one and grows with the row",
          "[reference][prefill]") {
  for (std::int64_t W : {0, 1, 2, 5, 40})
    for (std::int64_t len : {0, 1, 3, 39, 40})
      for (std::int64_t t = 0; t < 50; ++t) {
        INFO("W " << W << " len " << len << " t " << t);
        std::int64_t first = prefill_first_key(t, len, W);
        CHECK(prefill_visible(first, t, len, W));
        if (first > 0) CHECK_FALSE(prefill_visible(first - 1, t, len, W));
        CHECK(prefill_visible(len + t, t, len, W));  // a row always sees its own token
        CHECK_FALSE(prefill_visible(len + t + 1, t, len, W));
        CHECK(prefill_first_key(t + 1, len, W) >= first);
        std::int64_t seen = 0;  // visible keys: all of [first, len + t]
        for (std::int64_t k = 0; k <= len + t + 1; ++k) seen += prefill_visible(k, t, len, W);
        CHECK(seen == len + t + 1 - first);
        if (W > 0) CHECK(seen == std::min<std::int64_t>(W, len + t + 1));
      }
  CHECK(prefill_query_tiles(0, 4) == 0);
  CHECK(prefill_query_tiles(1, 1) == 1);
  CHECK(prefill_query_tiles(4, 4) == 1);
  CHECK(prefill_query_tiles(5, 4) == 2);
}
