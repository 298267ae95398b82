// SPDX-License-Identifier: Apache-2.0
// Decode reservations that fit real engines, on the tiny hybrid model worked by hand (groups and
// lengths as in manager_test.cpp): growing a running turn (try_extend), several tokens per step
// (append_tokens, decode_step with counts), rolling back rejected speculative tokens (rollback,
// max_rollback), an early end_turn returning what was not used; every misuse changes nothing.
// Both reservation modes. engine_sim checks every token's K/V through the view on a host pool.
#include <cstdint>
#include <limits>
#include <vector>

#include "memory_fixtures.hpp"
#include "storm/engine_sim.hpp"
#include "tangram/memory/host_memory_resource.hpp"
#include "tangram/memory/kv_cache_manager.hpp"

using namespace tangram;
using namespace tangram::test;

namespace {

// Group ids of the tiny plan under global grouping, Hp = 2 (see tiny_budgets):
//   0: (0,2)+(3,2) B .75   1: (0,0)+(3,0) B .5   2: (0,3)+(3,3) B .35   3: (0,1)+(3,1) B .25
//   4, 5: sliding (layer 1, W = 10, ring 3 pages of P = 4)   6, 7: uncompressed (layer 2)
// After a 20-token prompt the longest kept heads are G0 15, G1 10, G2 7, G3 5 tokens.

/// Admits (20, T) and prefills it in chunks of 8, 8, 4 at the static rules.
sequence_id prefilled(engine_sim& sim, std::int64_t T) {
  auto id = sim.admit(20, T);
  REQUIRE(id);
  sim.chunk(*id, 8);
  sim.chunk(*id, 8);
  sim.chunk(*id, 4);
  return *id;
}

}  // namespace

TEST_CASE("try_extend grows a running turn's decode reservation by exact page counts",
          "[memory][decode_reservation]") {
  tiny_manager fx(opts(100, 8));
  auto& m = fx.m;
  engine_sim sim(m, 3, /*keep_fewer_probability=*/0.0);
  auto id = prefilled(sim, 5);
  // T = 5: targets G0 ceil(20/4)=5 G1 ceil(15/4)=4 G2 3 G3 3, sliding 3, uncompressed 7.
  CHECK(group_page_targets(m, id) == std::vector<std::int32_t>{5, 4, 3, 3, 3, 3, 7, 7});
  CHECK(group_page_counts(m, id) == std::vector<std::int32_t>{4, 3, 2, 2, 3, 3, 5, 5});
  CHECK(m.info(id).reserved_pages == 8);
  sim.decode({id});
  m.clear_view_changes();
  // +3 (T = 8): G0 ceil(23/4)=6 G1 ceil(18/4)=5 G2 ceil(15/4)=4 G3 ceil(13/4)=4 (+1 each); the
  // ring stays 3; uncompressed ceil(28/4)=7 (no change). Four more pages, lists grow: the
  // segment moves and the journal asks for a full upload.
  REQUIRE(sim.extend(id, 3));
  CHECK(group_page_targets(m, id) == std::vector<std::int32_t>{6, 5, 4, 4, 3, 3, 7, 7});
  CHECK(m.info(id).max_new == 8);
  CHECK(m.info(id).reserved_pages == 8 - 2 + 4);  // one decode step drew 2 (uncompressed)
  CHECK(m.pool().stats().reserved == 10);
  CHECK(m.changes().full_resync);
  CHECK(m.stats().extended == 1);
  m.check_invariants();
  // +4 (T = 12): G0 ceil(27/4)=7 G1 6 G2 5 G3 5, uncompressed ceil(32/4)=8: six more pages.
  REQUIRE(sim.extend(id, 4));
  CHECK(group_page_targets(m, id) == std::vector<std::int32_t>{7, 6, 5, 5, 3, 3, 8, 8});
  CHECK(m.info(id).reserved_pages == 16);
  // Decode the whole extended turn: the lists reach the targets exactly, nothing is left over.
  for (int k = 1; k < 12; ++k) sim.decode({id});
  CHECK(group_page_counts(m, id) == group_page_targets(m, id));
  CHECK(m.info(id).reserved_pages == 0);
  CHECK(m.pool().stats().peak_used == 7 + 6 + 5 + 5 + 3 + 3 + 8 + 8);
  sim.verify();
  // Past the extended T: refused, pointing at try_extend.
  m.set_batch({id});
  auto before = snapshot(m, {id});
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      m.decode_step(), logic_error, "max_new_tokens = 12", "try_extend first");
  CHECK(snapshot(m, {id}) == before);
}

TEST_CASE("try_extend that does not fit answers false and changes nothing",
          "[memory][decode_reservation]") {
  tiny_manager fx(opts(40, 8));
  auto& m = fx.m;
  engine_sim sim(m, 4, 0.0);
  auto id = prefilled(sim, 5);  // 35 pages reserved of 40 (27 used, 8 reserved)
  // +8: G0..G3 +2 each, uncompressed +2 each = 12 > 5 available.
  CHECK(sim.extension_pages(sim.sequences().at(id.slot), 8).total() == 12);
  auto before = snapshot(m, {id});
  CHECK_FALSE(m.try_extend(id, 8));
  CHECK(snapshot(m, {id}) == before);
  CHECK(m.stats().extend_rejected == 1);
  // +4 needs exactly 4 + 2 = 6 > 5 as well; +1 needs G0 ceil(21/4)=6 > 5 (+1), uncompressed
  // ceil(26/4)=7 (no change), G1 ceil(16/4)=4, G2 ceil(13/4)=4 (+1), G3 ceil(11/4)=3: 2 pages.
  CHECK_FALSE(m.try_extend(id, 4));
  REQUIRE(sim.extend(id, 1));
  CHECK(m.info(id).reserved_pages == 10);
  CHECK(m.pool().available_pages() == 3);
  sim.verify();
}

TEST_CASE("try_extend misuse names the field and value, nothing changes",
          "[memory][decode_reservation]") {
  tiny_manager fx(opts(100, 8));
  auto& m = fx.m;
  engine_sim sim(m, 5, 0.0);
  auto id  = prefilled(sim, 5);
  auto pre = sim.admit(4, 1);
  REQUIRE(pre);
  std::vector<sequence_id> ids{id, *pre};
  auto before = snapshot(m, ids);
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      (void)m.try_extend(id, 0), invalid_argument, "try_extend.more_tokens: must be >= 1, got 0");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      (void)m.try_extend(id, -7), invalid_argument, "try_extend.more_tokens: must be >= 1, got -7");
  TANGRAM_REQUIRE_THROWS_WITH_ALL((void)m.try_extend(id, std::numeric_limits<std::int64_t>::max()),
                                  invalid_argument,
                                  "try_extend.more_tokens: 9223372036854775807",
                                  "exceed 2147483647");
  TANGRAM_REQUIRE_THROWS_WITH_ALL((void)m.try_extend(id, std::int64_t{1} << 31),
                                  invalid_argument,
                                  "seq_tokens 20 + max_new_tokens 5",
                                  "exceed 2147483647");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      (void)m.try_extend(*pre, 1), logic_error, "try_extend", "phase prefill, not decode");
  TANGRAM_REQUIRE_THROWS_WITH_ALL((void)m.try_extend(sequence_id{99, 1}, 1),
                                  logic_error,
                                  "try_extend: unknown sequence (slot 99");
  CHECK(snapshot(m, ids) == before);
  sim.end_turn(id);
  TANGRAM_REQUIRE_THROWS_WITH_ALL((void)m.try_extend(id, 1), logic_error, "phase ended");
  sim.free(id);
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      (void)m.try_extend(id, 1), logic_error, "try_extend: unknown sequence", "the slot is free");
}

TEST_CASE("speculative tokens: append several, roll back the rejected ones into the reservation",
          "[memory][decode_reservation]") {
  tiny_manager fx(opts(100, 8));
  auto& m = fx.m;
  engine_sim sim(m, 6, 0.0);
  auto id = prefilled(sim, 8);
  // T = 8: targets G0 ceil(23/4)=6 G1 5 G2 4 G3 4, sliding 3, uncompressed 7: 39 pages.
  CHECK(group_page_targets(m, id) == std::vector<std::int32_t>{6, 5, 4, 4, 3, 3, 7, 7});
  CHECK(m.info(id).reserved_pages == 12);
  // A draft of 3: G0 18 tokens -> 5 (+1), G1 13 -> 4 (+1), G2 10 -> 3 (+1), G3 8 -> 2, rings
  // full, uncompressed 23 -> 6 (+1 each): five pages drawn.
  auto drawn = m.stats().pages_drawn;
  sim.append(id, 3);
  CHECK(m.stats().pages_drawn - drawn == 5);
  CHECK(group_page_counts(m, id) == std::vector<std::int32_t>{5, 4, 3, 2, 3, 3, 6, 6});
  CHECK(m.info(id).reserved_pages == 7);
  sim.verify();
  // The sliding rings hold 12 positions for W = 10 and already wrapped (23 tokens): only 2 of the
  // 3 draft tokens can be rolled back without losing a token the window needs again.
  CHECK(m.max_rollback(id) == 2);
  auto before = snapshot(m, {id});
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      m.rollback(id, 3), logic_error, "rollback.tokens: 3 exceeds max_rollback = 2", "sliding");
  CHECK(snapshot(m, {id}) == before);
  // Reject 2: a = 1. G0 16 -> 4, G1 11 -> 3, G2 8 -> 2 give one page each back to their own
  // budget (not the pool); uncompressed 21 tokens still need 6.
  auto used = m.pool().stats().used;
  sim.rollback(id, 2);
  CHECK(group_page_counts(m, id) == std::vector<std::int32_t>{4, 3, 2, 2, 3, 3, 6, 6});
  CHECK(m.info(id).decoded == 1);
  CHECK(m.info(id).seq_tokens == 21);
  CHECK(m.info(id).reserved_pages == 10);
  CHECK(m.pool().stats().used == used - 3);
  CHECK(m.pool().stats().reserved == 10);
  CHECK(m.stats().rollback_pages_returned == 3);
  CHECK(m.stats().rolled_back_tokens == 2);
  CHECK(m.stats().surplus_pages_released == 0);
  sim.verify();  // the sliding heads see their older tokens again, from the ring
  // The rest of the turn in one verified step of 7: exactly the targets, nothing left.
  sim.decode({id}, {7});
  CHECK(group_page_counts(m, id) == group_page_targets(m, id));
  CHECK(m.info(id).reserved_pages == 0);
  CHECK(m.pool().stats().peak_used == 39);
  sim.verify();
  sim.end_turn(id);
  sim.free(id);
  CHECK(m.pool().stats().used == 0);
  CHECK(m.pool().stats().reserved == 0);
}

TEST_CASE("rollback never rewrites a page a fork shares", "[memory][decode_reservation]") {
  tiny_manager fx(opts(200, 8));
  auto& m = fx.m;
  engine_sim sim(m, 7, 0.0);
  auto id = prefilled(sim, 8);
  sim.append(id, 4);  // 24 tokens: the uncompressed groups' 6 pages are full
  auto child = sim.fork(id);
  REQUIRE(child);
  // Fully written pages are shared: the uncompressed lists (24 = 6 x 4 tokens) are shared to
  // their last position, so neither side may roll back anything.
  CHECK(m.max_rollback(id) == 0);
  CHECK(m.max_rollback(*child) == 0);
  auto before = snapshot(m, {id, *child});
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      m.rollback(id, 1), logic_error, "exceeds max_rollback = 0", "shared with a fork");
  CHECK(snapshot(m, {id, *child}) == before);
  sim.free(*child);
  CHECK(m.max_rollback(id) == 2);  // back to the ring's limit (12 - 10)
  sim.rollback(id, 2);
  sim.verify();
}

TEST_CASE("append_tokens, decode_step counts and rollback misuse changes nothing",
          "[memory][decode_reservation]") {
  tiny_manager fx(opts(100, 8));
  auto& m = fx.m;
  engine_sim sim(m, 8, 0.0);
  auto id  = prefilled(sim, 4);
  auto pre = sim.admit(4, 1);
  REQUIRE(pre);
  std::vector<sequence_id> ids{id, *pre};
  m.set_batch({id});
  auto before = snapshot(m, ids);
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      m.append_tokens(id, 0), invalid_argument, "append_tokens.tokens: must be >= 1, got 0");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      m.append_tokens(id, -3), invalid_argument, "append_tokens.tokens: must be >= 1, got -3");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(m.append_tokens(id, 5),
                                  logic_error,
                                  "append_tokens: sequence in slot",
                                  "has appended 0 of its max_new_tokens = 4",
                                  "5 more");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(m.append_tokens(id, std::numeric_limits<std::int64_t>::max()),
                                  logic_error,
                                  "try_extend first");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(m.append_tokens(*pre, 1), logic_error, "phase prefill");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      (m.decode_step({1, 1})), invalid_argument, "decode_step.tokens: expected 1 counts", "got 2");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      m.decode_step({-1}), invalid_argument, "decode_step.tokens[0]: must be >= 0, got -1");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(m.decode_step({5}), logic_error, "past the reservation");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      m.rollback(id, 0), invalid_argument, "rollback.tokens: must be >= 1, got 0");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      m.rollback(id, -1), invalid_argument, "rollback.tokens: must be >= 1, got -1");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(m.rollback(id, 1),
                                  logic_error,
                                  "rollback.tokens: 1 exceeds max_rollback = 0",
                                  "0 decode tokens this turn");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(m.rollback(id, std::numeric_limits<std::int64_t>::max()),
                                  logic_error,
                                  "exceeds max_rollback = 0");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(m.rollback(*pre, 1), logic_error, "phase prefill, not decode");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      m.rollback(sequence_id{99, 1}, 1), logic_error, "rollback: unknown sequence");
  CHECK(m.max_rollback(*pre) == 0);
  CHECK(snapshot(m, ids) == before);
  // A zero count is allowed in a step: that member appends nothing.
  sim.decode({id}, {0});
  CHECK(m.info(id).decoded == 0);
  sim.append(id, 2);
  CHECK(m.max_rollback(id) == 2);  // 22 tokens: ring 12 - W 10
  sim.rollback(id, 1);
  sim.verify();
}

TEST_CASE("an early end_turn returns the whole unused reservation",
          "[memory][decode_reservation]") {
  tiny_manager fx(opts(100, 8));
  auto& m = fx.m;
  engine_sim sim(m, 9, 0.0);
  auto id = prefilled(sim, 8);  // 39 pages reserved
  sim.decode({id});
  sim.decode({id});
  // EOS after 2 of 8: the lists keep what the heads use (G0 ceil(17/4)=5, G1 3, G2 3, G3 2,
  // rings 3, uncompressed ceil(22/4)=6) and every other page returns to the pool.
  sim.end_turn(id);
  CHECK(group_page_counts(m, id) == std::vector<std::int32_t>{5, 3, 3, 2, 3, 3, 6, 6});
  CHECK(m.info(id).reserved_pages == 0);
  CHECK(m.pool().stats().reserved == 0);
  CHECK(m.pool().stats().used == 31);
  CHECK(m.pool().available_pages() == 100 - 31);
  sim.verify();
}

TEST_CASE("elastic reservation: try_extend, speculative append and rollback",
          "[memory][decode_reservation][elastic]") {
  auto plan =
      tiny_plan(tiny_budgets(), 4, 2, 10, grouping_scope::global, elastic_reservation(0.15));
  host_memory_resource mr;
  auto o             = opts(200, 8);
  o.max_chunk_tokens = 8;  // staging: 4 compressed groups x 2 pages
  kv_cache_manager m(plan, mr, o);
  engine_sim sim(m, 10, 0.0);
  auto id = prefilled(sim, 4);
  auto r0 = m.info(id).reserved_pages;
  // +8 = two pages per growing group: the four compressed groups' shared budget grows by 4 x 2,
  // the uncompressed groups by 2 each; the rings are full. 12 pages.
  REQUIRE(sim.extend(id, 8));
  CHECK(m.info(id).reserved_pages == r0 + 12);
  CHECK(m.info(id).max_new == 12);
  sim.verify();
  sim.append(id, 5);
  CHECK(m.max_rollback(id) == 2);
  sim.rollback(id, 2);
  sim.verify();
  sim.decode({id}, {9});
  CHECK(m.info(id).decoded == 12);
  CHECK(m.info(id).reserved_pages == 0);
  sim.verify();
  auto before = snapshot(m, {id});
  TANGRAM_REQUIRE_THROWS_WITH_ALL(m.append_tokens(id, 1), logic_error, "try_extend first");
  CHECK(snapshot(m, {id}) == before);
  sim.end_turn(id);
  sim.free(id);
  CHECK(m.pool().stats().used == 0);
  CHECK(m.pool().stats().reserved == 0);
}

TEST_CASE("the change journal lists appended / seq_tokens changes, extents fit every batch",
          "[memory][decode_reservation][journal]") {
  auto plan = tiny_plan(tiny_budgets());
  host_memory_resource mr;
  auto o      = opts(100, 8);
  o.max_batch = 4;
  kv_cache_manager m(plan, mr, o);
  engine_sim sim(m, 12, 0.0);
  // Sized at load time, before any batch: batch_slots holds max_batch entries.
  auto e = m.view_extents();
  CHECK(e.batch == 4);
  CHECK(e.slots == 9);  // 8 sequence slots + the padding slot
  CHECK(m.batch_size() == 0);
  auto a = prefilled(sim, 8);
  auto b = prefilled(sim, 8);
  m.clear_view_changes();
  sim.decode({a});  // only a's counters move
  auto c = m.changes();
  REQUIRE(c.num_counter_slots == 1);
  CHECK(c.counter_slots[0] == a.slot);
  CHECK(c.num_slots == 0);
  m.clear_view_changes();
  sim.append(b, 3);
  sim.rollback(b, 1);
  sim.decode({a, b}, {0, 1});  // a appends nothing but stays listed only if it changed
  c = m.changes();
  REQUIRE(c.num_counter_slots == 1);
  CHECK(c.counter_slots[0] == b.slot);
  m.clear_view_changes();
  sim.rollback(a, 1);
  sim.free(b);
  c = m.changes();
  std::vector<std::int32_t> listed(c.counter_slots, c.counter_slots + c.num_counter_slots);
  CHECK(listed == std::vector<std::int32_t>{a.slot, b.slot});
  CHECK(m.view_extents().batch == 4);
}

TEST_CASE("a speculative step past a sliding window: every token written, a rollback reads them",
          "[memory][decode_reservation][sliding]") {
  // W 3 on a ring of 5 tokens (P 5): a 4-token step pushes its own first token out of the window
  // within the step; a rollback of up to ring - W brings it back, so the engine must have
  // written it at its ring position (docs/memory.md, speculative decoding on rings). The engine
  // model writes every token of a step and checks every held token's bytes after each operation
  // (host pool); it wrote only the window's tokens before, and these sequences then read a stale
  // token (review of 2026-12-04).
  auto plan = test::tiny_plan(test::tiny_budgets(), /*page_tokens=*/5, /*group_size=*/2,
                              /*window=*/3);
  for (auto const& [prompt, ops] :
       std::vector<std::pair<std::int64_t, std::vector<int>>>{
           {1, {4, -1}}, {6, {1, 1, -1, 4, -1}}, {1, {4, -2, 1}}, {4, {4, -2, 4, -2, 1}}}) {
    host_memory_resource host;
    manager_options o;
    o.num_pages     = 256;
    o.max_sequences = 2;
    kv_cache_manager m(plan, host, o);
    test::engine_sim sim(m, 1, 0.0);
    auto id = sim.admit(prompt, 20);
    REQUIRE(id);
    sim.chunk(*id, prompt);
    sim.verify();
    for (int k : ops) {
      INFO("prompt " << prompt << ", op " << k << " (negative: a rollback)");
      REQUIRE(m.max_rollback(*id) >= (k < 0 ? -k : 0));
      if (k > 0)
        sim.append(*id, k);
      else
        sim.rollback(*id, -k);
      sim.verify();
    }
  }
}
