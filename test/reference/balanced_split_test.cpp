// SPDX-License-Identifier: Apache-2.0
// The per-step balanced split map's CPU reference (reference/balanced_split.hpp): hand-worked
// maps, the least fullest CTA against brute force on random views (sliding layers and padding
// rows included), and its refusals.
#include "tangram/reference/balanced_split.hpp"

#include <random>
#include <vector>

#include "../gpu/balanced_split_cases.hpp"
#include "balanced_brute_force.hpp"
#include "kv_test_cache.hpp"
#include "test_support.hpp"

using namespace tangram;

namespace {

// One layer of 3 KV heads (Hp 1, d 1); sequence 0 holds 60 / 10 / 0 tokens, sequence 1 40 / 0 / 0.
struct three_heads {
  test::test_cache cache;
  three_heads()
      : cache(test::adjacent_layout(page_geometry{16, 1, 1, dtype::f32}, 1, 3),
              {spec({60, 10, 0}), spec({40, 0, 0})},
              1) {}
  static test::sequence_spec spec(std::vector<std::int32_t> base) {
    test::sequence_spec s;
    s.seq_tokens = base[0];
    s.base_len   = std::move(base);
    return s;
  }
  std::vector<std::int32_t> map(std::vector<std::int32_t> const& batch, std::int32_t ctas) {
    std::vector<std::int32_t> begin(4, -1);
    balanced_split_params p;
    p.kv        = cache.view(batch);
    p.num_ctas  = ctas;
    p.cta_begin = begin.data();
    reference::balance_decode_splits(p);
    return begin;
  }
};

}  // namespace

TEST_CASE("balanced split map: hand-worked layers", "[balanced_split]") {
  three_heads t;
  // W = 100 / 10 / 0. On 6 CTAs: T = 25 needs 4 + 1 + 1 = 6, T = 24 needs 7: shares 4 / 1 / 1.
  CHECK(t.map({0, 1}, 6) == std::vector<std::int32_t>{0, 4, 5, 6});
  // A padding row holds nothing: the same map.
  CHECK(t.map({0, kv_cache_view{}.padding_slot, 1}, 6) == std::vector<std::int32_t>{0, 4, 5, 6});
  // On 9 CTAs: T = 15 needs 7 + 1 + 1 = 9, T = 14 needs 10: shares 7 / 1 / 1, none left over.
  CHECK(t.map({0, 1}, 9) == std::vector<std::int32_t>{0, 7, 8, 9});
  // Sequence 1 alone, W = 40 / 0 / 0, on 8 CTAs: T = 7 needs 6 + 1 + 1 = 8: 6 / 1 / 1.
  CHECK(t.map({1}, 8) == std::vector<std::int32_t>{0, 6, 7, 8});
  // An empty batch: T = 1, every head 1 CTA, the 4 left over round-robin: 1 + 1 + 1 / 1 + 1 / 1
  // + 1.
  CHECK(t.map({}, 7) == std::vector<std::int32_t>{0, 3, 5, 7});
  // One CTA per head: nothing to choose.
  CHECK(t.map({0, 1}, 3) == std::vector<std::int32_t>{0, 1, 2, 3});
}

TEST_CASE("balanced split map: the least fullest CTA of every layer (brute force)",
          "[balanced_split]") {
  std::mt19937_64 rng(11);
  for (int trial = 0; trial < 150; ++trial) {
    std::int32_t L = 2, H = 1 + static_cast<std::int32_t>(rng() % 4);
    std::int32_t N = H + static_cast<std::int32_t>(rng() % 8);
    auto layout    = test::adjacent_layout(page_geometry{4, 1, 1, dtype::f32}, L, H, {1}, 6, 2);
    std::vector<test::sequence_spec> seqs;
    for (int s = 0; s < 4; ++s) {
      test::sequence_spec q;
      q.seq_tokens = static_cast<std::int32_t>(rng() % 40);
      q.appended   = static_cast<std::int32_t>(rng() % 3);
      for (std::int32_t i = 0; i < L * H; ++i)
        q.base_len.push_back(rng() % 4 == 0 ? 0 : static_cast<std::int32_t>(rng() % 50));
      seqs.push_back(q);
    }
    test::test_cache cache(layout, seqs, 3);
    std::vector<std::int32_t> batch;
    for (int r = 0; r < 1 + static_cast<int>(rng() % 5); ++r)
      batch.push_back(rng() % 5 == 0 ? kv_cache_view{}.padding_slot
                                     : static_cast<std::int32_t>(rng() % 4));
    std::vector<std::int32_t> begin(static_cast<std::size_t>(L * (H + 1)));
    balanced_split_params p;
    p.kv        = cache.view(batch);
    p.num_ctas  = N;
    p.cta_begin = begin.data();
    reference::balance_decode_splits(p);
    for (std::int32_t l = 0; l < L; ++l) {
      // Each head's tokens from the cache's own spec (windows and appended tokens included).
      std::vector<std::int64_t> W(static_cast<std::size_t>(H), 0), S;
      for (auto s : batch)
        for (std::int32_t h = 0; h < H && s >= 0; ++h)
          W[static_cast<std::size_t>(h)] += cache.len(s, l, h);
      auto const* b = begin.data() + l * (H + 1);
      for (std::int32_t h = 0; h < H; ++h) S.push_back(b[h + 1] - b[h]);
      INFO("trial " << trial << " layer " << l << " H " << H << " N " << N);
      CHECK(b[0] == 0);
      CHECK(b[H] == N);
      CHECK(*std::min_element(S.begin(), S.end()) >= 1);
      CHECK(test::fullest_cta(W, S) == test::least_fullest_cta(W, N));
    }
  }
}

TEST_CASE("balanced split map: the kernels' scenarios give valid maps", "[balanced_split]") {
  // The scenarios the emulated and GPU kernels run, against the reference itself: every map valid.
  struct reference_backend {
    void balance(test::test_cache&, balanced_split_params const& p) {
      reference::balance_decode_splits(p);
    }
  } backend;
  for (auto const& c : test::balanced_split_cases())
    CHECK(test::check_balanced_split(c, backend) == "");
}

TEST_CASE("balanced split map: refusals name the field", "[balanced_split]") {
  three_heads t;
  std::vector<std::int32_t> begin(4);
  balanced_split_params p;
  p.kv        = t.cache.view({0});
  p.num_ctas  = 2;
  p.cta_begin = begin.data();
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      reference::balance_decode_splits(p), invalid_argument, "num_ctas: 2", "3 KV heads");
  p.num_ctas  = 3;
  p.cta_begin = nullptr;
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      reference::balance_decode_splits(p), invalid_argument, "cta_begin: null");
  p.cta_begin     = begin.data();
  p.kv.batch_size = decode_max_batch + 1;
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      reference::balance_decode_splits(p), invalid_argument, "batch_size");
}
