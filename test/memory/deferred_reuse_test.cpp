// SPDX-License-Identifier: Apache-2.0
// Deferred page reuse (multi-stream safety, issue #14 item 5): the pool's retire list and epochs
// worked by hand (a page released in epoch e is handed out only after release_epochs_through(e),
// FIFO, shared pages retire once, the counters add up, bad input names the value and changes
// nothing), the manager's paths on the tiny hybrid model (free, end_turn, a recompressing
// chunk, copy-on-write, rollback's spares, admission's pages_awaiting_release), and random
// lifecycles with deferral on, checked after every operation against an independent model of
// which pages work still in flight may read.
#include <algorithm>
#include <cstdint>
#include <map>
#include <set>
#include <vector>

#include "memory_fixtures.hpp"
#include "prefix_fixtures.hpp"
#include "storm/engine_sim.hpp"
#include "tangram/memory/host_memory_resource.hpp"
#include "tangram/memory/kv_cache_manager.hpp"
#include "tangram/memory/page_pool.hpp"

using namespace tangram;
using namespace tangram::test;

namespace {

std::vector<std::pair<page_id, std::int64_t>> retired_list(page_pool<> const& pool) {
  std::vector<std::pair<page_id, std::int64_t>> out;
  pool.for_each_retired([&](page_id p, std::int64_t e) { out.emplace_back(p, e); });
  return out;
}

/// Every page a live sequence references (its lists and its spares) or a pending copy holds,
/// from the manager's public accessors only.
std::set<page_id> owned_pages(kv_cache_manager const& m) {
  std::set<page_id> out;
  m.for_each_sequence([&](sequence_info const& i) {
    for (std::int32_t g = 0; g < m.num_groups(); ++g) {
      auto p = m.group_pages(i.id, g);
      out.insert(p, p + m.group_page_count(i.id, g));
    }
    m.for_each_spare_page(i.id, [&](page_id p) { out.insert(p); });
  });
  for (auto c : m.pending_copies()) {
    out.insert(c.src);
    out.insert(c.dst);
  }
  return out;
}

std::set<page_id> retired_set(kv_cache_manager const& m) {
  std::set<page_id> out;
  m.pool().for_each_retired([&](page_id p, std::int64_t) { out.insert(p); });
  return out;
}

/// free + retired + used = capacity, retired pages owned by nobody and listed once.
void check_accounting(kv_cache_manager const& m) {
  auto ps = m.pool().stats();
  REQUIRE(ps.free + ps.retired + ps.used == ps.capacity);
  auto owned   = owned_pages(m);
  auto retired = retired_list(m.pool());
  std::set<page_id> once;
  for (auto [p, e] : retired) {
    REQUIRE(once.insert(p).second);
    REQUIRE(owned.count(p) == 0);
    REQUIRE(e > m.released_epoch());
    REQUIRE(e <= m.current_epoch());
  }
  REQUIRE(static_cast<std::int64_t>(owned.size()) == ps.used);
  m.check_invariants();
}

manager_options deferred_opts(std::int64_t pages, std::int32_t slots) {
  auto o           = opts(pages, slots);
  o.deferred_reuse = true;
  return o;
}

}  // namespace

TEST_CASE(
    "page_pool deferred reuse: a page released in epoch e is handed out only after its "
    "release",
    "[memory][pool][deferred]") {
  host_memory_resource mr;
  page_pool<> pool(mr, page_layout<>(page_geometry{4, 2, 4, dtype::f32}), 4, true);
  REQUIRE(pool.deferred_reuse());
  CHECK(pool.current_epoch() == 0);
  CHECK(pool.released_through() == -1);
  auto a = *pool.try_allocate(), b = *pool.try_allocate(), c = *pool.try_allocate();
  CHECK(a == 0);
  CHECK(b == 1);
  CHECK(c == 2);
  CHECK(pool.release(a));  // unreferenced: retired under epoch 0, not free
  auto s = pool.stats();
  CHECK(s.free == 1);
  CHECK(s.retired == 1);
  CHECK(s.used == 2);
  CHECK(s.frees == 0);
  CHECK(s.retirements == 1);
  CHECK(s.available() == 1);
  CHECK(retired_list(pool) == std::vector<std::pair<page_id, std::int64_t>>{{0, 0}});
  CHECK(pool.ref_count(a) == 0);
  pool.check_invariants();
  // Only page 3 can be handed out; page 0 waits.
  CHECK(*pool.try_allocate() == 3);
  CHECK_FALSE(pool.try_allocate().has_value());
  CHECK_FALSE(pool.try_reserve(1).has_value());
  CHECK(pool.advance_epoch() == 0);
  CHECK(pool.current_epoch() == 1);
  CHECK(pool.release(b));  // epoch 1
  CHECK(pool.release(3));  // epoch 1
  CHECK(retired_list(pool) ==
        std::vector<std::pair<page_id, std::int64_t>>{{0, 0}, {1, 1}, {3, 1}});
  // Epoch 1 is still open: releasing it is an error, nothing changes.
  TANGRAM_REQUIRE_THROWS_WITH_ALL(pool.release_epochs_through(1),
                                  invalid_argument,
                                  "release_epochs_through.epoch: 1 is not closed yet",
                                  "the open epoch is 1");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      pool.release_epochs_through(-1), invalid_argument, "must be >= 0, got -1");
  CHECK(pool.stats().retired == 3);
  CHECK(pool.released_through() == -1);
  // Epoch 0 completed: page 0 alone becomes free.
  CHECK(pool.release_epochs_through(0) == 1);
  CHECK(pool.released_through() == 0);
  CHECK(pool.stats().retired == 2);
  CHECK(pool.stats().frees == 1);
  CHECK(*pool.try_allocate() == 0);
  CHECK_FALSE(pool.try_allocate().has_value());
  CHECK(pool.release_epochs_through(0) == 0);  // again: nothing
  CHECK(pool.advance_epoch() == 1);
  CHECK(pool.release_epochs_through(1) == 2);
  CHECK(pool.released_through() == 1);
  // FIFO onto the free stack: 1 then 3, so 3 comes out first.
  CHECK(*pool.try_allocate() == 3);
  CHECK(*pool.try_allocate() == 1);
  pool.check_invariants();
  s = pool.stats();
  CHECK(s.free + s.retired + s.used == s.capacity);
  CHECK(s.used == 4);
}

TEST_CASE("page_pool deferred reuse: a shared page retires once, at its last reference",
          "[memory][pool][deferred]") {
  host_memory_resource mr;
  page_pool<> pool(mr, page_layout<>(page_geometry{4, 2, 4, dtype::f32}), 3, true);
  auto p = *pool.try_allocate();
  pool.retain(p);
  pool.retain(p);
  CHECK_FALSE(pool.release(p));
  CHECK_FALSE(pool.release(p));
  CHECK(pool.stats().retired == 0);
  CHECK(pool.advance_epoch() == 0);
  CHECK(pool.release(p));  // the last reference, in epoch 1
  CHECK(retired_list(pool) == std::vector<std::pair<page_id, std::int64_t>>{{p, 1}});
  // A retired page accepts neither another release nor a retain; nothing changes.
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      pool.release(p), logic_error, "page_pool::release: page 0", "already free or retired");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      pool.retain(p), logic_error, "page_pool::retain: page 0", "free or retired");
  CHECK(pool.stats().retired == 1);
  CHECK(pool.stats().retirements == 1);
  pool.check_invariants();
  // Epoch 0 holds none of it.
  CHECK(pool.release_epochs_through(0) == 0);
  CHECK(pool.stats().retired == 1);
  CHECK(pool.advance_epoch() == 1);
  CHECK(pool.release_epochs_through(1) == 1);
  CHECK(pool.stats().free == 3);
  pool.check_invariants();
}

TEST_CASE("page_pool without deferred reuse: pages free at once, epochs still count",
          "[memory][pool][deferred]") {
  host_memory_resource mr;
  page_pool<> pool(mr, page_layout<>(page_geometry{4, 2, 4, dtype::f32}), 2);
  CHECK_FALSE(pool.deferred_reuse());
  auto a = *pool.try_allocate();
  CHECK(pool.release(a));
  CHECK(pool.stats().free == 2);
  CHECK(pool.stats().retired == 0);
  CHECK(*pool.try_allocate() == a);  // the very next allocation reuses it
  CHECK(pool.advance_epoch() == 0);
  CHECK(pool.release_epochs_through(0) == 0);
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      pool.release_epochs_through(1), invalid_argument, "1 is not closed yet");
  pool.check_invariants();
}

TEST_CASE(
    "deferred reuse: free, end_turn and a recompressing chunk retire exactly the pages "
    "that left every list",
    "[memory][manager][deferred]") {
  tiny_manager fx(deferred_opts(40, 3));
  auto& m = fx.m;
  REQUIRE(m.options().deferred_reuse);
  auto a = *m.try_admit(20, 5);  // M(20, 5) = 35 of 40 pages
  prefill(m, a, 20);
  m.set_batch({a});
  m.decode_step();
  m.decode_step();
  auto held = owned_pages(m);
  auto used = m.pool().used_pages();
  REQUIRE(static_cast<std::int64_t>(held.size()) == used);
  check_accounting(m);

  // free: every page of a retires under epoch 0; its unused reservation returns at once.
  m.free(a);
  CHECK(m.retired_pages() == used);
  CHECK(retired_set(m) == held);
  CHECK(m.pool().used_pages() == 0);
  CHECK(m.pool().reserved_pages() == 0);
  CHECK(m.pool().available_pages() == 40 - used);
  check_accounting(m);

  // Admission cannot take them: the reason says they wait for a release, and how many.
  auto before = snapshot(m, {});
  auto r      = m.admit(20, 5);
  CHECK_FALSE(r);
  CHECK(r.reason == admit_failure::pages_awaiting_release);
  CHECK(to_string(r.reason) == "pages_awaiting_release");
  CHECK(r.pages_needed == 35);
  CHECK(r.pages_missing == 35 - (40 - used));
  CHECK(r.pages_retired == used);
  auto after = snapshot(m, {});
  for (std::size_t k = 0; k < before.numbers.size(); ++k)
    if (k != 1) CHECK(after.numbers[k] == before.numbers[k]);  // only `rejected` moved
  // Nothing handed out while epoch 0 is open; after its release, everything again.
  CHECK(m.advance_epoch() == 0);
  CHECK(m.current_epoch() == 1);
  CHECK(m.release_epochs_through(0) == used);
  CHECK(m.released_epoch() == 0);
  CHECK(m.retired_pages() == 0);
  CHECK(m.pool().free_pages() == 40);
  auto b = m.admit(20, 5);
  REQUIRE(b);
  CHECK(b.pages_retired == 0);
  check_accounting(m);

  // end_turn: the unused decode reservation returns at once (never written), pages beyond what
  // the heads use retire.
  prefill(m, *b.id, 20);
  m.set_batch({*b.id});
  m.decode_step();
  auto list_before = owned_pages(m);
  auto avail       = m.pool().available_pages();
  auto reserved    = m.info(*b.id).reserved_pages;
  m.end_turn(*b.id);
  auto list_after = owned_pages(m);
  std::set<page_id> left;
  std::set_difference(list_before.begin(),
                      list_before.end(),
                      list_after.begin(),
                      list_after.end(),
                      std::inserter(left, left.end()));
  CHECK(retired_set(m) == left);
  CHECK(m.pool().available_pages() == avail + reserved);
  check_accounting(m);

  // Bad input names the value; nothing changes.
  before = snapshot(m, {*b.id});
  TANGRAM_REQUIRE_THROWS_WITH_ALL(m.release_epochs_through(1),
                                  invalid_argument,
                                  "release_epochs_through.epoch: 1 is not closed yet",
                                  "open epoch is 1");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(m.release_epochs_through(-3),
                                  invalid_argument,
                                  "release_epochs_through.epoch: must be >= 0, got -3");
  CHECK(snapshot(m, {*b.id}) == before);

  m.free(*b.id);
  CHECK(m.advance_epoch() == 1);
  CHECK(m.release_epochs_through(1) > 0);
  auto ps = m.pool().stats();
  CHECK(ps.free == ps.capacity);
  CHECK(ps.retired == 0);
  check_accounting(m);
}

TEST_CASE("deferred reuse: a recompressing chunk retires the surplus pages, in its own epoch",
          "[memory][manager][deferred]") {
  tiny_manager fx(deferred_opts(200, 2));
  auto& m = fx.m;
  auto a = *m.try_admit(20, 12);
  prefill(m, a, 20);
  m.append_tokens(a, 12);
  m.end_turn(a);
  CHECK(m.advance_epoch() == 0);
  CHECK(m.release_epochs_through(0) == m.pool().stats().retirements);
  CHECK(m.retired_pages() == 0);
  // The next turn's first chunk recompresses 32 + 4 tokens: the 12 decode tokens of the previous
  // turn are compressed away in the compressed groups, whose surplus pages retire in epoch 1.
  REQUIRE(m.continue_turn(a, 4, 2));
  REQUIRE(m.pending_copies().empty());
  auto list_before = owned_pages(m);
  auto surplus     = m.stats().surplus_pages_released;
  prefill(m, a, 4);
  auto list_after = owned_pages(m);
  std::set<page_id> left;
  std::set_difference(list_before.begin(),
                      list_before.end(),
                      list_after.begin(),
                      list_after.end(),
                      std::inserter(left, left.end()));
  REQUIRE_FALSE(left.empty());
  CHECK(m.stats().surplus_pages_released - surplus == static_cast<std::int64_t>(left.size()));
  CHECK(retired_set(m) == left);
  for (auto [p, e] : retired_list(m.pool())) CHECK(e == 1);
  CHECK(m.release_epochs_through(0) == 0);  // epoch 0 again: none of them
  CHECK(m.retired_pages() == static_cast<std::int64_t>(left.size()));
  check_accounting(m);
  m.free(a);
  CHECK(m.advance_epoch() == 1);
  m.release_epochs_through(1);
  CHECK(m.pool().free_pages() == 200);
  check_accounting(m);
}

TEST_CASE("deferred reuse: copy-on-write pages retire once, when the last holder lets go",
          "[memory][manager][deferred]") {
  tiny_manager fx(deferred_opts(120, 4));
  auto& m = fx.m;
  auto a = *m.try_admit(20, 5);
  prefill(m, a, 20);
  m.set_batch({a});
  m.decode_step();
  auto c = m.fork(a);
  REQUIRE(c);
  REQUIRE_FALSE(m.pending_copies().empty());
  // Completing the copies drops their references; every page stays with a or c: none retires.
  m.complete_page_copies();
  CHECK(m.retired_pages() == 0);
  check_accounting(m);
  std::set<page_id> pages_a, pages_c;
  for (std::int32_t g = 0; g < m.num_groups(); ++g) {
    auto pa = m.group_pages(a, g);
    pages_a.insert(pa, pa + m.group_page_count(a, g));
    auto pc = m.group_pages(*c, g);
    pages_c.insert(pc, pc + m.group_page_count(*c, g));
  }
  std::set<page_id> shared, only_a;
  std::set_intersection(pages_a.begin(),
                        pages_a.end(),
                        pages_c.begin(),
                        pages_c.end(),
                        std::inserter(shared, shared.end()));
  std::set_difference(pages_a.begin(),
                      pages_a.end(),
                      pages_c.begin(),
                      pages_c.end(),
                      std::inserter(only_a, only_a.end()));
  REQUIRE_FALSE(shared.empty());
  // The parent goes in epoch 0: only its own pages retire; the shared ones stay with the child.
  m.free(a);
  CHECK(retired_set(m) == only_a);
  check_accounting(m);
  CHECK(m.advance_epoch() == 0);
  // The child goes in epoch 1: its pages (the shared ones included) retire, each once.
  m.free(*c);
  auto retired = retired_list(m.pool());
  CHECK(static_cast<std::int64_t>(retired.size()) ==
        static_cast<std::int64_t>(only_a.size() + pages_c.size()));
  for (auto [p, e] : retired) CHECK(e == (only_a.count(p) ? 0 : 1));
  check_accounting(m);
  CHECK(m.release_epochs_through(0) == static_cast<std::int64_t>(only_a.size()));
  CHECK(m.advance_epoch() == 1);
  CHECK(m.release_epochs_through(1) == static_cast<std::int64_t>(pages_c.size()));
  CHECK(m.pool().free_pages() == 120);
  check_accounting(m);
}

TEST_CASE("deferred reuse: a rollback's pages become its own spares, taken by its next tokens",
          "[memory][manager][deferred]") {
  auto plan = tiny_plan(tiny_budgets(), 4, 2, 40);  // a window the ring never wraps past here
  host_memory_resource mr;
  kv_cache_manager m(plan, mr, deferred_opts(80, 2));
  auto a = *m.try_admit(20, 12);
  prefill(m, a, 20);
  m.append_tokens(a, 9);
  auto lists       = group_page_counts(m, a);
  auto owned       = owned_pages(m);
  auto reserved    = m.info(a).reserved_pages;
  auto pool_before = m.pool().stats();
  REQUIRE(m.max_rollback(a) >= 8);
  m.rollback(a, 8);
  // The lists shrink as without deferral; the pages they drop stay with the sequence.
  std::int64_t spares = 0;
  for (std::int32_t g = 0; g < m.num_groups(); ++g) {
    CHECK(m.group_page_count(a, g) == m.group_pages_in_use(a, g));
    spares += lists[static_cast<std::size_t>(g)] - m.group_page_count(a, g);
  }
  REQUIRE(spares > 0);  // some group had crossed a page boundary in those 8 tokens
  std::set<page_id> spare_set;
  m.for_each_spare_page(a, [&](page_id p) { spare_set.insert(p); });
  CHECK(static_cast<std::int64_t>(spare_set.size()) == spares);
  CHECK(owned_pages(m) == owned);                            // referenced by a alone, as before
  CHECK(m.info(a).reserved_pages == reserved + spares);      // back in its reservation
  CHECK(m.pool().stats().reserved == pool_before.reserved);  // ... but not through the pool
  CHECK(m.pool().stats().used == pool_before.used);
  CHECK(m.retired_pages() == 0);
  CHECK(m.stats().spare_pages_kept == spares);
  CHECK(m.stats().rollback_pages_returned == spares);
  check_accounting(m);
  // The same tokens again: the spares come back, the pool hands out nothing.
  m.append_tokens(a, 8);
  CHECK(m.pool().stats().allocations == pool_before.allocations);
  CHECK(group_page_counts(m, a) == lists);
  CHECK(owned_pages(m) == owned);
  CHECK(m.info(a).reserved_pages == reserved);
  std::int64_t left = 0;
  m.for_each_spare_page(a, [&](page_id) { ++left; });
  CHECK(left == 0);
  // Spares left at end_turn retire with the pages past the heads.
  m.rollback(a, 8);
  spare_set.clear();
  m.for_each_spare_page(a, [&](page_id p) { spare_set.insert(p); });
  REQUIRE_FALSE(spare_set.empty());
  m.end_turn(a);
  CHECK(m.info(a).reserved_pages == 0);
  auto retired = retired_set(m);
  for (auto p : spare_set) CHECK(retired.count(p) == 1);
  check_accounting(m);
  m.free(a);
  m.release_epochs_through(m.advance_epoch());
  CHECK(m.pool().free_pages() == 80);
  check_accounting(m);
}

TEST_CASE(
    "deferred reuse: elastic reservation, staging pages an eviction did not keep become "
    "spares",
    "[memory][manager][deferred][elastic]") {
  auto plan =
      tiny_plan(tiny_budgets(), 4, 2, 10, grouping_scope::global, elastic_reservation(0.25));
  host_memory_resource mr;
  auto o             = deferred_opts(400, 4);
  o.max_chunk_tokens = 12;
  kv_cache_manager m(plan, mr, o);
  engine_sim sim(m, 5, 0.5);
  auto a = sim.admit(40, 8);
  REQUIRE(a);
  auto allocations         = m.pool().stats().allocations;
  std::int64_t staged_back = 0;
  while (sim.sequences().at(a->slot).prompt_remaining > 0) {
    sim.chunk(*a, std::min<std::int64_t>(12, sim.sequences().at(a->slot).prompt_remaining));
    sim.verify();
    check_accounting(m);
    staged_back = m.stats().staging_pages_returned;
  }
  REQUIRE(staged_back > 0);  // the evictions gave staging pages back
  CHECK(m.stats().spare_pages_kept == staged_back);
  // Every page given back was a spare taken again by a later chunk or trimmed (retired) when
  // the prompt ended: the pool drew only what the lists and spares hold now plus the retired.
  CHECK(m.pool().stats().allocations - allocations == m.pool().used_pages() + m.retired_pages());
  sim.decode({*a});
  sim.rollback(*a, 1);
  sim.verify();
  check_accounting(m);
  sim.free(*a);
  m.release_epochs_through(m.advance_epoch());
  CHECK(m.pool().free_pages() == 400);
  check_accounting(m);
}

TEST_CASE(
    "deferred reuse: a pinned prefix's pages are handed out again only after the last holder "
    "lets go and its epoch is released",
    "[memory][manager][deferred][prefix]") {
  tiny_manager fx(deferred_opts(60, 16));
  auto& m = fx.m;
  engine_sim sim(m, 13, 0.0);
  // The prefix (22 pages), pinned; the pages its recompressing chunk dropped released, so that
  // nothing is retired.
  auto p = prefill_prefix(sim);
  m.pin_prefix(p);
  m.release_epochs_through(m.advance_epoch());
  REQUIRE(m.retired_pages() == 0);
  auto prefix_pages = owned_pages(m);
  REQUIRE(prefix_pages.size() == 22);

  // A request over it shares 14 pages (the uncompressed groups' 8 filled ones, the compressed
  // groups' 6 pinned ones: prefix_sharing_test.cpp) and copies 8: nothing left a list, nothing
  // retires.
  auto a = sim.admit_with_prefix(p, 4, 4);
  REQUIRE(a);
  std::set<page_id> shared;
  for (std::int32_t g = 0; g < m.num_groups(); ++g) {
    auto const* pg = m.group_pages(p, g);
    shared.insert(pg, pg + m.group_pinned_tokens(*a, g) / 4);
  }
  REQUIRE(shared.size() == 14);
  std::set<page_id> own;  // the 8 the request copies
  std::set_difference(prefix_pages.begin(),
                      prefix_pages.end(),
                      shared.begin(),
                      shared.end(),
                      std::inserter(own, own.end()));
  sim.chunk(*a, 4);
  CHECK(m.retired_pages() == 0);
  for (auto pg : shared) CHECK(m.pool().ref_count(pg) == 2);
  check_accounting(m);

  // Unregistering the prefix in epoch e: its 8 own pages retire under e; the 14 shared stay held
  // by the request (one reference), neither free nor retired.
  auto e = m.current_epoch();
  sim.free(p);
  CHECK(retired_set(m) == own);
  for (auto [pg, pe] : retired_list(m.pool())) CHECK(pe == e);
  for (auto pg : shared) CHECK(m.pool().ref_count(pg) == 1);
  check_accounting(m);
  // Released: the 8 return to the free list, the 14 do not.
  CHECK(m.advance_epoch() == e);
  CHECK(m.release_epochs_through(e) == 8);
  CHECK(m.retired_pages() == 0);

  // Every other page handed out (requests admitted and prefilled until the pool refuses): none of
  // the 8, which the request alone still lists, and its tags read back unchanged.
  auto held_by_others = [&](std::vector<sequence_id> const& ids) {
    std::set<page_id> out;
    for (auto id : ids)
      for (std::int32_t g = 0; g < m.num_groups(); ++g) {
        auto const* pg = m.group_pages(id, g);
        out.insert(pg, pg + m.group_page_count(id, g));
      }
    return out;
  };
  auto fill = [&] {
    std::vector<sequence_id> fills;
    while (auto r = sim.admit(8, 0)) {
      sim.chunk(*r, 8);
      fills.push_back(*r);
    }
    return fills;
  };
  auto fills = fill();
  REQUIRE(fills.size() >= 2);
  CHECK(m.pool().available_pages() < m.admission_pages(8, 0));  // the pool refused: it is full
  for (auto pg : held_by_others(fills)) CHECK(shared.count(pg) == 0);
  for (auto pg : shared) CHECK(m.pool().ref_count(pg) == 1);
  sim.verify();
  check_accounting(m);
  for (auto id : fills) sim.free(id);
  m.release_epochs_through(m.advance_epoch());

  // The request freed in epoch e2: the 14 retire with its other pages, and a full pool still hands
  // none of them out until e2 is released.
  auto e2 = m.current_epoch();
  sim.free(*a);
  auto retired = retired_set(m);
  for (auto pg : shared) CHECK(retired.count(pg) == 1);
  for (auto [pg, pe] : retired_list(m.pool())) CHECK(pe == e2);
  fills = fill();
  for (auto pg : held_by_others(fills)) CHECK(retired.count(pg) == 0);
  check_accounting(m);
  CHECK(m.advance_epoch() == e2);
  CHECK(m.release_epochs_through(e2) == static_cast<std::int64_t>(retired.size()));
  for (auto pg : shared) CHECK(m.pool().ref_count(pg) == 0);
  for (auto id : fills) sim.free(id);
  m.release_epochs_through(m.advance_epoch());
  auto ps = m.pool().stats();
  CHECK(ps.free == ps.capacity);
  CHECK(m.stats().reclaimed_pages == 0);
  m.check_invariants();
}

TEST_CASE("deferred reuse: random lifecycles never hand out a page before its epoch's release",
          "[memory][manager][deferred][property]") {
  const int trials = 6, ops = 1500;
  std::int64_t advances = 0, releases = 0, waits = 0, rollbacks = 0, reuse_checks = 0;
  std::int64_t awaiting = 0, misuses = 0, pins = 0, prefix_admits = 0;
  for (int trial = 0; trial < trials; ++trial) {
    std::mt19937 rng(7000 + static_cast<std::uint32_t>(trial));
    auto uniform = [&](std::int64_t lo, std::int64_t hi) {
      return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng);
    };
    std::vector<double> budgets(8);
    for (auto& b : budgets) b = std::uniform_real_distribution<double>(0.05, 1.0)(rng);
    std::int32_t P      = static_cast<std::int32_t>(uniform(2, 5));
    std::int32_t window = static_cast<std::int32_t>(uniform(3, 12));
    bool elastic        = trial % 2 == 1;
    auto plan           = tiny_plan(budgets,
                          P,
                          2,
                          window,
                          grouping_scope::global,
                          elastic ? elastic_reservation(0.2) : static_reservation());
    host_memory_resource mr;
    auto o = deferred_opts(uniform(60, 250), static_cast<std::int32_t>(uniform(3, 8)));
    if (elastic) o.max_chunk_tokens = 12;
    std::int64_t max_chunk = elastic ? 12 : 1 << 30;
    kv_cache_manager m(plan, mr, o);
    engine_sim sim(m, static_cast<std::uint32_t>(trial), 0.25);
    INFO("trial " << trial << " P " << P << " W " << window << " pages " << o.num_pages
                  << (elastic ? " elastic" : " static"));
    // The model: the epoch in which each page was last seen referenced (-1: never). A page seen
    // unreferenced and then referenced again was handed out anew: that epoch must be released.
    std::vector<std::int64_t> last_owned(static_cast<std::size_t>(o.num_pages), -1);
    std::set<page_id> owned_before;
    std::vector<std::int64_t> closed;  // epochs closed and not yet released, oldest first
    auto in_phase = [&](sequence_phase ph) {
      std::vector<sequence_id> out;
      for (auto const& [s, q] : sim.sequences())
        if (q.phase == ph) out.push_back(q.id);
      return out;
    };
    auto pick = [&](std::vector<sequence_id> const& v) { return v[rng() % v.size()]; };
    for (int step = 0; step < ops; ++step) {
      int op = static_cast<int>(rng() % 100);
      if (op < 12) {
        auto r = sim.admit(uniform(1, 40), uniform(0, 20));
        if (!r) {
          auto const& a = sim.last_admit();
          if (a.reason == admit_failure::pages_awaiting_release) {
            REQUIRE(a.pages_missing > 0);
            REQUIRE(a.pages_missing <= a.pages_retired);
            ++awaiting;
          } else if (a.reason == admit_failure::not_enough_pages) {
            REQUIRE(a.pages_missing > a.pages_retired);
          }
          REQUIRE(a.pages_retired == m.retired_pages());
        }
      } else if (op < 30) {
        auto pre = in_phase(sequence_phase::prefill);
        if (!pre.empty()) {
          auto id = pick(pre);
          sim.chunk(id,
                    uniform(1, std::min(max_chunk, sim.sequences().at(id.slot).prompt_remaining)));
        }
      } else if (op < 48) {
        std::vector<sequence_id> batch;
        for (auto id : in_phase(sequence_phase::decode)) {
          auto const& q = sim.sequences().at(id.slot);
          if (q.decoded < q.max_new && rng() % 3 != 0) batch.push_back(id);
        }
        if (!batch.empty()) sim.decode(batch);
      } else if (op < 54) {
        auto dec = in_phase(sequence_phase::decode);
        if (!dec.empty()) {
          auto id = pick(dec);
          auto k  = m.max_rollback(id);
          if (k > 0) {
            sim.rollback(id, uniform(1, k));
            ++rollbacks;
          }
        }
      } else if (op < 60) {
        auto dec = in_phase(sequence_phase::decode);
        if (!dec.empty()) sim.end_turn(pick(dec));
      } else if (op < 66) {
        auto ended = in_phase(sequence_phase::ended);
        ended.erase(
            std::remove_if(
                ended.begin(), ended.end(), [&](sequence_id id) { return m.info(id).pinned; }),
            ended.end());  // a prefix is read-only
        if (!ended.empty()) (void)sim.continue_turn(pick(ended), uniform(1, 20), uniform(0, 15));
      } else if (op < 68) {
        // Pinned prefixes among them: a fork of one is a plain fork.
        auto cand  = in_phase(sequence_phase::decode);
        auto ended = in_phase(sequence_phase::ended);
        cand.insert(cand.end(), ended.begin(), ended.end());
        if (!cand.empty()) (void)sim.fork(pick(cand));
      } else if (op < 73) {
        // Shared prefixes: pin an ended sequence, or admit a request over a pinned one.
        std::vector<sequence_id> pinned, ended;
        for (auto id : in_phase(sequence_phase::ended))
          (m.info(id).pinned ? pinned : ended).push_back(id);
        if (!pinned.empty() && (ended.empty() || rng() % 4 != 0)) {
          if (sim.admit_with_prefix(pick(pinned), uniform(1, 8), uniform(0, 8))) ++prefix_admits;
        } else if (!ended.empty()) {
          m.pin_prefix(pick(ended));
          ++pins;
        }
      } else if (op < 78) {
        auto ids = sim.ids();
        if (!ids.empty()) sim.free(pick(ids));
      } else if (op < 80) {
        auto pre = in_phase(sequence_phase::prefill);
        if (!pre.empty()) {
          auto id = pick(pre);
          sim.abort_mid_chunk(
              id, uniform(1, std::min(max_chunk, sim.sequences().at(id.slot).prompt_remaining)));
        }
      } else if (op < 90) {
        closed.push_back(m.advance_epoch());  // the engine recorded its event
        ++advances;
      } else if (op < 97) {
        if (!closed.empty()) {
          // Completions arrive in order; a poller may skip some and catch up later.
          auto k = static_cast<std::size_t>(uniform(1, static_cast<std::int64_t>(closed.size())));
          auto e = closed[k - 1];
          // Independent expectation: the retired pages of epochs <= e.
          std::int64_t expect = 0;
          m.pool().for_each_retired([&](page_id, std::int64_t pe) { expect += pe <= e; });
          REQUIRE(m.release_epochs_through(e) == expect);
          closed.erase(closed.begin(), closed.begin() + static_cast<std::ptrdiff_t>(k));
          ++releases;
        } else {
          ++waits;
        }
      } else {
        // Misuse: an epoch not closed yet; nothing changes.
        auto ids    = sim.ids();
        auto before = snapshot(m, ids);
        auto e      = m.current_epoch() + static_cast<std::int64_t>(rng() % 3);
        REQUIRE_THROWS_AS(m.release_epochs_through(e), invalid_argument);
        REQUIRE(snapshot(m, ids) == before);
        ++misuses;
      }
      sim.verify();
      check_accounting(m);
      auto owned = owned_pages(m);
      for (auto p : owned) {
        auto& last = last_owned[static_cast<std::size_t>(p)];
        if (!owned_before.count(p) && last >= 0) {
          // Handed out again: the epoch it was last read in has been released.
          INFO("page " << p << " last referenced in epoch " << last << ", released through "
                       << m.released_epoch());
          REQUIRE(last <= m.released_epoch());
          ++reuse_checks;
        }
      }
      for (auto p : owned) last_owned[static_cast<std::size_t>(p)] = m.current_epoch();
      owned_before = std::move(owned);
    }
    for (auto id : sim.ids()) sim.free(id);
    auto e = m.advance_epoch();
    m.release_epochs_through(e);
    auto ps = m.pool().stats();
    CHECK(ps.used == 0);
    CHECK(ps.reserved == 0);
    CHECK(ps.retired == 0);
    CHECK(ps.free == ps.capacity);
    CHECK(ps.frees == ps.retirements);  // every page freed went through the retire list
    CHECK(m.live_sequences() == 0);
    m.check_invariants();
  }
  INFO("advances " << advances << " releases " << releases << " waits " << waits << " rollbacks "
                   << rollbacks << " reuse checks " << reuse_checks << " awaiting " << awaiting
                   << " misuses " << misuses << " pins " << pins << " prefix admits "
                   << prefix_admits);
  CHECK(advances > 300);
  CHECK(releases > 200);
  CHECK(rollbacks > 20);
  CHECK(reuse_checks > 500);  // pages really were handed out again, each after its release
  CHECK(awaiting > 0);        // admission really waited for a release
  CHECK(misuses > 50);
  CHECK(pins > 20);  // prefixes pinned, requests admitted over them, the pages reused after them
  CHECK(prefix_admits > 20);
}
