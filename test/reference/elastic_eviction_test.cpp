// SPDX-License-Identifier: Apache-2.0
// CPU reference of the elastic chunk eviction (reference/elastic_eviction.hpp): a case worked by
// hand, a brute force over every group-length vector on small random cases (optimal, within the
// limit, protected tokens kept, survivors in order, equal to the per-layer eviction with the same
// keep counts), and the real manager in elastic mode end to end.
#include "tangram/reference/elastic_eviction.hpp"

#include <algorithm>
#include <functional>
#include <map>
#include <memory>
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
  q.seq_tokens = 4;
  q.base_len   = std::vector<std::int32_t>(6, 4);
  q.reserve    = 2;
  s.seqs       = {q};
  s.batch      = {0};
  s.indptr     = {0, 2};
  s.sink       = 1;
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
    // Keys of the stage step: protected = 0xffffffff, others score_key(score).
    CHECK(o.keys[0] == protected_score_key);
    CHECK(o.keys[5] == protected_score_key);
    CHECK(o.keys[1] == score_key(9.f));
    using v = std::vector<std::int64_t>;
    CHECK(survivors(s, *cache, ck[0], cv[0], 0, 0, 0, 6) == v{0, 1, 2, 3, 4, 5});
    CHECK(survivors(s, *cache, ck[1], cv[1], 0, 0, 1, 6) == v{0, 1, 2, 3, 4, 5});
    CHECK(survivors(s, *cache, ck[2], cv[2], 0, 1, 0, 4) == v{0, 1, 2, 5});  // 5, 5 kept
    CHECK(survivors(s, *cache, ck[3], cv[3], 0, 1, 1, 4) == v{0, 1, 2, 5});  // 5, first 3
    CHECK(survivors(s, *cache, ck[4], cv[4], 0, 2, 0, 6) == v{0, 1, 2, 3, 4, 5});  // appended
  }
  SECTION("limit 4: group 1 stays at its floor and keeps only its protected tokens") {
    s.wanted = {13};
    s.limit  = {4};
    auto ck2 = candidate_rows(s, *cache, 0, 1, 0, 0), cv2 = candidate_rows(s, *cache, 0, 1, 0, 1);
    auto o   = run_elastic(s, *cache, ref);
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
  std::vector<std::uint32_t> keys(36);
  std::vector<std::int32_t> len(6);
  e.keys       = keys.data();
  e.wanted     = s.wanted.data();
  e.page_limit = s.limit.data();
  e.new_len    = len.data();
  auto bad     = e;
  bad.keys     = nullptr;
  CHECK_THROWS_WITH(reference::evict_elastic(bad), Catch::Contains("elastic_eviction_params.keys"));
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
}
