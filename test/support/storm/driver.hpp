// SPDX-License-Identifier: Apache-2.0
// Operation storms, the one random-operation driver of the manager's tests: long random walks of
// engine operations (admission, prefill chunks with fused eviction and kept counts below the rule,
// decode and speculative steps over changing batches, mixed steps on padded batches, growth, turn
// ends, next turns, forks, frees, aborts mid-chunk, parking idle sessions in host memory and
// restoring them, misuse) against a kv_cache_manager, checked by the independent model of
// engine_sim.hpp. A config (config.hpp) names the plan, the pool and the mix of operations. Used by
// the reliability storm (test/reliability/storm_test.cpp, named configs), the soak driver
// (tools/soak, millions of operations), the manager property test (random tiny configs, the
// lifecycle mix) and the mirror storms (mirror_storms.hpp).
//
// Files: config.hpp and totals.hpp (settings and counters), state.hpp (shared state and checks),
// lifecycle.hpp, parking.hpp and misuse.hpp (the operations), this file (the walk).
//
// Checks, beyond engine_sim::verify (every held token through the view on host pools, page counts,
// targets and reservations from the footprint formulas, reference counts = owners in the page
// lists, used + reserved <= capacity, the manager's own check_invariants):
// - an admitted request never fails: any exception from a chunk or decode step is a violation,
//   and draining runs every live request to the end of its turn;
// - "does not fit" changes nothing: the full observable state (engine_sim's snapshot) before and
//   after every rejected admission, continue_turn and fork predicted as possibly failing; and a
//   request whose footprint fits the unreserved pages (with a free slot) is admitted;
// - misuse (stale handles, unknown slots, double free, commit without prepare, kept above the
//   rule, decode past T, duplicate batch members, a freed batch member, ...) throws the
//   documented exception naming the value, with nothing changed; under elastic reservation also
//   a chunk above max_chunk_tokens and kept counts whose compressed groups exceed the limit;
// - parking: an ended session's or a running turn's pages go to a host buffer (park, copy-out now
//   or just before complete_park, sometimes cancel_park), the session later restores with its
//   next turn (try_unpark) or the turn resumes (try_resume), each fitting exactly when
//   unpark_pages / resume_pages are available with a free slot, else nothing changes; a growth
//   that does not fit parks the victims the answer window names (memory/answer_window.hpp) until
//   it fits; on host pools every restored token is read back through the view;
// - the view journal: an engine-side mirror updated only from view_changes() equals the arrays;
// - the FlashInfer export lists each head's length and its group's pages;
// - after every drain the pool is empty (nothing leaked) and the resource got its arena back.
//
// Reporting goes through REQUIRE (Catch's in the test suite, an exception-throwing shim in the
// soak driver), so a violation names the failed expression; callers add the seed and op index.
#pragma once

#include <cstdint>

#include "misuse.hpp"
#include "tangram/eval/sim/simulated_memory_resource.hpp"

namespace tangram::test {

/**
 * One storm over one config: owns its resource, its manager and the engine_sim model.
 * Deterministic for a given (config, seed): a violation is reproduced by the same seed and the
 * same number of steps.
 */
class storm : public storm_misuse {
 public:
  using storm_misuse::storm_misuse;

  /// Shown the manager after every step, before the checks (a mirror under test syncs there).
  struct observer {
    virtual ~observer()                          = default;
    virtual void after_step(kv_cache_manager& m) = 0;
  };
  /// Sets the observer of the following steps (nullptr: none); not owned.
  void observe(observer* o) { observer_ = o; }

  kv_cache_manager& manager() { return *manager_; }
  engine_sim& model() { return *sim_; }

  /// One random step, drawn from the config's mix. Checks everything every `check_every` steps.
  void step() {
    std::uint32_t total = 0;
    for (auto const& [o, w] : cfg_.mix) total += w;
    auto draw = static_cast<std::uint32_t>(rng_() % total);
    auto op   = cfg_.mix.back().first;
    for (auto const& [o, w] : cfg_.mix) {
      if (draw < w) {
        op = o;
        break;
      }
      draw -= w;
    }
    run(op);
    ++t_.ops;
    if (observer_) observer_->after_step(*manager_);
    if (t_.ops % check_every_ == 0) full_check();
  }

  /// Runs every live request to the end of its turn (prefill, decode to T), ends and frees it;
  /// then the pool must be empty.
  void drain() {
    // Prefill what remains, in random chunks.
    for (auto id : phase(sequence_phase::prefill)) {
      while (sim_->sequences().at(id.slot).prompt_remaining > 0) do_chunk(id);
    }
    // Decode every request to its T, all in one shrinking batch.
    for (;;) {
      std::vector<sequence_id> batch;
      for (auto id : phase(sequence_phase::decode)) {
        auto const& q = sim_->sequences().at(id.slot);
        if (q.decoded < q.max_new) batch.push_back(id);
      }
      if (batch.empty()) break;
      cap_batch(batch);
      do_decode(batch);
    }
    for (auto id : phase(sequence_phase::decode)) do_end_turn(id);
    full_check();
    for (auto id : sim_->ids()) {
      sim_->free(id);
      ++t_.frees;
      ++t_.calls;
      graveyard(id);
    }
    auto const& m = *manager_;
    auto ps       = m.pool().stats();
    REQUIRE(m.live_sequences() == 0);
    REQUIRE(ps.used == 0);
    REQUIRE(ps.reserved == 0);
    REQUIRE(ps.free == ps.capacity);
    REQUIRE(m.pending_copies().empty());
    REQUIRE(m.stats().reclaimed_pages == 0);
    m.check_invariants();
    // Nothing leaked in the page-id arena either: the largest request fits again (when the pool
    // can hold it at all).
    if (m.admission_pages(cfg_.max_prompt, cfg_.max_new) <= ps.capacity) {
      auto big = manager_->try_admit(cfg_.max_prompt, cfg_.max_new);
      REQUIRE(big.has_value());
      manager_->free(*big);
    }
    ++t_.drains;
    full_check();
  }

  /// Drains, destroys the manager and checks that the resource got every byte back.
  void finish() {
    drain();
    sim_.reset();
    manager_.reset();
    if (auto* s = dynamic_cast<simulated_memory_resource*>(resource_.get()))
      REQUIRE(s->allocated_bytes() == 0);
  }

  /// Full verification: the engine_sim model, the manager's invariants, the view journal mirror
  /// and the FlashInfer export of one random layer.
  void full_check() {
    sim_->verify();
    if (cfg_.journal_check) check_journal();
    check_export();
    ++t_.full_checks;
  }

 private:
  void run(storm_op op) {
    switch (op) {
      case storm_op::admit:
        return admit();
      case storm_op::chunk:
        return chunk();
      case storm_op::decode:
        return decode();
      case storm_op::end_turn:
        return end_turn();
      case storm_op::continue_turn:
        return continue_turn();
      case storm_op::fork:
        return fork();
      case storm_op::free:
        return free_one();
      case storm_op::abort_chunk:
        return abort_mid_chunk();
      case storm_op::misuse:
        return misuse();
      case storm_op::full_pool_burst:
        return full_pool_burst();
      case storm_op::drain:
        return drain();
      case storm_op::speculate:
        return speculate();
      case storm_op::extend:
        return extend();
      case storm_op::park:
        return park_op();
      case storm_op::mixed_step:
        return mixed_step();
      case storm_op::set_batch:
        return random_batch();
      case storm_op::prefix:
        return prefix_op();
    }
  }

  observer* observer_ = nullptr;
};

}  // namespace tangram::test
