// SPDX-License-Identifier: Apache-2.0
// The KV-cache manager on the tiny hybrid model, worked by hand: admission footprint, chunked
// prefill, decode page draws, turns, surplus release, forks with copy-on-write (checked on real
// page contents), sliding rings, the FlashInfer export, tensor parallelism and every misuse.
#include "tangram/eval/sim/simulated_memory_resource.hpp"
#include "tangram/interop/flashinfer.hpp"
#include "tangram/memory/host_memory_resource.hpp"
#include "tangram/memory/kv_cache_manager.hpp"
#include "tangram/memory/limiting_resource_adaptor.hpp"
#include "tangram/memory/tensor_parallel.hpp"
#include "tangram/plan/build_static_plan.hpp"

#include <numeric>

#include "memory_fixtures.hpp"
#include "storm/engine_sim.hpp"

using namespace tangram;
using namespace tangram::test;

// Group ids of the tiny plan under global grouping, Hp = 2 (see tiny_budgets):
//   0: (0,2)+(3,2) B .75   1: (0,0)+(3,0) B .5   2: (0,3)+(3,3) B .35   3: (0,1)+(3,1) B .25
//   4, 5: sliding (layer 1)   6, 7: uncompressed (layer 2)

TEST_CASE("tiny plan groups as worked out by hand", "[memory][manager]") {
  auto plan = tiny_plan(tiny_budgets());
  REQUIRE(plan.num_groups() == 8);
  CHECK(plan.grouping.groups[0].members == std::vector<head_ref>{{0, 2}, {3, 2}});
  CHECK(plan.grouping.groups[0].rule.budget == 0.75);
  CHECK(plan.grouping.groups[3].members == std::vector<head_ref>{{0, 1}, {3, 1}});
  CHECK(plan.grouping.groups[4].rule.kind == layer_kind::sliding_window);
  CHECK(plan.grouping.groups[6].rule.kind == layer_kind::uncompressed);
  CHECK(plan.rule(0, 0).protect == 3);
  CHECK(plan.page_bytes() == 256);
}

TEST_CASE("admission, chunked prefill and decode follow the footprint exactly",
          "[memory][manager]") {
  tiny_manager fx(opts(100, 8));
  auto& m = fx.m;
  // M(r) for N = 20, T = 5 (k = retained tokens after 20):
  //   G0 ceil((15+5)/4)=5  G1 ceil((10+5)/4)=4  G2 ceil((7+5)/4)=3  G3 ceil((5+5)/4)=3
  //   sliding ceil(min(25,10)/4)=3 (x2)   uncompressed ceil(25/4)=7 (x2)   total 35
  CHECK(m.admission_pages(20, 5) == 35);
  engine_sim sim(m, 1, /*keep_fewer_probability=*/0.0);
  auto id = sim.admit(20, 5);
  REQUIRE(id);
  CHECK(m.info(*id).reserved_pages == 35);
  CHECK(m.pool().stats().reserved == 35);
  CHECK(m.pool().stats().used == 0);
  std::vector<std::int32_t> targets;
  for (std::int32_t g = 0; g < 8; ++g) targets.push_back(m.group_target(*id, g));
  CHECK(targets == std::vector<std::int32_t>{5, 4, 3, 3, 3, 3, 7, 7});
  // Chunk 1 (n = 8): G0 k=6 -> 2 pages; G1 4 -> 1; G2 3 -> 1; G3 3 -> 1; sliding 2; uncompressed 2.
  sim.chunk(*id, 8);
  CHECK(group_page_counts(m, *id) == std::vector<std::int32_t>{2, 1, 1, 1, 2, 2, 2, 2});
  CHECK(m.info(*id).reserved_pages == 35 - 13);
  CHECK(m.head_len(*id, 0, 2) == 6);
  CHECK(m.head_len(*id, 0, 1) == 3);  // protect = 3
  CHECK(m.head_len(*id, 1, 0) == 8);
  CHECK(m.head_len(*id, 2, 3) == 8);
  sim.verify();
  // Chunk 2 (n = 16): G0 12 -> 3; G1 8 -> 2; G2 6 -> 2; G3 4 -> 1; sliding min(4, 3) = 3; unc. 4.
  sim.chunk(*id, 8);
  CHECK(group_page_counts(m, *id) == std::vector<std::int32_t>{3, 2, 2, 1, 3, 3, 4, 4});
  CHECK(m.head_len(*id, 1, 0) == 10);  // the window
  // Chunk 3 (n = 20): G0 15 -> 4; G1 10 -> 3; G2 7 -> 2; G3 5 -> 2; sliding 3; unc. 5.
  sim.chunk(*id, 4);
  CHECK(group_page_counts(m, *id) == std::vector<std::int32_t>{4, 3, 2, 2, 3, 3, 5, 5});
  CHECK(m.info(*id).phase == sequence_phase::decode);
  CHECK(m.info(*id).reserved_pages == 35 - 27);
  sim.verify();
  // Decode: appended a = 1 .. 5. New pages: a=1 uncompressed x2 (21 tokens), a=2 G0 (17) and
  // G2 (9), a=3 G1 (13), a=4 G3 (9), a=5 uncompressed x2 (25). Sliding rings stay at 3 pages.
  std::vector<std::int64_t> drawn_per_step;
  for (int a = 1; a <= 5; ++a) {
    auto before = m.stats().pages_drawn;
    sim.decode({*id});
    drawn_per_step.push_back(m.stats().pages_drawn - before);
  }
  CHECK(drawn_per_step == std::vector<std::int64_t>{2, 2, 1, 1, 2});
  CHECK(group_page_counts(m, *id) == targets);  // tight: the peak is exactly M(r)
  CHECK(m.pool().stats().peak_used == 35);
  CHECK(m.info(*id).reserved_pages == 0);
  CHECK(m.head_len(*id, 0, 2) == 20);
  CHECK(m.head_len(*id, 1, 3) == 10);
  CHECK(m.head_len(*id, 2, 0) == 25);
  sim.verify();
  // Decoding past T is refused with nothing changed.
  m.set_batch({*id});
  auto before = snapshot(m, {*id});
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      m.decode_step(), logic_error, "max_new_tokens = 5", "past the reservation");
  CHECK(snapshot(m, {*id}) == before);
  CHECK(m.stats().reclaimed_pages == 0);
  CHECK(m.stats().surplus_pages_released == 0);
}

TEST_CASE("multi-turn: a new turn reserves only the increment, dropped decode pages return",
          "[memory][manager][turns]") {
  tiny_manager fx(opts(200, 8));
  auto& m = fx.m;
  engine_sim sim(m, 2, 0.0);
  SECTION("increment max(0, final - held)") {
    auto id = *sim.admit(20, 5);
    sim.chunk(id, 20);
    for (int i = 0; i < 5; ++i) sim.decode({id});
    sim.end_turn(id);
    CHECK(m.info(id).reserved_pages == 0);
    CHECK(m.pool().stats().used == 35);
    // Turn 2: N = 6, T = 2, history 25 -> 31 tokens. Final pages: G0 k=24 -> 7, G1 16 -> 5,
    // G2 11 -> 4, G3 8 -> 3, sliding 3, uncompressed ceil(33/4) = 9.
    // Held 5 4 3 3 3 3 7 7 -> increments 2 1 1 0 0 0 2 2 = 8.
    REQUIRE(sim.continue_turn(id, 6, 2));
    CHECK(m.info(id).reserved_pages == 8);
    sim.chunk(id, 6);
    sim.decode({id});
    sim.decode({id});
    CHECK(group_page_counts(m, id) == std::vector<std::int32_t>{7, 5, 4, 3, 3, 3, 9, 9});
    CHECK(m.info(id).reserved_pages == 0);
    CHECK(m.stats().surplus_pages_released == 0);
    sim.verify();
  }
  SECTION("recompression drops the previous turn's decode tokens: surplus pages go back") {
    auto id = *sim.admit(20, 40);
    sim.chunk(id, 20);
    for (int i = 0; i < 40; ++i) sim.decode({id});
    sim.end_turn(id);
    // Held after turn 1: G0 ceil(55/4)=14, G1 13, G2 12, G3 12, sliding 3, uncompressed 15.
    CHECK(group_page_counts(m, id) == std::vector<std::int32_t>{14, 13, 12, 12, 3, 3, 15, 15});
    auto used_before = m.pool().stats().used;
    // Turn 2: N = 1, T = 0, history 61: G0 k=46 -> 12, G1 31 -> 8, G2 22 -> 6, G3 16 -> 4,
    // uncompressed 16. Increments: only uncompressed +1 each = 2.
    REQUIRE(sim.continue_turn(id, 1, 0));
    CHECK(m.info(id).reserved_pages == 2);
    sim.chunk(id, 1);
    CHECK(group_page_counts(m, id) == std::vector<std::int32_t>{12, 8, 6, 4, 3, 3, 16, 16});
    CHECK(m.stats().surplus_pages_released == 2 + 5 + 6 + 8);
    CHECK(m.stats().reclaimed_pages == 0);  // not reclamation: no page was allocated then freed
    CHECK(m.pool().stats().used == used_before - 21 + 2);
    sim.verify();
  }
}

TEST_CASE("sliding-window rings use constant memory however long the session runs",
          "[memory][manager][sliding]") {
  auto plan = tiny_plan(tiny_budgets(), 4, 2, /*window=*/6);  // ring = ceil(6/4) = 2 pages
  host_memory_resource mr;
  kv_cache_manager m(plan, mr, opts(400, 8));
  engine_sim sim(m, 3, 0.0);
  auto id = *sim.admit(3, 30);
  sim.chunk(id, 3);
  for (int turn = 0; turn < 6; ++turn) {
    for (int i = 0; i < 30; ++i) {
      sim.decode({id});
      CHECK(m.group_page_count(id, 4) <= 2);
      CHECK(m.head_len(id, 1, 2) == std::min<std::int64_t>(m.info(id).seq_tokens, 6));
    }
    sim.verify();  // every window token read back through the ring, at t mod (2 * 4)
    sim.end_turn(id);
    REQUIRE(sim.continue_turn(id, 5, 30));
    sim.chunk(id, 2);
    sim.chunk(id, 3);
  }
  CHECK(m.group_page_count(id, 4) == 2);
  CHECK(m.group_page_count(id, 5) == 2);
  sim.verify();
}

TEST_CASE("fork shares filled pages and copies the pages heads still write",
          "[memory][manager][fork]") {
  tiny_manager fx(opts(300, 8));
  auto& m = fx.m;
  engine_sim sim(m, 4, 0.0);
  auto a = *sim.admit(20, 12);
  sim.chunk(a, 20);
  sim.decode({a});
  sim.verify();
  // Group 0 heads hold 15+1 = 16 and 12+1 = 13 tokens: pages 0..2 are full for both heads
  // (floor(13/4) = 3) and shared; page 3 (tokens 12..15) is still written by head (3,2): copied.
  auto pages_a0 =
      std::vector<page_id>(m.group_pages(a, 0), m.group_pages(a, 0) + m.group_page_count(a, 0));
  auto child = m.fork(a);
  REQUIRE(child);
  auto const& copies = m.pending_copies();
  REQUIRE_FALSE(copies.empty());
  auto c0 = std::vector<page_id>(m.group_pages(*child, 0),
                                 m.group_pages(*child, 0) + m.group_page_count(*child, 0));
  REQUIRE(c0.size() == 4);
  CHECK(std::equal(c0.begin(), c0.begin() + 3, pages_a0.begin()));
  CHECK(c0[3] != pages_a0[3]);
  CHECK(std::find(copies.begin(), copies.end(), page_copy{pages_a0[3], c0[3]}) != copies.end());
  for (int p = 0; p < 3; ++p) CHECK(m.pool().ref_count(c0[static_cast<std::size_t>(p)]) == 2);
  // Sliding rings are copied whole.
  CHECK(m.group_pages(*child, 4)[0] != m.group_pages(a, 4)[0]);
  m.check_invariants();  // pending copies hold references on both pages
  m.execute_page_copies_host();
  CHECK(m.pool().ref_count(c0[3]) == 1);
  // Track the child in the sim and let both diverge.
  auto q = sim.sequences().at(a.slot);
  q.id   = *child;
  for (std::int32_t g = 0; g < m.num_groups(); ++g)
    q.held[static_cast<std::size_t>(g)] = sim.in_use(q, g);
  sim.sequences()[child->slot] = q;
  sim.verify();
  for (int i = 0; i < 6; ++i) {
    sim.decode({a, *child});
    sim.verify();  // divergent tokens never overwrite each other
  }
  // Next turn of the parent: its shared pages are copied before the recompression rewrites them.
  sim.end_turn(a);
  auto copies_before = m.stats().page_copies;
  REQUIRE(sim.continue_turn(a, 4, 2));
  CHECK(m.stats().page_copies > copies_before);
  sim.chunk(a, 4);
  sim.verify();
  for (int i = 0; i < 5; ++i) sim.decode({*child});
  sim.verify();
  sim.free(a);
  sim.verify();
  sim.free(*child);
  CHECK(m.pool().stats().used == 0);
  CHECK(m.pool().stats().reserved == 0);
  m.check_invariants();
}

TEST_CASE("does-not-fit is a return value and changes nothing", "[memory][manager]") {
  tiny_manager fx(opts(40, 2));
  auto& m = fx.m;
  auto a = m.try_admit(20, 5);  // 35 pages
  REQUIRE(a);
  auto before = snapshot(m, {*a});
  CHECK_FALSE(m.try_admit(20, 5).has_value());  // 35 > 5 available
  CHECK(m.stats().rejected == 1);
  auto after = snapshot(m, {*a});
  // Only the rejection counter moved.
  CHECK(after.numbers.size() == before.numbers.size());
  CHECK(std::equal(before.numbers.begin() + 2, before.numbers.end(), after.numbers.begin() + 2));
  auto b = m.try_admit(1, 0);  // 8 groups x 1 page
  CHECK_FALSE(b.has_value());  // 8 > 5
  auto c = m.try_admit(1, 0);
  CHECK_FALSE(c.has_value());
  m.free(*a);
  auto d = m.try_admit(1, 0);
  auto e = m.try_admit(1, 0);
  REQUIRE((d && e));
  CHECK_FALSE(m.try_admit(1, 0).has_value());  // both slots taken
  m.check_invariants();
}

TEST_CASE("manager misuse is a clear logic_error with nothing changed",
          "[memory][manager][errors]") {
  tiny_manager fx(opts(200, 4));
  auto& m = fx.m;
  auto a = *m.try_admit(12, 3);
  auto b = *m.try_admit(12, 3);
  std::vector<sequence_id> ids{a, b};
  auto expect_unchanged = [&](auto&& call, std::vector<std::string> pieces) {
    auto before = snapshot(m, ids);
    bool threw  = false;
    try {
      call();
    } catch (logic_error const& e) {
      threw           = true;
      std::string msg = e.what();
      for (auto const& p : pieces) {
        INFO(msg);
        CHECK(msg.find(p) != std::string::npos);
      }
    }
    CHECK(threw);
    CHECK(snapshot(m, ids) == before);
  };
  expect_unchanged([&] { m.commit_chunk(a, std::vector<std::int32_t>(16, 0)); },
                   {"slot 0", "no prepared chunk"});
  expect_unchanged([&] { m.prepare_chunk(a, 13); }, {"chunk_tokens 13", "12 prompt tokens left"});
  expect_unchanged([&] { m.end_turn(a); }, {"phase prefill"});
  expect_unchanged([&] { (void)m.fork(a); }, {"fork", "phase prefill"});
  expect_unchanged([&] { (void)m.continue_turn(a, 4, 4); }, {"end_turn first"});
  m.set_batch({a});
  expect_unchanged([&] { m.decode_step(); }, {"phase prefill", "not decode"});
  expect_unchanged([&] { m.set_batch({a, b, a}); }, {"slot 0", "listed twice"});
  expect_unchanged([&] { m.free(sequence_id{7, 1}); }, {"slot 7", "out of range"});
  expect_unchanged([&] { m.free(sequence_id{2, 1}); }, {"slot 2", "free"});
  expect_unchanged(
      [&] {
        m.free(sequence_id{a.slot, a.generation + 1});
      },
      {"slot 0", "generation"});
  // Kept counts: a compressed head may not keep more than its rule, others must keep exactly.
  m.prepare_chunk(a, 12);
  std::vector<std::int32_t> kept(16);
  m.expected_kept(a, 12, kept.data());
  // Head (0,0) B .5 at n = 12 keeps 6; (1,*) sliding keeps 10; (2,*) all 12.
  CHECK(kept[0] == 6);
  CHECK(kept[4] == 10);
  CHECK(kept[8] == 12);
  auto bad = kept;
  bad[0]   = 7;
  expect_unchanged([&] { m.commit_chunk(a, bad); },
                   {"layer 0", "head 0", "kept 7", "between 0 and 6"});
  bad    = kept;
  bad[9] = 11;
  expect_unchanged([&] { m.commit_chunk(a, bad); }, {"layer 2", "head 1", "kept 11", "exactly 12"});
  bad    = kept;
  bad[5] = 9;
  expect_unchanged([&] { m.commit_chunk(a, bad); }, {"layer 1", "sliding_window", "exactly 10"});
  expect_unchanged([&] { m.prepare_chunk(a, 1); }, {"already has a prepared chunk of 12"});
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      m.commit_chunk(a, std::vector<std::int32_t>(3)), invalid_argument, "expected 16", "got 3");
  auto fewer = kept;
  fewer[0]   = 5;  // keeping fewer than the rule is allowed
  m.commit_chunk(a, fewer);
  CHECK(m.head_len(a, 0, 0) == 5);
  m.free(a);
  ids = {b};
  expect_unchanged([&] { m.free(a); }, {"unknown sequence", "slot 0"});
  expect_unchanged([&] { m.prepare_chunk(a, 1); }, {"prepare_chunk", "unknown sequence"});
  TANGRAM_REQUIRE_THROWS_WITH_ALL(m.try_admit(0, 1), invalid_argument, "prompt_tokens", "got 0");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(m.try_admit(1, -1), invalid_argument, "max_new_tokens", "got -1");
  m.check_invariants();
}

TEST_CASE("the pool arena failure surfaces as out_of_memory at construction",
          "[memory][manager][resource]") {
  auto plan = tiny_plan(tiny_budgets());
  host_memory_resource host;
  limiting_resource_adaptor lim(host, 100 * 256 - 1);
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      (basic_kv_cache_manager<>(plan, lim, opts(100, 8))), out_of_memory, "25600 bytes");
  CHECK(lim.allocated_bytes() == 0);
  manager_options o = opts(0, 8);
  o.pool_bytes      = 255;
  simulated_memory_resource sim;
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      kv_cache_manager(plan, sim, o), invalid_argument, "at least one page", "256");
  // A static layout must match the plan.
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      (basic_kv_cache_manager<page_layout<128>>(plan, sim, opts(10, 8))),
      invalid_argument,
      "head_dim is fixed to 128");
  basic_kv_cache_manager<page_layout<4, 2, 4>> fixed(plan, sim, opts(10, 8));
  CHECK(fixed.pool().page_bytes() == 256);
}

TEST_CASE("FlashInfer export lists the same token addresses as the view",
          "[memory][manager][flashinfer]") {
  auto plan = tiny_plan(tiny_budgets(), 4, 2, 6);
  host_memory_resource mr;
  kv_cache_manager m(plan, mr, opts(400, 8));
  engine_sim sim(m, 5, 0.3);
  auto a = *sim.admit(23, 20);
  auto b = *sim.admit(9, 20);
  sim.chunk(a, 10);
  sim.chunk(a, 13);
  sim.chunk(b, 9);
  for (int i = 0; i < 7; ++i) sim.decode({a, b});
  for (int i = 0; i < 3; ++i) sim.decode({b});
  m.set_batch({b, a});
  auto v = m.view();
  flashinfer_paged_kv fi;
  auto const d = plan.geometry.head_dim, Hp = plan.geometry.group_size,
             P = plan.geometry.page_tokens;
  for (std::int32_t l = 0; l < plan.num_layers; ++l) {
    export_flashinfer_layer(m, l, fi);
    REQUIRE(fi.indptr.size() == 2 * 4 + 1);
    CHECK(fi.v_offset_elements == Hp * P * d);
    CHECK(fi.page_stride_elements == P * d);
    auto* k_base = reinterpret_cast<float*>(v.pool);
    for (std::int32_t r = 0; r < 2; ++r) {
      for (std::int32_t h = 0; h < 4; ++h) {
        auto j   = static_cast<std::size_t>(r * 4 + h);
        auto len = v.head_len(r, l, h);
        CHECK(fi.kv_len(j) == len + fi.first_page_skip[j]);
        if (v.group_window[v.slot_of(l, h).group] == 0) CHECK(fi.first_page_skip[j] == 0);
        for (std::int32_t i = 0; i < len; ++i) {
          // FlashInfer position of held token i, after the masked skip.
          std::int64_t pos   = fi.first_page_skip[j] + i;
          std::int32_t vpage = fi.indices[static_cast<std::size_t>(fi.indptr[j] + pos / P)];
          float* fk =
              k_base + static_cast<std::int64_t>(vpage) * fi.page_stride_elements + (pos % P) * d;
          float* fv = fk + fi.v_offset_elements;
          auto loc  = v.locate(r, l, h, i);
          auto col  = v.slot_of(l, h).column;
          REQUIRE(fk == v.element_ptr<float>(loc, col, 0));
          REQUIRE(fv == v.element_ptr<float>(loc, col, 1));
        }
        if (len > 0) {
          CHECK(fi.last_page_len[j] >= 1);
          CHECK(fi.last_page_len[j] <= P);
        }
      }
    }
  }
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      export_flashinfer_layer(m, 4, fi), invalid_argument, "layer", "got 4");
}

TEST_CASE("tensor parallelism: admit on every rank or on none", "[memory][manager][tp]") {
  auto plans = tiny_tp_plans();
  simulated_memory_resource sim;
  kv_cache_manager r0(plans[0], sim, opts(100, 8));
  kv_cache_manager r1(plans[1], sim, opts(30, 8));
  std::vector<kv_cache_manager*> ranks{&r0, &r1};
  auto need0 = r0.admission_pages(20, 5), need1 = r1.admission_pages(20, 5);
  CHECK(need0 + need1 == 35);  // the ranks split the model's heads
  auto ids = try_admit_all(ranks, 20, 5);
  REQUIRE(ids);
  CHECK((*ids)[0].slot == (*ids)[1].slot);
  // Rank 1 has 30 - need1 pages left; a second request fits rank 0 but not rank 1.
  REQUIRE(need1 * 2 > 30);
  auto second = try_admit_all(ranks, 20, 5);
  CHECK_FALSE(second.has_value());
  CHECK(r0.live_sequences() == 1);  // rank 0 rolled back
  CHECK(r0.pool().stats().reserved == need0);
  CHECK(r1.pool().stats().reserved == need1);
}

TEST_CASE("view journal lists the page-table entries a step wrote", "[memory][manager][view]") {
  tiny_manager_on<simulated_memory_resource> fx(opts(200, 8));
  auto& m = fx.m;
  auto a = *m.try_admit(20, 5);
  m.prepare_chunk(a, 20);
  std::vector<std::int32_t> kept(16);
  m.expected_kept(a, 20, kept.data());
  m.commit_chunk(a, kept);
  m.clear_view_changes();
  m.set_batch({a});
  m.decode_step();  // a = 1: two uncompressed groups cross into a new page
  auto c = m.changes();
  CHECK_FALSE(c.full_resync);
  REQUIRE(c.num_page_entries == 2);
  CHECK(c.num_slots == 0);
  auto v = m.view();
  for (std::size_t i = 0; i < c.num_page_entries; ++i) {
    auto e = c.page_entries[i];
    // The entry is the 6th page (index 5) of group 6 or 7 of slot a.
    bool found = false;
    for (std::int32_t g : {6, 7}) found |= e == v.page_offset[a.slot * v.num_groups + g] + 5;
    CHECK(found);
  }
  m.clear_view_changes();
  m.decode_step();
  CHECK(m.changes().num_page_entries == 2);  // a = 2: G0 and G2
  auto e = m.view_extents();
  CHECK(e.page_offset == (8 + 1) * 8);  // + the padding slot's row
  CHECK(e.head_base_len == (8 + 1) * 16);
  CHECK(e.batch == 8);  // max_batch (0: max_sequences), not the current batch of 1
  CHECK(e.slots == 8 + 1);
}
