// SPDX-License-Identifier: Apache-2.0
// Host offload of idle sessions (park / complete_park / try_unpark) on the tiny hybrid model,
// worked by hand: the pages a parked session hands out and restores, the reservation of the
// restored turn (continue_turn's increment plus the history), every byte of the restored pages,
// shared (forked) pages, the same state as continue_turn on the original, and every misuse.
#include <cstring>
#include <numeric>

#include "engine_sim.hpp"
#include "memory_fixtures.hpp"
#include "tangram/memory/concurrent_kv_cache.hpp"
#include "tangram/memory/tensor_parallel.hpp"
#include "tangram/plan/build_static_plan.hpp"

using namespace tangram;
using namespace tangram::test;

namespace {


/// The bytes of pages `pages` of m's host arena, one after another.
std::vector<std::byte> page_bytes(kv_cache_manager const& m, std::vector<page_id> const& pages) {
  std::vector<std::byte> out(pages.size() * static_cast<std::size_t>(m.pool().page_bytes()));
  copy_pages_to_host(m.pool().base(), m.pool().page_bytes(), pages.data(), pages.size(), out.data());
  return out;
}

template <class Exception, class F>
void expect_unchanged(kv_cache_manager& m,
                      std::vector<sequence_id> const& ids,
                      F&& f,
                      std::string const& piece) {
  auto before = snapshot(m, ids);
  std::string msg;
  try {
    f();
  } catch (Exception const& e) {
    msg = e.what();
  }
  INFO("expected \"" << piece << "\", got: " << msg);
  CHECK(msg.find(piece) != std::string::npos);
  CHECK(snapshot(m, ids) == before);
}

}  // namespace

TEST_CASE("parking: the pages out, the reservation back in and every byte, worked by hand",
          "[memory][manager][parking]") {
  auto plan = tiny_plan(tiny_budgets());
  host_memory_resource mr;
  kv_cache_manager m(plan, mr, opts(200, 8));
  // The arena starts uninitialised; the byte comparisons below cover whole pages, including
  // slots no token was written to, so give every byte a value first (valgrind memcheck).
  std::memset(m.pool().base(), 0x5a,
              static_cast<std::size_t>(m.pool().capacity()) *
                  static_cast<std::size_t>(plan.page_bytes()));
  engine_sim sim(m, 3, 0.0);
  // Turn 1 as in manager_test ("multi-turn"): N = 20, T = 5; the ended session holds
  // G0..G3 5 4 3 3, sliding 3 3, uncompressed 7 7 = 35 pages, reserves nothing.
  auto id = *sim.admit(20, 5);
  sim.chunk(id, 20);
  for (int i = 0; i < 5; ++i) sim.decode({id});
  sim.end_turn(id);
  REQUIRE(group_page_counts(m, id) == std::vector<std::int32_t>{5, 4, 3, 3, 3, 3, 7, 7});
  std::vector<page_id> original;
  for (std::int32_t g = 0; g < m.num_groups(); ++g)
    original.insert(original.end(), m.group_pages(id, g), m.group_pages(id, g) + group_page_counts(m, id)[g]);
  auto original_bytes = page_bytes(m, original);

  auto session = sim.park(id);
  CHECK(m.info(id).phase == sequence_phase::parking);
  CHECK(session.group_pages == std::vector<std::int32_t>{5, 4, 3, 3, 3, 3, 7, 7});
  CHECK(session.device_pages == original);  // group after group, in list order
  CHECK(session.host_pages() == 35);
  CHECK(session.seq_tokens == 25);
  CHECK(session.appended == 5);
  CHECK(session.plan_fingerprint == m.fingerprint());
  CHECK(m.pool().stats().used == 35);  // held until complete_park
  sim.verify();
  auto host = sim.copy_out(session);
  CHECK(host == original_bytes);
  auto parked = sim.complete_park(id, session, host);
  CHECK_FALSE(m.contains(id));
  CHECK(m.pool().stats().used == 0);
  CHECK(m.pool().stats().reserved == 0);
  CHECK(m.stats().parked == 1);
  CHECK(m.stats().pages_parked == 35);
  sim.verify();

  SECTION("next turn N = 6, T = 2: history 35 + continue_turn's increment 8") {
    // Final pages after 31 tokens + 2: G0 7, G1 5, G2 4, G3 3, sliding 3, uncompressed 9;
    // held 5 4 3 3 3 3 7 7 -> increments 2 1 1 0 0 0 2 2 = 8 (manager_test).
    CHECK(m.unpark_pages(parked.session, 6, 2) == 43);
    // Another sequence takes pages 0.. so the restored ones differ from the originals.
    auto other = *sim.admit(3, 1);
    auto back  = sim.unpark(parked, 6, 2);
    REQUIRE(back);
    CHECK(m.info(*back).phase == sequence_phase::prefill);
    CHECK(m.info(*back).reserved_pages == 8);
    CHECK(group_page_counts(m, *back) == std::vector<std::int32_t>{5, 4, 3, 3, 3, 3, 7, 7});
    CHECK(group_page_targets(m, *back) == std::vector<std::int32_t>{7, 5, 4, 3, 3, 3, 9, 9});
    CHECK(m.stats().unparked == 1);
    CHECK(m.stats().pages_restored == 35);
    std::vector<page_id> restored;
    for (std::int32_t g = 0; g < m.num_groups(); ++g)
      restored.insert(
          restored.end(), m.group_pages(*back, g), m.group_pages(*back, g) + group_page_counts(m, *back)[g]);
    CHECK(restored != original);
    // Every byte of every restored page equals the page it was parked from.
    CHECK(page_bytes(m, restored) == original_bytes);
    sim.verify();  // every held token of every head, read back through the view
    sim.chunk(*back, 6);
    sim.decode({*back});
    sim.decode({*back});
    CHECK(group_page_counts(m, *back) == std::vector<std::int32_t>{7, 5, 4, 3, 3, 3, 9, 9});
    CHECK(m.info(*back).reserved_pages == 0);
    sim.verify();
    // The same host copy restores again, into its own pages.
    sim.end_turn(*back);
    auto again = sim.unpark(parked, 1, 0);
    REQUIRE(again);
    sim.verify();
    sim.free(*again);
    sim.free(*back);
    sim.free(other);
    CHECK(m.pool().stats().used == 0);
    m.check_invariants();
  }
  SECTION("does not fit: one page short, no slot; nothing changes") {
    manager_options o = opts(42, 8);
    kv_cache_manager small(plan, mr, o);
    auto s = small.try_unpark(parked.session, 6, 2);
    CHECK_FALSE(s.has_value());
    CHECK(small.stats().unpark_rejected == 1);
    CHECK(small.pool().stats().used == 0);
    CHECK(small.pool().stats().reserved == 0);
    kv_cache_manager one(plan, mr, opts(200, 1));
    auto a = *one.try_admit(1, 0);
    CHECK_FALSE(one.try_unpark(parked.session, 6, 2).has_value());
    one.free(a);
    auto b = one.try_unpark(parked.session, 6, 2);
    REQUIRE(b);
    CHECK(one.info(b->id).reserved_pages == 8);
    one.check_invariants();
  }
}

TEST_CASE("parking: a restored session is in the state continue_turn leaves the original in",
          "[memory][manager][parking]") {
  // Twin managers walk the same operations; one continues its session, the other parks and
  // restores it. Everything but the page ids must agree, and the data through the view.
  auto run = [](static_plan const& plan, std::int64_t N1, std::int64_t T1, std::int64_t N2,
                std::int64_t T2) {
    host_memory_resource mr;
    auto o             = opts(400, 8);
    o.max_chunk_tokens = 8;  // elastic: each turn stages one chunk of at most 8 tokens
    kv_cache_manager a(plan, mr, o), b(plan, mr, o);
    engine_sim sa(a, 11, 0.3), sb(b, 11, 0.3);
    auto ia = *sa.admit(N1, T1), ib = *sb.admit(N1, T1);
    for (std::int64_t done = 0; done < N1; done += 7) {
      sa.chunk(ia, std::min<std::int64_t>(7, N1 - done));
      sb.chunk(ib, std::min<std::int64_t>(7, N1 - done));
    }
    for (std::int64_t t = 0; t < T1; ++t) {
      sa.decode({ia});
      sb.decode({ib});
    }
    sa.end_turn(ia);
    sb.end_turn(ib);
    REQUIRE(sa.continue_turn(ia, N2, T2));
    auto session = sb.park(ib);
    auto host    = sb.copy_out(session);
    auto parked  = sb.complete_park(ib, session, host);
    auto rb      = sb.unpark(parked, N2, T2);
    REQUIRE(rb);
    auto x = a.info(ia), y = b.info(*rb);
    CHECK(x.phase == y.phase);
    CHECK(x.seq_tokens == y.seq_tokens);
    CHECK(x.appended == y.appended);
    CHECK(x.prompt_remaining == y.prompt_remaining);
    CHECK(x.max_new == y.max_new);
    CHECK(x.decoded == y.decoded);
    CHECK(x.reserved_pages == y.reserved_pages);
    CHECK(x.held_pages == y.held_pages);
    CHECK(group_page_counts(a, ia) == group_page_counts(b, *rb));
    CHECK(group_page_targets(a, ia) == group_page_targets(b, *rb));
    CHECK(a.elastic_page_limit(ia) == b.elastic_page_limit(*rb));
    for (std::int32_t g = 0; g < a.num_groups(); ++g)
      CHECK(a.group_reserved(ia, g) == b.group_reserved(*rb, g));
    for (std::int32_t l = 0; l < plan.num_layers; ++l)
      for (std::int32_t h = 0; h < plan.num_kv_heads; ++h)
        CHECK(a.head_len(ia, l, h) == b.head_len(*rb, l, h));
    CHECK(a.pool().stats().used == b.pool().stats().used);
    CHECK(a.pool().stats().reserved == b.pool().stats().reserved);
    sa.verify();
    sb.verify();
    // The turns run on identically from there.
    for (std::int64_t done = 0; done < N2; done += 5) {
      sa.chunk(ia, std::min<std::int64_t>(5, N2 - done));
      sb.chunk(*rb, std::min<std::int64_t>(5, N2 - done));
    }
    for (std::int64_t t = 0; t < T2; ++t) {
      sa.decode({ia});
      sb.decode({*rb});
    }
    CHECK(group_page_counts(a, ia) == group_page_counts(b, *rb));
    CHECK(a.info(ia).reserved_pages == b.info(*rb).reserved_pages);
    sa.verify();
    sb.verify();
  };
  SECTION("static budgets, global grouping") { run(tiny_plan(tiny_budgets()), 20, 5, 6, 2); }
  SECTION("static budgets, turn shorter than the dropped decode (surplus)") {
    run(tiny_plan(tiny_budgets(), 3, 1, 7, grouping_scope::layer), 30, 40, 1, 0);
  }
  SECTION("elastic reservation") {
    run(tiny_plan(tiny_budgets(), 4, 2, 10, grouping_scope::global, elastic_reservation(0.15)),
        33,
        9,
        12,
        6);
  }
}

TEST_CASE("parking a forked session keeps the pages its fork shares",
          "[memory][manager][parking]") {
  auto plan = tiny_plan(tiny_budgets());
  host_memory_resource mr;
  kv_cache_manager m(plan, mr, opts(200, 8));
  engine_sim sim(m, 5, 0.0);
  auto a = *sim.admit(20, 5);
  sim.chunk(a, 20);
  for (int i = 0; i < 5; ++i) sim.decode({a});
  sim.end_turn(a);
  auto b = *sim.fork(a);  // shares every filled page of a
  std::int64_t shared = 0;
  for (std::int32_t g = 0; g < m.num_groups(); ++g)
    for (std::int32_t p = 0; p < m.group_page_count(a, g); ++p)
      shared += m.pool().ref_count(m.group_pages(a, g)[p]) == 2;
  REQUIRE(shared > 0);
  auto used    = m.pool().stats().used;
  auto session = sim.park(a);
  auto host    = sim.copy_out(session);
  auto parked  = sim.complete_park(a, session, host);
  // Only a's exclusive pages were freed; the shared ones stay with b (reference count 1 now).
  CHECK(m.pool().stats().used == used - (35 - shared));
  sim.verify();  // b's every token intact
  auto back = sim.unpark(parked, 4, 3);
  REQUIRE(back);
  // The restored pages are a's own: nothing shared, so b and the restored session write freely.
  for (std::int32_t g = 0; g < m.num_groups(); ++g)
    for (std::int32_t p = 0; p < m.group_page_count(*back, g); ++p)
      CHECK(m.pool().ref_count(m.group_pages(*back, g)[p]) == 1);
  sim.verify();
  sim.chunk(*back, 4);
  REQUIRE(sim.continue_turn(b, 2, 2));
  sim.chunk(b, 2);
  sim.decode({*back, b});
  sim.verify();

  SECTION("cancel_park gives the session back, pages and all") {
    sim.decode({*back, b});
    sim.end_turn(b);
    auto s2 = sim.park(b);
    sim.cancel_park(b);
    CHECK(m.info(b).phase == sequence_phase::ended);
    CHECK(s2.host_pages() == m.info(b).held_pages);
    sim.verify();
    REQUIRE(sim.continue_turn(b, 1, 1));
    sim.verify();
  }
}

TEST_CASE("parking misuse is a clear error with nothing changed", "[memory][manager][parking]") {
  auto plan = tiny_plan(tiny_budgets());
  host_memory_resource mr;
  kv_cache_manager m(plan, mr, opts(200, 8));
  engine_sim sim(m, 7, 0.0);
  auto a = *sim.admit(9, 3);
  auto b = *sim.admit(9, 3);
  sim.chunk(b, 9);
  std::vector<sequence_id> ids{a, b};
  expect_unchanged<logic_error>(m, ids, [&] { (void)m.park(a); }, "park: sequence in slot");
  expect_unchanged<logic_error>(m, ids, [&] { (void)m.park(b); }, "phase decode; only an ended");
  expect_unchanged<logic_error>(m, ids, [&] { m.complete_park(b); }, "not parking");
  expect_unchanged<logic_error>(m, ids, [&] { m.cancel_park(a); }, "phase prefill, not parking");
  for (int i = 0; i < 3; ++i) sim.decode({b});
  sim.end_turn(b);
  auto session = sim.park(b);
  // A parking sequence accepts nothing but complete_park, cancel_park and free.
  expect_unchanged<logic_error>(
      m, ids, [&] { (void)m.continue_turn(b, 1, 1); }, "phase parking; call end_turn first");
  expect_unchanged<logic_error>(m, ids, [&] { (void)m.fork(b); }, "phase parking");
  expect_unchanged<logic_error>(m, ids, [&] { (void)m.park(b); }, "phase parking");
  expect_unchanged<logic_error>(m, ids, [&] { m.end_turn(b); }, "phase parking");
  expect_unchanged<logic_error>(m, ids, [&] { m.prepare_chunk(b, 1); }, "phase parking");
  auto host   = sim.copy_out(session);
  auto parked = sim.complete_park(b, session, host);
  ids         = {a};
  expect_unchanged<logic_error>(m, ids, [&] { m.complete_park(b); }, "unknown sequence");
  expect_unchanged<logic_error>(m, ids, [&] { (void)m.park(b); }, "unknown sequence");

  // Sessions of another plan, or that no ended sequence can have: invalid_argument naming the
  // field and the value.
  auto s = parked.session;
  {
    kv_cache_manager other(tiny_plan(tiny_budgets(), 4, 2, 11), mr, opts(200, 8));
    CHECK(other.fingerprint() != m.fingerprint());
    CHECK_THROWS_WITH(other.try_unpark(s, 1, 1),
                      Catch::Contains("try_unpark.session.plan_fingerprint"));
    CHECK(other.pool().stats().used == 0);
  }
  {
    // Same plan built twice: same fingerprint (stable, content-based).
    kv_cache_manager twin(tiny_plan(tiny_budgets()), mr, opts(200, 8));
    CHECK(twin.fingerprint() == m.fingerprint());
  }
  auto bad = [&](auto&& corrupt, std::string const& piece) {
    auto c = s;
    corrupt(c);
    expect_unchanged<invalid_argument>(m, ids, [&] { (void)m.try_unpark(c, 1, 1); }, piece);
  };
  bad([](parked_session& c) { c.page_bytes += 4; }, "session.page_bytes: expected 256, got 260");
  bad([](parked_session& c) { c.group_pages.pop_back(); }, "session.group_pages: expected 8");
  bad([](parked_session& c) { c.head_base_len.push_back(0); }, "session.head_base_len: expected 16");
  bad([](parked_session& c) { c.group_pages[2] += 1; }, "session.group_pages[2]: ");
  bad([](parked_session& c) { c.seq_tokens = 0; }, "session.seq_tokens: must be in [1, 2^31 - 1]");
  bad([](parked_session& c) { c.appended = -1; }, "session.appended");
  bad([](parked_session& c) { c.written_tokens = 0; }, "session.written_tokens");
  bad([](parked_session& c) { c.head_base_len[4] = 3; }, "head_base_len[4]: 3 for a sliding");
  bad([](parked_session& c) { c.head_base_len[0] = 1 << 30; }, "outside [0, seq_tokens - appended]");
  expect_unchanged<invalid_argument>(
      m, ids, [&] { (void)m.try_unpark(s, 0, 1); }, "try_unpark.prompt_tokens: must be >= 1");
  expect_unchanged<invalid_argument>(
      m, ids, [&] { (void)m.try_unpark(s, 1, -1); }, "try_unpark.max_new_tokens");
  expect_unchanged<invalid_argument>(
      m,
      ids,
      [&] { (void)m.try_unpark(s, 1, std::numeric_limits<std::int64_t>::max()); },
      "prompt_tokens + max_new_tokens overflows");
  expect_unchanged<invalid_argument>(
      m, ids, [&] { (void)m.try_unpark(s, std::int64_t{1} << 31, 0); }, "prompt_tokens + max_new_tokens = ");
  CHECK_THROWS_AS(m.unpark_pages(s, 0, 1), invalid_argument);
  CHECK(sim.unpark(parked, 2, 2).has_value());
  sim.verify();
}

TEST_CASE("concurrent_kv_cache forwards parking", "[memory][manager][parking]") {
  auto plan = tiny_plan(tiny_budgets());
  host_memory_resource mr;
  concurrent_kv_cache<> kv(plan, mr, opts(100, 4));
  auto id = *kv.try_admit(8, 0);
  kv.with_lock([&](kv_cache_manager& m) {
    std::vector<std::int32_t> kept(plan.rules.size());
    m.prepare_chunk(id, 8);
    m.expected_kept(id, 8, kept.data());
    m.commit_chunk(id, kept);
  });
  kv.end_turn(id);
  auto session = kv.park(id);
  kv.cancel_park(id);
  session = kv.park(id);
  kv.complete_park(id);
  CHECK_FALSE(kv.contains(id));
  CHECK(kv.pool_statistics().used == 0);
  auto back = kv.try_unpark(session, 4, 4);
  REQUIRE(back);
  CHECK(kv.info(back->id)->phase == sequence_phase::prefill);
  CHECK(static_cast<std::int64_t>(back->device_pages.size()) == session.host_pages());
  kv.check_invariants();
}

TEST_CASE("tensor parallelism: restore a parked session on every rank or on none",
          "[memory][manager][parking][tp]") {
  auto plans = tiny_tp_plans();
  simulated_memory_resource mr;
  kv_cache_manager r0(plans[0], mr, opts(100, 8)), r1(plans[1], mr, opts(100, 8));
  CHECK(r0.fingerprint() != r1.fingerprint());  // the ranks hold different heads
  std::vector<kv_cache_manager*> ranks{&r0, &r1};
  auto ids = *try_admit_all(ranks, 20, 5);
  std::vector<parked_session> sessions;
  for (std::size_t r = 0; r < 2; ++r) {
    prefill(*ranks[r], ids[r], 20);
    ranks[r]->end_turn(ids[r]);
    sessions.push_back(ranks[r]->park(ids[r]));
    ranks[r]->complete_park(ids[r]);
  }
  // Swapped sessions belong to the other rank: refused before any rank changes.
  CHECK_THROWS_AS(try_unpark_all(ranks, {sessions[1], sessions[0]}, 6, 2), invalid_argument);
  CHECK_THROWS_AS(try_unpark_all(ranks, {sessions[0]}, 6, 2), invalid_argument);
  CHECK(r0.live_sequences() + r1.live_sequences() == 0);
  // Rank 1 full: rank 0's restore is rolled back.
  std::int64_t T = 0;  // the longest request that still fits rank 1 leaves < G pages free
  while (r1.admission_pages(1, T + 1) <= r1.pool().available_pages()) ++T;
  auto hog = r1.try_admit(1, T);
  REQUIRE(hog);
  REQUIRE(r1.pool().available_pages() < r1.unpark_pages(sessions[1], 6, 2));
  CHECK_FALSE(try_unpark_all(ranks, sessions, 6, 2).has_value());
  CHECK(r0.live_sequences() == 0);
  CHECK(r0.pool().stats().used + r0.pool().stats().reserved == 0);
  r1.free(*hog);
  auto back = try_unpark_all(ranks, sessions, 6, 2);
  REQUIRE(back);
  for (std::size_t r = 0; r < 2; ++r) {
    CHECK(ranks[r]->info((*back)[r].id).phase == sequence_phase::prefill);
    CHECK(static_cast<std::int64_t>((*back)[r].device_pages.size()) ==
          sessions[r].host_pages());
    ranks[r]->check_invariants();
  }
}
