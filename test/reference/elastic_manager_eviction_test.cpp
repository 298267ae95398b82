// SPDX-License-Identifier: Apache-2.0
// The elastic eviction driven by the real manager in elastic mode, end to end over host memory:
// prepare_chunk -> the stage launch of every layer -> the elastic selection -> commit_chunk
// accepted, the compressed groups never above elastic_page_limit, and every head holding the
// tokens it should (token ids written into K and V).
#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "../memory/memory_fixtures.hpp"
#include "tangram/memory/host_memory_resource.hpp"
#include "tangram/memory/memory_resource.hpp"
#include "tangram/plan/footprint.hpp"
#include "tangram/reference/elastic_eviction.hpp"
#include "tangram/reference/eviction.hpp"

using namespace tangram;
using namespace tangram::test;

TEST_CASE("elastic eviction reference with the real manager: chunks commit within the limit",
          "[reference][elastic]") {
  auto margin = GENERATE(0.0, 0.25);
  INFO("margin " << margin);
  static_plan plan =
      tiny_plan(tiny_budgets(), 4, 2, 10, grouping_scope::global, elastic_reservation(margin));
  host_memory_resource mr;
  auto o             = opts(400, 4);
  o.max_chunk_tokens = 8;
  kv_cache_manager m(plan, mr, o);
  const std::int32_t L = plan.num_layers, H = plan.num_kv_heads, d = plan.geometry.head_dim;
  const std::int32_t sink = plan.profile.sink_tokens, window = 2;  // tiny: protect 1 + 2
  scorer_total total{plan.profile.target_keep_ratio,
                     plan.profile.protected_tokens(),
                     keep_ratio_basis::all_tokens};
  std::int64_t compressed = 0;
  for (auto const& r : plan.rules) compressed += r.kind == layer_kind::compressed;
  std::vector<sequence_id> ids     = {*m.try_admit(20, 6), *m.try_admit(13, 2), *m.try_admit(7, 1)};
  std::vector<std::int64_t> prompt = {20, 13, 7}, seen = {0, 0, 0};
  std::vector<std::vector<std::int64_t>> chunks = {{8, 8, 4}, {5, 8}, {7}};
  std::mt19937_64 rng(99);
  int evicted_heads = 0;
  // The stage keys, one buffer for the whole run as an engine would keep it, sized once by the
  // bound for 3 requests of at most 20 tokens (the longest prompt): stale keys of earlier chunks
  // stay in it; every stage launch rewrites its own.
  std::vector<std::uint32_t> keys(static_cast<std::size_t>(stage_key_words_bound(plan, 20, 3)),
                                  0xdeadbeefu);
  for (std::size_t step = 0; step < 3; ++step) {
    std::vector<sequence_id> batch;
    std::vector<std::int32_t> indptr = {0};
    std::vector<std::size_t> which;
    for (std::size_t q = 0; q < ids.size(); ++q) {
      if (step >= chunks[q].size()) continue;
      m.prepare_chunk(ids[q], chunks[q][step]);
      batch.push_back(ids[q]);
      which.push_back(q);
      indptr.push_back(indptr.back() + static_cast<std::int32_t>(chunks[q][step]));
    }
    m.set_batch(batch);
    // Pages the compressed groups hold once staged: until the prompt is in, a commit keeps them.
    std::vector<std::int64_t> staged;
    for (auto id : batch) staged.push_back(compressed_pages_held(m, id));
    auto v            = m.view();
    auto B            = static_cast<std::int32_t>(batch.size());
    std::int32_t rows = indptr.back(), max_cand = 1;
    for (std::int32_t r = 0; r < B; ++r)
      for (std::int32_t i = 0; i < L * H; ++i)
        max_cand = std::max(max_cand,
                            v.head_len(r, i / H, i % H) + indptr[static_cast<std::size_t>(r) + 1] -
                                indptr[static_cast<std::size_t>(r)]);
    // Chunk K/V: element 0 holds the token's id (request * 1000 + position), the rest noise.
    std::vector<float> ck(static_cast<std::size_t>(rows * H * d)), cv(ck.size());
    for (std::int32_t r = 0; r < B; ++r)
      for (std::int32_t t = indptr[static_cast<std::size_t>(r)];
           t < indptr[static_cast<std::size_t>(r) + 1];
           ++t)
        for (std::int32_t h = 0; h < H; ++h)
          for (std::int32_t x = 0; x < d; ++x) {
            auto at  = static_cast<std::size_t>((t * H + h) * d + x);
            float id = static_cast<float>(
                static_cast<std::int64_t>(which[static_cast<std::size_t>(r)]) * 1000 +
                seen[which[static_cast<std::size_t>(r)]] + t - indptr[static_cast<std::size_t>(r)]);
            ck[at] = x == 0 ? id : std::uniform_real_distribution<float>(-1, 1)(rng);
            cv[at] = x == 0 ? id : std::uniform_real_distribution<float>(-1, 1)(rng);
          }
    std::vector<std::int64_t> key_base(static_cast<std::size_t>(B * m.num_groups()));
    auto words = stage_key_layout(v, plan.rules.data(), indptr.data(), key_base.data());
    REQUIRE(static_cast<std::size_t>(words) <= keys.size());
    if (step == 0) {
      // The last request stages its whole 7-token prompt as one chunk: its block is exactly the
      // bound for one request of 7 tokens (every compressed group ceil(7 / P) pages of keys).
      REQUIRE(which.back() == 2);
      CHECK(words - key_base[static_cast<std::size_t>((B - 1) * m.num_groups())] ==
            stage_key_words_bound(plan, 7, 1));
    }
    std::vector<float> scores(static_cast<std::size_t>(B * H * max_cand));
    std::vector<std::int32_t> stage_len(static_cast<std::size_t>(B * H));
    for (std::int32_t l = 0; l < L; ++l) {
      for (auto& x : scores) x = std::uniform_real_distribution<float>(0, 1)(rng);
      eviction_params p;
      p.kv             = v;
      p.layer          = l;
      p.rules          = plan.rules.data() + l * H;
      p.sink           = sink;
      p.chunk_indptr   = indptr.data();
      p.chunk_k        = ck.data();
      p.chunk_v        = cv.data();
      p.max_candidates = max_cand;
      p.source         = score_source::supplied;
      p.scores         = scores.data();
      p.new_len        = stage_len.data();
      p.stage_keys     = keys.data();
      p.stage_key_base = key_base.data();
      reference::evict_chunk(p);
    }
    std::vector<std::int64_t> wanted, limit;
    for (std::int32_t r = 0; r < B; ++r) {
      auto q = which[static_cast<std::size_t>(r)];
      wanted.push_back(total.tokens(compressed, seen[q] + chunks[q][step]));
      limit.push_back(m.elastic_page_limit(batch[static_cast<std::size_t>(r)]));
    }
    std::vector<std::int32_t> new_len(static_cast<std::size_t>(B * L * H));
    std::vector<std::int64_t> pages(static_cast<std::size_t>(B));
    elastic_eviction_params e;
    e.kv             = v;
    e.rules          = plan.rules.data();
    e.sink           = sink;
    e.chunk_indptr   = indptr.data();
    e.max_candidates = max_cand;
    e.stage_keys     = keys.data();
    e.stage_key_base = key_base.data();
    e.wanted         = wanted.data();
    e.page_limit     = limit.data();
    e.new_len        = new_len.data();
    e.pages_out      = pages.data();
    reference::evict_elastic(e);
    for (std::int32_t r = 0; r < B; ++r) {
      auto q = which[static_cast<std::size_t>(r)];
      INFO("step " << step << ", request " << q);
      REQUIRE(pages[static_cast<std::size_t>(r)] >= 0);
      CHECK(pages[static_cast<std::size_t>(r)] <= limit[static_cast<std::size_t>(r)]);
      std::int64_t n_seen = seen[q] + chunks[q][step];
      // Contents before the commit (the view still has the old lengths; read through new_len).
      for (std::int32_t i = 0; i < L * H; ++i) {
        auto rule = plan.rules[static_cast<std::size_t>(i)];
        auto len  = new_len[static_cast<std::size_t>(r * L * H + i)];
        if (rule.kind == layer_kind::sliding_window) continue;
        auto cur = make_head_cursor(v, r, i / H, i % H);
        std::vector<std::int64_t> got;
        for (std::int32_t pos = 0; pos < len; ++pos)
          got.push_back(static_cast<std::int64_t>(*cur.ptr_at_position<float>(pos, 0)) -
                        static_cast<std::int64_t>(q) * 1000);
        CHECK(std::is_sorted(got.begin(), got.end()));
        CHECK(std::adjacent_find(got.begin(), got.end()) == got.end());
        if (rule.kind == layer_kind::uncompressed) {
          CHECK(len == n_seen);
          CHECK((got.empty() || (got.front() == 0 && got.back() == n_seen - 1)));
          continue;
        }
        ++evicted_heads;
        CHECK(std::find(got.begin(), got.end(), 0) != got.end());  // sink
        for (std::int64_t t = std::max<std::int64_t>(0, n_seen - window); t < n_seen; ++t)
          CHECK(std::find(got.begin(), got.end(), t) != got.end());  // recent window
        for (auto t : got) CHECK((t >= 0 && t < n_seen));
      }
      std::vector<std::int32_t> kept(new_len.begin() + r * L * H,
                                     new_len.begin() + (r + 1) * L * H);
      CHECK_NOTHROW(m.commit_chunk(batch[static_cast<std::size_t>(r)], kept));
      // The compressed groups use at most the limit (until the prompt is in they also keep the
      // chunk's staged pages for the next chunk; then those go back).
      auto used = compressed_pages_used(m, batch[static_cast<std::size_t>(r)]);
      auto held = compressed_pages_held(m, batch[static_cast<std::size_t>(r)]);
      CHECK(used <= limit[static_cast<std::size_t>(r)]);
      if (m.info(batch[static_cast<std::size_t>(r)]).phase == sequence_phase::decode)
        CHECK(held == used);
      else
        CHECK(held == staged[static_cast<std::size_t>(r)]);
      seen[q] = n_seen;
    }
    m.check_invariants();
  }
  CHECK(evicted_heads > 0);
  for (std::size_t q = 0; q < ids.size(); ++q)
    CHECK(m.info(ids[q]).phase == sequence_phase::decode);
}
