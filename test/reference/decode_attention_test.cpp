// SPDX-License-Identifier: Apache-2.0
// CPU reference of ragged paged decode attention against a dense (non-paged) softmax attention
// computed here in double precision over the same held tokens.
#include "tangram/reference/decode_attention.hpp"

#include <cmath>
#include <random>
#include <vector>

#include "kv_test_cache.hpp"
#include "tangram/kernels/head_cursor.hpp"
#include "tangram/plan/split_planner.hpp"
#include "test_support.hpp"

using namespace tangram;
using tangram::test::test_cache;

namespace {

struct decode_case {
  dtype kv_dtype      = dtype::f32;
  std::int32_t d      = 64;
  std::int32_t P      = 16;
  std::int32_t Hp     = 2;
  std::int32_t group  = 1;
  std::int32_t layers = 2;
  std::int32_t heads  = 4;
  std::vector<std::int32_t> lens;     ///< nominal length per request (head 0 holds exactly it)
  std::vector<std::int32_t> sliding;  ///< sliding-window layers
  std::int32_t window = 40, ring_pages = 4;
  bool sinks                    = false;
  std::int32_t appended         = 0;  ///< decode tokens of every sequence
  int split_maps                = 3;
  std::int32_t invariant_pieces = 0;  ///< decode_params::invariant_pieces of the split paths
  std::uint64_t seed            = 1;
};

/// Split map views with random shares (at least one CTA per head), N_CTA from H to H + 400.
struct random_split_map {
  std::vector<std::int32_t> begin;
  split_map_view view{};
  random_split_map(std::int32_t L, std::int32_t H, std::mt19937_64& rng) {
    std::int32_t n_cta = std::uniform_int_distribution<std::int32_t>(H, H + 400)(rng);
    begin              = test::random_cta_begin(L, H, n_cta, rng);
    view               = {L, H, n_cta, begin.data()};
  }
};

/// Dense softmax attention in double: o [G * d] and natural-log lse [G] of one (request, KV head).
void dense_attention(std::vector<float> const& k,
                     std::vector<float> const& v,
                     std::int32_t n,
                     std::vector<float> const& q,
                     std::int32_t G,
                     std::int32_t d,
                     double scale,
                     const float* sinks,
                     std::vector<double>& o,
                     std::vector<double>& lse) {
  o.assign(static_cast<std::size_t>(G * d), 0.0);
  lse.assign(static_cast<std::size_t>(G), 0.0);
  for (std::int32_t g = 0; g < G; ++g) {
    std::vector<double> logit(static_cast<std::size_t>(n));
    double m = sinks ? sinks[g] : -INFINITY;
    for (std::int32_t i = 0; i < n; ++i) {
      double dot = 0;
      for (std::int32_t x = 0; x < d; ++x)
        dot += static_cast<double>(q[static_cast<std::size_t>(g * d + x)]) *
               k[static_cast<std::size_t>(i * d + x)];
      logit[static_cast<std::size_t>(i)] = dot * scale;
      m                                  = std::max(m, logit[static_cast<std::size_t>(i)]);
    }
    if (n == 0 && !sinks) {
      lse[static_cast<std::size_t>(g)] = -INFINITY;
      continue;
    }
    double den = sinks ? std::exp(sinks[g] - m) : 0.0;
    for (std::int32_t i = 0; i < n; ++i) {
      double p = std::exp(logit[static_cast<std::size_t>(i)] - m);
      den += p;
      for (std::int32_t x = 0; x < d; ++x)
        o[static_cast<std::size_t>(g * d + x)] += p * v[static_cast<std::size_t>(i * d + x)];
    }
    for (std::int32_t x = 0; x < d; ++x) o[static_cast<std::size_t>(g * d + x)] /= den;
    lse[static_cast<std::size_t>(g)] = m + std::log(den);
  }
}

void run_case(decode_case const& c) {
  INFO("dtype " << to_string(c.kv_dtype) << " d " << c.d << " P " << c.P << " group " << c.group
                << " seed " << c.seed);
  std::mt19937_64 rng(c.seed);
  page_geometry geo{c.P, c.Hp, c.d, c.kv_dtype};
  auto layout = test::adjacent_layout(geo, c.layers, c.heads, c.sliding, c.window, c.ring_pages);
  std::vector<std::int32_t> appended, seq_tokens;
  for (std::size_t r = 0; r < c.lens.size(); ++r) {
    appended.push_back(std::min(c.appended, c.lens[r]));
    seq_tokens.push_back(c.lens[r] + 7 * static_cast<std::int32_t>(r) + 50);  // rings wrap
  }
  auto seqs = test::ragged_sequences(c.lens, appended, seq_tokens, c.layers, c.heads, rng);
  test_cache cache(layout, seqs, c.seed * 7 + 1);
  std::vector<std::int32_t> batch(c.lens.size());
  std::iota(batch.begin(), batch.end(), 0);
  std::shuffle(batch.begin(), batch.end(), rng);  // requests in any slot order
  auto kv = cache.view(batch);

  std::int32_t B = kv.batch_size, Hq = c.heads * c.group, d = c.d;
  std::vector<float> q(static_cast<std::size_t>(B * Hq * d)), sinks(static_cast<std::size_t>(Hq));
  for (auto& x : q) x = std::uniform_real_distribution<float>(-3.f, 3.f)(rng);
  for (auto& x : sinks) x = std::uniform_real_distribution<float>(-2.f, 4.f)(rng);
  double tol = c.kv_dtype == dtype::f32 ? 1e-5 : 1e-3;

  for (std::int32_t layer = 0; layer < c.layers; ++layer) {
    decode_params p;
    p.kv      = kv;
    p.layer   = layer;
    p.group   = c.group;
    p.q       = q.data();
    p.q_dtype = dtype::f32;
    p.o_dtype = dtype::f32;
    p.sinks   = c.sinks ? sinks.data() : nullptr;
    std::vector<float> o_unsplit(q.size()), lse_unsplit(static_cast<std::size_t>(B * Hq));
    p.o   = o_unsplit.data();
    p.lse = lse_unsplit.data();
    reference::decode_attention(p, reference::split_mode::unsplit);

    // Against the dense reference.
    std::vector<double> o_ref, lse_ref;
    for (std::int32_t r = 0; r < B; ++r)
      for (std::int32_t h = 0; h < c.heads; ++h) {
        std::int32_t s = batch[static_cast<std::size_t>(r)];
        std::int32_t n = cache.len(s, layer, h);
        REQUIRE(kv.head_len(r, layer, h) == n);
        std::vector<float> qh(q.begin() + (r * Hq + h * c.group) * d,
                              q.begin() + (r * Hq + (h + 1) * c.group) * d);
        dense_attention(cache.dense(0, s, layer, h),
                        cache.dense(1, s, layer, h),
                        n,
                        qh,
                        c.group,
                        d,
                        1.0 / std::sqrt(static_cast<double>(d)),
                        c.sinks ? sinks.data() + h * c.group : nullptr,
                        o_ref,
                        lse_ref);
        for (std::int32_t g = 0; g < c.group; ++g) {
          INFO("request " << r << " layer " << layer << " head " << h << " g " << g << " len "
                          << n);
          for (std::int32_t x = 0; x < d; ++x)
            REQUIRE(
                std::abs(o_unsplit[static_cast<std::size_t>((r * Hq + h * c.group + g) * d + x)] -
                         o_ref[static_cast<std::size_t>(g * d + x)]) <= tol);
          double lr = lse_ref[static_cast<std::size_t>(g)];
          float lu  = lse_unsplit[static_cast<std::size_t>(r * Hq + h * c.group + g)];
          if (std::isinf(lr))
            REQUIRE(lu == -INFINITY);
          else
            REQUIRE(std::abs(lu - lr) <= 1e-4 * std::max(1.0, std::abs(lr)));
        }
      }

    // Split paths equal the unsplit one (and hence the dense reference).
    // Random per-head maps, then layer streams of 1 CTA, 3 and H + 5 (crossing head bounds).
    for (int m = 0; m < c.split_maps + 3; ++m) {
      random_split_map map(c.layers, c.heads, rng);
      if (m >= c.split_maps)
        map.view = layer_stream_split(c.layers,
                                      c.heads,
                                      m == c.split_maps       ? 1
                                      : m == c.split_maps + 1 ? 3
                                                              : c.heads + 5);
      p.splits           = map.view;
      p.invariant_pieces = c.invariant_pieces;
      std::vector<float> o_split(q.size()), lse_split(lse_unsplit.size());
      p.o   = o_split.data();
      p.lse = lse_split.data();
      reference::decode_attention(p, reference::split_mode::split);
      INFO("N_CTA " << map.view.num_ctas << " layer " << layer);
      for (std::size_t i = 0; i < o_split.size(); ++i)
        REQUIRE(std::abs(o_split[i] - o_unsplit[i]) <= 1e-5);
      for (std::size_t i = 0; i < lse_split.size(); ++i)
        REQUIRE(
            (lse_split[i] == lse_unsplit[i] || std::abs(lse_split[i] - lse_unsplit[i]) <=
                                                   1e-4 * std::max(1.f, std::abs(lse_unsplit[i]))));
    }
  }
}

}  // namespace

TEST_CASE("head_cursor resolves exactly what kv_cache_view::locate does", "[decode][cursor]") {
  page_geometry geo{8, 2, 64, dtype::bf16};
  auto layout = test::adjacent_layout(geo, 2, 4, {1}, 21, 3);
  std::vector<test::sequence_spec> seqs;
  for (std::int32_t n : {5, 23, 100}) {
    test::sequence_spec s;
    s.seq_tokens = n;
    s.appended   = 2;
    for (int i = 0; i < 8; ++i) s.base_len.push_back(n / (1 + i % 3));
    seqs.push_back(s);
  }
  test_cache cache(layout, seqs, 3);
  auto kv = cache.view({2, 0, 1});
  for (std::int32_t r = 0; r < 3; ++r)
    for (std::int32_t l = 0; l < 2; ++l)
      for (std::int32_t h = 0; h < 4; ++h) {
        auto cur = make_head_cursor(kv, r, l, h);
        REQUIRE(cur.len == kv.head_len(r, l, h));
        for (std::int32_t i = 0; i < cur.len; ++i) {
          auto a = cur.locate(i);
          auto b = kv.locate(r, l, h, i);
          REQUIRE(a.page == b.page);
          REQUIRE(a.token == b.token);
          REQUIRE(cur.k<bfloat16>(i) == kv.element_ptr<bfloat16>(b, kv.slot_of(l, h).column, 0));
          REQUIRE(cur.v<bfloat16>(i) == kv.element_ptr<bfloat16>(b, kv.slot_of(l, h).column, 1));
        }
      }
}

TEST_CASE("split pieces cover each request once, in CTA order", "[decode][split]") {
  std::mt19937_64 rng(11);
  for (int t = 0; t < 400; ++t) {
    std::int64_t share = 1 + static_cast<std::int64_t>(rng() % 40);
    std::vector<std::int64_t> len(1 + rng() % 12);
    for (auto& x : len) x = static_cast<std::int64_t>(rng() % (t % 2 ? 7 : 3000));
    std::int64_t total = std::accumulate(len.begin(), len.end(), std::int64_t{0});
    std::int64_t pre   = 0;
    for (auto n : len) {
      if (n > 0) {
        auto span         = request_ctas(pre, n, share, total);
        std::int64_t next = 0;
        for (auto j = span.first; j <= span.last; ++j) {
          auto piece = piece_of(j, share, total, pre, n);
          if (piece.empty()) continue;
          REQUIRE(piece.begin == next);  // contiguous, in order
          next = piece.end;
        }
        REQUIRE(next == n);
        // CTAs outside the span never reach the request.
        if (span.first > 0) REQUIRE(piece_of(span.first - 1, share, total, pre, n).empty());
        if (span.last + 1 < share) REQUIRE(piece_of(span.last + 1, share, total, pre, n).empty());
        CHECK(span.single() == (piece_of(span.first, share, total, pre, n).end == n));
      }
      pre += n;
    }
  }
}

TEST_CASE("layer-stream pieces: every token once, unique slots, CTAs within one token",
          "[decode][split][layer_stream]") {
  // The kernels' index math over a layer stream, enumerated per CTA as the split kernels walk it
  // (heads in order, each head's requests in batch order), against the layer's tokens.
  std::mt19937_64 rng(29);
  for (int t = 0; t < 300; ++t) {
    const auto H = static_cast<std::int32_t>(1 + rng() % 9);
    const auto B = static_cast<std::int32_t>(1 + rng() % 12);
    const auto N = static_cast<std::int32_t>(1 + rng() % (t % 3 == 0 ? 4 : 300));
    std::vector<std::int64_t> len(static_cast<std::size_t>(H * B));  // [h][r]
    for (auto& x : len)
      x = rng() % 4 == 0 ? 0 : static_cast<std::int64_t>(rng() % (t % 2 ? 9 : 700));
    const split_map_view map = layer_stream_split(1, H, N);
    std::int64_t W           = std::accumulate(len.begin(), len.end(), std::int64_t{0});
    std::vector<int> slot_used(static_cast<std::size_t>(map.partial_slots(B)), 0);
    std::vector<std::int64_t> covered(len.size(), 0);
    std::int64_t fullest = 0;
    for (std::int32_t j = 0; j < N; ++j) {
      std::int64_t mine = 0, pre = 0;
      for (std::int32_t h = 0; h < H; ++h)
        for (std::int32_t r = 0; r < B; ++r) {
          const std::int64_t n     = len[static_cast<std::size_t>(h * B + r)];
          const stream_range piece = piece_of(j, map.head_ctas(0, h), W, pre, n);
          if (n > 0 && !piece.empty()) {
            const std::int64_t slot = map.partial_slot(0, h, j, r, B);
            REQUIRE(slot >= 0);
            REQUIRE(slot < map.partial_slots(B));
            REQUIRE(slot_used[static_cast<std::size_t>(slot)]++ == 0);
            REQUIRE(piece.begin == covered[static_cast<std::size_t>(h * B + r)]);  // in order
            covered[static_cast<std::size_t>(h * B + r)] = piece.end;
            mine += piece.end - piece.begin;
            // The merge finds this CTA among the request's span.
            const cta_span span = request_ctas(pre, n, map.head_ctas(0, h), W);
            REQUIRE(span.first <= j);
            REQUIRE(j <= span.last);
          }
          pre += n;
        }
      fullest = std::max(fullest, mine);
    }
    INFO("H " << H << " B " << B << " N " << N << " W " << W);
    for (std::size_t i = 0; i < len.size(); ++i) REQUIRE(covered[i] == len[i]);
    REQUIRE(fullest <= (W + N - 1) / N);  // whatever the heads' lengths
  }
}

TEST_CASE("decode reference equals dense attention: every GQA ratio 1..8", "[decode]") {
  for (std::int32_t g = 1; g <= 8; ++g) {
    decode_case c;
    c.group    = g;
    c.lens     = {1, 15, 54, 97, 1000};
    c.sliding  = {1};
    c.sinks    = g % 2 == 1;
    c.appended = g % 3;
    c.seed     = 100 + static_cast<std::uint64_t>(g);
    run_case(c);
  }
}

TEST_CASE("decode reference equals dense attention: page sizes 1, 8, 16, 32", "[decode]") {
  for (std::int32_t P : {1, 8, 16, 32}) {
    decode_case c;
    c.kv_dtype   = dtype::bf16;
    c.d          = 128;
    c.P          = P;
    c.Hp         = 4;
    c.group      = 4;
    c.lens       = {97, 1, 54, 15, 1000};
    c.sliding    = {0};
    c.window     = 33;
    c.ring_pages = (33 + P - 1) / P + 1;
    c.seed       = 200 + static_cast<std::uint64_t>(P);
    run_case(c);
  }
}

TEST_CASE("decode reference equals dense attention: head dims and dtypes", "[decode]") {
  std::uint64_t seed = 300;
  for (dtype t : {dtype::f32, dtype::f16, dtype::bf16})
    for (std::int32_t d : {64, 128, 256}) {
      decode_case c;
      c.kv_dtype = t;
      c.d        = d;
      c.group    = d == 128 ? 7 : 5;
      c.heads    = 2;
      c.Hp       = 1;
      c.lens     = {54, 15, 97};
      c.sinks    = d == 64;
      c.seed     = ++seed;
      run_case(c);
    }
}

TEST_CASE("decode reference equals dense attention: batch-invariant pieces, K 1..64",
          "[decode][invariant]") {
  std::uint64_t seed = 450;
  for (std::int32_t K : {1, 3, 16, decode_max_invariant_pieces}) {
    decode_case c;
    c.kv_dtype         = K % 2 ? dtype::bf16 : dtype::f32;
    c.group            = K == 3 ? 4 : 2;
    c.lens             = {1, 255, 256, 257, 3000, 9001};
    c.sliding          = {1};
    c.sinks            = K != 16;
    c.invariant_pieces = K;
    c.split_maps       = 2;
    c.seed             = seed++;
    run_case(c);
  }
}

TEST_CASE("batch-invariant piece sizes: hand-worked values and bounds", "[decode][invariant]") {
  // ceil(len / K) rounded up to 64 tokens, at least 256.
  CHECK(invariant_piece_tokens(1, 16) == 256);
  CHECK(invariant_piece_count(1, 16) == 1);
  CHECK(invariant_piece_count(0, 16) == 0);
  CHECK(invariant_piece_tokens(257, 64) == 256);
  CHECK(invariant_piece_count(257, 64) == 2);
  CHECK(invariant_piece_tokens(9001, 16) == 576);  // ceil(9001 / 16) = 563 -> 576
  CHECK(invariant_piece_count(9001, 16) == 16);    // 15 * 576 = 8640 < 9001
  CHECK(invariant_piece_tokens(9001, 3) == 3008);  // 3001 -> 3008
  CHECK(invariant_piece_count(9001, 3) == 3);
  CHECK(invariant_piece_tokens(100000, 1) == 100032);
  CHECK(invariant_piece_count(100000, 1) == 1);
  std::mt19937_64 rng(5);
  for (int t = 0; t < 20000; ++t) {
    const std::int64_t len  = static_cast<std::int64_t>(rng() % (t % 2 ? 600 : 3000000));
    const auto K            = static_cast<std::int32_t>(1 + rng() % decode_max_invariant_pieces);
    const std::int64_t size = invariant_piece_tokens(len, K), n = invariant_piece_count(len, K);
    INFO("len " << len << " K " << K);
    REQUIRE(size % decode_invariant_piece_align == 0);
    REQUIRE(size >= decode_invariant_min_piece);
    REQUIRE(n <= K);
    REQUIRE(n * size >= len);
    REQUIRE((n == 0 || (n - 1) * size < len));
  }
}

TEST_CASE("decode reference equals dense attention: 32769 tokens", "[decode][long]") {
  decode_case c;
  c.kv_dtype   = dtype::bf16;
  c.d          = 128;
  c.group      = 4;
  c.layers     = 1;
  c.heads      = 2;
  c.lens       = {32769, 3};
  c.sinks      = true;
  c.split_maps = 2;
  c.seed       = 400;
  run_case(c);
}

TEST_CASE("decode reference: heads with no tokens output zeros", "[decode]") {
  page_geometry geo{16, 2, 64, dtype::f32};
  auto layout = test::adjacent_layout(geo, 1, 2);
  test::sequence_spec s;
  s.seq_tokens = 10;
  s.base_len   = {0, 10};
  test_cache cache(layout, {s}, 5);
  decode_params p;
  p.kv = cache.view({0});
  std::vector<float> q(2 * 64, 1.f), o(2 * 64, 42.f), lse(2, 42.f);
  float sinks[2] = {0.5f, 0.5f};
  p.q            = q.data();
  p.q_dtype = p.o_dtype = dtype::f32;
  p.o                   = o.data();
  p.lse                 = lse.data();
  reference::decode_attention(p, reference::split_mode::unsplit);
  for (int x = 0; x < 64; ++x) CHECK(o[static_cast<std::size_t>(x)] == 0.f);
  CHECK(lse[0] == -INFINITY);
  p.sinks = sinks;
  reference::decode_attention(p, reference::split_mode::unsplit);
  CHECK(lse[0] == Approx(0.5f));
}

TEST_CASE("decode reference: strided queries and narrow outputs", "[decode]") {
  page_geometry geo{16, 2, 64, dtype::bf16};
  auto layout = test::adjacent_layout(geo, 1, 2);
  std::vector<test::sequence_spec> seqs(2);
  seqs[0].seq_tokens = 40;
  seqs[0].base_len   = {40, 33};
  seqs[1].seq_tokens = 9;
  seqs[1].base_len   = {9, 2};
  test_cache cache(layout, seqs, 9);
  decode_params p;
  p.kv                = cache.view({1, 0});
  p.group             = 3;
  std::int64_t stride = 3 * 2 * 64 + 17;
  std::vector<float> q(static_cast<std::size_t>(2 * stride));
  std::mt19937 rng(2);
  for (auto& x : q) x = std::uniform_real_distribution<float>(-1, 1)(rng);
  std::vector<bfloat16> qb(q.size());
  for (std::size_t i = 0; i < q.size(); ++i) qb[i] = bfloat16(q[i]);
  std::vector<float> o32(2 * 6 * 64);
  std::vector<bfloat16> o16(o32.size());
  p.q        = qb.data();
  p.q_dtype  = dtype::bf16;
  p.q_stride = stride;
  p.o        = o16.data();
  p.o_dtype  = dtype::bf16;
  reference::decode_attention(p, reference::split_mode::unsplit);
  // Same queries widened to f32 and packed densely.
  std::vector<float> qd(2 * 6 * 64);
  for (int r = 0; r < 2; ++r)
    for (int i = 0; i < 6 * 64; ++i)
      qd[static_cast<std::size_t>(r * 6 * 64 + i)] =
          static_cast<float>(qb[static_cast<std::size_t>(r * stride + i)]);
  p.q        = qd.data();
  p.q_dtype  = dtype::f32;
  p.q_stride = 0;
  p.o        = o32.data();
  p.o_dtype  = dtype::f32;
  reference::decode_attention(p, reference::split_mode::unsplit);
  for (std::size_t i = 0; i < o32.size(); ++i) REQUIRE(o16[i].bits == bfloat16(o32[i]).bits);
}

TEST_CASE("decode_params::validate names the field and the value", "[decode][errors]") {
  page_geometry geo{16, 2, 64, dtype::f32};
  test::sequence_spec s;
  s.seq_tokens = 1;
  s.base_len   = {1, 1};
  test_cache cache(test::adjacent_layout(geo, 1, 2), {s}, 1);
  std::vector<float> q(128), o(128);
  std::int32_t begin[3] = {0, 1, 2};
  decode_params p;
  p.kv     = cache.view({0});
  p.splits = {1, 2, 2, begin};
  p.q      = q.data();
  p.o      = o.data();
  CHECK_NOTHROW(p.validate());
  auto bad  = p;
  bad.group = 9;
  TANGRAM_REQUIRE_THROWS_WITH_ALL(bad.validate(), invalid_argument, "decode_params.group", "9");
  bad       = p;
  bad.layer = 1;
  TANGRAM_REQUIRE_THROWS_WITH_ALL(bad.validate(), invalid_argument, "decode_params.layer", "got 1");
  bad                     = p;
  bad.splits.num_kv_heads = 3;
  TANGRAM_REQUIRE_THROWS_WITH_ALL(bad.validate(), invalid_argument, "splits.num_kv_heads", "3");
  // A layer stream reads no boundaries and may have fewer CTAs than heads, but at least one.
  bad        = p;
  bad.splits = layer_stream_split(1, 2, 1);
  CHECK_NOTHROW(bad.validate());
  bad.splits.num_ctas = 0;
  TANGRAM_REQUIRE_THROWS_WITH_ALL(bad.validate(), invalid_argument, "splits.num_ctas", "got 0");
  bad                  = p;
  bad.splits.cta_begin = nullptr;
  TANGRAM_REQUIRE_THROWS_WITH_ALL(bad.validate(), invalid_argument, "splits.cta_begin", "null");
  bad                 = p;  // a per-head map needs a CTA per head
  bad.splits.num_ctas = 1;
  TANGRAM_REQUIRE_THROWS_WITH_ALL(bad.validate(), invalid_argument, "splits.num_ctas", "1");
  bad          = p;
  bad.q_stride = 5;
  TANGRAM_REQUIRE_THROWS_WITH_ALL(bad.validate(), invalid_argument, "decode_params.q_stride", "5");
  bad          = p;
  bad.sm_scale = -1.f;
  TANGRAM_REQUIRE_THROWS_WITH_ALL(bad.validate(), invalid_argument, "decode_params.sm_scale", "-1");
  bad               = p;
  bad.kv.batch_size = decode_max_batch + 1;
  TANGRAM_REQUIRE_THROWS_WITH_ALL(bad.validate(), invalid_argument, "kv.batch_size", "4097");
  CHECK_THROWS_AS(reference::decode_attention(bad), invalid_argument);
  for (std::int32_t K : {-1, decode_max_invariant_pieces + 1}) {
    bad                     = p;
    bad.invariant_pieces    = K;
    const std::string value = "got " + std::to_string(K);
    TANGRAM_REQUIRE_THROWS_WITH_ALL(
        bad.validate(), invalid_argument, "decode_params.invariant_pieces", value.c_str());
  }
}

TEST_CASE("decode workspace layout: aligned, disjoint, monotone", "[decode]") {
  for (std::int32_t b : {0, 1, 7, 128}) {
    auto w = decode_workspace(264, 8, b, 4, 128);
    CHECK(w.partial_lse % 256 == 0);
    CHECK(w.prefix % 256 == 0);
    CHECK(w.partial_lse >= (264 + 8 * b) * 4 * 128 * 4);
    CHECK(w.prefix - w.partial_lse >= (264 + 8 * b) * 4 * 4);
    CHECK(w.bytes - w.prefix >= 8 * (b + 1) * 8);
    CHECK(decode_workspace(264, 8, b + 1, 4, 128).bytes >= w.bytes);
    // Batch-invariant mode: H * batch * K slots, whatever N_CTA is.
    auto v = decode_workspace(264, 8, b, 4, 128, 16);
    CHECK(v.partial_lse == (8 * b * 16 * 4 * 128 * 4 + 255) / 256 * 256);
    CHECK(v.prefix - v.partial_lse == (8 * b * 16 * 4 * 4 + 255) / 256 * 256);
    CHECK(decode_workspace(4, 8, b, 4, 128, 16).bytes == v.bytes);
    CHECK(decode_workspace(264, 8, b, 4, 128, 17).bytes >= v.bytes);
  }
}

TEST_CASE("decode workspace bytes: mode and range checked, overflow refused", "[decode][errors]") {
  std::int32_t begin[3] = {0, 100, 264};
  split_map_view splits{1, 2, 264, begin};
  CHECK(decode_workspace_bytes(splits, 32, 4, 128, 8) ==
        static_cast<std::size_t>(decode_workspace(264, 2, 32, 4, 128, 8).bytes));
  CHECK(decode_workspace_bytes(splits, 32, 4, 128) ==
        static_cast<std::size_t>(decode_workspace(264, 2, 32, 4, 128).bytes));
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      decode_workspace_bytes(splits, 32, 4, 128, 65), invalid_argument, "invariant_pieces", "65");
  // 2^30 KV heads x 4096 requests x 64 pieces x 8 heads x 1024 dims: past int64.
  split_map_view huge{1, 1 << 30, 1 << 30, begin};
  TANGRAM_REQUIRE_THROWS_WITH_ALL(decode_workspace_bytes(huge, decode_max_batch, 8, 1024, 64),
                                  invalid_argument,
                                  "decode workspace bytes",
                                  "overflows");
}
