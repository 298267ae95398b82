// SPDX-License-Identifier: Apache-2.0
// The manager's parts (memory/detail/) on their own, against small cases worked by hand.
#include <algorithm>
#include <vector>

#include "memory_fixtures.hpp"
#include "tangram/eval/sim/simulated_memory_resource.hpp"
#include "tangram/memory/detail/batch_membership.hpp"
#include "tangram/memory/detail/chunk_rules.hpp"
#include "tangram/memory/detail/copy_on_write.hpp"
#include "tangram/memory/detail/decode_buckets.hpp"
#include "tangram/memory/detail/group_lookup.hpp"
#include "tangram/memory/detail/head_lengths.hpp"
#include "tangram/memory/detail/page_flow.hpp"
#include "tangram/memory/detail/page_table_storage.hpp"
#include "tangram/memory/detail/page_usage.hpp"
#include "tangram/memory/detail/sequence_table.hpp"
#include "tangram/memory/detail/turn_footprint.hpp"
#include "tangram/memory/detail/view_assembly.hpp"
#include "tangram/memory/detail/view_journal.hpp"
#include "tangram/memory/host_memory_resource.hpp"
#include "tangram/memory/memory_resource.hpp"
#include "tangram/memory/page_pool.hpp"

using namespace tangram;
using namespace tangram::detail;
using namespace tangram::test;

namespace {

std::vector<std::int32_t> range_of(std::int32_t const* b, std::int32_t const* e) {
  return {b, e};
}

}  // namespace

TEST_CASE("turn_footprint: per-group reserve, capacity, copies and their totals",
          "[memory][parts]") {
  turn_footprint fp(3);
  fp.clear();
  // group 0: fresh, 5 pages; group 1: holds 4 exclusive of a target of 6, list of 4 grows to 6;
  // group 2: keeps 3 of which 1 is exclusive (2 copies), list of 8 stays.
  fp.add(0, 5, 0, 0, 5, 0);
  fp.add(1, 6, 4, 0, 6, 4);
  fp.add(2, 3, 1, 2, 8, 8);
  CHECK(fp.target(1) == 6);
  CHECK(fp.reserve(0) == 5);
  CHECK(fp.reserve(1) == 2);
  CHECK(fp.reserve(2) == 2);
  CHECK(fp.capacity(2) == 8);
  CHECK(fp.reserve_total() == 9);
  CHECK(fp.capacity_total() == 19);
  CHECK(fp.copies_total() == 2);
  CHECK(fp.grows_capacity());
  fp.clear();
  fp.add(0, 1, 1, 0, 2, 2);
  fp.add(1, 0, 0, 0, 0, 0);
  fp.add(2, 0, 0, 0, 0, 3);
  CHECK(fp.reserve_total() == 0);
  CHECK(fp.capacity_total() == 2);
  CHECK_FALSE(fp.grows_capacity());
}

TEST_CASE("sequence_table: lowest free slot first, stale handles, free list invariant",
          "[memory][parts]") {
  sequence_table t(3);
  CHECK(t.size() == 3);
  CHECK(t.live() == 0);
  auto a = t.take(sequence_phase::prefill, page_reservation{});
  auto b = t.take(sequence_phase::decode, page_reservation{});
  CHECK(a == 0);
  CHECK(b == 1);
  CHECK(t.live() == 2);
  CHECK(t[b].phase == sequence_phase::decode);
  sequence_id ida{a, t[a].generation};
  CHECK(t.contains(ida));
  CHECK(t.find(ida, "op") == 0);
  t.release(a);
  CHECK(t[a].generation == ida.generation + 1);
  CHECK_FALSE(t.contains(ida));
  TANGRAM_REQUIRE_THROWS_WITH_ALL(t.find(ida, "op"), logic_error, "op", "slot is free");
  auto c = t.take(sequence_phase::prefill, page_reservation{});
  CHECK(c == 0);  // the freed slot is reused first
  TANGRAM_REQUIRE_THROWS_WITH_ALL(t.find(ida, "op"), logic_error, "slot holds a newer sequence");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      t.find(sequence_id{7, 1}, "op"), logic_error, "out of range [0, 3)");
  t.check_invariants();
  t.take(sequence_phase::prefill, page_reservation{});
  CHECK(t.full());
}

TEST_CASE("page_table_storage: segments, lists, relocation, compaction", "[memory][parts]") {
  page_table_storage pt(3, 2, 32);
  turn_footprint fp(2);
  auto size = [&](std::int64_t c0, std::int64_t c1) {
    fp.clear();
    fp.add(0, c0, 0, 0, c0, 0);
    fp.add(1, c1, 1, 0, c1, 0);
  };
  size(3, 2);
  REQUIRE(pt.has_room(5));
  pt.open(0, fp);  // entries [0, 5): group 0 at 0, group 1 at 3
  size(4, 4);
  pt.open(1, fp);  // entries [5, 13)
  size(2, 2);
  pt.open(2, fp);  // entries [13, 17)
  CHECK(pt.offset(0, 1) == 3);
  CHECK(pt.offset(1, 0) == 5);
  CHECK(pt.offset(1, 1) == 9);
  CHECK(pt.offset(2, 0) == 13);
  CHECK(pt.target(1, 1) == 4);
  CHECK(pt.budget(1, 1) == 3);  // target 4, one page already held
  CHECK(pt.push(1, 1, 40) == 9);
  CHECK(pt.push(1, 1, 41) == 10);
  CHECK(pt.push(2, 0, 50) == 13);
  CHECK(pt.count(1, 1) == 2);
  CHECK(pt.list(1, 1)[1] == 41);
  CHECK(pt.set_entry(1, 1, 0, 42) == 9);
  CHECK(pt.entry(1, 1, 0) == 42);
  CHECK(pt.pop(1, 1) == 41);
  CHECK(pt.count(1, 1) == 1);

  // Closing slot 1 leaves 23 free entries in two pieces, [5, 13) and [17, 32): a segment of 16
  // fits only after compaction.
  pt.close(1);
  CHECK(pt.count(1, 1) == 0);
  CHECK(pt.has_room(23));
  CHECK_FALSE(pt.has_room(24));
  CHECK(pt.needs_compaction(16));
  pt.compact();  // slot 2 moves from 13 to 5, its entries with it
  CHECK(pt.offset(2, 0) == 5);
  CHECK(pt.offset(2, 1) == 7);
  CHECK(pt.entry(2, 0, 0) == 50);
  CHECK_FALSE(pt.needs_compaction(23));

  // Relocation keeps the entries and gives the new capacities.
  pt.push(0, 0, 60);
  pt.push(0, 0, 61);
  size(6, 2);
  pt.relocate(0, fp);  // the free block is now [9, 32)
  CHECK(pt.offset(0, 0) == 9);
  CHECK(pt.capacity(0, 0) == 6);
  CHECK(pt.offset(0, 1) == 15);
  CHECK(pt.entry(0, 0, 1) == 61);
  CHECK(pt.count(0, 0) == 2);

  std::vector<std::uint32_t> owners(100, 0);
  auto budget = pt.check_slot(
      0, [](std::int32_t g) { return g == 0 ? 2 : 0; }, 100, owners);
  CHECK(budget == 3 + 1);  // budgets from the first footprint of slot 0: 3 and 2 - 1
  CHECK(owners[60] == 1);
  CHECK(owners[61] == 1);
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      pt.check_slot(
          0, [](std::int32_t g) { return g == 0 ? 3 : 0; }, 100, owners),
      logic_error,
      "2 pages but heads use 3");
  pt.check_segments([](std::int32_t s) { return s != 1; });
}

TEST_CASE("decode_buckets: groups that start a page at each decode step", "[memory][parts]") {
  // P = 4, growing groups 0, 2, 3 (group 1 is a sliding ring).
  decode_buckets b(2, 4, {0, 2, 3});
  b.reset(1);
  CHECK(range_of(b.bucket_begin(1, 0), b.bucket_end(1, 0)) == std::vector<std::int32_t>{0, 2, 3});
  for (std::int32_t r = 1; r < 4; ++r) CHECK(b.bucket_begin(1, r) == b.bucket_end(1, r));
  // Longest base lengths 5, 7, 9 -> mod 4: 1, 3, 1.
  std::vector<std::int32_t> longest{5, -1, 7, 9};
  b.rebuild(1, [&](std::int32_t g) { return longest[static_cast<std::size_t>(g)] % 4; });
  CHECK(range_of(b.bucket_begin(1, 1), b.bucket_end(1, 1)) == std::vector<std::int32_t>{0, 3});
  CHECK(range_of(b.bucket_begin(1, 3), b.bucket_end(1, 3)) == std::vector<std::int32_t>{2});
  CHECK(b.bucket_begin(1, 0) == b.bucket_end(1, 0));
  CHECK(b.bucket_begin(1, 2) == b.bucket_end(1, 2));
  // A group whose longest head holds 5 tokens fills its second page at 8 and starts the third
  // with the 9th token: appended a = 4, bucket (1 - 4) mod 4 = 1.
}

TEST_CASE("batch_membership: set validates all first, dead members are named", "[memory][parts]") {
  sequence_table t(4);
  auto a = t.take(sequence_phase::decode, page_reservation{});
  auto b = t.take(sequence_phase::decode, page_reservation{});
  sequence_id ia{a, t[a].generation}, ib{b, t[b].generation};
  batch_membership batch(2, 4);
  std::vector<sequence_id> ids{ib, ia};
  batch.set(ids.data(), ids.size(), t);
  CHECK(batch.size() == 2);
  CHECK(batch.slot(0) == b);
  CHECK(batch.member(1) == ia);
  batch.check_live("view", t);

  std::vector<sequence_id> twice{ia, ia};
  TANGRAM_REQUIRE_THROWS_WITH_ALL(batch.set(twice.data(), 2, t), logic_error, "listed twice");
  CHECK(batch.member(0) == ib);  // unchanged
  batch.check_invariants();      // marks cleared after the failure
  std::vector<sequence_id> three{ia, ib, ia};
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      batch.set(three.data(), 3, t), invalid_argument, "exceed max_batch 2");

  t.release(a);
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      batch.check_live("view", t), logic_error, "view", "batch request 1", "freed");
}

TEST_CASE("batch_membership: padding requests name the padding slot, after the members",
          "[memory][parts]") {
  sequence_table t(4);
  auto a = t.take(sequence_phase::decode, page_reservation{});
  sequence_id ia{a, t[a].generation};
  batch_membership batch(3, 4);
  CHECK(batch.padding_slot() == 4);
  batch.set(&ia, 1, t, 3);
  CHECK(batch.size() == 3);
  CHECK(batch.members() == 1);
  CHECK(batch.slot(0) == a);
  CHECK(batch.slot(1) == 4);
  CHECK(batch.slot(2) == 4);
  batch.check_live("view", t);  // padding is never "freed"
  batch.check_invariants();
  // Bad sizes: named, batch unchanged.
  TANGRAM_REQUIRE_THROWS_WITH_ALL(batch.set(&ia, 1, t, 4),
                                  invalid_argument,
                                  "set_batch.padded_size: must be 0 (no padding) or in [count = "
                                  "1, max_batch = 3], got 4");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      batch.set(nullptr, 2, t), invalid_argument, "set_batch.ids: null with count 2");
  CHECK(batch.size() == 3);
  // No padding again: 0 means none; entries past the size are not the batch's any more.
  batch.set(&ia, 1, t);
  CHECK(batch.size() == 1);
  CHECK(batch.members() == 1);
  batch.set(nullptr, 0, t, 2);  // an all-padding batch
  CHECK(batch.members() == 0);
  CHECK(batch.size() == 2);
  batch.check_invariants();
  t.release(a);
  batch.check_live("decode_step", t);  // no members left to check
}

TEST_CASE("view_journal: entries until full, slots once, clear", "[memory][parts]") {
  view_journal j(2, 4);
  j.note_entry(7);
  j.note_slot(3);
  j.note_slot(3);
  j.note_entry(9);
  auto c = j.changes();
  REQUIRE(c.num_page_entries == 2);
  CHECK(c.page_entries[1] == 9);
  REQUIRE(c.num_slots == 1);
  CHECK(c.slots[0] == 3);
  CHECK_FALSE(c.full_resync);
  j.note_entry(11);  // a third entry does not fit: upload everything
  CHECK(j.changes().full_resync);
  CHECK(j.changes().num_page_entries == 2);
  j.clear();
  CHECK(j.changes().num_page_entries == 0);
  CHECK_FALSE(j.changes().full_resync);
  j.note_slot(3);  // listed again after clear
  CHECK(j.changes().num_slots == 1);
}

TEST_CASE("copy_on_write: references of pending copies, released once", "[memory][parts]") {
  struct counting_pool {
    std::vector<page_id> released;
    bool release(page_id p) {
      released.push_back(p);
      return true;
    }
  } pool;
  copy_on_write cow;
  cow.reserve(2);
  auto cap = cow.pending().capacity();
  cow.record(3, 8);
  cow.record(3, 9);
  CHECK(cow.pending().capacity() == cap);  // reserved: no growth while recording
  std::vector<std::uint32_t> owners(10, 0);
  cow.count_references(owners);
  CHECK(owners[3] == 2);
  CHECK(owners[8] == 1);
  CHECK(owners[9] == 1);
  cow.complete(pool);
  CHECK(pool.released == std::vector<page_id>{3, 8, 3, 9});
  CHECK(cow.pending().empty());
}

TEST_CASE("head_lengths: reset, fork copy, held tokens", "[memory][parts]") {
  head_lengths l(2, 3);
  l.base(0)[0]  = 5;
  l.base(0)[2]  = 2;
  l.appended(0) = 4;
  l.tokens(0)   = 20;
  CHECK(l.held(0, 0) == 9);
  CHECK(l.held(0, 1) == 4);
  l.copy(0, 1);
  CHECK(l.base(1)[2] == 2);
  CHECK(l.tokens(1) == 20);
  l.reset(0);
  CHECK(l.held(0, 0) == 0);
  CHECK(l.tokens(0) == 0);
  CHECK(l.held(1, 0) == 9);
  CHECK(l.base_array()[3 + 2] == 2);  // slot 1, head 2 in the flat view array
}

TEST_CASE("group_lookup: groups of the tiny plan and page arithmetic", "[memory][parts]") {
  // 16 heads in groups of 2: layer 1 (sliding, W = 10) fills 2 groups, the rest 6.
  group_lookup g4(tiny_plan(tiny_budgets(), 4));
  CHECK(g4.num_heads() == 16);
  CHECK(g4.num_groups() == 8);
  CHECK(g4.sliding_groups().size() == 2);
  CHECK(g4.growing_groups().size() == 6);
  std::vector<int> seen(16, 0);
  for (std::int32_t g = 0; g < g4.num_groups(); ++g)
    for (auto const* m = g4.members_begin(g); m != g4.members_end(g); ++m) {
      ++seen[static_cast<std::size_t>(*m)];
      CHECK(g4.head_slot_of(*m).group == g);
      CHECK(g4.is_sliding(g) == (*m / 4 == 1));  // flat head = layer * 4 + head
    }
  CHECK(std::all_of(seen.begin(), seen.end(), [](int k) { return k == 1; }));
  for (auto g : g4.sliding_groups()) CHECK(g4.window(g) == 10);
  CHECK(g4.pages_for(0) == 0);
  CHECK(g4.pages_for(8) == 2);
  CHECK(g4.pages_for(9) == 3);
  CHECK(g4.mod_page(9) == 1);
  // P = 3 is not a power of two: the same answers through division.
  group_lookup g3(tiny_plan(tiny_budgets(), 3));
  CHECK(g3.pages_for(7) == 3);
  CHECK(g3.pages_for(6) == 2);
  CHECK(g3.mod_page(7) == 1);
  // Sliding: pages for n tokens capped by the ring; growing uncompressed: ceil(n / P).
  auto sliding = g4.sliding_groups()[0];
  CHECK(g4.pages_after(sliding, 5) == 2);
  CHECK(g4.pages_after(sliding, 1000) == g4.ring_pages(sliding));
}

TEST_CASE("page_usage: pages in use, shareable, exclusive, and a turn's footprint",
          "[memory][parts]") {
  auto plan = tiny_plan(tiny_budgets(), 4);
  group_lookup groups(plan);
  sequence_table sequences(2);
  page_table_storage table(2, groups.num_groups(), 256);
  head_lengths lengths(2, groups.num_heads());
  struct shared_pool {
    std::int32_t ref_count(page_id p) const { return p == 7 ? 2 : 1; }  // page 7 is shared
  } pool;
  page_usage<shared_pool> usage(groups, sequences, table, lengths, pool, 16);  // static: no staging
  turn_footprint fp(groups.num_groups());

  // Admission: per group exactly group_pages(rule, N, T); in all M(r) in pages.
  usage.size_turn(turn_kind::admit, -1, 9, 9, 3, fp);
  CHECK(fp.reserve_total() == footprint_pages(plan, 9, 3));
  CHECK(fp.capacity_total() == fp.reserve_total());
  CHECK(fp.copies_total() == 0);

  auto s = sequences.take(sequence_phase::decode, page_reservation{});
  table.open(s, fp);
  auto growing = groups.growing_groups()[0];
  auto sliding = groups.sliding_groups()[0];
  // Longest head 5 tokens + 4 appended: 9 tokens on pages of 4 -> 3 pages; the shortest head
  // 3 + 4 = 7 tokens fills 1 page completely.
  table.longest_base(s, growing)  = 5;
  table.shortest_base(s, growing) = 3;
  lengths.appended(s)             = 4;
  lengths.tokens(s)               = 5;
  CHECK(usage.in_use(s, growing) == 3);
  CHECK(usage.shareable(s, growing) == 1);
  CHECK(usage.in_use(s, sliding) == 2);  // 5 tokens of the window: 2 ring pages so far
  CHECK(usage.shareable(s, sliding) == 0);

  for (page_id p : {6, 7, 8}) table.push(s, growing, p);
  CHECK(usage.exclusive(s, growing, 3) == 3);  // never forked: no scan, all exclusive
  CHECK(usage.exclusive_tail(s, growing, 1) == 2);
  sequences[s].may_share = true;
  CHECK(usage.exclusive(s, growing, 3) == 2);  // page 7 is shared
  CHECK(usage.exclusive(s, growing, 1) == 1);
  // The tail after `keep` pages: 7 (shared) and 8 -> 1; after 2 pages: 8 -> 1; none after 3.
  CHECK(usage.exclusive_tail(s, growing, 1) == 1);
  CHECK(usage.exclusive_tail(s, growing, 0) == 2);
  CHECK(usage.exclusive_tail(s, growing, 2) == 1);
  CHECK(usage.exclusive_tail(s, growing, 3) == 0);
  CHECK(usage.exclusive_tail(s, growing, 5) == 0);
}

TEST_CASE("chunk_rules: expected kept counts and the check of reported counts", "[memory][parts]") {
  head_rule compressed{layer_kind::compressed, 0.25, 3, 0};
  head_rule sliding{layer_kind::sliding_window, 1.0, 0, 10};
  head_rule full{layer_kind::uncompressed, 1.0, 0, 0};
  // 40 tokens at budget 1/4: 10 kept; a head holding 6 with a chunk of 8 can reach only 14.
  CHECK(expected_kept(compressed, 6, 40, 8) == 10);
  CHECK(expected_kept(compressed, 1, 40, 8) == 9);
  CHECK(expected_kept(compressed, 0, 2, 2) == 2);  // within the protected tokens
  CHECK(expected_kept(sliding, 10, 40, 8) == 10);
  CHECK(expected_kept(sliding, 0, 7, 7) == 7);
  CHECK(expected_kept(full, 32, 40, 8) == 40);

  check_kept(layer_kind::compressed, 0, 10, 40, 2, 0, 1);
  check_kept(layer_kind::compressed, 10, 10, 40, 2, 0, 1);
  check_kept(layer_kind::sliding_window, 10, 10, 40, 2, 1, 0);
  TANGRAM_REQUIRE_THROWS_WITH_ALL(check_kept(layer_kind::compressed, 11, 10, 40, 2, 3, 1),
                                  logic_error,
                                  "head (layer 3, head 1) of slot 2 kept 11",
                                  "between 0 and 10 after 40 tokens");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      check_kept(layer_kind::uncompressed, 39, 40, 40, 0, 2, 0), logic_error, "exactly 40");
}

TEST_CASE("sequence_table and page_table_storage: turn and list checks", "[memory][parts]") {
  sequence_table t(2);
  auto s                = t.take(sequence_phase::prefill, page_reservation{});
  t[s].prompt_remaining = 5;
  t.expect_chunk_fits(s, 5, "op");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(t.expect_chunk_fits(s, 6, "op"),
                                  logic_error,
                                  "op: chunk_tokens 6 exceeds the 5 prompt tokens left");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(t.expect_prepared_chunk(s), logic_error, "no prepared chunk");
  t[s].chunk_pending = 3;
  t.expect_prepared_chunk(s);
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      t.expect_no_prepared_chunk(s), logic_error, "prepared chunk of 3 tokens");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      t.expect_decode_room(s), logic_error, "phase prefill, not decode");
  t[s].phase   = sequence_phase::decode;
  t[s].max_new = 1;
  t.expect_decode_room(s);
  t[s].decoded = 1;
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      t.expect_decode_room(s), logic_error, "has appended 1 of its max_new_tokens = 1");

  page_table_storage pt(1, 1, 8);
  turn_footprint fp(1);
  fp.clear();
  fp.add(0, 4, 2, 0, 4, 0);  // target 4, 2 already held: budget 2
  pt.open(0, fp);
  pt.push(0, 0, 1);
  pt.expect_can_grow(0, 0, 3, "op");  // 1 held + 2 drawn
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      pt.expect_can_grow(0, 0, 4, "op"), logic_error, "needs 4 pages but holds 1 with 2 reserved");
  pt.expect_budget(0, 0);
  pt.expect_budget(0, 0, 2);
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      pt.expect_budget(0, 0, 3), logic_error, "needs 3 pages but its budget covers 2");
  pt.budget(0, 0) = 0;
  TANGRAM_REQUIRE_THROWS_WITH_ALL(pt.expect_budget(0, 0), logic_error, "beyond its reservation");
}

namespace {

/// The parts page_flow moves pages between, over the tiny plan (P = 4), 3 slots, 256 pages.
struct flow_fixture {
  static_plan plan = tiny_plan(tiny_budgets(), 4);
  group_lookup groups{plan};
  sequence_table sequences{3};
  page_table_storage table{3, groups.num_groups(), 256};
  head_lengths lengths{3, groups.num_heads()};
  decode_buckets buckets{3, groups.page_tokens(), groups.growing_groups()};
  view_journal journal{1024, 3};
  copy_on_write copies;
  simulated_memory_resource mr;
  page_pool<> pool{mr, page_layout<>(plan.geometry), 256};
  manager_stats stats;
  page_flow<page_pool<>> flow{
      groups, sequences, table, lengths, buckets, journal, copies, pool, stats};
  turn_footprint fp{groups.num_groups()};

  /// A slot reserving `per_group` pages for every group (list capacity the same).
  std::int32_t open(std::int64_t per_group, sequence_phase phase = sequence_phase::decode) {
    fp.clear();
    for (std::int32_t g = 0; g < groups.num_groups(); ++g) fp.add(g, per_group, 0, 0, per_group, 0);
    auto s = sequences.take(phase, std::move(*pool.try_reserve(fp.reserve_total())));
    table.open(s, fp);
    return s;
  }
};

}  // namespace

TEST_CASE("page_flow: draws charge budgets and the reservation, tails release as surplus",
          "[memory][parts]") {
  flow_fixture f;
  auto s = f.open(3);
  auto G = f.groups.num_groups();
  CHECK(f.sequences[s].reservation.pages() == 3 * G);
  // The pages 3 single draws would take, in order: a fresh pool hands out 0, 1, 2.
  std::vector<page_id> const expected{0, 1, 2};
  f.flow.grow_to(s, 0, 3);
  CHECK(f.table.count(s, 0) == 3);
  CHECK(std::vector<page_id>(f.table.list(s, 0), f.table.list(s, 0) + 3) == expected);
  CHECK(f.table.budget(s, 0) == 0);
  CHECK(f.sequences[s].reservation.pages() == 3 * G - 3);
  CHECK(f.stats.pages_drawn == 3);
  CHECK(f.pool.stats().used == 3);
  CHECK(f.journal.changes().num_page_entries == 3);  // each new entry is journaled
  f.flow.grow_to(s, 0, 2);                           // already holds more: nothing
  CHECK(f.stats.pages_drawn == 3);
  // Beyond the group's budget is an internal inconsistency; nothing changes.
  REQUIRE_THROWS_AS(f.flow.grow_to(s, 0, 4), logic_error);
  CHECK(f.table.count(s, 0) == 3);
  CHECK(f.sequences[s].reservation.pages() == 3 * G - 3);
  // A growth its budget covers only in part draws nothing at all (not the pages it could).
  REQUIRE(G >= 2);
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      f.flow.grow_to(s, 1, 4), logic_error, "needs 4 pages but its budget covers 3");
  CHECK(f.table.count(s, 1) == 0);
  CHECK(f.table.budget(s, 1) == 3);
  CHECK(f.sequences[s].reservation.pages() == 3 * G - 3);
  CHECK(f.stats.pages_drawn == 3);
  CHECK(f.pool.stats().used == 3);
  CHECK(f.journal.changes().num_page_entries == 3);

  // Pages at positions >= 2 were drawn by "this chunk": the last is reclaimed, the other not.
  f.flow.release_tail(s, 0, 1, 2);
  CHECK(f.table.count(s, 0) == 1);
  CHECK(f.stats.surplus_pages_released == 2);
  CHECK(f.stats.reclaimed_pages == 1);
  CHECK(f.pool.stats().used == 1);
  f.flow.release_all(s);
  CHECK(f.pool.stats().used == 0);

  // The page-id arena: room up to its free entries, none beyond.
  CHECK(f.flow.make_index_room(256 - 3 * G));
  CHECK_FALSE(f.flow.make_index_room(256 - 3 * G + 1));
  CHECK(f.stats.index_compactions == 0);
}

TEST_CASE("page_flow: copy-on-write of shared pages, fork sharing, decode growth",
          "[memory][parts]") {
  flow_fixture f;
  auto growing = f.groups.growing_groups()[0];
  auto sliding = f.groups.sliding_groups()[0];
  auto s       = f.open(6);
  f.flow.grow_to(s, growing, 3);
  auto p0 = f.table.entry(s, growing, 0), p1 = f.table.entry(s, growing, 1),
       p2 = f.table.entry(s, growing, 2);

  // Fork: the first page shared, the next two (still written) copied into drawn pages.
  auto c                            = f.open(6);
  f.table.longest_base(s, growing)  = 9;
  f.table.shortest_base(s, growing) = 4;
  f.flow.share_into_fork(s, c, growing, 1, 3);
  REQUIRE(f.table.count(c, growing) == 3);
  CHECK(f.table.entry(c, growing, 0) == p0);
  CHECK(f.table.longest_base(c, growing) == 9);
  CHECK(f.table.shortest_base(c, growing) == 4);
  CHECK(f.pool.ref_count(p0) == 2);
  CHECK(f.pool.ref_count(p1) == 2);  // held by the pending copy until the engine copied
  auto d1 = f.table.entry(c, growing, 1), d2 = f.table.entry(c, growing, 2);
  CHECK(f.pool.ref_count(d1) == 2);
  REQUIRE(f.copies.pending().size() == 2);
  CHECK(f.copies.pending()[0] == page_copy{p1, d1});
  CHECK(f.copies.pending()[1] == page_copy{p2, d2});
  CHECK(f.stats.page_copies == 2);
  f.copies.complete(f.pool);
  CHECK(f.pool.ref_count(p1) == 1);
  CHECK(f.pool.ref_count(d1) == 1);

  // A new turn of s overwrites its first pages: without may_share nothing is scanned.
  f.flow.copy_shared_head(s, growing, 0, 3);
  CHECK(f.copies.pending().empty());
  f.sequences[s].may_share = true;
  f.flow.copy_shared_head(s, growing, 0, 3);  // only p0 is shared (with c)
  REQUIRE(f.copies.pending().size() == 1);
  auto fresh = f.table.entry(s, growing, 0);
  CHECK(fresh != p0);
  CHECK(f.copies.pending()[0] == page_copy{p0, fresh});
  CHECK(f.pool.ref_count(p0) == 2);     // c's reference and the copy's (moved from s)
  CHECK(f.pool.ref_count(fresh) == 2);  // s's list and the copy
  CHECK(f.table.entry(s, growing, 1) == p1);

  // Decode: a group whose longest head ends on a page boundary starts a page with the next
  // token; a sliding ring grows when the token count crosses a page.
  auto d = f.open(6);
  for (auto g : f.groups.growing_groups()) {
    f.flow.grow_to(d, g, 1);
    f.table.longest_base(d, g) = g == growing ? 4 : 3;
  }
  for (auto g : f.groups.sliding_groups()) f.flow.grow_to(d, g, 1);
  f.lengths.tokens(d) = 4;
  f.flow.rebuild_buckets(d);
  f.flow.append_decode_token(d);
  CHECK(f.lengths.appended(d) == 1);
  CHECK(f.lengths.tokens(d) == 5);
  CHECK(f.sequences[d].decoded == 1);
  CHECK(f.table.count(d, growing) == 2);  // 4 + 1 tokens: 2 pages
  for (auto g : f.groups.growing_groups())
    if (g != growing) CHECK(f.table.count(d, g) == 1);  // 3 + 1 tokens: still 1 page
  CHECK(f.table.count(d, sliding) == 2);
  f.flow.append_decode_token(d);  // 3 + 2 = 5 tokens: the other groups start their second page
  for (auto g : f.groups.growing_groups()) CHECK(f.table.count(d, g) == 2);
  CHECK(f.table.count(d, sliding) == 2);
}

TEST_CASE("page_table_storage turns, head_lengths commit, view assembly", "[memory][parts]") {
  flow_fixture f;
  auto s = f.open(4, sequence_phase::prefill);
  f.flow.grow_to(s, 0, 2);
  f.fp.clear();
  for (std::int32_t g = 0; g < f.groups.num_groups(); ++g) f.fp.add(g, 5, 2, 0, 5, 4);
  f.table.start_turn(s, f.fp);
  CHECK(f.table.target(s, 0) == 5);
  CHECK(f.table.budget(s, 0) == 3);
  CHECK(f.table.count_before_chunk(s, 0) == 2);
  f.table.end_turn(s);
  CHECK(f.table.budget(s, 0) == 0);
  CHECK(f.table.target(s, 0) == 2);  // the list as it is
  CHECK(f.table.target(s, 1) == 0);

  std::vector<std::int32_t> kept(static_cast<std::size_t>(f.groups.num_heads()));
  for (std::size_t h = 0; h < kept.size(); ++h) kept[h] = static_cast<std::int32_t>(h + 1);
  f.lengths.appended(s) = 7;
  f.lengths.commit_chunk(s, kept.data(), 30, [](std::int32_t h) { return h == 5; });
  CHECK(f.lengths.base(s)[4] == 5);
  CHECK(f.lengths.base(s)[5] == 0);  // a sliding head's length is the token count
  CHECK(f.lengths.appended(s) == 0);
  CHECK(f.lengths.tokens(s) == 30);

  batch_membership batch(4, 3);
  sequence_id id{s, f.sequences[s].generation};
  batch.set(&id, 1, f.sequences);
  auto v = assemble_view(f.pool.base(), f.plan.geometry, f.groups, f.table, f.lengths, batch);
  CHECK(v.pool == f.pool.base());
  CHECK(v.num_groups == f.groups.num_groups());
  CHECK(v.batch_size == 1);
  CHECK(v.batch_slots[0] == s);
  CHECK(v.seq_tokens[s] == 30);
  CHECK(v.pages[v.page_offset[s * v.num_groups]] == f.table.entry(s, 0, 0));
  auto e = assemble_extents(2, f.groups, f.table, batch);
  CHECK(e.page_offset == 3 * f.groups.num_groups());  // 2 slots + the padding slot
  CHECK(e.head_base_len == 3 * f.groups.num_heads());
  CHECK(e.slots == 3);
  CHECK(v.padding_slot == 3);  // the batch's (slots = 3 of its table): one past the real ones
  CHECK(e.pages == 256);
  CHECK(e.batch == 4);  // the capacity (max_batch), not the current batch of 1
  auto i = assemble_info(id, s, f.sequences, f.lengths, f.table);
  CHECK(i.phase == sequence_phase::prefill);
  CHECK(i.seq_tokens == 30);
  CHECK(i.held_pages == 2);
  CHECK(i.reserved_pages == f.sequences[s].reservation.pages());
}

TEST_CASE("copy_on_write::execute_host copies host pages and refuses other memory",
          "[memory][parts]") {
  host_memory_resource host;
  page_pool<> pool(host, page_layout<>(page_geometry{2, 1, 4, dtype::f32}), 4);
  auto a = *pool.try_allocate(), b = *pool.try_allocate(), c = *pool.try_allocate();
  auto bytes = static_cast<std::size_t>(pool.page_bytes());
  std::fill_n(pool.base() + a * static_cast<std::ptrdiff_t>(bytes), bytes, std::byte{7});
  std::fill_n(pool.base() + b * static_cast<std::ptrdiff_t>(bytes), bytes, std::byte{0});
  copy_on_write cow;
  cow.reserve(1);
  pool.retain(a);
  pool.retain(b);
  cow.record(a, b);
  cow.execute_host(pool);
  CHECK(std::all_of(pool.base() + b * static_cast<std::ptrdiff_t>(bytes),
                    pool.base() + (b + 1) * static_cast<std::ptrdiff_t>(bytes),
                    [](std::byte x) { return x == std::byte{7}; }));
  CHECK(cow.pending().empty());
  CHECK(pool.ref_count(a) == 1);
  CHECK(pool.ref_count(b) == 1);

  simulated_memory_resource sim;
  page_pool<> fake(sim, page_layout<>(page_geometry{2, 1, 4, dtype::f32}), 4);
  auto x = *fake.try_allocate(), y = *fake.try_allocate();
  fake.retain(x);
  fake.retain(y);
  cow.record(x, y);
  TANGRAM_REQUIRE_THROWS_WITH_ALL(cow.execute_host(fake), logic_error, "simulated memory");
  CHECK(cow.pending().size() == 1);  // nothing done
  (void)c;
}

TEST_CASE("view_journal lists counter changes once per slot, note_slot lists them too",
          "[memory][parts]") {
  tangram::detail::view_journal j(4, 3);
  j.note_counters(2);
  j.note_counters(2);
  j.note_slot(0);
  auto c = j.changes();
  REQUIRE(c.num_counter_slots == 2);
  CHECK(c.counter_slots[0] == 2);
  CHECK(c.counter_slots[1] == 0);
  CHECK(c.num_slots == 1);
  j.clear();
  CHECK(j.changes().num_counter_slots == 0);
  j.note_counters(2);
  CHECK(j.changes().num_counter_slots == 1);
}

TEST_CASE("page_usage and page_flow: extension sizing, max_rollback, rollback into the budgets",
          "[memory][parts]") {
  flow_fixture f;
  page_usage<page_pool<>> usage{f.groups, f.sequences, f.table, f.lengths, f.pool, 16};
  auto G       = f.groups.num_groups();
  auto growing = static_cast<std::int32_t>(f.groups.growing_groups().size());
  auto s       = f.open(6);  // decode, every base length 0, 6 pages of budget per group
  f.lengths.reset(s);
  f.buckets.reset(s);
  f.sequences[s].max_new = 8;
  f.flow.append_decode_tokens(s, 5);  // every group: ceil(5 / 4) = 2 pages (rings too)
  for (std::int32_t g = 0; g < G; ++g) CHECK(f.table.count(s, g) == 2);
  CHECK(f.sequences[s].decoded == 5);
  CHECK(f.sequences[s].written_tokens == 5);
  CHECK(usage.max_rollback(s) == 5);  // 5 tokens never wrapped a 12-position ring
  f.flow.rollback_decode_tokens(s, 2);
  for (std::int32_t g = 0; g < G; ++g) {
    CHECK(f.table.count(s, g) == 1);  // ceil(3 / 4)
    CHECK(f.table.budget(s, g) == 5);
  }
  CHECK(f.stats.rollback_pages_returned == G);
  CHECK(f.sequences[s].reservation.pages() == 5 * G);
  CHECK(f.pool.stats().used == G);
  CHECK(f.lengths.tokens(s) == 3);
  CHECK(f.lengths.appended(s) == 3);
  CHECK(f.sequences[s].written_tokens == 5);  // the ring's high-water mark stays
  // A shared first page (as after a fork) bars rewriting positions 0..3: nothing may go.
  f.sequences[s].may_share = true;
  auto shared              = f.table.entry(s, f.groups.growing_groups()[0], 0);
  f.pool.retain(shared);
  CHECK(usage.max_rollback(s) == 0);
  f.pool.release(shared);
  CHECK(usage.max_rollback(s) == 3);
  // Sizing an extension: T = 12 fits the targets of 6 (growing ends at ceil(12 / 4) = 3);
  // T = 30 needs ceil(30 / 4) = 8 pages per growing group: 2 more each, lists grow. Rings stay.
  usage.size_extension(s, 12, f.fp);
  CHECK(f.fp.reserve_total() == 0);
  CHECK_FALSE(f.fp.grows_capacity());
  usage.size_extension(s, 30, f.fp);
  CHECK(f.fp.reserve_total() == 2 * growing);
  CHECK(f.fp.grows_capacity());
  CHECK(f.fp.target(f.groups.growing_groups()[0]) == 8);
  CHECK(f.fp.target(f.groups.sliding_groups()[0]) == 6);
  f.flow.release_all(s);
}
