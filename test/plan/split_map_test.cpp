// SPDX-License-Identifier: Apache-2.0
#include "tangram/plan/split_map.hpp"

#include <numeric>
#include <random>

#include "tangram/plan/footprint.hpp"
#include "tangram/plan/split_planner.hpp"
#include "test_support.hpp"

using namespace tangram;

TEST_CASE("apportion: proportional, at least one, exact total", "[split]") {
  CHECK(apportion({1, 1, 2}, 8) == std::vector<std::int32_t>{2, 2, 4});
  CHECK(apportion({1, 1, 1}, 4) == std::vector<std::int32_t>{2, 1, 1});      // tie to lower index
  CHECK(apportion({100, 0.001, 0}, 10) == std::vector<std::int32_t>{8, 1, 1});  // pinned minimum
  CHECK(apportion({0, 0}, 5) == std::vector<std::int32_t>{3, 2});
  TANGRAM_REQUIRE_THROWS_WITH_ALL(apportion({1, 1, 1}, 2), invalid_argument, "N_CTA = 2", "3 heads");
  std::mt19937 rng(3);
  std::uniform_real_distribution<double> u(0, 1);
  for (int t = 0; t < 500; ++t) {
    std::vector<double> w(1 + t % 16);
    for (auto& x : w) x = u(rng) * u(rng);
    auto total = static_cast<std::int32_t>(w.size() + t % 300);
    auto s = apportion(w, total);
    CHECK(std::accumulate(s.begin(), s.end(), 0) == total);
    double sum = std::accumulate(w.begin(), w.end(), 0.0);
    for (std::size_t i = 0; i < w.size(); ++i) {
      CHECK(s[i] >= 1);
      // Never more than one seat above the proportional quota.
      CHECK(s[i] <= std::max(1.0, total * w[i] / sum + 1.0));
    }
  }
}

TEST_CASE("split arithmetic: every token covered once, partial slots unique", "[split]") {
  std::mt19937 rng(5);
  for (int t = 0; t < 300; ++t) {
    std::int64_t share = 1 + t % 37;
    std::vector<std::int64_t> len(1 + t % 9);
    for (auto& x : len) x = std::uniform_int_distribution<std::int64_t>(0, t % 3 == 0 ? 3 : 5000)(rng);
    std::int64_t total = std::accumulate(len.begin(), len.end(), std::int64_t{0});
    if (total == 0) continue;
    std::vector<int> covered(static_cast<std::size_t>(total), 0);
    std::vector<int> slot_used(static_cast<std::size_t>(share + static_cast<std::int64_t>(len.size())), 0);
    for (std::int64_t j = 0; j < share; ++j)
      for (auto p = split_bound(j, share, total); p < split_bound(j + 1, share, total); ++p) covered[static_cast<std::size_t>(p)]++;
    for (int c : covered) REQUIRE(c == 1);
    std::int64_t prefix = 0;
    for (std::size_t r = 0; r < len.size(); ++r) {
      if (len[r] == 0) continue;
      auto first = split_cta_of(prefix, share, total);
      auto last  = split_cta_of(prefix + len[r] - 1, share, total);
      REQUIRE(split_bound(first, share, total) <= prefix);
      REQUIRE(split_bound(first + 1, share, total) > prefix);
      REQUIRE(split_bound(last, share, total) <= prefix + len[r] - 1);
      REQUIRE(split_bound(last + 1, share, total) > prefix + len[r] - 1);
      for (auto j = first; j <= last; ++j) {
        if (split_bound(j, share, total) == split_bound(j + 1, share, total)) continue;  // empty CTA
        REQUIRE(slot_used[static_cast<std::size_t>(j + static_cast<std::int64_t>(r))]++ == 0);
      }
      prefix += len[r];
    }
  }
}

TEST_CASE("build_split_map follows Algorithm 1", "[split]") {
  // One layer, 4 heads; budget weighting: shares proportional to B.
  std::vector<head_rule> rules = {{layer_kind::compressed, 0.1, 0, 0},
                                  {layer_kind::compressed, 0.2, 0, 0},
                                  {layer_kind::compressed, 0.3, 0, 0},
                                  {layer_kind::compressed, 0.4, 0, 0}};
  split_options o;
  o.limits    = {10, 2};
  o.weighting = split_weighting::budget;
  auto m = build_split_map(rules, 1, 4, o);
  REQUIRE_NOTHROW(m.validate());
  auto v = m.view();
  CHECK(v.num_ctas == 20);
  CHECK(v.share(0, 0) == 2);
  CHECK(v.share(0, 1) == 4);
  CHECK(v.share(0, 2) == 6);
  CHECK(v.share(0, 3) == 8);
  CHECK(v.head_of_cta(0, 0) == 0);
  CHECK(v.head_of_cta(0, 5) == 1);
  CHECK(v.head_of_cta(0, 19) == 3);
  CHECK(v.partial_slots(3) == 20 + 4 * 3);
  // batch_share weighting accounts for the protected floor: at contexts below `protect`
  // every head keeps everything, so the shares even out.
  o.weighting          = split_weighting::batch_share;
  o.reference_contexts = {100};
  for (auto& r : rules) r.protect = 200;
  auto even = build_split_map(rules, 1, 4, o);
  CHECK(even.view().share(0, 0) == 5);
  CHECK(even.view().share(0, 3) == 5);
  TANGRAM_REQUIRE_THROWS_WITH_ALL(build_split_map(rules, 1, 4, split_options{{1, 2}}), invalid_argument,
                                  "N_CTA = 2", "4 heads");
}

TEST_CASE("retained tokens and footprint follow the brief's formulas", "[footprint]") {
  head_rule r{layer_kind::compressed, 0.3, 100, 0};
  CHECK(retained_tokens(r, 0) == 0);
  CHECK(retained_tokens(r, 100) == 100);   // n <= protect keeps all
  CHECK(retained_tokens(r, 200) == 100);   // ceil(60) < protect
  CHECK(retained_tokens(r, 1000) == 300);
  CHECK(retained_tokens(r, 1001) == 301);  // ceil(300.3)
  head_rule full{layer_kind::compressed, 1.0, 0, 0};
  CHECK(retained_tokens(full, 777) == 777);
  head_rule sw{layer_kind::sliding_window, 1.0, 0, 128};
  CHECK(retained_tokens(sw, 50) == 50);
  CHECK(retained_tokens(sw, 5000) == 128);
  // Group pages: ceil((k + t) / P); ring of ceil(W / P).
  CHECK(group_pages(r, 1000, 0, 16) == 19);   // 300 / 16 -> 19
  CHECK(group_pages(r, 1000, 20, 16) == 20);  // 320 / 16
  CHECK(group_pages(sw, 5000, 100, 16) == 8);
  CHECK(group_pages(sw, 20, 5, 16) == 2);
}
