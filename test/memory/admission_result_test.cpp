// SPDX-License-Identifier: Apache-2.0
// admit(N, T): the reason a request did not fit, and the pages it lacks, on the tiny hybrid model
// worked by hand (M(20, 5) = 35 pages: see manager_test.cpp); the listing of live sequences.
// Both reservation modes; a refusal changes nothing but the rejection counter.
#include <cstdint>
#include <limits>
#include <vector>

#include "memory_fixtures.hpp"
#include "storm/engine_sim.hpp"
#include "tangram/memory/host_memory_resource.hpp"
#include "tangram/memory/kv_cache_manager.hpp"

using namespace tangram;
using namespace tangram::test;

TEST_CASE("admit names why a request does not fit and the pages it lacks", "[memory][admission]") {
  tiny_manager fx(opts(40, 2));
  auto& m = fx.m;
  auto a = m.admit(20, 5);
  REQUIRE(a);
  CHECK(a.reason == admit_failure::none);
  CHECK(a.pages_needed == 35);
  CHECK(a.pages_missing == 0);
  // 5 pages left: a second (20, 5) lacks 30.
  auto before = snapshot(m, {*a.id});
  auto b      = m.admit(20, 5);
  CHECK_FALSE(b);
  CHECK_FALSE(b.id.has_value());
  CHECK(b.reason == admit_failure::not_enough_pages);
  CHECK(b.pages_needed == 35);
  CHECK(b.pages_missing == 30);
  CHECK(to_string(b.reason) == "not_enough_pages");
  // Larger than the whole pool: M(60, 40) = G0 ceil((45+40)/4) = 22 alone > 40.
  auto c = m.admit(60, 40);
  CHECK(c.reason == admit_failure::never_fits);
  CHECK(c.pages_needed == m.admission_pages(60, 40));
  CHECK(c.pages_missing == m.admission_pages(60, 40) - 40);
  // The rejections moved only the counter (index 1 of the snapshot).
  auto after = snapshot(m, {*a.id});
  for (std::size_t k = 0; k < before.numbers.size(); ++k)
    if (k != 1) CHECK(after.numbers[k] == before.numbers[k]);
  CHECK(m.stats().rejected == 2);
  // (1, 0) needs one page per group: 8 > 5 as well.
  CHECK(m.admit(1, 0).pages_missing == 3);
}

TEST_CASE("admit: no free slot, a full page-id arena, an arena too small ever",
          "[memory][admission]") {
  auto plan = tiny_plan(tiny_budgets());
  host_memory_resource mr;
  auto o           = opts(200, 2);
  o.index_capacity = 40;  // entries for the page lists of all sequences
  kv_cache_manager m(plan, mr, o);
  auto a = m.admit(20, 5);  // 35 entries (capacity = target per group)
  REQUIRE(a);
  // (1, 0): 8 pages fit the pool, but its 8 list entries do not fit the 5 left in the arena.
  auto b = m.admit(1, 0);
  CHECK(b.reason == admit_failure::page_table_arena_full);
  CHECK(b.pages_missing == 0);
  CHECK(b.pages_needed == 8);
  // More entries than the whole arena: never.
  auto c = m.admit(40, 10);
  CHECK(c.pages_needed <= 200 - 35);
  CHECK(c.reason == admit_failure::never_fits);
  CHECK(c.pages_missing == 0);
  m.free(*a.id);
  auto d = m.admit(1, 0);
  auto e = m.admit(1, 0);
  REQUIRE(d);
  REQUIRE(e);
  auto f = m.admit(1, 0);
  CHECK(f.reason == admit_failure::no_free_slot);
  CHECK(f.pages_missing == 0);
  CHECK(to_string(f.reason) == "no_free_slot");
  // try_admit keeps its signature: the same answer without the reason.
  CHECK_FALSE(m.try_admit(1, 0).has_value());
  m.check_invariants();
}

TEST_CASE("admit rejects sizes no sequence may have, naming admit", "[memory][admission]") {
  tiny_manager fx(opts(40, 2));
  auto& m = fx.m;
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      (void)m.admit(0, 1), invalid_argument, "admit.prompt_tokens: must be >= 1, got 0");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      (void)m.admit(1, -1), invalid_argument, "admit.max_new_tokens: must be >= 0, got -1");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      (void)m.admit(std::numeric_limits<std::int64_t>::max(), 1), invalid_argument, "overflows");
  CHECK(m.stats().rejected == 0);
  CHECK(m.live_sequences() == 0);
}

TEST_CASE("admit under elastic reservation reports the elastic footprint",
          "[memory][admission][elastic]") {
  auto plan =
      tiny_plan(tiny_budgets(), 4, 2, 10, grouping_scope::global, elastic_reservation(0.15));
  host_memory_resource mr;
  auto o             = opts(60, 4);
  o.max_chunk_tokens = 8;
  kv_cache_manager m(plan, mr, o);
  auto need = m.admission_pages(20, 5);
  auto a    = m.admit(20, 5);
  REQUIRE(a);
  CHECK(a.pages_needed == need);
  CHECK(m.info(*a.id).reserved_pages == need);
  auto b = m.admit(20, 5);
  if (2 * need > 60) {
    CHECK(b.reason == admit_failure::not_enough_pages);
    CHECK(b.pages_missing == need - (60 - need));
  }
  auto c = m.admit(400, 100);
  CHECK(c.reason == admit_failure::never_fits);
  CHECK(c.pages_missing == m.admission_pages(400, 100) - 60);
}

TEST_CASE("sequences() lists every live sequence with its phase", "[memory][admission]") {
  tiny_manager fx(opts(200, 8));
  auto& m = fx.m;
  engine_sim sim(m, 11, 0.0);
  CHECK(m.sequences().empty());
  auto a = sim.admit(20, 5);
  auto b = sim.admit(4, 2);
  auto c = sim.admit(8, 1);
  REQUIRE((a && b && c));
  sim.chunk(*a, 20);
  sim.chunk(*c, 8);
  sim.decode({*c});
  sim.end_turn(*c);
  sim.free(*b);
  auto list = m.sequences();
  REQUIRE(list.size() == 2);
  CHECK(list[0].id == *a);
  CHECK(list[0].phase == sequence_phase::decode);
  CHECK(list[0].seq_tokens == 20);
  CHECK(list[0].max_new == 5);
  CHECK(list[1].id == *c);
  CHECK(list[1].phase == sequence_phase::ended);
  CHECK(list[1].seq_tokens == 9);
  int visited = 0;
  m.for_each_sequence([&](sequence_info const& i) {
    ++visited;
    CHECK(m.contains(i.id));
    CHECK(i.held_pages == m.info(i.id).held_pages);
  });
  CHECK(visited == 2);
}
