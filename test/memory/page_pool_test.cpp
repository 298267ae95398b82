// SPDX-License-Identifier: Apache-2.0
// Memory resources and the page pool: hand-worked cases, misuse, failure injection, and a long
// random run against an independent model (a multiset of owners per page).
#include "tangram/memory/page_pool.hpp"
#include "tangram/eval/sim/simulated_memory_resource.hpp"
#include "tangram/memory/host_memory_resource.hpp"
#include "tangram/memory/limiting_resource_adaptor.hpp"

#include <cstring>
#include <map>
#include <random>
#include <set>

#include "tangram/memory/memory_resource.hpp"
#include "tangram/memory/segment_arena.hpp"
#include "test_support.hpp"

using namespace tangram;

namespace {

page_geometry small_geometry() {
  return {4, 2, 4, dtype::f32};
}  // 256-byte pages

struct pool_snapshot {
  pool_stats stats;
  std::vector<std::uint32_t> refs;
  friend bool operator==(pool_snapshot const& a, pool_snapshot const& b) {
    return a.refs == b.refs && a.stats.free == b.stats.free &&
           a.stats.reserved == b.stats.reserved && a.stats.used == b.stats.used &&
           a.stats.peak_used == b.stats.peak_used && a.stats.allocations == b.stats.allocations &&
           a.stats.frees == b.stats.frees;
  }
};

template <class Pool>
pool_snapshot snap(Pool const& p) {
  pool_snapshot s{p.stats(), {}};
  for (page_id i = 0; i < p.capacity(); ++i) s.refs.push_back(p.ref_count(i));
  return s;
}

}  // namespace

TEST_CASE("host resource gives aligned, writable memory", "[memory][resource]") {
  host_memory_resource mr;
  CHECK(mr.kind() == memory_kind::host);
  for (std::size_t align : {16u, 256u, 4096u}) {
    void* p = mr.allocate(1000, align);
    CHECK(reinterpret_cast<std::uintptr_t>(p) % align == 0);
    std::memset(p, 0xab, 1000);
    mr.deallocate(p, 1000, align);
  }
  TANGRAM_REQUIRE_THROWS_WITH_ALL(mr.allocate(64, 48), invalid_argument, "alignment", "48");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(mr.allocate(0), invalid_argument, "bytes", "0");
}

TEST_CASE("simulated resource hands out fake aligned addresses up to its capacity",
          "[memory][resource]") {
  simulated_memory_resource mr(std::size_t{141} << 30);
  CHECK(mr.kind() == memory_kind::simulated);
  void* a = mr.allocate(std::size_t{100} << 30);
  void* b = mr.allocate(1000, 4096);
  CHECK(reinterpret_cast<std::uintptr_t>(a) % 256 == 0);
  CHECK(reinterpret_cast<std::uintptr_t>(b) % 4096 == 0);
  CHECK(reinterpret_cast<std::uintptr_t>(b) >=
        reinterpret_cast<std::uintptr_t>(a) + (std::size_t{100} << 30));
  CHECK(mr.allocated_bytes() == (std::size_t{100} << 30) + 1000);
  TANGRAM_REQUIRE_THROWS_WITH_ALL(mr.allocate(std::size_t{41} << 30),
                                  out_of_memory,
                                  "simulated_memory_resource",
                                  "44023414784",
                                  "in use");
  mr.deallocate(a, std::size_t{100} << 30);
  CHECK(mr.allocated_bytes() == 1000);
  CHECK(mr.peak_bytes() == (std::size_t{100} << 30) + 1000);
}

TEST_CASE("limiting adaptor injects arena failure, the pool throws out_of_memory and leaks nothing",
          "[memory][resource][pool]") {
  host_memory_resource host;
  limiting_resource_adaptor lim(host, 1000);
  CHECK(lim.kind() == memory_kind::host);
  // 4 pages of 256 bytes = 1024 > 1000.
  TANGRAM_REQUIRE_THROWS_WITH_ALL((page_pool<>(lim, page_layout<>(small_geometry()), 4)),
                                  out_of_memory,
                                  "1024 bytes",
                                  "1000-byte limit");
  CHECK(lim.refusals() == 1);
  CHECK(lim.allocated_bytes() == 0);
  {
    page_pool<> ok(lim, page_layout<>(small_geometry()), 3);
    CHECK(lim.allocated_bytes() == 768);
  }
  CHECK(lim.allocated_bytes() == 0);  // the destructor returned the arena
  limiting_resource_adaptor none(host, 0);
  CHECK_THROWS_AS(none.allocate(1), out_of_memory);
}

TEST_CASE("pool geometry, addresses and static layouts", "[memory][pool]") {
  simulated_memory_resource sim;
  // Brief: bf16, P = 16, Hp = 4, d = 128 -> 32 KiB pages; a 141 GB pool on a CPU.
  page_geometry g{16, 4, 128, dtype::bf16};
  std::int64_t pages = page_pool<>::pages_for_bytes(141'000'000'000, page_layout<>(g));
  CHECK(pages == 141'000'000'000 / 32768);
  page_pool<> big(sim, page_layout<>(g), pages);
  CHECK(big.page_bytes() == 32768);
  CHECK(big.kind() == memory_kind::simulated);
  CHECK(big.page_ptr(10) - big.page_ptr(0) == 10 * 32768);
  CHECK(big.stats().available() == pages);
  page_pool<page_layout<128, 4, 16>> fixed(sim, page_layout<128, 4, 16>(g), 8);
  CHECK(fixed.page_bytes() == 32768);
  TANGRAM_REQUIRE_THROWS_WITH_ALL(page_layout<64>(g), invalid_argument, "head_dim", "64", "128");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      page_pool<>(sim, page_layout<>(g), 0), invalid_argument, "num_pages", "0");
}

TEST_CASE("allocate, share and free: hand-worked", "[memory][pool]") {
  host_memory_resource mr;
  page_pool<> pool(mr, page_layout<>(small_geometry()), 4);
  CHECK(pool.arena_bytes() == 1024);
  // A fresh pool hands out 0, 1, 2, 3; LIFO reuse afterwards.
  CHECK(*pool.try_allocate() == 0);
  CHECK(*pool.try_allocate() == 1);
  CHECK(*pool.try_allocate() == 2);
  CHECK(pool.release(1));
  CHECK(*pool.try_allocate() == 1);
  CHECK(*pool.try_allocate() == 3);
  CHECK_FALSE(pool.try_allocate().has_value());  // "does not fit" is a value
  pool.retain(2);
  CHECK(pool.ref_count(2) == 2);
  CHECK_FALSE(pool.release(2));
  CHECK(pool.release(2));
  auto s = pool.stats();
  CHECK(s.used == 3);
  CHECK(s.free == 1);
  CHECK(s.peak_used == 4);
  CHECK(s.allocations == 5);
  CHECK(s.frees == 2);
  // Pages are real host memory: write one, read it back.
  std::memset(pool.page_ptr(3), 7, 256);
  CHECK(static_cast<int>(pool.page_ptr(3)[255]) == 7);
  pool.check_invariants();
}

TEST_CASE("reservations are all or nothing and never exceed capacity", "[memory][pool]") {
  simulated_memory_resource mr;
  page_pool<> pool(mr, page_layout<>(small_geometry()), 10);
  auto a = pool.try_reserve(6);
  REQUIRE(a);
  CHECK(a->pages() == 6);
  CHECK(pool.available_pages() == 4);
  CHECK_FALSE(pool.try_reserve(5).has_value());
  CHECK(pool.available_pages() == 4);  // unchanged
  auto p1 = pool.try_allocate();
  auto p2 = pool.try_allocate();
  auto p3 = pool.try_allocate();
  auto p4 = pool.try_allocate();
  REQUIRE((p1 && p2 && p3 && p4));
  CHECK_FALSE(pool.try_allocate().has_value());  // the rest is promised to `a`
  for (int i = 0; i < 6; ++i) (void)pool.draw(*a);
  CHECK(a->empty());
  CHECK(pool.used_pages() == 10);
  CHECK(pool.reserved_pages() == 0);
  pool.release(*p1);
  CHECK(pool.try_extend(*a, 1));
  CHECK_FALSE(pool.try_extend(*a, 1));
  CHECK(a->pages() == 1);
  pool.release_unused(*a);
  CHECK(pool.reserved_pages() == 0);
  CHECK(pool.available_pages() == 1);
  auto empty = pool.try_reserve(0);
  REQUIRE(empty);
  CHECK(empty->empty());
  // Moving a reservation moves the promise.
  auto b                 = pool.try_reserve(1);
  page_reservation moved = std::move(*b);
  CHECK(b->empty());
  CHECK(moved.pages() == 1);
  pool.release_unused(moved);
  pool.check_invariants();
}

TEST_CASE("a bulk draw takes the pages single draws would, in order, all or nothing",
          "[memory][pool]") {
  simulated_memory_resource mr;
  page_pool<> one(mr, page_layout<>(small_geometry()), 12);
  page_pool<> bulk(mr, page_layout<>(small_geometry()), 12);
  // The same history on both pools, so that the free stacks are out of index order.
  for (auto* pool : {&one, &bulk}) {
    std::vector<page_id> taken;
    for (int i = 0; i < 7; ++i) taken.push_back(*pool->try_allocate());
    for (int i : {3, 0, 5, 6}) CHECK(pool->release(taken[static_cast<std::size_t>(i)]));
  }
  auto a = *one.try_reserve(6);
  auto b = *bulk.try_reserve(6);
  std::vector<page_id> singles;
  for (int i = 0; i < 5; ++i) singles.push_back(one.draw(a));
  std::vector<page_id> drawn(5, -1);
  bulk.draw(b, 5, drawn.data());
  CHECK(drawn == singles);
  CHECK(snap(bulk) == snap(one));
  CHECK(b.pages() == 1);
  // More than the reservation holds, a negative count or a foreign reservation: nothing changes.
  auto before = snap(bulk);
  std::vector<page_id> more(2, -1);
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      bulk.draw(b, 2, more.data()), logic_error, "drawing 2", "holds 1");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(bulk.draw(b, -1, more.data()), invalid_argument, "-1");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      bulk.draw(b, 1, nullptr), invalid_argument, "out is null for 1 pages");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(bulk.draw(a, 1, more.data()), logic_error, "another pool");
  CHECK(snap(bulk) == before);
  CHECK(more == std::vector<page_id>{-1, -1});
  bulk.draw(b, 0, more.data());  // nothing to take
  CHECK(snap(bulk) == before);
  one.release_unused(a);
  bulk.release_unused(b);
  one.check_invariants();
  bulk.check_invariants();
}

TEST_CASE("a bulk release into a reservation ends as single releases and extends would",
          "[memory][pool]") {
  simulated_memory_resource mr;
  page_pool<> one(mr, page_layout<>(small_geometry()), 100);
  page_pool<> bulk(mr, page_layout<>(small_geometry()), 100);
  auto a = *one.try_reserve(80);
  auto b = *bulk.try_reserve(80);
  // 80 pages in list order (more than the prefetch distance), the free stacks shuffled first;
  // pages 4 and 11 of the list shared.
  std::vector<page_id> list_a(80), list_b(80);
  for (auto* pool : {&one, &bulk}) {
    std::vector<page_id> taken;
    for (int i = 0; i < 9; ++i) taken.push_back(*pool->try_allocate());
    for (int i : {8, 2, 5, 0, 7, 1, 6, 3, 4})
      CHECK(pool->release(taken[static_cast<std::size_t>(i)]));
  }
  one.draw(a, 80, list_a.data());
  bulk.draw(b, 80, list_b.data());
  REQUIRE(list_a == list_b);
  for (auto* pool : {&one, &bulk}) {
    pool->retain(list_a[4]);
    pool->retain(list_a[11]);
  }
  // Release the list's last 76 pages (positions 4..79), the last first, as a list shrinks.
  std::int64_t singles = 0;
  for (int k = 79; k >= 4; --k)
    if (one.release(list_a[static_cast<std::size_t>(k)])) {
      REQUIRE(one.try_extend(a, 1));
      ++singles;
    }
  CHECK(singles == 74);  // the two shared pages only lose a reference
  CHECK(bulk.release_into(b, list_b.data() + 4, 76) == 74);
  CHECK(snap(bulk) == snap(one));
  CHECK(b.pages() == a.pages());
  CHECK(b.pages() == 74);
  // The same free order: the next draws take the same pages.
  std::vector<page_id> next_a(74), next_b(74);
  one.draw(a, 74, next_a.data());
  bulk.draw(b, 74, next_b.data());
  CHECK(next_a == next_b);
  CHECK(bulk.ref_count(list_b[4]) == 1);
  CHECK(bulk.ref_count(list_b[11]) == 1);
  // Nothing to release; misuse names the value; a foreign reservation or deferred reuse changes
  // nothing.
  auto before = snap(bulk);
  CHECK(bulk.release_into(b, nullptr, 0) == 0);
  TANGRAM_REQUIRE_THROWS_WITH_ALL(bulk.release_into(b, list_b.data(), -1), invalid_argument, "-1");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      bulk.release_into(b, nullptr, 2), invalid_argument, "pages is null for 2 pages");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      bulk.release_into(a, list_b.data(), 1), logic_error, "another pool");
  CHECK(snap(bulk) == before);
  page_pool<> deferred(mr, page_layout<>(small_geometry()), 4, true);
  auto d     = *deferred.try_reserve(1);
  page_id dp = deferred.draw(d);
  TANGRAM_REQUIRE_THROWS_WITH_ALL(deferred.release_into(d, &dp, 1), logic_error, "deferred reuse");
  CHECK(deferred.ref_count(dp) == 1);
  // A double free names the page; the pages released before it stay released and promised.
  std::vector<page_id> twice{list_b[0], list_b[1], list_b[1]};
  const std::string named = "page " + std::to_string(list_b[1]) + " is already free";
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      bulk.release_into(b, twice.data(), 3), logic_error, named, std::string("double free"));
  CHECK(bulk.ref_count(list_b[1]) == 0);
  CHECK(bulk.ref_count(list_b[0]) == 1);
  CHECK(b.pages() == 1);
  bulk.check_invariants();
  one.check_invariants();
  CHECK(deferred.release(dp));
}

TEST_CASE("a bulk release ends as single releases would, with and without deferred reuse",
          "[memory][pool]") {
  simulated_memory_resource mr;
  for (bool deferred : {false, true}) {
    INFO("deferred reuse " << deferred);
    page_pool<> one(mr, page_layout<>(small_geometry()), 64, deferred);
    page_pool<> bulk(mr, page_layout<>(small_geometry()), 64, deferred);
    std::vector<page_id> pages;
    for (auto* pool : {&one, &bulk}) {
      std::vector<page_id> taken;
      for (int i = 0; i < 50; ++i) taken.push_back(*pool->try_allocate());
      // Every third page shared, so it only loses a reference.
      for (int i = 0; i < 50; i += 3) pool->retain(taken[static_cast<std::size_t>(i)]);
      pages = taken;
    }
    std::int64_t singles = 0;
    for (auto p : pages) singles += one.release(p) ? 1 : 0;
    CHECK(singles == 33);
    CHECK(bulk.release(pages.data(), 50) == 33);
    CHECK(snap(bulk) == snap(one));
    CHECK(bulk.retired_pages() == one.retired_pages());
    // The same order: the same retire list (pages and epochs) with deferred reuse, the same free
    // stack without (the next allocations take the same pages).
    std::vector<std::pair<page_id, std::int64_t>> retired_one, retired_bulk;
    one.for_each_retired([&](page_id p, std::int64_t e) { retired_one.emplace_back(p, e); });
    bulk.for_each_retired([&](page_id p, std::int64_t e) { retired_bulk.emplace_back(p, e); });
    CHECK(retired_bulk == retired_one);
    CHECK(retired_bulk.size() == (deferred ? 33u : 0u));
    if (!deferred) {
      std::vector<page_id> next_one, next_bulk;
      for (int i = 0; i < 33; ++i) {
        next_one.push_back(*one.try_allocate());
        next_bulk.push_back(*bulk.try_allocate());
      }
      CHECK(next_bulk == next_one);
      for (int i = 0; i < 33; ++i) {
        one.release(next_one[static_cast<std::size_t>(i)]);
        bulk.release(next_bulk[static_cast<std::size_t>(i)]);
      }
    }
    CHECK(bulk.release(nullptr, 0) == 0);
    TANGRAM_REQUIRE_THROWS_WITH_ALL(bulk.release(pages.data(), -3), invalid_argument, "-3");
    TANGRAM_REQUIRE_THROWS_WITH_ALL(
        bulk.release(nullptr, 1), invalid_argument, "pages is null for 1 pages");
    CHECK(snap(bulk) == snap(one));
    // The first page (still shared) goes, then page 1 (already free) is a double free.
    TANGRAM_REQUIRE_THROWS_WITH_ALL(
        bulk.release(pages.data(), 2), logic_error, "page " + std::to_string(pages[1]));
    CHECK(bulk.ref_count(pages[0]) == 0);
    one.check_invariants();
    bulk.check_invariants();
  }
}

TEST_CASE("pool misuse is a logic_error naming the value, with nothing changed",
          "[memory][pool][errors]") {
  simulated_memory_resource mr;
  page_pool<> pool(mr, page_layout<>(small_geometry()), 8);
  page_pool<> other(mr, page_layout<>(small_geometry()), 8);
  auto p       = *pool.try_allocate();
  auto res     = *pool.try_reserve(2);
  auto foreign = *other.try_reserve(1);
  auto before  = snap(pool);
  TANGRAM_REQUIRE_THROWS_WITH_ALL(pool.release(5), logic_error, "page 5", "already free");
  CHECK(snap(pool) == before);
  TANGRAM_REQUIRE_THROWS_WITH_ALL(pool.release(8), logic_error, "page 8", "capacity 8");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(pool.release(-1), logic_error, "page -1");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(pool.retain(3), logic_error, "page 3", "free");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(pool.draw(foreign), logic_error, "another pool");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(pool.release_unused(foreign), logic_error, "another pool");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      pool.release_unused(res, 3), logic_error, "releasing 3", "holds 2");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(pool.try_reserve(-2), invalid_argument, "-2");
  CHECK(snap(pool) == before);
  (void)pool.draw(res);
  (void)pool.draw(res);
  before = snap(pool);
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      pool.draw(res), logic_error, "exhausted", "more pages than reserved");
  CHECK(snap(pool) == before);
  CHECK(pool.release(p));
  TANGRAM_REQUIRE_THROWS_WITH_ALL(pool.release(p), logic_error, "page 0", "double free");
  CHECK(foreign.pages() == 1);
  other.release_unused(foreign);
  pool.check_invariants();
}

TEST_CASE("random pool operations agree with an independent model", "[memory][pool][property]") {
  simulated_memory_resource mr;
  std::mt19937 rng(7);
  for (int trial = 0; trial < 5; ++trial) {
    const std::int64_t cap = 1 + trial * 13;
    page_pool<> pool(mr, page_layout<>(small_geometry()), cap);
    std::map<page_id, int> owners;  // model: references per used page
    std::vector<page_reservation> reservations;
    std::vector<std::int64_t> model_res;  // pages each reservation still holds
    std::int64_t peak = 0;
    for (int step = 0; step < 4000; ++step) {
      std::int64_t reserved = 0;
      for (auto r : model_res) reserved += r;
      std::int64_t used = static_cast<std::int64_t>(owners.size());
      int op            = static_cast<int>(rng() % 7);
      if (op == 0) {
        auto p = pool.try_allocate();
        CHECK(p.has_value() == (used + reserved < cap));
        if (p) {
          CHECK(owners.count(*p) == 0);
          owners[*p] = 1;
        }
      } else if (op == 1 && !owners.empty()) {
        auto it    = std::next(owners.begin(), static_cast<long>(rng() % owners.size()));
        bool freed = pool.release(it->first);
        CHECK(freed == (it->second == 1));
        if (--it->second == 0) owners.erase(it);
      } else if (op == 2 && !owners.empty()) {
        auto it = std::next(owners.begin(), static_cast<long>(rng() % owners.size()));
        pool.retain(it->first);
        ++it->second;
      } else if (op == 3) {
        std::int64_t n = static_cast<std::int64_t>(rng() % 6);
        auto r         = pool.try_reserve(n);
        CHECK(r.has_value() == (used + reserved + n <= cap));
        if (r) {
          reservations.push_back(std::move(*r));
          model_res.push_back(n);
        }
      } else if (op == 4 && !reservations.empty() && rng() % 2 == 0) {
        // Bulk: up to one page more than the reservation holds (refused, nothing changes).
        auto k         = rng() % reservations.size();
        std::int64_t n = static_cast<std::int64_t>(rng() % static_cast<unsigned>(model_res[k] + 2));
        std::vector<page_id> got(static_cast<std::size_t>(n), -1);
        if (n <= model_res[k]) {
          pool.draw(reservations[k], n, got.data());
          for (auto p : got) {
            CHECK(owners.count(p) == 0);
            owners[p] = 1;
          }
          model_res[k] -= n;
        } else {
          auto before = snap(pool);
          CHECK_THROWS_AS(pool.draw(reservations[k], n, got.data()), logic_error);
          for (auto p : got) CHECK(p == -1);
          CHECK(snap(pool) == before);
          CHECK(reservations[k].pages() == model_res[k]);
        }
      } else if (op == 4 && !reservations.empty()) {
        auto k = rng() % reservations.size();
        if (model_res[k] > 0) {
          auto p = pool.draw(reservations[k]);
          CHECK(owners.count(p) == 0);
          owners[p] = 1;
          --model_res[k];
        } else {
          CHECK_THROWS_AS(pool.draw(reservations[k]), logic_error);
        }
      } else if (op == 5 && !reservations.empty()) {
        auto k = rng() % reservations.size();
        pool.release_unused(reservations[k]);
        reservations.erase(reservations.begin() + static_cast<long>(k));
        model_res.erase(model_res.begin() + static_cast<long>(k));
      } else if (op == 6) {
        page_id p = static_cast<page_id>(rng() % static_cast<unsigned>(cap));
        if (owners.count(p) == 0) CHECK_THROWS_AS(pool.release(p), logic_error);
      }
      used     = static_cast<std::int64_t>(owners.size());
      peak     = std::max(peak, used);
      reserved = 0;
      for (auto r : model_res) reserved += r;
      auto s = pool.stats();
      REQUIRE(s.used == used);
      REQUIRE(s.reserved == reserved);
      REQUIRE(s.used + s.reserved <= s.capacity);
      REQUIRE(s.peak_used == peak);
      for (auto const& [p, n] : owners) REQUIRE(pool.ref_count(p) == static_cast<std::uint32_t>(n));
      if (step % 97 == 0) pool.check_invariants();
    }
    for (auto& r : reservations) pool.release_unused(r);
    for (auto const& [p, n] : owners)
      for (int i = 0; i < n; ++i) pool.release(p);
    CHECK(pool.stats().free == cap);
    CHECK(pool.stats().reserved == 0);
    pool.check_invariants();
  }
}

TEST_CASE("segment arena: first fit, coalescing, against a bitmap model", "[memory][segments]") {
  std::mt19937 rng(3);
  const std::int64_t cap = 200;
  segment_arena arena(cap, 64);
  std::vector<char> used(static_cast<std::size_t>(cap), 0);
  std::vector<std::pair<std::int64_t, std::int64_t>> live;
  for (int step = 0; step < 5000; ++step) {
    if (live.size() < 60 && rng() % 2 == 0) {
      std::int64_t size = 1 + static_cast<std::int64_t>(rng() % 20);
      // Model: the lowest start of a free run of `size`.
      std::int64_t expect = -1;
      for (std::int64_t b = 0; b + size <= cap && expect < 0; ++b) {
        bool ok = true;
        for (std::int64_t k = b; k < b + size && ok; ++k) ok = !used[static_cast<std::size_t>(k)];
        // first fit over maximal free runs: b must start a run
        if (ok && (b == 0 || used[static_cast<std::size_t>(b - 1)])) expect = b;
      }
      CHECK(arena.can_allocate(size) == (expect >= 0));
      auto at = arena.allocate(size);
      REQUIRE(at.has_value() == (expect >= 0));
      if (at) {
        CHECK(*at == expect);
        for (std::int64_t k = *at; k < *at + size; ++k) used[static_cast<std::size_t>(k)] = 1;
        live.emplace_back(*at, size);
      }
    } else if (!live.empty()) {
      auto k = rng() % live.size();
      arena.free(live[k].first, live[k].second);
      for (std::int64_t x = live[k].first; x < live[k].first + live[k].second; ++x)
        used[static_cast<std::size_t>(x)] = 0;
      live.erase(live.begin() + static_cast<long>(k));
    }
    std::int64_t free_model = 0, runs = 0;
    for (std::int64_t x = 0; x < cap; ++x) {
      free_model += !used[static_cast<std::size_t>(x)];
      runs +=
          !used[static_cast<std::size_t>(x)] && (x == 0 || used[static_cast<std::size_t>(x - 1)]);
    }
    REQUIRE(arena.free_total() == free_model);
    REQUIRE(arena.free_ranges() == static_cast<std::size_t>(runs));
  }
}
