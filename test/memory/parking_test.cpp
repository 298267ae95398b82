// SPDX-License-Identifier: Apache-2.0
// Host offload of sessions (park / complete_park / try_unpark, and try_resume for a turn parked in
// decode) on the tiny hybrid model, worked by hand: the pages a parked session hands out and
// restores, the reservation of the restored turn (continue_turn's increment plus the history, or
// the resumed answer's growth), every byte of the restored pages, shared (forked) pages, the same
// state as continue_turn (or the uninterrupted turn) on the original, and every misuse.
#include <cstring>
#include <numeric>

#include "memory_fixtures.hpp"
#include "storm/engine_sim.hpp"
#include "tangram/eval/sim/simulated_memory_resource.hpp"
#include "tangram/memory/concurrent_kv_cache.hpp"
#include "tangram/memory/host_memory_resource.hpp"
#include "tangram/memory/tensor_parallel.hpp"
#include "tangram/plan/build_static_plan.hpp"

using namespace tangram;
using namespace tangram::test;

namespace {

/// The bytes of pages `pages` of m's host arena, one after another.
std::vector<std::byte> page_bytes(kv_cache_manager const& m, std::vector<page_id> const& pages) {
  std::vector<std::byte> out(pages.size() * static_cast<std::size_t>(m.pool().page_bytes()));
  copy_pages_to_host(
      m.pool().base(), m.pool().page_bytes(), pages.data(), pages.size(), out.data());
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
  tiny_manager fx(opts(200, 8));
  auto& m          = fx.m;
  auto const& plan = fx.plan;
  auto& mr         = fx.mr;
  // The arena starts uninitialised; the byte comparisons below cover whole pages, including
  // slots no token was written to, so give every byte a value first (valgrind memcheck).
  std::memset(
      m.pool().base(),
      0x5a,
      static_cast<std::size_t>(m.pool().capacity()) * static_cast<std::size_t>(plan.page_bytes()));
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
    original.insert(
        original.end(), m.group_pages(id, g), m.group_pages(id, g) + group_page_counts(m, id)[g]);
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
      restored.insert(restored.end(),
                      m.group_pages(*back, g),
                      m.group_pages(*back, g) + group_page_counts(m, *back)[g]);
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
  auto run = [](static_plan const& plan,
                std::int64_t N1,
                std::int64_t T1,
                std::int64_t N2,
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
  SECTION("static budgets, global grouping") {
    run(tiny_plan(tiny_budgets()), 20, 5, 6, 2);
  }
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

TEST_CASE("parking a running turn: it resumes where it stopped, every byte and token back",
          "[memory][manager][parking][mid_turn]") {
  // Twin managers: `a` runs the turn through, `b` parks it after 3 of its 5 answer tokens (an
  // answer's growth that did not fit, memory/answer_window.hpp) and resumes it. The model
  // (engine_sim::park / resume) predicts every count from the plan; the twin shows the resumed
  // turn ends exactly where the uninterrupted one does.
  auto run = [](static_plan const& plan, bool deferred) {
    host_memory_resource mr;
    auto o             = opts(300, 8);
    o.max_chunk_tokens = 8;
    o.deferred_reuse   = deferred;
    kv_cache_manager a(plan, mr, o), b(plan, mr, o);
    std::memset(b.pool().base(), 0x5a, static_cast<std::size_t>(b.pool().arena_bytes()));
    engine_sim sa(a, 21, 0.3), sb(b, 21, 0.3);
    auto ia = *sa.admit(20, 5), ib = *sb.admit(20, 5);
    for (std::int64_t done = 0; done < 20; done += 8) {
      sa.chunk(ia, std::min<std::int64_t>(8, 20 - done));
      sb.chunk(ib, std::min<std::int64_t>(8, 20 - done));
    }
    for (int t = 0; t < 3; ++t) {
      sa.decode({ia});
      sb.decode({ib});
    }
    // A rollback leaves pages back in the reservation (spares under deferred reuse).
    sb.append(ib, 2);
    sb.rollback(ib, 2);
    sa.append(ia, 2);
    sa.rollback(ia, 2);
    auto reserved = b.info(ib).reserved_pages;
    auto used     = b.pool().stats().used;
    auto session  = sb.park(ib);
    CHECK(session.mid_turn);
    CHECK(session.decoded == 3);
    CHECK(session.max_new == 5);
    CHECK(session.seq_tokens == 23);
    CHECK(session.appended == 3);
    // Parking keeps pages and reservation until complete_park; nothing else is allowed.
    CHECK(b.info(ib).phase == sequence_phase::parking);
    CHECK(b.info(ib).reserved_pages == reserved);
    CHECK(b.pool().stats().used == used);
    b.set_batch({ib});
    CHECK_THROWS_WITH(b.decode_step(), Catch::Contains("phase parking, not decode"));
    CHECK_THROWS_WITH(b.try_extend(ib, 1), Catch::Contains("phase parking"));
    CHECK_THROWS_WITH(b.end_turn(ib), Catch::Contains("phase parking"));
    sb.verify();
    // cancel_park: back in decode with its turn; it decodes on.
    sb.cancel_park(ib);
    CHECK(b.info(ib).phase == sequence_phase::decode);
    CHECK(b.info(ib).reserved_pages == reserved);
    sb.verify();
    session   = sb.park(ib);
    auto host = sb.copy_out(session);
    std::vector<page_id> original(session.device_pages);
    auto parked = sb.complete_park(ib, session, host);
    // Everything it held or had reserved is back (retired first under deferred reuse).
    if (deferred) b.release_epochs_through(b.advance_epoch());
    CHECK(b.pool().stats().used == 0);
    CHECK(b.pool().stats().reserved == 0);
    CHECK(b.stats().parked_mid_turn == 1);
    CHECK_THROWS_WITH(b.view(), Catch::Contains("freed"));  // the batch named it: set it again
    // Another sequence takes the first pages, so the resumed pages differ from the parked ones.
    auto other = *sb.admit(3, 1);
    auto rb    = sb.resume(parked, 5);
    REQUIRE(rb);
    CHECK(b.stats().resumed == 1);
    CHECK(b.info(*rb).phase == sequence_phase::decode);
    CHECK(b.info(*rb).decoded == 3);
    CHECK(b.info(*rb).max_new == 5);
    std::vector<page_id> now;
    for (std::int32_t g = 0; g < b.num_groups(); ++g)
      now.insert(
          now.end(), b.group_pages(*rb, g), b.group_pages(*rb, g) + b.group_page_count(*rb, g));
    CHECK(now != original);
    CHECK(page_bytes(b, now) == host);  // every byte of every page it parked
    sb.verify();                        // every held token of every head, through the view
    // The turn ends where the uninterrupted twin's does.
    for (int t = 0; t < 2; ++t) {
      sa.decode({ia});
      sb.decode({*rb});
    }
    CHECK(b.info(*rb).reserved_pages == 0);  // exactly its answer: nothing missing or left
    sa.end_turn(ia);
    sb.end_turn(*rb);
    CHECK(group_page_counts(a, ia) == group_page_counts(b, *rb));
    for (std::int32_t l = 0; l < plan.num_layers; ++l)
      for (std::int32_t h = 0; h < plan.num_kv_heads; ++h)
        CHECK(a.head_len(ia, l, h) == b.head_len(*rb, l, h));
    sa.verify();
    sb.verify();
    // A resume may also reserve a longer answer than it had (its next window).
    sb.free(*rb);
    auto longer = sb.resume(parked, 9);
    REQUIRE(longer);
    for (int t = 0; t < 6; ++t) sb.decode({*longer});
    sb.verify();
    sb.free(*longer);
    sb.free(other);
    if (deferred) b.release_epochs_through(b.advance_epoch());
    CHECK(b.pool().stats().used == 0);
    CHECK(b.pool().stats().reserved == 0);
    CHECK(b.stats().reclaimed_pages == 0);
    b.check_invariants();
  };
  SECTION("static budgets") {
    run(tiny_plan(tiny_budgets()), false);
  }
  SECTION("static budgets, deferred reuse") {
    run(tiny_plan(tiny_budgets()), true);
  }
  SECTION("elastic reservation") {
    run(tiny_plan(tiny_budgets(), 4, 2, 10, grouping_scope::global, elastic_reservation(0.15)),
        false);
  }
}

TEST_CASE("resuming a parked turn, worked by hand, does not fit, misuse",
          "[memory][manager][parking][mid_turn]") {
  tiny_manager_on<simulated_memory_resource> fx(opts(200, 8));
  auto& m          = fx.m;
  auto const& plan = fx.plan;
  engine_sim sim(m, 3, 0.0);
  // N 20, T 5, 3 decoded: uncompressed groups (2) use ceil(23 / 4) = 6 pages each and reach
  // ceil(25 / 4) = 7: 1 page each to reserve; sliding groups (2, W 10) use and keep their
  // ceil(10 / 4) = 3 ring pages; compressed group g keeps retained_tokens(rule_g, 20) and uses
  // ceil((k_g + 3) / 4), reaching ceil((k_g + 5) / 4).
  auto id = *sim.admit(20, 5);
  sim.chunk(id, 20);
  for (int t = 0; t < 3; ++t) sim.decode({id});
  std::int64_t history = 0, grow = 0;
  for (std::int32_t g = 0; g < m.num_groups(); ++g) {
    auto const& rule = plan.grouping.groups[static_cast<std::size_t>(g)].rule;
    std::int64_t use = 0, end = 0;
    if (rule.kind == layer_kind::sliding_window) {
      use = end = 3;
    } else if (rule.kind == layer_kind::uncompressed) {
      use = 6;
      end = 7;
    } else {
      auto k = retained_tokens(rule, 20);
      use    = (k + 3 + 3) / 4;
      end    = (k + 5 + 3) / 4;
    }
    history += use;
    grow += end - use;
  }
  auto session = sim.park(id);
  CHECK(session.host_pages() == history);
  auto parked = sim.complete_park(id, session, {});
  CHECK(m.resume_pages(parked.session, 5) == history + grow);
  CHECK(m.resume_pages(parked.session, 3) == history);  // no answer room: only its history
  // One page short, then no free slot: nothing changes; then it fits.
  {
    simulated_memory_resource mr2;
    kv_cache_manager small(plan, mr2, opts(history + grow - 1, 8));
    CHECK_FALSE(small.try_resume(parked.session, 5).has_value());
    CHECK(small.stats().resume_rejected == 1);
    CHECK(small.pool().stats().used + small.pool().stats().reserved == 0);
    kv_cache_manager one(plan, mr2, opts(200, 1));
    auto hog = *one.try_admit(1, 0);
    CHECK_FALSE(one.try_resume(parked.session, 5).has_value());
    one.free(hog);
    auto r = one.try_resume(parked.session, 5);
    REQUIRE(r);
    CHECK(one.info(r->id).reserved_pages == grow);
    one.check_invariants();
  }
  // Misuse: invalid_argument naming the field, nothing changed.
  std::vector<sequence_id> ids;
  auto s = parked.session;
  expect_unchanged<invalid_argument>(
      m,
      ids,
      [&] { (void)m.try_resume(s, 2); },
      "try_resume.max_new_tokens: must be in [decoded = 3");
  expect_unchanged<invalid_argument>(
      m,
      ids,
      [&] { (void)m.try_resume(s, std::int64_t{1} << 31); },
      "2^31 - 1 - 20 tokens before the answer]");
  expect_unchanged<invalid_argument>(
      m, ids, [&] { (void)m.try_unpark(s, 1, 1); }, "try_unpark.session.mid_turn");
  auto bad = [&](auto&& corrupt, std::string const& piece) {
    auto c = s;
    corrupt(c);
    expect_unchanged<invalid_argument>(
        m, ids, [&] { (void)m.try_resume(c, 5); }, piece);
  };
  bad([](parked_session& c) { c.decoded = 2; },
      "try_resume.session.decoded: a turn parked in decode");
  bad([](parked_session& c) { c.max_new = 2; },
      "try_resume.session.max_new: must be in [decoded = 3");
  bad([](parked_session& c) { c.group_pages[6] += 1; }, "try_resume.session.group_pages[6]");
  bad([](parked_session& c) { c.plan_fingerprint ^= 1; }, "try_resume.session.plan_fingerprint");
  CHECK_THROWS_WITH(m.resume_pages(s, 2), Catch::Contains("resume_pages.max_new_tokens"));
  CHECK(m.live_sequences() == 0);
  auto back = sim.resume(parked, 5);
  REQUIRE(back);
  sim.decode({*back});
  sim.decode({*back});
  sim.verify();
}

TEST_CASE("parking a forked session keeps the pages its fork shares",
          "[memory][manager][parking]") {
  tiny_manager fx(opts(200, 8));
  auto& m = fx.m;
  engine_sim sim(m, 5, 0.0);
  auto a = *sim.admit(20, 5);
  sim.chunk(a, 20);
  for (int i = 0; i < 5; ++i) sim.decode({a});
  sim.end_turn(a);
  auto b              = *sim.fork(a);  // shares every filled page of a
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
  tiny_manager fx(opts(200, 8));
  auto& m  = fx.m;
  auto& mr = fx.mr;
  engine_sim sim(m, 7, 0.0);
  auto a = *sim.admit(9, 3);
  auto b = *sim.admit(9, 3);
  sim.chunk(b, 9);
  std::vector<sequence_id> ids{a, b};
  expect_unchanged<logic_error>(
      m, ids, [&] { (void)m.park(a); }, "phase prefill; only an ended session or a turn in decode");
  expect_unchanged<logic_error>(
      m, ids, [&] { m.complete_park(b); }, "not parking");
  expect_unchanged<logic_error>(
      m, ids, [&] { m.cancel_park(a); }, "phase prefill, not parking");
  for (int i = 0; i < 3; ++i) sim.decode({b});
  sim.end_turn(b);
  auto session = sim.park(b);
  // A parking sequence accepts nothing but complete_park, cancel_park and free.
  expect_unchanged<logic_error>(
      m, ids, [&] { (void)m.continue_turn(b, 1, 1); }, "phase parking; call end_turn first");
  expect_unchanged<logic_error>(
      m, ids, [&] { (void)m.fork(b); }, "phase parking");
  expect_unchanged<logic_error>(
      m, ids, [&] { (void)m.park(b); }, "phase parking");
  expect_unchanged<logic_error>(
      m, ids, [&] { m.end_turn(b); }, "phase parking");
  expect_unchanged<logic_error>(
      m, ids, [&] { m.prepare_chunk(b, 1); }, "phase parking");
  auto host   = sim.copy_out(session);
  auto parked = sim.complete_park(b, session, host);
  ids         = {a};
  expect_unchanged<logic_error>(
      m, ids, [&] { m.complete_park(b); }, "unknown sequence");
  expect_unchanged<logic_error>(
      m, ids, [&] { (void)m.park(b); }, "unknown sequence");

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
    expect_unchanged<invalid_argument>(
        m, ids, [&] { (void)m.try_unpark(c, 1, 1); }, piece);
  };
  bad([](parked_session& c) { c.page_bytes += 4; }, "session.page_bytes: expected 256, got 260");
  bad([](parked_session& c) { c.group_pages.pop_back(); }, "session.group_pages: expected 8");
  bad([](parked_session& c) { c.head_base_len.push_back(0); },
      "session.head_base_len: expected 16");
  bad([](parked_session& c) { c.group_pages[2] += 1; }, "session.group_pages[2]: ");
  bad([](parked_session& c) { c.seq_tokens = 0; }, "session.seq_tokens: must be in [1, 2^31 - 1]");
  bad([](parked_session& c) { c.appended = -1; }, "session.appended");
  bad([](parked_session& c) { c.written_tokens = 0; }, "session.written_tokens");
  bad([](parked_session& c) { c.head_base_len[4] = 3; }, "head_base_len[4]: 3 for a sliding");
  bad([](parked_session& c) { c.head_base_len[0] = 1 << 30; },
      "outside [0, seq_tokens - appended]");
  bad([](parked_session& c) { c.decoded = 1; }, "session: an ended session (mid_turn false)");
  bad([](parked_session& c) { c.max_new = 2; }, "has decoded = max_new = 0, got 0 and 2");
  // A session made to look parked mid-turn: try_unpark refuses it (try_resume continues it).
  bad(
      [](parked_session& c) {
        c.mid_turn = true;
        c.decoded = c.max_new = c.appended;
      },
      "try_unpark.session.mid_turn: the session was parked in the middle of a turn (3 of 3");
  expect_unchanged<invalid_argument>(
      m, ids, [&] { (void)m.try_resume(s, 4); }, "try_resume.session.mid_turn: the session ended");
  CHECK_THROWS_WITH(m.resume_pages(s, 4), Catch::Contains("resume_pages.session.mid_turn"));
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
      m,
      ids,
      [&] { (void)m.try_unpark(s, std::int64_t{1} << 31, 0); },
      "prompt_tokens + max_new_tokens = ");
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
  // A turn in decode parks too, and resumes with try_resume.
  kv.with_lock([&](kv_cache_manager& m) { prefill(m, back->id, 4); });
  auto mid = kv.park(back->id);
  CHECK(mid.mid_turn);
  kv.complete_park(back->id);
  auto resumed = kv.try_resume(mid, 4);
  REQUIRE(resumed);
  CHECK(kv.info(resumed->id)->phase == sequence_phase::decode);
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
    CHECK(static_cast<std::int64_t>((*back)[r].device_pages.size()) == sessions[r].host_pages());
    ranks[r]->check_invariants();
  }
  // The turn parked again in decode resumes on every rank or on none.
  std::vector<parked_session> mid;
  for (std::size_t r = 0; r < 2; ++r) {
    prefill(*ranks[r], (*back)[r].id, 6);
    mid.push_back(ranks[r]->park((*back)[r].id));
    ranks[r]->complete_park((*back)[r].id);
  }
  CHECK_THROWS_WITH(try_resume_all(ranks, {mid[0]}, 2),
                    Catch::Contains("try_resume_all.sessions: expected one per rank (2), got 1"));
  CHECK_THROWS_AS(try_resume_all(ranks, sessions, 2), invalid_argument);  // ended: try_unpark
  auto hog2 = r1.try_admit(1, T);
  REQUIRE(hog2);
  CHECK_FALSE(try_resume_all(ranks, mid, 2).has_value());
  CHECK(r0.live_sequences() == 0);
  r1.free(*hog2);
  auto resumed = try_resume_all(ranks, mid, 2);
  REQUIRE(resumed);
  for (std::size_t r = 0; r < 2; ++r) {
    CHECK(ranks[r]->info((*resumed)[r].id).phase == sequence_phase::decode);
    ranks[r]->check_invariants();
  }
}
