// SPDX-License-Identifier: Apache-2.0
// Host allocation failures. This executable wraps the global operator new/delete: every form
// forwards to the next definition in the symbol lookup order (the C++ runtime's, or a sanitizer's
// or valgrind's when one is active, so allocation and release always stay in one family), counts
// live allocations, and can be armed to throw std::bad_alloc at the k-th allocation. With it:
// - the calls documented as allocation-free (admission, chunks, decode, turn end, free, batch,
//   view) are checked to allocate nothing;
// - every allocation of a manager's constructor, of fork, of continue_turn (copy-on-write) and of
//   the FlashInfer export is made to fail in turn: the call must throw std::bad_alloc, leave the
//   manager's whole observable state unchanged (strong guarantee) and leak nothing; then it
//   succeeds once nothing is injected.
// Valgrind replaces operator new itself, so faults cannot be injected under it: these cases skip
// there (with a warning); valgrind's own leak check covers that run.
#include <dlfcn.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <new>

#include "../memory/memory_fixtures.hpp"
#include "runtime.hpp"
#include "storm/engine_sim.hpp"
#include "tangram/eval/sim/simulated_memory_resource.hpp"
#include "tangram/interop/flashinfer.hpp"
#include "tangram/memory/host_memory_resource.hpp"

namespace {

// Armed countdown: the allocation that brings it from 1 to 0 fails; negative means disarmed.
std::atomic<long> fail_countdown{-1};
std::atomic<long> live_allocations{0};
std::atomic<long> total_allocations{0};

using new_fn         = void* (*)(std::size_t);
using new_aligned_fn = void* (*)(std::size_t, std::align_val_t);
using del_fn         = void (*)(void*);
using del_aligned_fn = void (*)(void*, std::align_val_t);

/// The next definition of `symbol` after this executable's (resolved once; dlsym itself only
/// uses malloc, never operator new).
template <class Fn>
Fn next(char const* symbol, std::atomic<void*>& cache) {
  void* f = cache.load(std::memory_order_acquire);
  if (f == nullptr) {
    f = dlsym(RTLD_NEXT, symbol);
    if (f == nullptr) std::abort();
    cache.store(f, std::memory_order_release);
  }
  return reinterpret_cast<Fn>(f);
}
std::atomic<void*> next_new{nullptr}, next_new_array{nullptr}, next_new_aligned{nullptr},
    next_new_array_aligned{nullptr}, next_delete{nullptr}, next_delete_array{nullptr},
    next_delete_aligned{nullptr}, next_delete_array_aligned{nullptr};

void maybe_fail() {
  if (fail_countdown.load(std::memory_order_relaxed) > 0 &&
      fail_countdown.fetch_sub(1, std::memory_order_relaxed) == 1)
    throw std::bad_alloc();
}
void* counted(void* p) {
  live_allocations.fetch_add(1, std::memory_order_relaxed);
  total_allocations.fetch_add(1, std::memory_order_relaxed);
  return p;
}
bool uncounted(void* p) {
  if (p == nullptr) return false;
  live_allocations.fetch_sub(1, std::memory_order_relaxed);
  return true;
}

}  // namespace

void* operator new(std::size_t n) {
  maybe_fail();
  return counted(next<new_fn>("_Znwm", next_new)(n));
}
void* operator new[](std::size_t n) {
  maybe_fail();
  return counted(next<new_fn>("_Znam", next_new_array)(n));
}
void* operator new(std::size_t n, std::align_val_t a) {
  maybe_fail();
  return counted(next<new_aligned_fn>("_ZnwmSt11align_val_t", next_new_aligned)(n, a));
}
void* operator new[](std::size_t n, std::align_val_t a) {
  maybe_fail();
  return counted(next<new_aligned_fn>("_ZnamSt11align_val_t", next_new_array_aligned)(n, a));
}
void* operator new(std::size_t n, std::nothrow_t const&) noexcept {
  try {
    return operator new(n);
  } catch (...) {
    return nullptr;
  }
}
void* operator new[](std::size_t n, std::nothrow_t const&) noexcept {
  try {
    return operator new[](n);
  } catch (...) {
    return nullptr;
  }
}
void operator delete(void* p) noexcept {
  if (uncounted(p)) next<del_fn>("_ZdlPv", next_delete)(p);
}
void operator delete[](void* p) noexcept {
  if (uncounted(p)) next<del_fn>("_ZdaPv", next_delete_array)(p);
}
void operator delete(void* p, std::size_t) noexcept {
  operator delete(p);
}
void operator delete[](void* p, std::size_t) noexcept {
  operator delete[](p);
}
void operator delete(void* p, std::align_val_t a) noexcept {
  if (uncounted(p)) next<del_aligned_fn>("_ZdlPvSt11align_val_t", next_delete_aligned)(p, a);
}
void operator delete[](void* p, std::align_val_t a) noexcept {
  if (uncounted(p)) next<del_aligned_fn>("_ZdaPvSt11align_val_t", next_delete_array_aligned)(p, a);
}
void operator delete(void* p, std::size_t, std::align_val_t a) noexcept {
  operator delete(p, a);
}
void operator delete[](void* p, std::size_t, std::align_val_t a) noexcept {
  operator delete[](p, a);
}
void operator delete(void* p, std::nothrow_t const&) noexcept {
  operator delete(p);
}
void operator delete[](void* p, std::nothrow_t const&) noexcept {
  operator delete[](p);
}

using namespace tangram;
using namespace tangram::test;

namespace {

/// Allocations made by `call` (nothing injected).
template <class Call>
long allocations_of(Call&& call) {
  long before = total_allocations.load();
  call();
  return total_allocations.load() - before;
}

/// Fails allocation k = 1, 2, ... of `call` until it completes. Each failure must be
/// std::bad_alloc with `state()` unchanged and, when `leak_check`, no allocation left behind
/// (objects that live on, like a manager or an output vector, may keep buffers they grew).
/// Returns the number of allocation points found.
template <class Call, class State>
int fail_each_allocation(Call&& call, State&& state, bool leak_check = false) {
  for (int k = 1; k < 10000; ++k) {
    auto before      = state();
    long live_before = live_allocations.load();
    bool failed      = false;
    fail_countdown.store(k);
    try {
      call();
    } catch (std::bad_alloc const&) {
      failed = true;
    }
    bool injected = fail_countdown.load() == 0;
    fail_countdown.store(-1);
    if (!failed) {
      REQUIRE_FALSE(injected);  // the injected failure was not swallowed
      return k - 1;
    }
    long live_after = live_allocations.load();
    bool unchanged  = state() == before;
    INFO("allocation " << k);
    REQUIRE(injected);
    if (leak_check) REQUIRE(live_after == live_before);
    REQUIRE(unchanged);
  }
  FAIL("the call never completed");
  return -1;
}

}  // namespace

TEST_CASE("a failed host allocation in the manager's constructor leaks nothing",
          "[reliability][faults][alloc]") {
  if (under_valgrind()) {
    WARN("skipped under valgrind: it replaces operator new, so no fault can be injected");
    return;
  }
  for (bool host : {true, false}) {
    auto plan = tiny_plan(tiny_budgets());
    host_memory_resource hmr;
    simulated_memory_resource smr;
    memory_resource& mr = host ? static_cast<memory_resource&>(hmr) : smr;
    int points          = fail_each_allocation([&] { kv_cache_manager m(plan, mr, opts(64, 4)); },
                                      [&] { return smr.allocated_bytes(); },
                                      true);
    INFO("host " << host);
    CHECK(points > 10);  // every array of the manager, each failed in turn
    CHECK(smr.allocated_bytes() == 0);
  }
}

TEST_CASE("documented allocation-free calls allocate nothing", "[reliability][alloc]") {
  if (under_valgrind()) {
    WARN("skipped under valgrind: it replaces operator new, so no fault can be injected");
    return;
  }
  auto plan = tiny_plan(tiny_budgets());
  simulated_memory_resource mr;
  kv_cache_manager m(plan, mr, opts(400, 6));
  std::vector<std::int32_t> kept(plan.rules.size());
  std::vector<sequence_id> batch;
  std::optional<sequence_id> a, b;
  CHECK(allocations_of([&] {
          a = m.try_admit(20, 8);
          b = m.try_admit(9, 5);
        }) == 0);
  REQUIRE((a && b));
  batch = {*a, *b};
  CHECK(allocations_of([&] {
          m.prepare_chunk(*a, 20);
          m.expected_kept(*a, 20, kept.data());
          m.commit_chunk(*a, kept);
          m.prepare_chunk(*b, 9);
          m.expected_kept(*b, 9, kept.data());
          m.commit_chunk(*b, kept);
          m.set_batch(batch);
          for (int t = 0; t < 5; ++t) {
            m.decode_step();
            (void)m.view();
          }
          (void)m.changes();
          m.clear_view_changes();
          m.end_turn(*b);
          m.free(*a);
          (void)m.try_admit(1000, 0);  // does not fit
        }) == 0);
  m.check_invariants();
}

TEST_CASE("elastic chunks allocate nothing, the staging kept and given back included",
          "[reliability][alloc]") {
  if (under_valgrind()) {
    WARN("skipped under valgrind: it replaces operator new, so no fault can be injected");
    return;
  }
  auto plan =
      tiny_plan(tiny_budgets(), 4, 2, 10, grouping_scope::global, elastic_reservation(0.25));
  simulated_memory_resource mr;
  auto o             = opts(400, 6);
  o.max_chunk_tokens = 8;
  kv_cache_manager m(plan, mr, o);
  std::vector<std::int32_t> kept(plan.rules.size());
  auto id = m.try_admit(20, 6);
  REQUIRE(id);
  std::vector<sequence_id> batch = {*id};
  auto stats_before              = m.stats();
  // Chunks 8, 8, 1, 3: every compressed head keeps at most 4 (so the groups shrink after the
  // second chunk and the third gives staged pages back), the others what expected_kept says.
  CHECK(allocations_of([&] {
          for (std::int64_t c : {8, 8, 1, 3}) {
            m.prepare_chunk(*id, c);
            m.expected_kept(*id, c, kept.data());
            for (std::size_t h = 0; h < kept.size(); ++h)
              if (plan.rules[h].kind == layer_kind::compressed) kept[h] = std::min(kept[h], 4);
            m.commit_chunk(*id, kept);
          }
          m.set_batch(batch);
          for (int t = 0; t < 6; ++t) m.decode_step();
          m.end_turn(*id);
          m.free(*id);
        }) == 0);
  CHECK(m.stats().staging_pages_returned > stats_before.staging_pages_returned);
  m.check_invariants();
}

TEST_CASE("fork, continue_turn and the FlashInfer export keep the state on bad_alloc",
          "[reliability][faults][alloc]") {
  if (under_valgrind()) {
    WARN("skipped under valgrind: it replaces operator new, so no fault can be injected");
    return;
  }
  auto plan = tiny_plan(tiny_budgets());
  host_memory_resource mr;
  kv_cache_manager m(plan, mr, opts(400, 6));
  auto a = *m.try_admit(21, 9);
  prefill(m, a, 21);
  m.set_batch({a});
  for (int t = 0; t < 6; ++t) m.decode_step();
  std::vector<sequence_id> ids{a};
  auto state = [&] { return snapshot(m, ids); };

  // Fork copies the partial tails and the sliding ring: the pending-copy list grows.
  std::optional<sequence_id> child;
  int fork_points = fail_each_allocation([&] { child = m.fork(a); }, state);
  REQUIRE(child.has_value());
  CHECK(fork_points >= 1);
  m.check_invariants();
  m.execute_page_copies_host();
  ids.push_back(*child);

  // The next turn of a forked session copies the shared pages its recompression rewrites (not
  // the filled uncompressed ones, never written again); recorded behind the fork's copies, not
  // yet performed, the pending-copy list must grow past the fork's size.
  {
    kv_cache_manager m3(plan, mr, opts(400, 6));
    auto q = *m3.try_admit(30, 4);
    prefill(m3, q, 30);
    m3.end_turn(q);
    auto qc          = *m3.fork(q);
    auto fork_copies = m3.pending_copies().size();
    std::vector<sequence_id> ids3{q, qc};
    bool ok         = false;
    int cont_points = fail_each_allocation([&] { ok = m3.continue_turn(q, 40, 6); },
                                           [&] { return snapshot(m3, ids3); });
    REQUIRE(ok);
    INFO("fork copies " << fork_copies << ", turn copies " << m3.pending_copies().size());
    CHECK(m3.pending_copies().size() > fork_copies);
    CHECK(cont_points >= 1);
    m3.check_invariants();
  }

  // The export only fills the caller's vectors: a failure leaves the manager as it was.
  m.set_batch(ids);
  flashinfer_paged_kv out;
  int export_points = fail_each_allocation([&] { export_flashinfer_layer(m, 0, out); }, state);
  CHECK(export_points >= 1);
  m.check_invariants();
}
