// SPDX-License-Identifier: Apache-2.0
// CPU reference of the fused chunk eviction against a brute-force top-k written here: rank every
// candidate against every other, keep those beaten fewer than k times, in order.
#include "tangram/reference/eviction.hpp"

#include <numeric>

#include <cmath>
#include <random>
#include <vector>

#include "kv_test_cache.hpp"
#include "tangram/reference/prefill_attention.hpp"
#include "test_support.hpp"

using namespace tangram;
using tangram::test::test_cache;

namespace {

struct eviction_case {
  dtype kv_dtype           = dtype::f32;
  std::int32_t d           = 64;
  std::int32_t P           = 16;
  std::int32_t group       = 2;
  std::int32_t Hp          = 2;  ///< heads per page: 2 or 1 (per-head pages)
  std::int32_t sink        = 4;
  std::int32_t recent      = 8;   ///< protected recent window
  std::int32_t window      = 24;  ///< sliding layer window
  score_source source      = score_source::supplied;
  std::int32_t pool_kernel = 0;
  std::int32_t obs_window  = 16;
  bool tied_scores         = true;  ///< supplied scores from a small integer set (many ties)
  std::uint64_t seed       = 1;
  std::vector<float> k_scale, v_scale;  ///< fp8 only: 0, 1 (per tensor) or H (per KV head)
  /// Leading pages of every growing group pinned (kv_cache_view::pinned, test_cache::
  /// pin_leading_pages); the pinned candidates' supplied scores are the lowest.
  std::int32_t pin_pages = 0;

  /// K scale of KV head h as the test reads it (1 without scales).
  [[nodiscard]] double k_scale_of(std::int32_t h) const {
    return k_scale.empty() ? 1.0 : k_scale[k_scale.size() == 1 ? 0 : static_cast<std::size_t>(h)];
  }
};

constexpr std::int32_t L = test::eviction_scenario::num_layers,
                       H = test::eviction_scenario::num_kv_heads;

/// Max-pool with NaN read as -inf, written independently of the library.
std::vector<double> pool_scores(std::vector<double> raw, std::int32_t kernel) {
  for (auto& x : raw)
    if (std::isnan(x)) x = -INFINITY;
  std::vector<double> out(raw.size(), -INFINITY);
  auto n = static_cast<std::int64_t>(raw.size());
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t j = std::max<std::int64_t>(0, i - kernel / 2);
         j <= std::min(n - 1, i + kernel / 2);
         ++j)
      out[static_cast<std::size_t>(i)] =
          std::max(out[static_cast<std::size_t>(i)], raw[static_cast<std::size_t>(j)]);
  return out;
}

/// Brute force: candidate a beats b when protected over unprotected, else (for unprotected) a
/// higher pooled score, else the earlier position. Keeps those beaten fewer than k times.
std::vector<std::int64_t> brute_force_keep(std::vector<double> const& pooled,
                                           std::int64_t k,
                                           std::int64_t sink,
                                           std::int64_t recent) {
  auto n     = static_cast<std::int64_t>(pooled.size());
  auto prot  = [&](std::int64_t i) { return i < sink || i >= n - recent; };
  auto beats = [&](std::int64_t a, std::int64_t b) {
    if (prot(a) != prot(b)) return prot(a);
    if (!prot(a) && pooled[static_cast<std::size_t>(a)] != pooled[static_cast<std::size_t>(b)])
      return pooled[static_cast<std::size_t>(a)] > pooled[static_cast<std::size_t>(b)];
    return a < b;
  };
  std::vector<std::int64_t> keep;
  for (std::int64_t a = 0; a < n; ++a) {
    std::int64_t beaten = 0;
    for (std::int64_t b = 0; b < n; ++b) beaten += b != a && beats(b, a);
    if (beaten < k) keep.push_back(a);
  }
  return keep;
}

/// SnapKV raw scores in double, written independently: mean over the last w queries and the
/// group of the causal softmax over the candidates.
std::vector<double> snapkv_double(std::vector<float> const& cand_k,
                                  std::int64_t len,
                                  std::int64_t c,
                                  std::vector<float> const& q_rows /* [c][G][d] */,
                                  std::int32_t G,
                                  std::int32_t d,
                                  std::int32_t w_max) {
  std::int64_t n = len + c, w = std::min<std::int64_t>(w_max, c);
  std::vector<double> acc(static_cast<std::size_t>(n), 0.0);
  double scale = 1.0 / std::sqrt(static_cast<double>(d));
  for (std::int64_t iq = c - w; iq < c; ++iq)
    for (std::int32_t g = 0; g < G; ++g) {
      std::int64_t vis = len + iq + 1;
      std::vector<double> l(static_cast<std::size_t>(vis));
      double m = -INFINITY;
      for (std::int64_t i = 0; i < vis; ++i) {
        double dot = 0;
        for (std::int32_t x = 0; x < d; ++x)
          dot += static_cast<double>(q_rows[static_cast<std::size_t>((iq * G + g) * d + x)]) *
                 cand_k[static_cast<std::size_t>(i * d + x)];
        l[static_cast<std::size_t>(i)] = dot * scale;
        m                              = std::max(m, l[static_cast<std::size_t>(i)]);
      }
      double s = 0;
      for (auto v : l) s += std::exp(v - m);
      for (std::int64_t i = 0; i < vis; ++i)
        acc[static_cast<std::size_t>(i)] += std::exp(l[static_cast<std::size_t>(i)] - m) / s;
    }
  for (auto& x : acc) x /= static_cast<double>(w * G);
  return acc;
}

void run_case(eviction_case const& c) {
  INFO("dtype " << to_string(c.kv_dtype) << " d " << c.d << " P " << c.P << " Hp " << c.Hp
                << " source " << to_string(c.source) << " seed " << c.seed << " scales "
                << c.k_scale.size());
  std::mt19937_64 rng(c.seed);
  page_geometry geo{c.P, c.Hp, c.d, c.kv_dtype};
  auto sc            = test::make_eviction_scenario(geo, c.window, c.sink + c.recent);
  auto const& rules  = sc.rules;
  auto const& req    = sc.requests;
  auto const& batch  = sc.batch;
  auto const& layout = sc.layout;
  auto const& seqs   = sc.seqs;
  test_cache cache(sc.layout, sc.seqs, c.seed + 17);
  if (c.pin_pages > 0) cache.pin_leading_pages(c.pin_pages);
  auto kv        = cache.view(batch);
  std::int32_t B = kv.batch_size, d = c.d;
  auto const& indptr = sc.chunk_indptr;
  std::int32_t rows  = indptr.back();
  std::vector<float> ck(static_cast<std::size_t>(rows * H * d)), cv(ck.size());
  for (auto& x : ck) x = cache.random_value();
  for (auto& x : cv) x = cache.random_value();
  std::vector<std::byte> ck_store(ck.size() * static_cast<std::size_t>(geo.element_bytes())),
      cv_store(ck_store.size());
  for (std::size_t i = 0; i < ck.size(); ++i) {
    reference::detail::store_from_float(
        ck_store.data(), c.kv_dtype, static_cast<std::int64_t>(i), ck[i]);
    reference::detail::store_from_float(
        cv_store.data(), c.kv_dtype, static_cast<std::int64_t>(i), cv[i]);
  }
  std::vector<float> q(static_cast<std::size_t>(rows * H * c.group * d));
  for (auto& x : q) x = std::uniform_real_distribution<float>(-2.f, 2.f)(rng);

  std::int32_t max_cand = 0;
  for (std::int32_t r = 0; r < B; ++r)
    for (std::int32_t l = 0; l < L; ++l)
      for (std::int32_t h = 0; h < H; ++h)
        max_cand = std::max(max_cand,
                            kv.head_len(r, l, h) + indptr[static_cast<std::size_t>(r) + 1] -
                                indptr[static_cast<std::size_t>(r)]);
  std::vector<float> scores(static_cast<std::size_t>(B * H * max_cand));
  for (auto& x : scores)
    x = c.tied_scores ? static_cast<float>(rng() % 5)
                      : std::uniform_real_distribution<float>(0, 1)(rng);
  scores[7] = NAN;
  scores[8] = -INFINITY;
  // -0 ties with +0 (the earlier position wins), whatever the sign bit.
  for (std::size_t i = 0; i < scores.size(); i += 3)
    if (scores[i] == 0.f) scores[i] = -0.f;
  // Pinned candidates score lowest: only the pin keeps them (every layer of the group).
  for (std::int32_t r = 0; r < B; ++r)
    for (std::int32_t l = 0; l < L; ++l)
      for (std::int32_t h = 0; h < H; ++h)
        for (std::int32_t i = 0; i < kv.pinned(r, kv.slot_of(l, h).group); ++i)
          scores[static_cast<std::size_t>((r * H + h) * max_cand + i)] = -1e30f;

  // Expected state, computed from the dense copies before the pool changes.
  struct expect {
    std::int32_t len = 0;
    std::vector<float> k, v;  // [len * d], the head's tokens in order afterwards
  };
  for (std::int32_t layer = 0; layer < L; ++layer) {
    INFO("layer " << layer);
    std::vector<expect> want(static_cast<std::size_t>(B * H));
    std::vector<float> scores_out(scores.size(), 12345.f);
    eviction_params p;
    p.kv             = kv;
    p.layer          = layer;
    p.rules          = rules.data() + layer * H;
    p.sink           = c.sink;
    p.chunk_indptr   = indptr.data();
    p.chunk_k        = ck_store.data();
    p.chunk_v        = cv_store.data();
    p.max_candidates = max_cand;
    p.source         = c.source;
    p.scores         = scores.data();
    p.q              = q.data();
    p.q_dtype        = dtype::f32;
    p.group          = c.group;
    p.obs_window     = c.obs_window;
    p.pool_kernel    = c.pool_kernel;
    p.scores_out     = scores_out.data();
    p.scales.count   = static_cast<std::int32_t>(c.k_scale.size());
    p.scales.k       = c.k_scale.empty() ? nullptr : c.k_scale.data();
    p.scales.v       = c.v_scale.empty() ? nullptr : c.v_scale.data();
    std::vector<std::int32_t> new_len(static_cast<std::size_t>(B * H), -7);
    p.new_len = new_len.data();

    // Unchanged copies of every other layer's heads.
    auto snapshot = [&](std::int32_t l) {
      std::vector<float> out;
      for (std::int32_t r = 0; r < B; ++r)
        for (std::int32_t h = 0; h < H; ++h) {
          auto s = batch[static_cast<std::size_t>(r)];
          for (std::int32_t i = 0; i < cache.len(s, l, h); ++i)
            for (std::int32_t x = 0; x < d; ++x)
              for (std::int32_t kvi = 0; kvi < 2; ++kvi)
                out.push_back(cache.stored(s, l, h, cache.position(s, l, h, i), x, kvi));
        }
      return out;
    };
    std::vector<std::vector<float>> before;
    for (std::int32_t l = 0; l < L; ++l)
      before.push_back(l == layer ? std::vector<float>{} : snapshot(l));

    reference::evict_chunk(p);

    for (std::int32_t r = 0; r < B; ++r)
      for (std::int32_t h = 0; h < H; ++h) {
        INFO("request " << r << " head " << h);
        std::int32_t s   = batch[static_cast<std::size_t>(r)];
        auto rule        = rules[static_cast<std::size_t>(layer * H + h)];
        std::int64_t len = cache.len(s, layer, h);
        std::int64_t chunk =
            indptr[static_cast<std::size_t>(r) + 1] - indptr[static_cast<std::size_t>(r)];
        std::int64_t n_seen = req[static_cast<std::size_t>(s)].first + chunk;
        auto const& dk      = cache.dense(0, s, layer, h);
        auto const& dv      = cache.dense(1, s, layer, h);
        // Candidates in order: held, then chunk.
        std::vector<float> cand_k(dk), cand_v(dv);
        for (std::int64_t t = 0; t < chunk; ++t)
          for (std::int32_t x = 0; x < d; ++x) {
            auto at = static_cast<std::size_t>(
                ((indptr[static_cast<std::size_t>(r)] + t) * H + h) * d + x);
            cand_k.push_back(ck[at]);
            cand_v.push_back(cv[at]);
          }
        std::int64_t n = len + chunk;
        std::vector<std::int64_t> keep;
        if (chunk == 0) {
          for (std::int64_t i = 0; i < len; ++i) keep.push_back(i);
        } else if (rule.kind == layer_kind::sliding_window) {
          for (std::int64_t i =
                   std::max<std::int64_t>(0, n - std::min<std::int64_t>(n_seen, c.window));
               i < n;
               ++i)
            keep.push_back(i);
        } else if (rule.kind == layer_kind::uncompressed || retained_tokens(rule, n_seen) >= n) {
          for (std::int64_t i = 0; i < n; ++i) keep.push_back(i);
        } else {
          // Pinned tokens lead the protected candidates and count in the budget.
          std::int64_t pin  = std::min<std::int64_t>(kv.pinned(r, layout.slot(layer, h).group), len);
          std::int64_t lead = std::max<std::int64_t>(c.sink, pin);
          std::int64_t k    = std::max(retained_tokens(rule, n_seen), pin);
          std::vector<double> raw(static_cast<std::size_t>(n));
          const float* so = scores_out.data() + (static_cast<std::int64_t>(r) * H + h) * max_cand;
          if (c.source == score_source::supplied) {
            for (std::int64_t i = 0; i < n; ++i)
              raw[static_cast<std::size_t>(i)] =
                  scores[static_cast<std::size_t>((r * H + h) * max_cand + i)];
          } else {
            // Scores see the dequantised K: stored value times the head's K scale.
            std::vector<float> real_k(cand_k);
            for (auto& x : real_k) x = static_cast<float>(x * c.k_scale_of(h));
            std::vector<double> indep;
            if (c.source == score_source::snapkv) {
              std::vector<float> qr;
              for (std::int64_t t = 0; t < chunk; ++t)
                for (std::int32_t g = 0; g < c.group; ++g)
                  for (std::int32_t x = 0; x < d; ++x)
                    qr.push_back(q[static_cast<std::size_t>(
                        ((indptr[static_cast<std::size_t>(r)] + t) * H * c.group + h * c.group +
                         g) *
                            d +
                        x)]);
              indep = snapkv_double(real_k, len, chunk, qr, c.group, d, c.obs_window);
            } else {
              for (std::int64_t i = 0; i < n; ++i) {
                double ss = 0;
                for (std::int32_t x = 0; x < d; ++x)
                  ss +=
                      std::pow(static_cast<double>(real_k[static_cast<std::size_t>(i * d + x)]), 2);
                indep.push_back(-std::sqrt(ss));
              }
            }
            for (std::int64_t i = 0; i < n; ++i) {
              REQUIRE(std::abs(so[i] - indep[static_cast<std::size_t>(i)]) <=
                      1e-5 * std::max(1.0, std::abs(indep[static_cast<std::size_t>(i)])) + 1e-7);
              raw[static_cast<std::size_t>(i)] = so[i];  // select on the reference's own floats
            }
          }
          std::int32_t kernel =
              c.pool_kernel ? c.pool_kernel : (c.source == score_source::snapkv ? 7 : 1);
          keep = brute_force_keep(pool_scores(raw, kernel), k, lead, rule.protect - c.sink);
          REQUIRE(static_cast<std::int64_t>(keep.size()) == k);
          // The pinned candidates are among the survivors, and every protected one when they
          // all fit (with a pin the budget may hold little more than the pinned tokens).
          bool all_fit = lead + (rule.protect - c.sink) <= k;
          for (std::int64_t i = 0; i < n; ++i)
            if (i < pin || (all_fit && (i < lead || i >= n - (rule.protect - c.sink))))
              REQUIRE(std::find(keep.begin(), keep.end(), i) != keep.end());
        }
        REQUIRE(new_len[static_cast<std::size_t>(r * H + h)] ==
                static_cast<std::int32_t>(keep.size()));
        // Contents: a growing head's column positions [0, k); a ring read through the view after
        // the owner records the chunk.
        for (std::size_t j = 0; j < keep.size(); ++j) {
          std::int32_t pos = static_cast<std::int32_t>(j);
          if (rule.kind == layer_kind::sliding_window) {
            std::int32_t ring =
                layout.group_ring_pages[static_cast<std::size_t>(layout.slot(layer, h).group)] *
                c.P;
            pos = static_cast<std::int32_t>(
                (n_seen - static_cast<std::int64_t>(keep.size()) + static_cast<std::int64_t>(j)) %
                ring);
          }
          auto i = static_cast<std::size_t>(keep[j]);
          for (std::int32_t x = 0; x < d; ++x) {
            REQUIRE(cache.stored(s, layer, h, pos, x, 0) ==
                    cand_k[i * static_cast<std::size_t>(d) + static_cast<std::size_t>(x)]);
            REQUIRE(cache.stored(s, layer, h, pos, x, 1) ==
                    cand_v[i * static_cast<std::size_t>(d) + static_cast<std::size_t>(x)]);
          }
        }
      }
    for (std::int32_t l = 0; l < L; ++l)
      if (l != layer) REQUIRE(snapshot(l) == before[static_cast<std::size_t>(l)]);
    // Put the dense content back in place for the next layer: re-evicting needs the old state,
    // so rebuild the cache from scratch instead.
    cache.pool() = test_cache(layout, seqs, c.seed + 17).pool();
  }
}

}  // namespace

TEST_CASE("eviction reference: supplied scores with ties, NaN and -inf", "[eviction]") {
  for (std::uint64_t seed = 1; seed <= 4; ++seed) {
    eviction_case c;
    c.seed     = seed;
    c.kv_dtype = seed % 2 ? dtype::f32 : dtype::bf16;
    c.P        = seed <= 2 ? 16 : 1;
    run_case(c);
  }
}

TEST_CASE("eviction reference: pinned shared-prefix tokens are kept in place",
          "[eviction][pinned]") {
  for (std::uint64_t seed = 40; seed <= 45; ++seed) {
    eviction_case c;
    c.seed      = seed;
    c.pin_pages = seed % 3 == 0 ? 40 : static_cast<std::int32_t>(seed % 3);
    c.Hp        = seed <= 42 ? 2 : 1;
    c.kv_dtype  = seed % 2 ? dtype::f32 : dtype::bf16;
    c.source    = seed == 44 ? score_source::key_norm : score_source::supplied;
    run_case(c);
  }
}

TEST_CASE("eviction reference: per-head pages (Hp 1), supplied and SnapKV scores",
          "[eviction][per_head]") {
  for (std::uint64_t seed = 30; seed <= 33; ++seed) {
    eviction_case c;
    c.Hp       = 1;
    c.seed     = seed;
    c.kv_dtype = seed % 2 ? dtype::f32 : dtype::bf16;
    c.P        = seed <= 31 ? 16 : 1;
    c.source   = seed >= 32 ? score_source::snapkv : score_source::supplied;
    run_case(c);
  }
}

TEST_CASE("eviction reference: supplied scores, max-pool 3, distinct scores", "[eviction]") {
  eviction_case c;
  c.pool_kernel = 3;
  c.tied_scores = false;
  c.kv_dtype    = dtype::f16;
  c.P           = 8;
  c.seed        = 9;
  run_case(c);
}

TEST_CASE("eviction reference: built-in SnapKV scores", "[eviction][snapkv]") {
  for (std::int32_t g : {1, 3, 8}) {
    eviction_case c;
    c.source     = score_source::snapkv;
    c.group      = g;
    c.obs_window = g == 3 ? 64 : 16;
    c.d          = g == 8 ? 128 : 64;
    c.kv_dtype   = g == 8 ? dtype::bf16 : dtype::f32;
    c.seed       = 20 + static_cast<std::uint64_t>(g);
    run_case(c);
  }
}

TEST_CASE("eviction reference: SnapKV from the prefill's log-sum-exp", "[eviction][snapkv][lse]") {
  // The prefill of the same chunk (reference/prefill_attention.hpp) gives the normalisers. Without
  // sinks the scores must equal the self-normalised ones (the prefill attends over exactly the
  // candidates); with sinks each query's weights sum to 1 - e^(z - lse) instead of 1.
  constexpr std::int32_t d = 64, G = 3, obs = 16;
  std::mt19937_64 rng(91);
  page_geometry geo{16, 2, d, dtype::f32};
  auto sc = test::make_eviction_scenario(geo, 24, 12, 400, 60);
  test_cache cache(sc.layout, sc.seqs, 92);
  auto kv            = cache.view(sc.batch);
  std::int32_t B     = kv.batch_size;
  auto const& indptr = sc.chunk_indptr;
  std::int32_t rows  = indptr.back();
  std::vector<float> ck(static_cast<std::size_t>(rows * H * d)), cv(ck.size());
  for (auto& x : ck) x = cache.random_value();
  for (auto& x : cv) x = cache.random_value();
  std::vector<float> q(static_cast<std::size_t>(rows * H * G * d));
  for (auto& x : q) x = std::uniform_real_distribution<float>(-2.f, 2.f)(rng);
  std::vector<float> sinks(static_cast<std::size_t>(H * G));
  for (auto& z : sinks) z = std::uniform_real_distribution<float>(-1.f, 3.f)(rng);
  std::int32_t max_cand = 0, max_chunk = 0;
  for (std::int32_t r = 0; r < B; ++r) {
    max_chunk = std::max(max_chunk, indptr[static_cast<std::size_t>(r) + 1] - indptr[r]);
    for (std::int32_t h = 0; h < H; ++h)
      max_cand = std::max(max_cand, kv.head_len(r, 0, h) + indptr[r + 1] - indptr[r]);
  }
  auto lse_of = [&](bool with_sinks) {
    std::vector<float> lse(static_cast<std::size_t>(rows * H * G), 0.f), o(q.size());
    prefill_params f;
    f.kv           = kv;
    f.group        = G;
    f.chunk_indptr = indptr.data();
    f.max_chunk    = max_chunk;
    f.q            = q.data();
    f.q_dtype      = dtype::f32;
    f.chunk_k      = ck.data();
    f.chunk_v      = cv.data();
    f.o            = o.data();
    f.o_dtype      = dtype::f32;
    f.lse          = lse.data();
    f.sinks        = with_sinks ? sinks.data() : nullptr;
    reference::prefill_attention(f);
    return lse;
  };
  auto scores_of = [&](const float* lse) {  // on a copy: the eviction rewrites the pages
    test_cache probe(sc.layout, sc.seqs, 92);
    std::vector<float> out(static_cast<std::size_t>(B * H * max_cand), 12345.f);
    std::vector<std::int32_t> new_len(static_cast<std::size_t>(B * H));
    eviction_params p;
    p.kv             = probe.view(sc.batch);
    p.rules          = sc.rules.data();
    p.sink           = 4;
    p.chunk_indptr   = indptr.data();
    p.chunk_k        = ck.data();
    p.chunk_v        = cv.data();
    p.max_candidates = max_cand;
    p.source         = score_source::snapkv;
    p.q              = q.data();
    p.q_dtype        = dtype::f32;
    p.group          = G;
    p.obs_window     = obs;
    p.q_lse          = lse;
    p.new_len        = new_len.data();
    p.scores_out     = out.data();
    reference::evict_chunk(p);
    return out;
  };
  const auto lse_plain = lse_of(false), lse_sinks = lse_of(true);
  const auto own = scores_of(nullptr), plain = scores_of(lse_plain.data()),
             with_sinks = scores_of(lse_sinks.data());
  int heads_scored = 0;
  for (std::int32_t r = 0; r < B; ++r)
    for (std::int32_t h = 0; h < H; ++h) {
      const std::size_t at = static_cast<std::size_t>((r * H + h) * max_cand);
      if (own[at] == 12345.f) continue;  // this head did not select
      ++heads_scored;
      INFO("request " << r << " head " << h);
      const std::int32_t c = indptr[r + 1] - indptr[r], n = kv.head_len(r, 0, h) + c;
      const std::int32_t w = std::min(obs, c);
      double sum = 0.0;
      for (std::int32_t i = 0; i < n; ++i) {
        const float a = own[at + static_cast<std::size_t>(i)];
        CHECK(std::abs(plain[at + static_cast<std::size_t>(i)] - a) <= 1e-5f * a + 1e-7f);
        CHECK(with_sinks[at + static_cast<std::size_t>(i)] <= a * (1.f + 1e-5f) + 1e-7f);
        sum += with_sinks[at + static_cast<std::size_t>(i)];
      }
      double expected = 0.0;  // sum over the window's queries of 1 - e^(z - lse)
      for (std::int32_t t = c - w; t < c; ++t)
        for (std::int32_t g = 0; g < G; ++g) {
          const std::size_t qh = static_cast<std::size_t>(h * G + g);
          expected += 1.0 - std::exp(static_cast<double>(sinks[qh]) -
                                     lse_sinks[static_cast<std::size_t>(indptr[r] + t) * H * G + qh]);
        }
      CHECK(sum * w * G == Approx(expected).epsilon(1e-4));
    }
  CHECK(heads_scored >= 4);
}

TEST_CASE("eviction reference: built-in key-norm scores", "[eviction][keynorm]") {
  eviction_case c;
  c.source   = score_source::key_norm;
  c.kv_dtype = dtype::bf16;
  c.d        = 128;
  c.P        = 32;
  c.seed     = 31;
  run_case(c);
}

TEST_CASE("eviction reference: fp8 caches with and without K/V scales", "[eviction][fp8]") {
  // Per-head scales distinct per head and K apart from V (a scale read for the wrong head, or V's
  // read for K, changes the built-in scores the test computes independently).
  const std::vector<float> ks = {0.75f, 1.5f, 0.5f, 2.f}, vs = {1.25f, 0.625f, 1.75f, 0.875f};
  std::uint64_t seed = 60;
  for (dtype t : {dtype::fp8_e4m3, dtype::fp8_e5m2})
    for (score_source src : {score_source::supplied, score_source::snapkv, score_source::key_norm})
      for (int mode = 0; mode < 3; ++mode) {  // none, per tensor, per head
        eviction_case c;
        c.kv_dtype = t;
        c.source   = src;
        c.group    = src == score_source::snapkv ? 3 : 2;
        c.d        = mode == 2 ? 128 : 64;
        c.P        = mode == 1 ? 1 : 16;
        c.seed     = ++seed;
        if (mode == 1) {
          c.k_scale = {1.75f};
          c.v_scale = {0.5f};
        } else if (mode == 2) {
          c.k_scale = ks;
          c.v_scale = vs;
        }
        run_case(c);
      }
}

namespace {

/// Built-in scores of a one-request fp8 cache (2 KV heads, 40 held tokens, a chunk of 8) with
/// `scales`: scores_out of both heads.
std::vector<float> fp8_scores(score_source source, kv_scales scales) {
  page_geometry geo{16, 2, 64, dtype::fp8_e4m3};
  test::sequence_spec s;
  s.seq_tokens = 40;
  s.base_len   = {40, 40};
  s.reserve    = 8;
  test_cache cache(test::adjacent_layout(geo, 1, 2), {s}, 5);
  head_rule rules[2];
  rules[0].kind = rules[1].kind = layer_kind::compressed;
  rules[0].budget = rules[1].budget = 0.25;
  std::int32_t indptr[2]            = {0, 8}, new_len[2];
  std::vector<unsigned char> ck(8 * 2 * 64), cv(ck.size());
  for (std::size_t i = 0; i < ck.size(); ++i) {
    reference::detail::store_from_float(
        ck.data(), geo.kv_dtype, static_cast<std::int64_t>(i), cache.random_value());
    reference::detail::store_from_float(
        cv.data(), geo.kv_dtype, static_cast<std::int64_t>(i), cache.random_value());
  }
  std::vector<float> q(8 * 2 * 64);
  std::mt19937 rng(3);
  for (auto& x : q) x = std::uniform_real_distribution<float>(-2.f, 2.f)(rng);
  std::vector<float> out(2 * 48, 0.f);
  eviction_params p;
  p.kv             = cache.view({0});
  p.rules          = rules;
  p.chunk_indptr   = indptr;
  p.chunk_k        = ck.data();
  p.chunk_v        = cv.data();
  p.q              = q.data();
  p.q_dtype        = dtype::f32;
  p.group          = 1;
  p.obs_window     = 8;
  p.max_candidates = 48;
  p.source         = source;
  p.new_len        = new_len;
  p.scores_out     = out.data();
  p.scales         = scales;
  reference::evict_chunk(p);
  REQUIRE(new_len[0] < 48);  // the heads selected: their scores were written
  REQUIRE(new_len[1] < 48);
  return out;
}

}  // namespace

TEST_CASE("eviction reference: the fp8 K scale reaches the built-in scores", "[eviction][fp8]") {
  const float k[2] = {0.5f, 2.f}, v[2] = {3.f, 0.25f}, k_swapped[2] = {2.f, 0.5f};
  const kv_scales none{}, per_head{k, v, 2}, swapped{k_swapped, v, 2}, as_v{v, v, 2};
  for (score_source src : {score_source::snapkv, score_source::key_norm}) {
    INFO(to_string(src));
    auto right = fp8_scores(src, per_head);
    // A missing scale, scales of the wrong heads or V's scale for K each give other scores.
    CHECK(right != fp8_scores(src, none));
    CHECK(right != fp8_scores(src, swapped));
    CHECK(right != fp8_scores(src, as_v));
    // The V scale is not read by scoring: only K's matters.
    const float v_other[2] = {0.125f, 8.f};
    CHECK(right == fp8_scores(src, kv_scales{k, v_other, 2}));
  }
  // Key norm is linear in the scale: -||s k|| = s (-||k||), per head.
  auto unscaled = fp8_scores(score_source::key_norm, none);
  auto scaled   = fp8_scores(score_source::key_norm, per_head);
  for (std::size_t i = 0; i < 96; ++i)
    CHECK(scaled[i] == Approx(unscaled[i] * k[i / 48]).epsilon(1e-6));
}

TEST_CASE("eviction selection keys order scores, NaN lowest, protected highest", "[eviction]") {
  std::vector<float> v = {-INFINITY, -3.5f, -1e-30f, -0.f, 0.f, 1e-30f, 2.f, 7.5e30f, INFINITY};
  for (std::size_t i = 0; i + 1 < v.size(); ++i) CHECK(score_key(v[i]) <= score_key(v[i + 1]));
  CHECK(score_key(-3.5f) < score_key(-1e-30f));
  CHECK(score_key(NAN) == 0u);
  CHECK(score_key(-0.f) == score_key(0.f));  // equal scores: ties go to the earlier position
  CHECK(score_key(-INFINITY) > score_key(NAN));
  CHECK(score_key(INFINITY) < protected_score_key);
  float raw[5] = {1.f, NAN, 5.f, NAN, NAN};
  CHECK(pooled_score(raw, 5, 0, 1) == 1.f);
  CHECK(pooled_score(raw, 5, 1, 1) == -INFINITY);
  CHECK(pooled_score(raw, 5, 1, 3) == 5.f);
  CHECK(pooled_score(raw, 5, 4, 3) == -INFINITY);
  CHECK(pooled_score(raw, 5, 4, 7) == 5.f);
  CHECK(eviction_protected(0, 10, 1, 2));
  CHECK_FALSE(eviction_protected(1, 10, 1, 2));
  CHECK(eviction_protected(8, 10, 1, 2));
}

TEST_CASE("eviction reference: invalid heads are reported, not modified", "[eviction][errors]") {
  page_geometry geo{16, 2, 64, dtype::f32};
  auto layout = test::adjacent_layout(geo, 1, 2);
  test::sequence_spec s;
  s.seq_tokens = 40;
  s.base_len   = {40, 40};
  s.reserve    = 8;
  test_cache cache(layout, {s}, 4);
  auto kv = cache.view({0});
  head_rule rules[2];
  rules[0].kind          = layer_kind::sliding_window;  // but the view's group grows: a mismatch
  rules[0].window        = 16;
  rules[1].kind          = layer_kind::uncompressed;
  std::int32_t indptr[2] = {0, 8};
  std::vector<float> ck(8 * 2 * 64, 0.5f);
  std::int32_t new_len[2] = {0, 0};
  eviction_params p;
  p.kv             = kv;
  p.rules          = rules;
  p.chunk_indptr   = indptr;
  p.chunk_k        = ck.data();
  p.chunk_v        = ck.data();
  p.max_candidates = 47;  // head 1 has 48 candidates
  p.source         = score_source::key_norm;
  p.new_len        = new_len;
  auto pool        = cache.pool();
  reference::evict_chunk(p);
  CHECK(new_len[0] == -1);
  CHECK(new_len[1] == -1);
  CHECK(cache.pool() == pool);
  p.max_candidates = 48;
  reference::evict_chunk(p);
  CHECK(new_len[1] == 48);
}

namespace {
/// A one-request, one-layer, two-head cache of `kv_dtype` with an empty chunk and valid
/// parameters over it (host arrays owned here): the base of the validation tests.
struct minimal_eviction {
  test_cache cache;
  head_rule rules[2];
  std::int32_t indptr[2] = {0, 0}, new_len[2] = {0, 0};
  float x = 0;
  eviction_params p;

  explicit minimal_eviction(dtype kv_dtype)
      : cache(test::adjacent_layout(page_geometry{16, 2, 64, kv_dtype}, 1, 2), {one_token()}, 1) {
    p.kv           = cache.view({0});
    p.rules        = rules;
    p.chunk_indptr = indptr;
    p.chunk_k = p.chunk_v = p.q = &x;
    p.new_len                   = new_len;
    p.max_candidates            = 4;
  }
  static test::sequence_spec one_token() {
    test::sequence_spec s;
    s.seq_tokens = 1;
    s.base_len   = {1, 1};
    return s;
  }
};
}  // namespace

TEST_CASE("eviction_params::validate names the field and the value", "[eviction][errors]") {
  minimal_eviction m(dtype::f32);
  eviction_params const& p = m.p;
  CHECK_NOTHROW(p.validate());
  auto bad       = p;
  bad.obs_window = 65;
  TANGRAM_REQUIRE_THROWS_WITH_ALL(bad.validate(), invalid_argument, "obs_window", "65");
  bad             = p;
  bad.pool_kernel = 4;
  TANGRAM_REQUIRE_THROWS_WITH_ALL(bad.validate(), invalid_argument, "pool_kernel", "4");
  bad        = p;
  bad.source = score_source::supplied;
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      bad.validate(), invalid_argument, "eviction_params.scores", "supplied");
  bad      = p;
  bad.sink = -1;
  TANGRAM_REQUIRE_THROWS_WITH_ALL(bad.validate(), invalid_argument, "eviction_params.sink", "-1");
  bad                = p;
  bad.max_candidates = 0;
  TANGRAM_REQUIRE_THROWS_WITH_ALL(bad.validate(), invalid_argument, "max_candidates", "0");
  CHECK_THROWS_AS(reference::evict_chunk(bad), invalid_argument);
  const float lse[1] = {0.f};
  bad                = p;
  bad.source         = score_source::key_norm;
  bad.q_lse          = lse;
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      bad.validate(), invalid_argument, "eviction_params.q_lse", "key_norm", "only snapkv");
  // Scales: only with an fp8 cache, count 0, 1 or num_kv_heads, arrays present.
  const float one[3] = {1.f, 1.f, 1.f};
  bad                = p;
  bad.scales         = kv_scales{one, one, 1};
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      bad.validate(), invalid_argument, "eviction_params.scales", "only for fp8", "f32");
}

TEST_CASE("eviction_params::validate checks fp8 scales", "[eviction][errors][fp8]") {
  minimal_eviction m(dtype::fp8_e5m2);
  const float k[2] = {0.5f, 2.f}, v[2] = {1.f, 0.f};
  eviction_params& p = m.p;
  p.scales           = kv_scales{k, k, 2};
  CHECK_NOTHROW(p.validate());
  CHECK_NOTHROW(reference::evict_chunk(p));
  auto bad         = p;
  bad.scales.count = 3;
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      bad.validate(), invalid_argument, "eviction_params.scales.count", "3");
  bad          = p;
  bad.scales.k = nullptr;
  TANGRAM_REQUIRE_THROWS_WITH_ALL(bad.validate(), invalid_argument, "eviction_params.scales.k");
  // Values are the reference's to check (a launcher cannot read device scales).
  bad          = p;
  bad.scales.v = v;
  CHECK_NOTHROW(bad.validate());
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      reference::evict_chunk(bad), invalid_argument, "eviction_params.scales.v[1]", "0");
}

TEST_CASE("expect_eviction_kernel: the compiled dtypes and head dims", "[eviction][errors]") {
  for (dtype t : {dtype::f32, dtype::f16, dtype::bf16, dtype::fp8_e4m3, dtype::fp8_e5m2})
    for (std::int32_t d : {64, 128, 256})
      CHECK_NOTHROW(expect_eviction_kernel(page_geometry{16, 2, d, t}, "evict_chunk"));
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      expect_eviction_kernel(page_geometry{16, 2, 96, dtype::fp8_e4m3}, "evict_elastic"),
      invalid_argument,
      "evict_elastic",
      "fp8_e4m3",
      "96",
      "f32/f16/bf16/fp8_e4m3/fp8_e5m2");
}

TEST_CASE("eviction workspace layout: aligned, disjoint, sized per source", "[eviction]") {
  auto sup  = eviction_workspace(4, 8, 5000, score_source::supplied, 4, 32, 128);
  auto kn   = eviction_workspace(4, 8, 5000, score_source::key_norm, 4, 32, 128);
  auto snap = eviction_workspace(4, 8, 5000, score_source::snapkv, 4, 32, 128);
  for (auto const& w : {sup, kn, snap}) {
    CHECK(w.raw % 256 == 0);
    CHECK(w.stats % 256 == 0);
    CHECK(w.norm % 256 == 0);
    CHECK(w.hist % 256 == 0);
    CHECK(w.state % 256 == 0);
    CHECK(w.raw >= 4 * 8 * 5000 * 4);  // keys
    CHECK(w.state - w.hist >= 4 * 8 * select_radix_bins * 4);
    CHECK(w.bytes - w.state >= 4 * 8 * select_state_words * 4);
  }
  CHECK(sup.hist == sup.raw);  // supplied scores need only the keys and the top-k's state
  CHECK_THROWS_WITH(
      eviction_workspace(1 << 30, 1 << 30, 1 << 30, score_source::supplied, 1, 1, 128),
      Catch::Contains("overflows"));
  CHECK(kn.stats - kn.raw >= 4 * 8 * 5000 * 4);
  std::int64_t tiles = (5000 + snapkv_key_tile(128) - 1) / snapkv_key_tile(128);
  CHECK(snap.norm - snap.stats >= 4 * 8 * tiles * 32 * 4 * 8);
  CHECK(snap.bytes - snap.norm >= 4 * 8 * 32 * 4 * 8);
  // From the prefill's log-sum-exp SnapKV needs no statistics: the supplied layout plus raw.
  auto from_lse = eviction_workspace(4, 8, 5000, score_source::snapkv, 4, 32, 128, true);
  CHECK(from_lse.stats == from_lse.norm);
  CHECK(from_lse.norm == from_lse.hist);
  CHECK(from_lse.bytes == kn.bytes);
  CHECK(snapkv_key_tile(64) * 64 == 4096);
  CHECK(snapkv_key_tile(256) == 16);
}
