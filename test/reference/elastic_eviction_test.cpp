// SPDX-License-Identifier: Apache-2.0
// CPU reference of the elastic chunk eviction (reference/elastic_eviction.hpp): a case worked by
// hand, a brute force over every group-length vector on small random cases (optimal, within the
// limit, protected tokens kept, survivors in order, equal to the per-layer eviction with the same
// keep counts), and the real manager in elastic mode end to end.
#include "tangram/reference/elastic_eviction.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <set>
#include <vector>

#include "elastic_harness.hpp"
#include "kv_test_cache.hpp"
#include "test_support.hpp"

using namespace tangram;
using namespace tangram::test;

namespace {

/// The survivors of a head after the eviction: for each position < count, the index of the
/// candidate whose K and V rows it holds (-1: none). Rows are random floats: unique.
std::vector<std::int64_t> survivors(elastic_setup& s,
                                    test_cache& cache,
                                    std::vector<std::vector<float>> const& ck,
                                    std::vector<std::vector<float>> const& cv,
                                    std::int32_t r,
                                    std::int32_t l,
                                    std::int32_t h,
                                    std::int32_t count) {
  std::vector<std::int64_t> out;
  for (std::int32_t pos = 0; pos < count; ++pos) {
    auto k = stored_row(s, cache, r, l, h, pos, 0), v = stored_row(s, cache, r, l, h, pos, 1);
    std::int64_t found = -1;
    for (std::size_t i = 0; i < ck.size(); ++i)
      if (ck[i] == k && cv[i] == v) found = static_cast<std::int64_t>(i);
    out.push_back(found);
  }
  return out;
}

/// Index of the stage key of column position `pos` of (request r, layer l, head h): its group's
/// block, then (page index * Hp + column) * P + in-page token.
std::size_t key_index(elastic_setup const& s,
                      elastic_outcome const& o,
                      std::int32_t r,
                      std::int32_t l,
                      std::int32_t h,
                      std::int32_t pos) {
  auto hs = s.layout.slot(l, h);
  auto P = s.layout.geometry.page_tokens, Hp = s.layout.geometry.group_size;
  auto base = o.base[static_cast<std::size_t>(r * s.layout.num_groups() + hs.group)];
  return static_cast<std::size_t>(base + (pos / P * Hp + hs.column) * P + pos % P);
}

/// The hand-worked model: 3 layers x 2 KV heads, P 2, Hp 2 (one group per layer), f32, d 4.
/// Layers 0 and 1 compressed (budget 1, protect 2 = sink 1 + window 1), layer 2 uncompressed.
/// One request: 4 tokens held by every head, a chunk of 2: 6 candidates, 0 and 5 protected.
elastic_setup hand_setup(test_cache*& cache_out, std::vector<std::unique_ptr<test_cache>>& keep) {
  elastic_setup s;
  s.layout = adjacent_layout(page_geometry{2, 2, 4, dtype::f32}, 3, 2);
  for (std::int32_t l = 0; l < 3; ++l)
    for (std::int32_t h = 0; h < 2; ++h) {
      head_rule r;
      r.kind    = l == 2 ? layer_kind::uncompressed : layer_kind::compressed;
      r.protect = l == 2 ? 0 : 2;
      s.rules.push_back(r);
    }
  sequence_spec q;
  q.seq_tokens     = 4;
  q.base_len       = std::vector<std::int32_t>(6, 4);
  q.reserve        = 2;
  s.seqs           = {q};
  s.batch          = {0};
  s.indptr         = {0, 2};
  s.sink           = 1;
  s.max_candidates = 6;
  keep.push_back(std::make_unique<test_cache>(s.layout, s.seqs, 7));
  cache_out = keep.back().get();
  s.fill_chunk(*cache_out);
  // Unprotected scores (positions 1..4) of A = (0, 0), B = (0, 1), C = (1, 0), D = (1, 1).
  float sc[4][4] = {{9, 8, 7, 6}, {1, 1, 1, 1}, {5, 5, 2, 2}, {5, 3, 3, 3}};
  for (std::int32_t x = 0; x < 4; ++x)
    for (std::int32_t i = 1; i <= 4; ++i) s.score(x / 2, 0, x % 2, i) = sc[x][i - 1];
  return s;
}

}  // namespace

TEST_CASE("elastic eviction reference: a case worked by hand", "[reference][elastic]") {
  std::vector<std::unique_ptr<test_cache>> caches;
  test_cache* cache = nullptr;
  auto s            = hand_setup(cache, caches);
  reference_backend ref;

  SECTION("limit 5, K 13: needs A 6, B 2, C 3, D 2; groups 3 and 2 pages") {
    // 8 protected keys, then 9 8 7 6 of A, then one of the three 5s: by (layer, head, position)
    // the first is C's position 1. Floors 1 page per group; group 0 gains 2, 2 (pages 1, 2),
    // group 1 gains 1 (page 1): 3 extra pages take all three.
    s.wanted = {13};
    s.limit  = {5};
    std::vector<std::vector<std::vector<float>>> ck, cv;
    for (std::int32_t x = 0; x < 6; ++x) {
      ck.push_back(candidate_rows(s, *cache, 0, x / 2, x % 2, 0));
      cv.push_back(candidate_rows(s, *cache, 0, x / 2, x % 2, 1));
    }
    auto o = run_elastic(s, *cache, ref);
    CHECK(o.stage_len == std::vector<std::int32_t>{6, 6, 6, 6, 6, 6});
    CHECK(o.new_len == std::vector<std::int32_t>{6, 6, 4, 4, 6, 6});
    CHECK(o.pages_out == std::vector<std::int64_t>{5});
    // The stage keys' blocks: groups 0 and 1 (layers 0, 1) hold 6 candidates a head: 3 pages of
    // Hp 2 x P 2 = 12 words each; the uncompressed group 2 none.
    CHECK(o.words == 24);
    CHECK(o.base[0] == 0);
    CHECK(o.base[1] == 12);
    // Keys of the stage step: the sink's (the lead) never written, the window's protected =
    // 0xffffffff, others score_key(score); head (0, 1) is column 1: page 1 of its block, word
    // (1 * 2 + 1) * 2 + 0 = 6.
    CHECK(key_index(s, o, 0, 0, 1, 2) == 6);
    CHECK(o.keys[key_index(s, o, 0, 0, 0, 0)] == unwritten_key);
    CHECK(o.keys[key_index(s, o, 0, 0, 0, 5)] == protected_score_key);
    CHECK(o.keys[key_index(s, o, 0, 0, 0, 1)] == score_key(9.f));
    CHECK(o.keys[key_index(s, o, 0, 1, 1, 4)] == score_key(3.f));
    CHECK(o.keys[6] == score_key(1.f));
    std::set<std::size_t> written;
    for (std::int32_t x = 0; x < 4; ++x)
      for (std::int32_t i = 1; i < 6; ++i) written.insert(key_index(s, o, 0, x / 2, x % 2, i));
    CHECK(written.size() == 20);
    for (std::size_t i = 0; i < o.keys.size(); ++i)
      if (!written.count(i)) CHECK(o.keys[i] == unwritten_key);
    using v = std::vector<std::int64_t>;
    CHECK(survivors(s, *cache, ck[0], cv[0], 0, 0, 0, 6) == v{0, 1, 2, 3, 4, 5});
    CHECK(survivors(s, *cache, ck[1], cv[1], 0, 0, 1, 6) == v{0, 1, 2, 3, 4, 5});
    CHECK(survivors(s, *cache, ck[2], cv[2], 0, 1, 0, 4) == v{0, 1, 2, 5});        // 5, 5 kept
    CHECK(survivors(s, *cache, ck[3], cv[3], 0, 1, 1, 4) == v{0, 1, 2, 5});        // 5, first 3
    CHECK(survivors(s, *cache, ck[4], cv[4], 0, 2, 0, 6) == v{0, 1, 2, 3, 4, 5});  // appended
  }
  SECTION("limit 4: group 1 stays at its floor and keeps only its protected tokens") {
    s.wanted = {13};
    s.limit  = {4};
    auto ck2 = candidate_rows(s, *cache, 0, 1, 0, 0), cv2 = candidate_rows(s, *cache, 0, 1, 0, 1);
    auto o = run_elastic(s, *cache, ref);
    CHECK(o.new_len == std::vector<std::int32_t>{6, 6, 2, 2, 6, 6});
    CHECK(o.pages_out == std::vector<std::int64_t>{4});
    CHECK(survivors(s, *cache, ck2, cv2, 0, 1, 0, 2) == std::vector<std::int64_t>{0, 5});
  }
  SECTION("K above every candidate: equal gains go to the lower group first") {
    s.wanted = {1000};
    s.limit  = {5};
    auto o   = run_elastic(s, *cache, ref);
    CHECK(o.new_len == std::vector<std::int32_t>{6, 6, 4, 4, 6, 6});
    CHECK(o.pages_out == std::vector<std::int64_t>{5});
  }
  SECTION("limit 1 < the floors (2 pages): does not fit, nothing compacted") {
    s.wanted = {13};
    s.limit  = {1};
    auto o   = run_elastic(s, *cache, ref);
    CHECK(o.new_len == std::vector<std::int32_t>{-1, -1, -1, -1, 6, 6});
    CHECK(o.pages_out == std::vector<std::int64_t>{elastic_does_not_fit});
  }
  SECTION("max_candidates below the candidates: every head invalid, the request unchanged") {
    s.max_candidates = 5;
    s.wanted         = {13};
    s.limit          = {5};
    auto before      = cache->pool();
    auto o           = run_elastic(s, *cache, ref);
    CHECK(o.stage_len == std::vector<std::int32_t>(6, -1));
    CHECK(o.new_len == std::vector<std::int32_t>(6, -1));
    CHECK(o.pages_out == std::vector<std::int64_t>{elastic_invalid_head});
    CHECK(cache->pool() == before);
  }
  SECTION("K 0 and no protection beyond the floors: a zero-gain page is never given") {
    s.wanted = {0};
    s.limit  = {6};
    auto o   = run_elastic(s, *cache, ref);
    CHECK(o.new_len == std::vector<std::int32_t>{2, 2, 2, 2, 6, 6});
    CHECK(o.pages_out == std::vector<std::int64_t>{2});
  }
}

TEST_CASE("elastic eviction reference: bad parameters name the field", "[reference][elastic]") {
  std::vector<std::unique_ptr<test_cache>> caches;
  test_cache* cache = nullptr;
  auto s            = hand_setup(cache, caches);
  s.wanted          = {1};
  s.limit           = {1};
  elastic_eviction_params e;
  e.kv             = cache->view(s.batch);
  e.rules          = s.rules.data();
  e.chunk_indptr   = s.indptr.data();
  e.max_candidates = 6;
  std::vector<std::int64_t> base(3);
  std::vector<std::uint32_t> keys(static_cast<std::size_t>(
      stage_key_layout(e.kv, s.rules.data(), s.indptr.data(), base.data())));
  std::vector<std::int32_t> len(6);
  e.stage_keys     = keys.data();
  e.stage_key_base = base.data();
  e.wanted     = s.wanted.data();
  e.page_limit = s.limit.data();
  e.new_len    = len.data();
  auto bad     = e;
  bad.stage_keys   = nullptr;
  CHECK_THROWS_WITH(reference::evict_elastic(bad),
                    Catch::Contains("elastic_eviction_params.stage_keys: null"));
  bad                = e;
  bad.stage_key_base = nullptr;
  CHECK_THROWS_WITH(reference::evict_elastic(bad),
                    Catch::Contains("elastic_eviction_params.stage_key_base: null"));
  bad                = e;
  bad.max_candidates = 0;
  CHECK_THROWS_WITH(reference::evict_elastic(bad),
                    Catch::Contains("max_candidates: must be >= 1, got 0"));
  bad      = e;
  bad.sink = -2;
  CHECK_THROWS_WITH(reference::evict_elastic(bad), Catch::Contains("sink: must be >= 0, got -2"));
  bad        = e;
  bad.wanted = nullptr;
  CHECK_THROWS_WITH(reference::evict_elastic(bad), Catch::Contains("wanted: null"));
  CHECK_THROWS_WITH(elastic_workspace(1 << 30, 1 << 30, 1, 1), Catch::Contains("overflows"));
  // The stage launches refuse keys without their blocks, before any work.
  auto pl = stage_params(s, e.kv, 0);
  std::vector<std::int32_t> stage_len(2, -9);
  pl.new_len        = stage_len.data();
  pl.stage_keys     = keys.data();
  pl.stage_key_base = nullptr;
  CHECK_THROWS_WITH(reference::evict_chunk(pl),
                    Catch::Contains("eviction_params.stage_key_base: null with stage_keys set"));
  CHECK(stage_len == std::vector<std::int32_t>(2, -9));
  // The layout names a null array; a batch with nothing staged still gets one word.
  CHECK_THROWS_WITH(
      stage_key_layout(e.kv, nullptr, s.indptr.data(), base.data()),
      Catch::Contains("stage_key_layout: rules, chunk_indptr and base must not be null"));
  std::vector<std::int32_t> empty_chunk = {0, 0};
  CHECK(stage_key_layout(e.kv, s.rules.data(), empty_chunk.data(), base.data()) == 1);
  CHECK(base == std::vector<std::int64_t>(3, 0));
}

namespace {

/// A small random elastic case: layers 0 and 1 compressed (their 2H heads shuffled into groups of
/// Hp = 2 across layers, or with H = 2 in half the cases per-head pages, Hp = 1), layer 2
/// uncompressed; 1-2 requests with ragged held lengths; scores from {0, 1, 2, 3} (many ties);
/// random K and page limit.
struct random_case {
  elastic_setup s;
  std::int32_t protect = 0;
  std::unique_ptr<test_cache> cache, twin;  ///< identical caches: elastic run, per-layer run
};

random_case make_random_case(std::mt19937_64& rng) {
  auto pick = [&](std::int64_t lo, std::int64_t hi) {
    return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng);
  };
  random_case c;
  auto& s              = c.s;
  const std::int32_t L = 3, H = pick(0, 1) ? 2 : 4, P = static_cast<std::int32_t>(pick(1, 3));
  const std::int32_t Hp = H == 2 && pick(0, 1) == 1 ? 1 : 2;
  s.layout.geometry     = page_geometry{P, Hp, 4, dtype::f32};
  s.layout.num_layers   = L;
  s.layout.num_kv_heads = H;
  s.layout.slots.resize(static_cast<std::size_t>(L * H));
  std::vector<std::int32_t> comp(static_cast<std::size_t>(2 * H));
  std::iota(comp.begin(), comp.end(), 0);
  std::shuffle(comp.begin(), comp.end(), rng);
  bool uncompressed_first = pick(0, 1) == 1;
  std::int32_t g0 = uncompressed_first ? H / Hp : 0, u0 = uncompressed_first ? 0 : 2 * H / Hp;
  for (std::size_t i = 0; i < comp.size(); ++i)
    s.layout.slots[static_cast<std::size_t>(comp[i])] = {g0 + static_cast<std::int32_t>(i) / Hp,
                                                         static_cast<std::int32_t>(i) % Hp};
  for (std::int32_t h = 0; h < H; ++h)
    s.layout.slots[static_cast<std::size_t>(2 * H + h)] = {u0 + h / Hp, h % Hp};
  s.layout.group_window.assign(static_cast<std::size_t>(3 * H / Hp), 0);
  s.layout.group_ring_pages.assign(s.layout.group_window.size(), 0);
  s.sink    = static_cast<std::int32_t>(pick(0, 1));
  c.protect = static_cast<std::int32_t>(pick(0, 3));
  for (std::int32_t i = 0; i < L * H; ++i) {
    head_rule r;
    r.kind    = i < 2 * H ? layer_kind::compressed : layer_kind::uncompressed;
    r.protect = i < 2 * H ? c.protect : 0;
    s.rules.push_back(r);
  }
  auto B                = static_cast<std::int32_t>(pick(1, 2));
  s.indptr              = {0};
  std::int32_t max_cand = 1;
  for (std::int32_t r = 0; r < B; ++r) {
    sequence_spec q;
    q.seq_tokens        = static_cast<std::int32_t>(pick(0, 10));
    auto chunk          = static_cast<std::int32_t>(pick(r == 1 ? 0 : 1, 5));
    q.reserve           = chunk;
    auto protected_held = std::min(q.seq_tokens, std::max(c.protect, s.sink));
    for (std::int32_t i = 0; i < L * H; ++i)
      q.base_len.push_back(i < 2 * H ? static_cast<std::int32_t>(pick(protected_held, q.seq_tokens))
                                     : q.seq_tokens);
    max_cand = std::max(max_cand, q.seq_tokens + chunk);
    s.seqs.push_back(q);
    s.batch.push_back(r);
    s.indptr.push_back(s.indptr.back() + chunk);
  }
  s.max_candidates = max_cand;
  auto seed        = rng();
  c.cache          = std::make_unique<test_cache>(s.layout, s.seqs, seed);
  c.twin           = std::make_unique<test_cache>(s.layout, s.seqs, seed);
  s.fill_chunk(*c.cache);
  for (auto& x : s.scores) x = static_cast<float>(pick(0, 3));
  for (std::int32_t r = 0; r < B; ++r) {
    std::int64_t cand = 0, pages = 0;
    for (std::int32_t i = 0; i < 2 * H; ++i)
      cand +=
          s.seqs[static_cast<std::size_t>(r)].base_len[static_cast<std::size_t>(i)] + s.chunk(r);
    for (std::int32_t i = 0; i < 2 * H; i += Hp) pages += (max_cand + P - 1) / P;
    s.wanted.push_back(pick(0, cand + 2));
    s.limit.push_back(pick(0, pages + 1));
  }
  return c;
}

/// A rule whose per-layer eviction keeps exactly `keep` of `cand` candidates at `n_seen`.
std::optional<head_rule> rule_keeping(head_rule r,
                                      std::int64_t n_seen,
                                      std::int64_t cand,
                                      std::int64_t keep) {
  if (keep == cand) {
    r.budget = 1.0;
    return r;
  }
  double b = static_cast<double>(keep) / static_cast<double>(n_seen);
  for (double x : {b, std::nextafter(b, 0.0), std::nextafter(b, 2.0)}) {
    r.budget = x;
    if (x > 0 && x <= 1 && eviction_keep(r, n_seen, cand) == keep) return r;
  }
  return std::nullopt;
}

}  // namespace

TEST_CASE("elastic eviction reference: optimal, within the limit, against brute force",
          "[reference][elastic]") {
  std::mt19937_64 rng(20261201);
  reference_backend ref;
  int fitted = 0, refused = 0, compared = 0;
  for (int iter = 0; iter < 400; ++iter) {
    auto c               = make_random_case(rng);
    auto& s              = c.s;
    const std::int32_t L = s.L(), H = s.H(), P = s.layout.geometry.page_tokens;
    // Candidates' rows before the run (held tokens from the dense copy, then the chunk).
    std::vector<std::vector<std::vector<float>>> ck, cv;
    for (std::int32_t r = 0; r < s.B(); ++r)
      for (std::int32_t i = 0; i < L * H; ++i) {
        ck.push_back(candidate_rows(s, *c.cache, r, i / H, i % H, 0));
        cv.push_back(candidate_rows(s, *c.cache, r, i / H, i % H, 1));
      }
    auto o = run_elastic(s, *c.cache, ref);
    {  // The stage keys: blocks of the compressed groups' pages after the chunk, each
       // candidate's key past the sink at its list position; nothing else.
      INFO("iteration " << iter);
      std::int64_t words = 0;
      for (std::int32_t r = 0; r < s.B(); ++r)
        for (std::int32_t g = 0; g < s.layout.num_groups(); ++g) {
          std::int32_t extent = 0;
          for (std::int32_t i = 0; i < 2 * H; ++i)
            if (s.chunk(r) > 0 && s.layout.slots[static_cast<std::size_t>(i)].group == g)
              extent = std::max(
                  extent,
                  s.seqs[static_cast<std::size_t>(r)].base_len[static_cast<std::size_t>(i)] +
                      s.chunk(r));
          CHECK(o.base[static_cast<std::size_t>(r * s.layout.num_groups() + g)] == words);
          words += (extent + P - 1) / P * s.layout.geometry.group_size * P;
        }
      CHECK(o.words == std::max<std::int64_t>(words, 1));  // never an empty buffer
      std::vector<std::uint32_t> want(o.keys.size(), unwritten_key);
      std::int32_t window = std::max(0, c.protect - s.sink);
      for (std::int32_t r = 0; r < s.B(); ++r) {
        if (s.chunk(r) == 0) continue;
        for (std::int32_t i = 0; i < 2 * H; ++i) {
          std::int32_t n =
              s.seqs[static_cast<std::size_t>(r)].base_len[static_cast<std::size_t>(i)] +
              s.chunk(r);
          for (std::int32_t x = s.sink; x < n; ++x)
            want[key_index(s, o, r, i / H, i % H, x)] =
                x >= n - window ? protected_score_key : score_key(s.score(i / H, r, i % H, x));
        }
      }
      CHECK(o.keys == want);
    }
    for (std::int32_t r = 0; r < s.B(); ++r) {
      INFO("iteration " << iter << ", request " << r);
      auto const& q      = s.seqs[static_cast<std::size_t>(r)];
      std::int64_t chunk = s.chunk(r), n_seen = q.seq_tokens + chunk;
      auto cand = [&](std::int32_t i) { return q.base_len[static_cast<std::size_t>(i)] + chunk; };
      auto new_len = [&](std::int32_t i) {
        return o.new_len[static_cast<std::size_t>(r * L * H + i)];
      };
      if (chunk == 0) {
        CHECK(o.pages_out[static_cast<std::size_t>(r)] == 0);
        for (std::int32_t i = 0; i < L * H; ++i)
          CHECK(new_len(i) == q.base_len[static_cast<std::size_t>(i)]);
        continue;
      }
      // Independent ranking of every compressed candidate: protected first, then the higher
      // score, then the lower (layer, head, position).
      std::int32_t window = std::max(0, c.protect - s.sink);
      auto prot           = [&](std::int32_t i, std::int64_t x) {
        return x < s.sink || x >= cand(i) - window;
      };
      struct item {
        bool p;
        float score;
        std::int64_t flat;
      };
      std::vector<item> all;
      for (std::int32_t i = 0; i < 2 * H; ++i)
        for (std::int64_t x = 0; x < cand(i); ++x)
          all.push_back(
              {prot(i, x), s.score(i / H, r, i % H, static_cast<std::int32_t>(x)), i * 1000 + x});
      auto beats = [](item const& a, item const& b) {
        if (a.p != b.p) return a.p;
        if (!a.p && a.score != b.score) return a.score > b.score;
        return a.flat < b.flat;
      };
      std::int64_t K = s.wanted[static_cast<std::size_t>(r)];
      std::vector<std::int64_t> need(static_cast<std::size_t>(2 * H), 0);
      std::set<std::int64_t> wanted_set;
      for (auto const& a : all) {
        std::int64_t beaten = 0;
        for (auto const& b : all) beaten += beats(b, a);
        if (beaten < K) {
          ++need[static_cast<std::size_t>(a.flat / 1000)];
          wanted_set.insert(a.flat);
        }
      }
      // Brute force over every group-length vector within the limit.
      const std::int32_t G = 2 * H / s.layout.geometry.group_size;  // 2H compressed heads
      std::vector<std::vector<std::int32_t>> members(static_cast<std::size_t>(G));
      std::int32_t gbase = s.layout.slots[0].group;
      for (std::int32_t i = 0; i < 2 * H; ++i)
        gbase = std::min(gbase, s.layout.slots[static_cast<std::size_t>(i)].group);
      for (std::int32_t i = 0; i < 2 * H; ++i)
        members[static_cast<std::size_t>(s.layout.slots[static_cast<std::size_t>(i)].group - gbase)]
            .push_back(i);
      std::int64_t protected_count = 0;
      for (std::int32_t i = 0; i < 2 * H; ++i)
        protected_count = std::max<std::int64_t>(protected_count,
                                                 std::min<std::int64_t>(cand(i), s.sink + window));
      std::int64_t lo = (protected_count + P - 1) / P, limit = s.limit[static_cast<std::size_t>(r)];
      if (G * lo > limit) {
        ++refused;
        CHECK(o.pages_out[static_cast<std::size_t>(r)] == elastic_does_not_fit);
        for (std::int32_t i = 0; i < 2 * H; ++i) CHECK(new_len(i) == -1);
        continue;
      }
      ++fitted;
      std::int64_t best = -1;
      std::vector<std::int64_t> p(static_cast<std::size_t>(G), lo);
      std::function<void(std::int32_t, std::int64_t)> enumerate = [&](std::int32_t g,
                                                                      std::int64_t used) {
        if (g == G) {
          std::int64_t w = 0;
          for (std::int32_t k = 0; k < G; ++k)
            for (auto i : members[static_cast<std::size_t>(k)])
              w += std::min<std::int64_t>(need[static_cast<std::size_t>(i)],
                                          p[static_cast<std::size_t>(k)] * P);
          best = std::max(best, w);
          return;
        }
        for (std::int64_t x = lo;
             used + x + (G - g - 1) * lo <= limit && x <= (s.max_candidates + P - 1) / P + 1;
             ++x) {
          p[static_cast<std::size_t>(g)] = x;
          enumerate(g + 1, used + x);
        }
      };
      enumerate(0, 0);
      // The reference's result: within the limit, optimal, protected kept, in order.
      std::int64_t pages = 0, kept_wanted = 0;
      for (std::int32_t k = 0; k < G; ++k) {
        std::int64_t longest = 0;
        for (auto i : members[static_cast<std::size_t>(k)])
          longest = std::max<std::int64_t>(longest, new_len(i));
        pages += (longest + P - 1) / P;
      }
      CHECK(pages <= limit);
      CHECK(o.pages_out[static_cast<std::size_t>(r)] <= limit);
      CHECK(o.pages_out[static_cast<std::size_t>(r)] >= pages);
      for (std::int32_t i = 0; i < 2 * H; ++i) {
        auto sv = survivors(s,
                            *c.cache,
                            ck[static_cast<std::size_t>(r * L * H + i)],
                            cv[static_cast<std::size_t>(r * L * H + i)],
                            r,
                            i / H,
                            i % H,
                            new_len(i));
        CHECK(std::is_sorted(sv.begin(), sv.end()));
        CHECK(std::adjacent_find(sv.begin(), sv.end()) == sv.end());
        CHECK(std::find(sv.begin(), sv.end(), -1) == sv.end());
        // Exactly the head's best new_len candidates by its own ranking.
        std::vector<std::int64_t> expect;
        for (std::int64_t x = 0; x < cand(i); ++x) {
          item a{prot(i, x), s.score(i / H, r, i % H, static_cast<std::int32_t>(x)), x};
          std::int64_t beaten = 0;
          for (std::int64_t y = 0; y < cand(i); ++y)
            beaten +=
                beats({prot(i, y), s.score(i / H, r, i % H, static_cast<std::int32_t>(y)), y}, a);
          if (beaten < new_len(i)) expect.push_back(x);
        }
        CHECK(sv == expect);
        for (std::int64_t x = 0; x < cand(i); ++x)
          if (prot(i, x)) CHECK(std::find(sv.begin(), sv.end(), x) != sv.end());
        for (auto x : sv) kept_wanted += wanted_set.count(i * 1000 + x);
        CHECK(std::min<std::int64_t>(need[static_cast<std::size_t>(i)], new_len(i)) ==
              static_cast<std::int64_t>(std::count_if(sv.begin(), sv.end(), [&](std::int64_t x) {
                return wanted_set.count(i * 1000 + x) > 0;
              })));
      }
      CHECK(kept_wanted == best);
      for (std::int32_t i = 2 * H; i < L * H; ++i) CHECK(new_len(i) == n_seen);
    }
    // Today's per-layer eviction with each head's keep count as its rule gives the same heads.
    auto rules      = s.rules;
    bool comparable = true;
    for (std::int32_t i = 0; i < 2 * H; ++i) {
      // Same rule for every request is needed: compare with one-request batches only.
      if (s.B() != 1) comparable = false;
    }
    if (!comparable || o.pages_out[0] < 0) continue;
    std::int64_t chunk = s.chunk(0), n_seen = s.seqs[0].seq_tokens + chunk;
    for (std::int32_t i = 0; i < 2 * H; ++i) {
      auto cand = s.seqs[0].base_len[static_cast<std::size_t>(i)] + chunk;
      auto keep = o.new_len[static_cast<std::size_t>(i)];
      if (keep == 0) {
        comparable = false;
        break;
      }
      auto rr = rule_keeping(rules[static_cast<std::size_t>(i)], n_seen, cand, keep);
      REQUIRE(rr.has_value());
      rules[static_cast<std::size_t>(i)] = *rr;
    }
    if (!comparable) continue;
    ++compared;
    auto v = c.twin->view(s.batch);
    std::vector<std::int32_t> len(static_cast<std::size_t>(H));
    for (std::int32_t l = 0; l < L; ++l) {
      auto pl    = stage_params(s, v, l);
      pl.rules   = rules.data() + l * H;
      pl.new_len = len.data();
      reference::evict_chunk(pl);
      for (std::int32_t h = 0; h < H; ++h) {
        INFO("iteration " << iter << ", per-layer comparison, layer " << l << " head " << h);
        CHECK(len[static_cast<std::size_t>(h)] == o.new_len[static_cast<std::size_t>(l * H + h)]);
        for (std::int32_t pos = 0; pos < len[static_cast<std::size_t>(h)]; ++pos)
          for (int kv = 0; kv < 2; ++kv)
            CHECK(stored_row(s, *c.twin, 0, l, h, pos, kv) ==
                  stored_row(s, *c.cache, 0, l, h, pos, kv));
      }
    }
  }
  CHECK(fitted > 200);
  CHECK(compared > 50);
  CHECK(refused > 10);
}
