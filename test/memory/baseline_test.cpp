// SPDX-License-Identifier: Apache-2.0
// The layer-wide paging baselines, worked by hand on the tiny model and compared with Tangram on
// the real Llama-3.1-8B plans (relations only; the figures are in bench/memory.cpp).
#include "tangram/eval/baselines/unified_paging.hpp"
#include "tangram/eval/sim/simulated_memory_resource.hpp"
#include "tangram/memory/host_memory_resource.hpp"

#include "memory_fixtures.hpp"

using namespace tangram;
using namespace tangram::test;

TEST_CASE("full-KV layer pages: ceil(n / P) pages per layer, nothing reclaimed",
          "[memory][baseline]") {
  auto plan = tiny_plan(tiny_budgets());
  host_memory_resource mr;
  unified_paging_baseline b(plan, unified_mode::full_kv, mr, 100, 2, 64);
  CHECK(b.page_bytes() == 4 * 2 * 4 * 4 * 4);  // H * 2 * P * d * sizeof(f32) = 512
  auto s = *b.try_admit();
  for (auto c : {8, 8, 4}) REQUIRE(b.prefill_chunk(s, c));
  CHECK(b.pages_held(s) == 4 * 5);
  std::int32_t one[] = {s};
  for (int i = 0; i < 5; ++i) REQUIRE(b.decode_step(one, 1));
  CHECK(b.pages_held(s) == 4 * 7);  // ceil(25 / 4) per layer
  CHECK(b.head_len(s, 0, 1) == 25);
  CHECK(b.stats().reclaim_ops == 0);
  CHECK(b.stats().pages_allocated == 28);
  b.free(s);
  CHECK(b.pool().stats().used == 0);
}

TEST_CASE("compressed pages spanning a layer: allocate the chunk, then reclaim the tail",
          "[memory][baseline]") {
  auto plan = tiny_plan(tiny_budgets());
  simulated_memory_resource mr;
  unified_paging_baseline b(plan, unified_mode::compressed_reclaim, mr, 100, 2, 64);
  auto s = *b.try_admit();
  // Chunk 1 (n = 8): every layer gets ceil(8/4) = 2 pages; longest kept heads 6 (l0), 8 (sliding,
  // W 10), 8 (uncompressed), 5 (l3): still 2 pages each, nothing reclaimed.
  REQUIRE(b.prefill_chunk(s, 8));
  CHECK(b.stats().pages_allocated == 8);
  CHECK(b.stats().reclaim_ops == 0);
  // Chunk 2 (n = 16): l0 6+8=14 -> 4 pages, keeps 12 -> 3 (1 reclaimed); l1 16 -> 4, keeps 10 -> 3
  // (1); l2 16 -> 4; l3 5+8=13 -> 4, keeps 10 -> 3 (1).
  REQUIRE(b.prefill_chunk(s, 8));
  CHECK(b.stats().pages_allocated == 16);
  CHECK(b.stats().reclaim_ops == 3);
  // Chunk 3 (n = 20): l0 12+4 -> 4, keeps 15 -> 4; l1 14 -> 4, keeps 10 -> 3 (1); l2 20 -> 5;
  // l3 10+4 -> 4, keeps 12 -> 3 (1).
  REQUIRE(b.prefill_chunk(s, 4));
  CHECK(b.stats().pages_allocated == 20);
  CHECK(b.stats().reclaim_ops == 5);
  CHECK(b.pages_held(s) == 4 + 3 + 5 + 3);
  CHECK(b.head_len(s, 0, 2) == 15);
  CHECK(b.head_len(s, 1, 0) == 10);
  // 15 pages of 512 bytes against Tangram's 27 pages of 256 bytes after the same prefill.
  CHECK(b.pages_held(s) * b.page_bytes() == 7680);
  // Every layer takes its chunk's pages before the evictions run: 13 held after chunk 2, plus one
  // page per layer for chunk 3 = 17 at the peak.
  CHECK(b.peak_pages() == 17);
  // A kept count above held + chunk is refused.
  std::vector<std::int32_t> kept(16, 0);
  auto s2 = *b.try_admit();
  kept[3] = 5;
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      b.prefill_chunk(s2, 4, kept.data()), logic_error, "head (0, 3)", "keeps 5 of 4");
  CHECK_THROWS_AS(b.free(7), logic_error);
  b.free(s);
  b.free(s2);
  CHECK(b.pool().stats().used == 0);
}

TEST_CASE("running out of pages is a failed step, not an exception", "[memory][baseline]") {
  auto plan = tiny_plan(tiny_budgets());
  simulated_memory_resource mr;
  unified_paging_baseline b(plan, unified_mode::full_kv, mr, 6, 1, 64);
  auto s = *b.try_admit();
  CHECK_FALSE(b.prefill_chunk(s, 8));  // needs 8 pages
  CHECK(b.stats().failed_steps == 1);
  CHECK(b.pool().stats().used == 0);
  REQUIRE(b.prefill_chunk(s, 4));
  std::int32_t one[] = {s};
  CHECK_FALSE(b.decode_step(one, 1));  // 4 more pages needed, 2 left
  CHECK(b.head_len(s, 0, 0) == 4);
}

TEST_CASE(
    "on the real profiles Tangram holds less than layer-wide compressed pages, and far less "
    "than full KV",
    "[memory][baseline][profiles]") {
  for (auto scorer : {"snapkv", "ea", "keydiff", "fastkvzip"}) {
    auto plan = llama_plan(scorer);
    simulated_memory_resource mr;
    const std::int64_t C = 32768, chunk = 4096;
    manager_options o;
    o.num_pages     = 200000;
    o.max_sequences = 1;
    kv_cache_manager t(plan, mr, o);
    auto id = *t.try_admit(C, 0);
    std::vector<std::int32_t> kept(static_cast<std::size_t>(plan.num_layers * plan.num_kv_heads));
    for (std::int64_t n = 0; n < C; n += chunk) {
      t.prepare_chunk(id, chunk);
      t.expected_kept(id, chunk, kept.data());
      t.commit_chunk(id, kept);
    }
    unified_paging_baseline full(plan, unified_mode::full_kv, mr, 100000, 1, C);
    unified_paging_baseline reclaim(plan, unified_mode::compressed_reclaim, mr, 100000, 1, C);
    auto f = *full.try_admit(), r = *reclaim.try_admit();
    for (std::int64_t n = 0; n < C; n += chunk) {
      REQUIRE(full.prefill_chunk(f, chunk));
      REQUIRE(reclaim.prefill_chunk(r, chunk));
    }
    double tangram_bytes = static_cast<double>(t.pool().stats().peak_used * t.pool().page_bytes());
    double steady        = static_cast<double>(reclaim.pages_held(r) * reclaim.page_bytes());
    double peak = static_cast<double>(reclaim.peak_pages() * reclaim.page_bytes());
    double full_bytes = static_cast<double>(full.pages_held(f) * full.page_bytes());
    INFO(scorer << " tangram " << tangram_bytes << " reclaim steady " << steady << " peak " << peak
                << " full " << full_bytes);
    CHECK(full_bytes == 32.0 * 2048 * full.page_bytes());
    CHECK(tangram_bytes < steady);
    CHECK(steady < peak);
    CHECK(peak < full_bytes);
    CHECK(reclaim.stats().reclaim_ops > 0);
    CHECK(t.stats().reclaimed_pages == 0);
    // Same heads, same rule: layer-wide pages hold every layer's longest head.
    for (std::int32_t l = 0; l < plan.num_layers; ++l)
      for (std::int32_t h = 0; h < plan.num_kv_heads; ++h)
        REQUIRE(reclaim.head_len(r, l, h) == t.head_len(id, l, h));
  }
}
