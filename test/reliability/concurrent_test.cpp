// SPDX-License-Identifier: Apache-2.0
// concurrent_kv_cache under a miniature multi-threaded engine: client threads admit, free,
// continue and fork their own sessions while a scheduler thread runs the steps (prefill chunks
// with kept counts below the rule, decode over the live batch, turn ends, page copies) and checks
// the manager's invariants and the view after every step. Run under ThreadSanitizer by
// scripts/tsan.sh. Nothing is timed: every thread does a fixed amount of work.
#include <algorithm>
#include <atomic>
#include <deque>
#include <exception>
#include <mutex>
#include <random>
#include <thread>
#include <type_traits>
#include <vector>

#include "../memory/memory_fixtures.hpp"
#include "tangram/eval/sim/simulated_memory_resource.hpp"
#include "tangram/memory/concurrent_kv_cache.hpp"
#include "tangram/memory/host_memory_resource.hpp"
#include "tangram/memory/tensor_parallel.hpp"

using namespace tangram;
using namespace tangram::test;

namespace {

/// Sequences handed from the client threads to the scheduler.
class inbox {
 public:
  void push(sequence_id id) {
    std::lock_guard<std::mutex> lock(mu_);
    q_.push_back(id);
  }
  /// Appends the new ids to `out`, skipping those already there (a next turn resubmits its id).
  void drain_into(std::vector<sequence_id>& out) {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto id : q_)
      if (std::find(out.begin(), out.end(), id) == out.end()) out.push_back(id);
    q_.clear();
  }

 private:
  std::mutex mu_;
  std::deque<sequence_id> q_;
};

/// What one thread saw; merged after join.
struct thread_counts {
  std::int64_t admitted = 0, rejected = 0, freed = 0, continued = 0, forks = 0, steps = 0;
  std::int64_t decode_tokens = 0, chunks = 0, ended = 0;
  std::int64_t unexpected = 0;  ///< a client's own session vanished (only its owner frees it)
  std::exception_ptr error;     ///< an exception a client thread did not expect
};

/// One scheduler step, under the lock: page copies, prefill chunks, a decode step over the live
/// batch, turn ends; then every check.
void scheduler_step(concurrent_kv_cache<>& kv,
                    std::vector<sequence_id>& active,
                    std::mt19937& rng,
                    thread_counts& c,
                    std::vector<std::int32_t>& kept,
                    std::vector<std::int32_t>& expected) {
  auto step = kv.begin_step();
  auto& m   = *step;
  m.execute_page_copies_host();  // forks and next turns of the clients
  // Sequences freed by a client since the last step leave the scheduler's list.
  std::size_t live = 0;
  for (auto id : active)
    if (m.contains(id)) active[live++] = id;
  active.resize(live);
  for (auto id : active) {
    auto i = m.info(id);
    if (i.phase != sequence_phase::prefill) continue;
    auto chunk =
        std::min<std::int64_t>(i.prompt_remaining, 1 + static_cast<std::int64_t>(rng() % 9));
    m.prepare_chunk(id, chunk);
    m.expected_kept(id, chunk, expected.data());
    for (std::size_t h = 0; h < kept.size(); ++h) {
      kept[h] = expected[h];
      if (m.plan().rules[h].kind == layer_kind::compressed && expected[h] > 0 && rng() % 4 == 0)
        kept[h] = expected[h] - 1;  // compression kept fewer than the rule
    }
    m.commit_chunk(id, kept);
    ++c.chunks;
  }
  std::vector<sequence_id> batch = active;
  step.set_live_batch(batch);
  if (!batch.empty()) {
    m.decode_step();
    c.decode_tokens += static_cast<std::int64_t>(batch.size());
  }
  // The view is consistent with every call so far: lengths agree with the manager's.
  auto v = m.view();
  REQUIRE(v.batch_size == static_cast<std::int32_t>(batch.size()));
  for (std::int32_t r = 0; r < v.batch_size; ++r) {
    REQUIRE(v.seq_tokens[v.seq_slot(r)] == m.info(batch[static_cast<std::size_t>(r)]).seq_tokens);
    for (std::int32_t l = 0; l < m.plan().num_layers; ++l)
      for (std::int32_t h = 0; h < m.plan().num_kv_heads; ++h)
        REQUIRE(v.head_len(r, l, h) == m.head_len(batch[static_cast<std::size_t>(r)], l, h));
  }
  for (auto id : active) {
    auto i = m.info(id);
    if (i.phase == sequence_phase::decode && i.decoded == i.max_new) {
      m.end_turn(id);
      ++c.ended;
    }
  }
  m.check_invariants();
  auto ps = m.pool().stats();
  REQUIRE(ps.used + ps.reserved <= ps.capacity);
  REQUIRE(m.stats().reclaimed_pages == 0);
  m.clear_view_changes();
  ++c.steps;
}

/// One client: admits sessions, frees them, starts next turns and forks when their turn ended.
void client(concurrent_kv_cache<>& kv,
            inbox& to_scheduler,
            std::uint32_t seed,
            int iterations,
            std::atomic<bool> const& abort,
            thread_counts& c) {
  std::mt19937 rng(seed);
  std::vector<sequence_id> own;
  for (int it = 0; it < iterations && !abort.load(); ++it) {
    int op = static_cast<int>(rng() % 10);
    if (op < 4 && own.size() < 4) {
      auto id = kv.try_admit(1 + static_cast<std::int64_t>(rng() % 40), rng() % 12);
      if (id) {
        own.push_back(*id);
        to_scheduler.push(*id);
        ++c.admitted;
      } else {
        ++c.rejected;
      }
    } else if (op < 6 && !own.empty()) {
      auto k = rng() % own.size();
      kv.free(own[k]);  // in any phase: also mid-prefill and in the middle of its decode
      own.erase(own.begin() + static_cast<std::ptrdiff_t>(k));
      ++c.freed;
    } else if (!own.empty()) {
      auto id = own[rng() % own.size()];
      auto i  = kv.info(id);
      if (!i) {  // only this thread frees its sessions
        ++c.unexpected;
        continue;
      }
      if (i->phase != sequence_phase::ended) {
        std::this_thread::yield();
        continue;
      }
      if (op < 8 || own.size() >= 4) {
        if (kv.continue_turn(id, 1 + static_cast<std::int64_t>(rng() % 16), rng() % 10)) {
          to_scheduler.push(id);
          ++c.continued;
        }
      } else if (auto child = kv.fork(id)) {
        own.push_back(*child);
        to_scheduler.push(*child);
        ++c.forks;
      }
    }
    if (it % 16 == 0) (void)kv.stats();
  }
  for (auto id : own) {
    kv.free(id);
    ++c.freed;
  }
}

}  // namespace

TEST_CASE("concurrent_kv_cache: clients admit, free, continue and fork while a scheduler steps",
          "[reliability][concurrent]") {
  auto plan = tiny_plan(tiny_budgets());
  host_memory_resource mr;
  concurrent_kv_cache kv(
      plan, mr, opts(600, 16));  // class template argument deduction: kv_cache_manager
  static_assert(std::is_same_v<decltype(kv), concurrent_kv_cache<kv_cache_manager>>);

  const int clients = 3, iterations = 3000;
  inbox box;
  std::atomic<int> running{clients};
  std::atomic<bool> abort{false};
  std::vector<thread_counts> counts(clients + 1);
  std::vector<std::thread> threads;
  for (int t = 0; t < clients; ++t)
    threads.emplace_back([&, t] {
      auto& c = counts[static_cast<std::size_t>(t)];
      try {
        client(kv, box, 100 + static_cast<std::uint32_t>(t), iterations, abort, c);
      } catch (...) {
        c.error = std::current_exception();
      }
      running.fetch_sub(1);
    });
  // The scheduler runs on this thread, so Catch assertions stay on one thread (Catch2 v2 is not
  // thread-safe); the clients report through their counts, checked after join.
  std::mt19937 rng(7);
  std::vector<sequence_id> active;
  std::vector<std::int32_t> kept(plan.rules.size()), expected(plan.rules.size());
  auto& sc = counts[clients];
  try {
    while (running.load() > 0) {
      box.drain_into(active);
      scheduler_step(kv, active, rng, sc, kept, expected);
      // std::mutex is not fair: give the clients a chance at the lock between steps (a real
      // scheduler waits for the GPU here). Without it, a serialising runtime such as valgrind
      // can starve them for minutes.
      std::this_thread::yield();
    }
  } catch (...) {  // a failed check: stop the clients before reporting it
    abort.store(true);
    for (auto& th : threads) th.join();
    throw;
  }
  for (auto& th : threads) th.join();
  box.drain_into(active);
  scheduler_step(kv, active, rng, sc, kept, expected);

  thread_counts all;
  for (auto const& c : counts) {
    if (c.error) std::rethrow_exception(c.error);
    CHECK(c.unexpected == 0);
    all.admitted += c.admitted;
    all.rejected += c.rejected;
    all.freed += c.freed;
    all.continued += c.continued;
    all.forks += c.forks;
  }
  INFO("admitted " << all.admitted << " forks " << all.forks << " freed " << all.freed
                   << " continued " << all.continued << " steps " << sc.steps << " decode tokens "
                   << sc.decode_tokens << " ended " << sc.ended);
  CHECK(all.freed == all.admitted + all.forks);
  auto st = kv.stats();
  CHECK(st.admitted == all.admitted);
  CHECK(st.rejected == all.rejected);
  CHECK(st.forks == all.forks);
  CHECK(st.turns_continued == all.continued);
  CHECK(st.freed == all.freed);
  CHECK(kv.live_sequences() == 0);
  auto ps = kv.pool_statistics();
  CHECK(ps.used == 0);
  CHECK(ps.reserved == 0);
  kv.check_invariants();
  // The interleavings reached the interesting paths.
  CHECK(all.admitted > 100);
  CHECK(sc.steps > 10);
  CHECK(sc.chunks > 0);
  CHECK(sc.decode_tokens > 0);
}

TEST_CASE("concurrent_kv_cache: readers see consistent counters while steps run",
          "[reliability][concurrent]") {
  auto plan = tiny_plan(tiny_budgets());
  simulated_memory_resource mr;
  concurrent_kv_cache<> kv(plan, mr, opts(300, 8));
  std::atomic<bool> stop{false};
  std::atomic<std::int64_t> inconsistent{0}, reads{0};
  std::vector<std::thread> readers;
  for (int t = 0; t < 2; ++t)
    readers.emplace_back([&] {
      while (!stop.load()) {
        auto ps = kv.pool_statistics();
        if (ps.used + ps.reserved > ps.capacity || ps.reserved > ps.free) ++inconsistent;
        auto s = kv.stats();
        if (s.freed > s.admitted + s.forks) ++inconsistent;
        ++reads;
        std::this_thread::yield();  // std::mutex is not fair (see above)
      }
    });
  std::mt19937 rng(3);
  std::vector<sequence_id> live;
  for (int i = 0; i < 4000; ++i) {
    if (live.size() < 6 && rng() % 3 == 0) {
      if (auto id = kv.try_admit(1 + static_cast<std::int64_t>(rng() % 30), rng() % 8)) {
        auto step = kv.begin_step();
        prefill(*step, *id, step->info(*id).prompt_remaining);
        live.push_back(*id);
      }
    } else if (!live.empty() && rng() % 4 == 0) {
      auto k = rng() % live.size();
      CHECK(kv.free_if_live(live[k]));
      CHECK_FALSE(kv.free_if_live(live[k]));
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(k));
    } else {
      auto step  = kv.begin_step();
      auto batch = live;
      if (step.set_live_batch(batch) > 0) step->decode_step();
    }
  }
  while (reads.load() < 2) std::this_thread::yield();  // the readers did run
  stop.store(true);
  for (auto& th : readers) th.join();
  for (auto id : live) kv.free(id);
  CHECK(inconsistent.load() == 0);
  CHECK(reads.load() > 0);
  CHECK(kv.live_sequences() == 0);
  kv.check_invariants();
}

TEST_CASE("concurrent_kv_cache: tensor-parallel admission on every rank or on none",
          "[reliability][concurrent][tp]") {
  auto plan = tiny_plan(tiny_budgets());
  simulated_memory_resource mr;
  concurrent_kv_cache<> r0(plan, mr, opts(200, 4));
  concurrent_kv_cache<> r1(plan, mr, opts(40, 4));  // the small rank refuses first
  std::vector<concurrent_kv_cache<>*> ranks{&r0, &r1};
  auto ids = try_admit_all(ranks, 20, 4);
  REQUIRE(ids.has_value());
  CHECK(r0.live_sequences() == 1);
  CHECK(r1.live_sequences() == 1);
  // Rank 1 has no room for a second one: rank 0 rolls back.
  CHECK_FALSE(try_admit_all(ranks, 20, 4).has_value());
  CHECK(r0.live_sequences() == 1);
  CHECK(r0.stats().freed == 1);
  for (std::size_t k = 0; k < ranks.size(); ++k) ranks[k]->free((*ids)[k]);
  CHECK(r0.pool_statistics().reserved == 0);
  CHECK(r1.pool_statistics().reserved == 0);
}

TEST_CASE("concurrent_kv_cache: admit says why, try_extend and sequences under the lock",
          "[reliability][concurrent]") {
  auto plan = tiny_plan(tiny_budgets());
  simulated_memory_resource mr;
  concurrent_kv_cache<> kv(plan, mr, opts(40, 4));
  auto a = kv.admit(20, 5);  // 35 of 40 pages (see manager_test.cpp)
  REQUIRE(a);
  auto b = kv.admit(20, 5);
  CHECK(b.reason == admit_failure::not_enough_pages);
  CHECK(b.pages_missing == 30);
  kv.with_lock([&](kv_cache_manager& m) {
    std::vector<std::int32_t> kept(m.plan().rules.size());
    m.prepare_chunk(*a.id, 20);
    m.expected_kept(*a.id, 20, kept.data());
    m.commit_chunk(*a.id, kept);
  });
  // +1: G0 and G2 grow by a page each (see decode_reservation_test.cpp): 2 of the 5 left.
  CHECK(kv.try_extend(*a.id, 1));
  CHECK(kv.info(*a.id)->max_new == 6);
  CHECK_FALSE(kv.try_extend(*a.id, 8));
  auto list = kv.sequences();
  REQUIRE(list.size() == 1);
  CHECK(list[0].phase == sequence_phase::decode);
  kv.free(*a.id);
  CHECK(kv.sequences().empty());
  kv.check_invariants();
}

TEST_CASE("concurrent_kv_cache: shared prefixes under the lock", "[reliability][concurrent]") {
  auto plan = tiny_plan(tiny_budgets());
  simulated_memory_resource mr;
  concurrent_kv_cache<> kv(plan, mr, opts(100, 4));
  auto p = kv.try_admit(16, 0);
  REQUIRE(p);
  kv.with_lock([&](kv_cache_manager& m) {
    std::vector<std::int32_t> kept(m.plan().rules.size());
    for (int c = 0; c < 2; ++c) {
      m.prepare_chunk(*p, 8);
      m.expected_kept(*p, 8, kept.data());
      m.commit_chunk(*p, kept);
    }
    m.end_turn(*p);
  });
  CHECK_THROWS_AS(kv.try_admit_with_prefix(*p, 4, 4), invalid_argument);  // not pinned yet
  kv.pin_prefix(*p);
  // (4, 4) over the 16-token prefix: 8 uncompressed and 6 pinned compressed pages shared, 8
  // copied (memory/prefix_sharing_test.cpp).
  auto a = kv.try_admit_with_prefix(*p, 4, 4);
  REQUIRE(a);
  kv.with_lock([&](kv_cache_manager& m) {
    CHECK(m.stats().prefix_pages_shared == 14);
    CHECK(m.pending_copies().size() == 8);
    m.complete_page_copies();
  });
  kv.free(*p);
  kv.free(*a);
  kv.check_invariants();
}
