// SPDX-License-Identifier: Apache-2.0
// Shared prefixes (pin_prefix, try_admit_with_prefix) on the tiny hybrid model, worked by hand:
// which pages a request over a pinned prefix shares and which it copies, its reservation and
// targets (those of the same tokens admitted alone), the K/V tags read back through the view after
// its chunks and decode steps (no pinned page written), reference counts as requests come and
// go, unregistering, a fork of a pinned prefix (a plain fork), and every refusal with nothing
// changed.
#include <algorithm>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "memory_fixtures.hpp"
#include "prefix_fixtures.hpp"
#include "storm/engine_sim.hpp"
#include "storm/manager_snapshot.hpp"
#include "tangram/eval/sim/shared_prompt.hpp"
#include "tangram/memory/host_memory_resource.hpp"
#include "tangram/memory/kv_cache_manager.hpp"

using namespace tangram;
using namespace tangram::test;

namespace {

// Group ids of the tiny plan (memory/manager_test.cpp): 0-3 compressed, 4-5 sliding (W 10, ring
// 3 pages), 6-7 uncompressed; P = 4.
constexpr std::int32_t uncompressed_a = 6, uncompressed_b = 7;

std::vector<page_id> pages_of(kv_cache_manager const& m, sequence_id id, std::int32_t g) {
  auto const* p = m.group_pages(id, g);
  return {p, p + m.group_page_count(id, g)};
}

}  // namespace

TEST_CASE("a request over a pinned prefix shares its filled pages and copies the rest",
          "[memory][prefix]") {
  tiny_manager fx(opts(100, 8));
  auto& m = fx.m;
  engine_sim sim(m, 7, /*keep_fewer_probability=*/0.0);
  auto p = prefill_prefix(sim);
  REQUIRE(group_page_counts(m, p) == std::vector<std::int32_t>{3, 2, 2, 1, 3, 3, 4, 4});
  REQUIRE(m.pool().stats().used == 22);
  CHECK_FALSE(m.info(p).pinned);
  m.pin_prefix(p);
  CHECK((m.info(p).pinned && m.info(p).phase == sequence_phase::ended));

  // Request a: N = 4 more prompt tokens, T = 4. Targets are a turn's over n + N = 20 tokens,
  // exactly those of the same 20 + 4 tokens admitted alone: G0 ceil((15+4)/4) = 5, G1 4, G2 3,
  // G3 3, sliding 3 (x2), uncompressed ceil(24/4) = 6 (x2). Kept pages: the prefix's. Shared:
  // the pages every head of a group filled. The prefix's compressed heads hold (12, 10) in G0,
  // (8, 8) in G1, (5, 6) in G2, (4, 4) in G3: 2 + 2 + 1 + 1 = 6 pages, pinned (the eviction keeps
  // them in place); the uncompressed ones 16 tokens, 4 full pages per group: 8. The 8 others
  // (G0's and G2's last page, the two rings) are copied.
  auto plain = m.admission_pages(20, 4);
  CHECK(plain == 5 + 4 + 3 + 3 + 3 + 3 + 6 + 6);
  auto copies_before = m.stats().page_copies;
  auto a             = sim.admit_with_prefix(p, 4, 4);
  REQUIRE(a);
  CHECK_FALSE(m.info(*a).pinned);
  CHECK(m.stats().prefix_admits == 1);
  CHECK(m.stats().prefix_pages_shared == 14);
  CHECK(m.stats().page_copies - copies_before == 8);
  std::vector<std::int32_t> pinned;
  for (std::int32_t g = 0; g < 8; ++g) pinned.push_back(m.group_pinned_tokens(*a, g));
  CHECK(pinned == std::vector<std::int32_t>{8, 8, 4, 4, 0, 0, 16, 16});
  CHECK(m.group_pinned_tokens(p, 0) == 0);  // the prefix itself holds its pages, unpinned
  std::vector<std::int32_t> targets;
  for (std::int32_t g = 0; g < 8; ++g) targets.push_back(m.group_target(*a, g));
  CHECK(targets == std::vector<std::int32_t>{5, 4, 3, 3, 3, 3, 6, 6});
  // Reserved: the targets less the kept pages (the shared ones charged without a reservation, the
  // copies drawn from it): 33 - 22 = 11. The pool counts each shared page once: 22 + 8 copies.
  CHECK(m.info(*a).reserved_pages == plain - 22);
  CHECK(m.pool().stats().used == 22 + 8);
  for (auto g : {uncompressed_a, uncompressed_b}) {
    CHECK(pages_of(m, *a, g) == pages_of(m, p, g));
    for (auto pg : pages_of(m, p, g)) CHECK(m.pool().ref_count(pg) == 2);
  }
  for (std::int32_t g = 0; g < 6; ++g) {
    auto mine = pages_of(m, *a, g), theirs = pages_of(m, p, g);
    auto shared = static_cast<std::size_t>(pinned[static_cast<std::size_t>(g)] / 4);
    for (std::size_t k = 0; k < mine.size(); ++k) CHECK((mine[k] == theirs[k]) == (k < shared));
  }
  sim.verify();
  m.check_invariants();

  // Its prompt and decode write after the pin only: the prefix's tags read back unchanged (the
  // compressed heads' evictions keep the pinned tokens in place).
  sim.chunk(*a, 4);
  sim.verify();
  for (int t = 0; t < 4; ++t) sim.decode({*a});
  sim.verify();
  for (auto g : {uncompressed_a, uncompressed_b}) {
    auto mine = pages_of(m, *a, g), theirs = pages_of(m, p, g);
    REQUIRE(mine.size() == 6);  // 24 tokens
    CHECK(std::vector<page_id>(mine.begin(), mine.begin() + 4) == theirs);
  }

  // A second request shares the same pages; its own next turn keeps them shared too.
  auto b = sim.admit_with_prefix(p, 8, 2);
  REQUIRE(b);
  CHECK(m.stats().prefix_pages_shared == 28);
  for (auto pg : pages_of(m, p, uncompressed_a)) CHECK(m.pool().ref_count(pg) == 3);
  CHECK(m.pool().ref_count(pages_of(m, p, 1)[1]) == 3);  // G1's two pinned pages
  sim.chunk(*b, 8);
  for (int t = 0; t < 2; ++t) sim.decode({*b});
  sim.end_turn(*b);
  copies_before = m.stats().page_copies;
  REQUIRE(sim.continue_turn(*b, 3, 1));
  // b's other compressed and sliding pages are its own (no copy); its pinned compressed pages
  // and uncompressed pages below the pin stay shared: the turn copies nothing.
  CHECK(m.stats().page_copies == copies_before);
  for (auto pg : pages_of(m, p, uncompressed_b)) CHECK(m.pool().ref_count(pg) == 3);
  for (auto pg : pages_of(m, p, 1)) CHECK(m.pool().ref_count(pg) == 3);
  CHECK(m.group_pinned_tokens(*b, 1) == 8);
  sim.chunk(*b, 3);
  sim.decode({*b});
  sim.verify();
  m.check_invariants();

  // Unregistering frees the prefix's own pages (22 - 14 shared = 8); the shared ones stay while
  // referenced.
  auto used = m.pool().stats().used;
  sim.free(p);
  CHECK(m.pool().stats().used == used - 8);
  for (auto g : {uncompressed_a, uncompressed_b}) {
    auto shared = pages_of(m, *a, g);
    for (std::size_t k = 0; k < 4; ++k) CHECK(m.pool().ref_count(shared[k]) == 2);
  }
  sim.verify();
  m.check_invariants();
  sim.free(*a);
  sim.verify();
  sim.free(*b);
  CHECK(m.pool().stats().used == 0);
  CHECK(m.pool().stats().reserved == 0);
  CHECK(m.stats().reclaimed_pages == 0);
  m.check_invariants();
}

TEST_CASE("a prefix that decoded before it was pinned: the pin stays within every head's budget",
          "[memory][prefix][regression]") {
  // Review of the pinned prefixes: a prefix with answer tokens holds more than its prompt's
  // budget; pinning all its filled pages could leave a static compressed group no room for the
  // request's answer (decode_step past the reservation). The pin is capped at floor(min over the
  // group's heads of retained_tokens(n + N) / P) pages (the engine model predicts it and
  // verify() compares every group's pin, data and reservation), at admission and at next turns.
  for (std::int64_t Tp : {0, 4, 12, 20})
    for (std::int64_t N : {1, 2, 4})
      for (std::int64_t Tr : {0, 1, 4, 8}) {
        INFO("prefix answer " << Tp << ", request (" << N << ", " << Tr << ")");
        tiny_manager fx(opts(400, 8));
        auto& m = fx.m;
        engine_sim sim(m, 17, 0.0);
        auto p = sim.admit(16, Tp);
        REQUIRE(p);
        sim.chunk(*p, 8);
        sim.chunk(*p, 8);
        for (std::int64_t t = 0; t < Tp; ++t) sim.decode({*p});
        sim.end_turn(*p);
        m.pin_prefix(*p);
        auto a = sim.admit_with_prefix(*p, N, Tr);
        REQUIRE(a);
        sim.chunk(*a, N);
        for (std::int64_t t = 0; t < Tr; ++t) sim.decode({*a});
        sim.verify();
        for (std::int32_t g = 0; g < 4; ++g) {  // the compressed groups: within the budget
          std::int64_t least = std::numeric_limits<std::int64_t>::max();
          for (auto mb : fx.plan.grouping.groups[static_cast<std::size_t>(g)].members)
            least = std::min(least, retained_tokens(fx.plan.rule(mb.layer, mb.head), 16 + Tp + N));
          CHECK(m.group_pinned_tokens(*a, g) <= least / 4 * 4);
        }
        sim.end_turn(*a);
        REQUIRE(sim.continue_turn(*a, 1, Tr));
        sim.chunk(*a, 1);
        for (std::int64_t t = 0; t < Tr; ++t) sim.decode({*a});
        sim.verify();
        m.check_invariants();
      }
}

TEST_CASE("a fork of a pinned prefix is a plain fork of an ended sequence", "[memory][prefix]") {
  // docs/memory.md: `fork` accepts a pinned prefix. The child is what a fork of any ended
  // sequence is: ended, not pinned, no reservation (an ended sequence's targets are its pages in
  // use), the pages every head of a group has filled shared by reference and the others copied
  // (a fork's `shareable`): here the sliding rings (3 + 3 pages, rewritten in place) and the
  // last page of compressed groups 0 and 2, which not every head filled: 8 copies. Its next turn
  // copies what it may rewrite; the prefix's tags read back unchanged and it keeps serving.
  tiny_manager fx(opts(100, 3));
  auto& m          = fx.m;
  auto const& plan = fx.plan;
  engine_sim sim(m, 5, 0.0);
  auto p = prefill_prefix(sim);
  m.pin_prefix(p);
  auto copies_before = m.stats().page_copies;
  auto c             = sim.fork(p);
  REQUIRE(c);
  CHECK(m.stats().forks == 1);
  CHECK(m.info(*c).phase == sequence_phase::ended);
  CHECK_FALSE(m.info(*c).pinned);
  CHECK(m.info(p).pinned);
  CHECK(m.info(*c).reserved_pages == 0);
  CHECK(m.stats().page_copies - copies_before == 8);
  CHECK(m.pool().stats().used == 22 + 8);
  std::vector<std::int32_t> copied;  // pages of each group the fork copied
  for (std::int32_t g = 0; g < 8; ++g) {
    auto mine = pages_of(m, *c, g), theirs = pages_of(m, p, g);
    REQUIRE(mine.size() == theirs.size());
    std::int32_t k = 0;
    while (k < static_cast<std::int32_t>(mine.size()) && mine[k] == theirs[k]) {
      CHECK(m.pool().ref_count(theirs[k]) == 2);
      ++k;
    }
    copied.push_back(static_cast<std::int32_t>(mine.size()) - k);
    for (; k < static_cast<std::int32_t>(mine.size()); ++k) {
      CHECK(mine[k] != theirs[k]);
      CHECK(m.pool().ref_count(theirs[k]) == 1);
    }
  }
  // Expected from the model's held tokens (engine_sim, not the manager): a group shares
  // floor(shortest head / P) pages, a sliding ring none.
  auto const& q = sim.sequences().at(p.slot);
  std::vector<std::int32_t> expect;
  for (std::int32_t g = 0; g < 8; ++g) {
    auto const& grp = plan.grouping.groups[static_cast<std::size_t>(g)];
    auto shortest   = std::numeric_limits<std::size_t>::max();
    for (auto const& h : grp.members)
      shortest = std::min(
          shortest, q.tags[static_cast<std::size_t>(h.layer * plan.num_kv_heads + h.head)].size());
    auto pages = m.group_page_count(p, g);
    expect.push_back(grp.rule.kind == layer_kind::sliding_window
                         ? pages
                         : pages - static_cast<std::int32_t>(shortest / 4));
  }
  CHECK(expect == std::vector<std::int32_t>{1, 0, 1, 0, 3, 3, 0, 0});
  CHECK(copied == expect);
  // The fork is no prefix: a request over it is refused until it is pinned itself.
  CHECK_THROWS_WITH(m.try_admit_with_prefix(*c, 1, 0), Catch::Contains("not pinned"));

  // Its next turn (N 4, T 4) copies the compressed pages it still shares (the 6 of groups 0-3
  // not copied yet): 8 + 6 = the 14 a request over the prefix copies; the 8 filled uncompressed
  // pages stay shared.
  REQUIRE(sim.continue_turn(*c, 4, 4));
  CHECK(m.stats().page_copies - copies_before == 14);
  sim.chunk(*c, 4);
  for (int t = 0; t < 4; ++t) sim.decode({*c});
  sim.verify();  // the prefix's tags unchanged
  for (auto g : {uncompressed_a, uncompressed_b}) {
    auto mine = pages_of(m, *c, g);
    CHECK(std::vector<page_id>(mine.begin(), mine.begin() + 4) == pages_of(m, p, g));
  }
  for (std::int32_t g = 0; g < 6; ++g)
    for (auto pg : pages_of(m, p, g)) CHECK(m.pool().ref_count(pg) == 1);

  // The prefix still serves a request; then, every slot taken, a fork is refused with nothing
  // changed.
  auto a = sim.admit_with_prefix(p, 4, 4);
  REQUIRE(a);
  for (auto pg : pages_of(m, p, uncompressed_a)) CHECK(m.pool().ref_count(pg) == 3);
  std::vector<sequence_id> ids{p, *c, *a};
  auto before = snapshot(m, ids);
  CHECK_FALSE(m.fork(p));
  CHECK(m.stats().fork_rejected == 1);
  auto after = snapshot(m, ids);
  REQUIRE(after.numbers.size() == before.numbers.size());
  for (std::size_t k = 0; k < before.numbers.size(); ++k)
    if (k != 5) CHECK(after.numbers[k] == before.numbers[k]);  // only fork_rejected moved
  sim.chunk(*a, 4);
  sim.verify();

  // Unregistering leaves the fork's and the request's pages; the last holder returns them.
  sim.free(p);
  sim.verify();
  for (auto g : {uncompressed_a, uncompressed_b}) {
    auto mine = pages_of(m, *c, g);
    for (std::size_t k = 0; k < mine.size(); ++k)
      CHECK(m.pool().ref_count(mine[k]) == (k < 4 ? 2 : 1));  // the 4 shared with a
  }
  sim.free(*c);
  sim.verify();
  sim.free(*a);
  CHECK(m.pool().stats().used == 0);
  CHECK(m.pool().stats().reserved == 0);
  CHECK(m.stats().reclaimed_pages == 0);
  m.check_invariants();
}

TEST_CASE("prefix misuse and refusals name the call and change nothing", "[memory][prefix]") {
  auto plan = tiny_plan(tiny_budgets());
  host_memory_resource mr;
  // 40 pages: the prefix holds 22; a request of (4, 4) over it reserves 33 - 14 shared = 19 > 18
  // left; one of (1, 0) 27 - 14 = 13 (targets after 17 tokens: 4, 3, 2, 2, 3, 3, 5, 5; shared:
  // the first test case's 8 uncompressed and 6 pinned compressed pages).
  kv_cache_manager m(plan, mr, opts(40, 2));
  engine_sim sim(m, 3, 0.0);
  auto p      = prefill_prefix(sim);
  auto ids    = std::vector<sequence_id>{p};
  auto before = snapshot(m, ids);

  // Not pinned yet: invalid_argument naming the prefix.
  try {
    (void)m.try_admit_with_prefix(p, 4, 4);
    FAIL("an unpinned prefix was accepted");
  } catch (invalid_argument const& e) {
    CHECK(std::string(e.what()).find("try_admit_with_prefix: prefix") != std::string::npos);
  }
  CHECK(snapshot(m, ids) == before);
  m.pin_prefix(p);
  m.pin_prefix(p);  // pinning again changes nothing
  before = snapshot(m, ids);
  // Sizes: N < 1, T < 0, n + N + T past 2^31 - 1.
  CHECK_THROWS_AS(m.try_admit_with_prefix(p, 0, 4), invalid_argument);
  CHECK_THROWS_AS(m.try_admit_with_prefix(p, 4, -1), invalid_argument);
  CHECK_THROWS_AS(m.try_admit_with_prefix(p, std::int64_t{1} << 31, 0), invalid_argument);
  // Read-only: no next turn, no park.
  CHECK_THROWS_WITH(m.continue_turn(p, 4, 4), Catch::Contains("pinned"));
  CHECK_THROWS_WITH(m.park(p), Catch::Contains("pinned"));
  CHECK(snapshot(m, ids) == before);
  // Does not fit (pages): nullopt, only the refusal counted.
  CHECK_FALSE(m.try_admit_with_prefix(p, 4, 4));
  CHECK(m.stats().prefix_rejected == 1);
  CHECK(snapshot(m, ids) == before);
  CHECK(m.pool().stats().used == 22);
  CHECK(m.pool().stats().reserved == 0);
  CHECK(m.live_sequences() == 1);
  // A request that fits: (1, 0) reserves 13 of the 18 pages left.
  auto a = sim.admit_with_prefix(p, 1, 0);
  REQUIRE(a);
  CHECK(m.pool().available_pages() == 5);
  // No slot left (2 slots): refused.
  CHECK_FALSE(m.try_admit_with_prefix(p, 1, 0));
  CHECK(m.stats().prefix_rejected == 2);
  // Pinning needs an ended sequence; a request in prefill is not one.
  CHECK_THROWS_AS(m.pin_prefix(*a), logic_error);
  // Stale handles after unregistering.
  sim.free(p);
  CHECK_THROWS_AS(m.try_admit_with_prefix(p, 1, 0), logic_error);
  CHECK_THROWS_AS(m.pin_prefix(p), logic_error);
  sim.chunk(*a, 1);
  sim.verify();
  sim.free(*a);
  CHECK(m.pool().stats().used == 0);
  m.check_invariants();
}

TEST_CASE("prefix requests under elastic reservation share the compressed pages pinned",
          "[memory][prefix]") {
  auto plan = tiny_plan(tiny_budgets(), 4, 2, 10, grouping_scope::global, elastic_reservation(0.1));
  for (bool share : {true, false}) {
    INFO("share_compressed_prefix " << share);
    host_memory_resource mr;
    auto o                    = opts(200, 8);
    o.share_compressed_prefix = share;
    kv_cache_manager m(plan, mr, o);
    engine_sim sim(m, 11, 0.0);
    auto p = prefill_prefix(sim);
    m.pin_prefix(p);
    // Shared per request: each growing group's pages all its heads filled, from the prefix's
    // head lengths (compressed groups only when sharing them); the uncompressed ones are 4 + 4.
    std::vector<std::int32_t> pinned(8, 0);
    std::int32_t per_request = 0;
    for (std::int32_t g = 0; g < 8; ++g) {
      auto const& grp = plan.grouping.groups[static_cast<std::size_t>(g)];
      if (grp.rule.kind == layer_kind::sliding_window) continue;
      if (grp.rule.kind == layer_kind::compressed && !share) continue;
      std::int64_t shortest = std::numeric_limits<std::int64_t>::max();
      for (auto mb : grp.members) shortest = std::min(shortest, m.head_len(p, mb.layer, mb.head));
      pinned[static_cast<std::size_t>(g)] = static_cast<std::int32_t>(shortest / 4 * 4);
      per_request += static_cast<std::int32_t>(shortest / 4);
    }
    CHECK(per_request > 8 * share);  // compressed pages among them when shared
    std::vector<sequence_id> reqs;
    for (std::int64_t N : {3, 9, 1}) {
      auto r = sim.admit_with_prefix(p, N, 5);
      REQUIRE(r);
      reqs.push_back(*r);
      for (std::int32_t g = 0; g < 8; ++g)
        CHECK(m.group_pinned_tokens(*r, g) == pinned[static_cast<std::size_t>(g)]);
      sim.verify();  // the model's elastic limit and budget (pinned pages held, the rest copied)
    }
    CHECK(m.stats().prefix_pages_shared == 3 * per_request);
    // Chunks (the elastic eviction keeps the pinned tokens in place: the prefix's tags read back
    // unchanged), decode, and a next turn that copies no pinned page.
    for (auto r : reqs) {
      while (m.info(r).prompt_remaining > 0)
        sim.chunk(r, std::min<std::int64_t>(4, m.info(r).prompt_remaining));
      for (int t = 0; t < 5; ++t) sim.decode({r});
      sim.verify();
    }
    sim.end_turn(reqs[0]);
    REQUIRE(sim.continue_turn(reqs[0], 6, 2));
    for (std::int32_t g = 0; g < 8; ++g) {
      auto const* mine = m.group_pages(reqs[0], g);
      auto const* its  = m.group_pages(p, g);
      for (std::int32_t k = 0; k < pinned[static_cast<std::size_t>(g)] / 4; ++k)
        CHECK(mine[k] == its[k]);  // still the prefix's page
    }
    sim.chunk(reqs[0], 6);
    sim.verify();
    sim.free(p);
    for (auto r : reqs) sim.free(r);
    CHECK(m.pool().stats().used == 0);
    m.check_invariants();
  }
}

TEST_CASE("the shared-prompt workload measures committed pages with and without the prefix",
          "[memory][prefix][sim]") {
  auto plan = tiny_plan(tiny_budgets());
  sim::shared_prompt_workload w;
  w.prompt_tokens = 16;
  w.user_tokens   = 4;
  w.answer_tokens = 4;
  w.chunk_tokens  = 8;
  w.full_kv_block = 16;
  double page     = static_cast<double>(plan.page_bytes());
  // Unshared: each request commits its targets, 33 pages. Shared: the prefix's 22 pages once,
  // each request its targets less the 14 shared pages (the 8 uncompressed and the 6 pinned
  // compressed ones of the first test case): 19, its 8 copies included.
  for (std::int64_t R : {2, 10}) {
    w.requests = R;
    auto r     = sim::measure_shared_prompt(plan, w, 100.0);
    CHECK(r.tangram.unshared == static_cast<double>(33 * R) * page);
    CHECK(r.tangram.shared == static_cast<double>(22 + 19 * R) * page);
    CHECK(r.tangram_pages_shared == 14 * R);
    CHECK(r.tangram_page_copies == 8 * R);
    // full_kv: 24 tokens = 2 blocks of 16 per request; the prompt's one full block held once.
    CHECK(r.full_kv.unshared == static_cast<double>(2 * R) * 1600.0);
    CHECK(r.full_kv.shared == static_cast<double>(1 + R) * 1600.0);
  }
  w.requests = 1;  // fewer requests than the prefix costs: sharing loses (22 > 14)
  CHECK(sim::measure_shared_prompt(plan, w, 100.0).tangram.saved() == -8 * page);
  w.user_tokens = 0;
  CHECK_THROWS_WITH(sim::measure_shared_prompt(plan, w, 100.0),
                    Catch::Contains("shared_prompt_workload.user_tokens: 0"));
}
