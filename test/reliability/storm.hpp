// SPDX-License-Identifier: Apache-2.0
// Operation storms: long random walks of engine operations (admission, prefill chunks with fused
// eviction and kept counts below the rule, decode steps over changing batches, turn ends, next
// turns, forks, frees, aborts mid-chunk, parking idle sessions in host memory and restoring them,
// misuse) against a kv_cache_manager built from real plans,
// checked by the independent model of test/memory/engine_sim.hpp. Shared by the Catch suite
// (test/reliability, a short storm) and the soak driver (tools/soak, millions of operations).
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

#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "../memory/engine_sim.hpp"
#include "../memory/memory_fixtures.hpp"
#include "tangram/interop/flashinfer.hpp"
#include "tangram/memory/answer_window.hpp"
#include "tangram/memory/kv_cache_manager.hpp"
#include "tangram/memory/memory_resource.hpp"
#include "tangram/model/presets.hpp"
#include "tangram/plan/calibration.hpp"
#include "tangram/plan/footprint.hpp"
#include "tangram/plan/static_plan.hpp"
#include "tangram/profile/retention_samples.hpp"

namespace tangram::test {

/// One storm setting: a plan, the pool and the request sizes.
struct storm_config {
  std::string name;
  static_plan plan;
  bool host = true;  ///< host pool: K/V tags written and read back; else simulated (counts only)
  manager_options options;
  std::int64_t max_prompt = 40;  ///< N of a first turn in [1, max_prompt]
  std::int64_t max_new    = 24;  ///< T in [0, max_new]
  std::int64_t max_chunk  = 16;  ///< chunk tokens in [1, max_chunk]
};

/// Counters of one storm (or a sum of storms).
struct storm_totals {
  std::int64_t ops      = 0;  ///< random steps (the op index of a violation counts these)
  std::int64_t calls    = 0;  ///< mutating manager calls issued (including misuse)
  std::int64_t admitted = 0, admit_rejected = 0;
  std::int64_t chunks = 0, decode_steps = 0, decode_tokens = 0;
  std::int64_t completed_turns = 0;  ///< turns ended with all T tokens decoded
  std::int64_t continued = 0, continue_rejected = 0;
  std::int64_t forks = 0, fork_rejected = 0;
  std::int64_t frees = 0, aborts = 0;
  std::int64_t misuses   = 0;  ///< misuse calls: threw, nothing changed
  std::int64_t bad_sizes = 0;  ///< of which sizes no sequence may have (0, < 0, near INT64_MAX)
  std::int64_t unchanged_checks  = 0;  ///< "does not fit" answers compared before/after
  std::int64_t index_refusals    = 0;  ///< refused with pages and a slot free (page-id arena full)
  std::int64_t full_checks       = 0;  ///< full verifications (model, invariants, journal, export)
  std::int64_t full_pool_bursts  = 0;  ///< admission bursts until the pool refused repeatedly
  std::int64_t drains            = 0;  ///< every request run to completion and freed; pool empty
  std::int64_t elastic_evictions = 0;  ///< elastic: chunk evictions with the group-length selection
  std::int64_t elastic_clipped   = 0;  ///< elastic: wanted tokens the limit made them drop
  std::int64_t limit_refusals    = 0;  ///< elastic: commits refused past elastic_page_limit
  std::int64_t extended = 0, extend_rejected = 0;  ///< try_extend that fit / did not
  std::int64_t speculative_steps = 0;  ///< decode steps with per-member counts, or append_tokens
  std::int64_t rollbacks         = 0;  ///< rollbacks of rejected speculative tokens
  std::int64_t rolled_back       = 0;  ///< tokens they removed
  std::int64_t parks = 0, park_cancels = 0;  ///< sessions parked (complete_park) / cancelled
  std::int64_t unparks = 0, unpark_rejected = 0;  ///< try_unpark that fit / did not
  std::int64_t running_parks = 0;                 ///< of the parks, turns parked in decode
  std::int64_t resumes = 0, resume_rejected = 0;  ///< try_resume that fit / did not
  std::int64_t growth_parks                 = 0;  ///< victims parked so that a refused growth fits
  static constexpr std::size_t misuse_kinds = 16;
  std::array<std::int64_t, misuse_kinds> misuse_by_kind{};  ///< misuses per case of storm::misuse

  void add(storm_totals const& o) {
    ops += o.ops;
    calls += o.calls;
    admitted += o.admitted;
    admit_rejected += o.admit_rejected;
    chunks += o.chunks;
    decode_steps += o.decode_steps;
    decode_tokens += o.decode_tokens;
    completed_turns += o.completed_turns;
    continued += o.continued;
    continue_rejected += o.continue_rejected;
    forks += o.forks;
    fork_rejected += o.fork_rejected;
    frees += o.frees;
    aborts += o.aborts;
    misuses += o.misuses;
    bad_sizes += o.bad_sizes;
    unchanged_checks += o.unchanged_checks;
    index_refusals += o.index_refusals;
    full_checks += o.full_checks;
    full_pool_bursts += o.full_pool_bursts;
    drains += o.drains;
    elastic_evictions += o.elastic_evictions;
    elastic_clipped += o.elastic_clipped;
    limit_refusals += o.limit_refusals;
    extended += o.extended;
    extend_rejected += o.extend_rejected;
    speculative_steps += o.speculative_steps;
    rollbacks += o.rollbacks;
    rolled_back += o.rolled_back;
    parks += o.parks;
    park_cancels += o.park_cancels;
    unparks += o.unparks;
    unpark_rejected += o.unpark_rejected;
    running_parks += o.running_parks;
    resumes += o.resumes;
    resume_rejected += o.resume_rejected;
    growth_parks += o.growth_parks;
    for (std::size_t k = 0; k < misuse_kinds; ++k) misuse_by_kind[k] += o.misuse_by_kind[k];
  }
};

/// The model with tiny heads in f32, so host pools can hold real K/V tags cheaply; budgets,
/// rules, kinds and grouping stay those of the real model.
inline model_spec with_small_heads(model_spec m) {
  m.head_dim = 4;
  m.kv_dtype = dtype::f32;
  return m;
}

/// A config whose pool holds about `requests` of the largest first turns.
inline storm_config make_storm_config(std::string name,
                                      static_plan plan,
                                      bool host,
                                      double requests,
                                      std::int32_t max_sequences,
                                      std::int64_t max_prompt,
                                      std::int64_t max_new,
                                      std::int64_t max_chunk,
                                      bool small_index = false) {
  storm_config c;
  c.name                  = std::move(name);
  c.host                  = host;
  c.max_prompt            = max_prompt;
  c.max_new               = max_new;
  c.max_chunk             = max_chunk;
  auto M                  = footprint_pages(plan, max_prompt, max_new);
  c.options.num_pages     = std::max<std::int64_t>(1, static_cast<std::int64_t>(requests * M));
  c.options.max_sequences = max_sequences;
  // A page-id arena barely above the pool forces repacking (and its journal resyncs).
  if (small_index) c.options.index_capacity = c.options.num_pages + 4 * plan.num_groups();
  c.plan = std::move(plan);
  return c;
}

/// An elastic-reservation config: chunks of at most `max_chunk` tokens (manager_options too), a
/// pool of about `requests` of the largest first turns' admission (footprint + staging).
inline storm_config make_elastic_storm_config(std::string name,
                                              static_plan plan,
                                              bool host,
                                              double requests,
                                              std::int32_t max_sequences,
                                              std::int64_t max_prompt,
                                              std::int64_t max_new,
                                              std::int64_t max_chunk) {
  auto c                     = make_storm_config(std::move(name),
                             std::move(plan),
                             host,
                             requests,
                             max_sequences,
                             max_prompt,
                             max_new,
                             max_chunk);
  c.options.max_chunk_tokens = max_chunk;
  auto M                     = admission_footprint_pages(c.plan, max_prompt, max_new, max_chunk);
  c.options.num_pages        = std::max<std::int64_t>(1, static_cast<std::int64_t>(requests * M));
  return c;
}

/// Pool pages for the resource fault cases of a config (test/reliability/faults.hpp): its pool,
/// at most `cap`. Those cases build managers with default options; under elastic reservation a
/// request then stages min(default max_chunk_tokens, its prompt), so the pool must hold the
/// (1, 1) and (2, 2) admissions they make (sized through admission_footprint_pages).
inline std::int64_t fault_case_pages(storm_config const& c, std::int64_t cap) {
  auto chunk = manager_options{}.max_chunk_tokens;
  return std::max({std::min<std::int64_t>(c.options.num_pages, cap),
                   admission_footprint_pages(c.plan, 1, 1, chunk),
                   admission_footprint_pages(c.plan, 2, 2, chunk)});
}

/**
 * The storm settings: tiny hand-checkable hybrid plans (every scope, several P and Hp) and real
 * plans from the bundled profiles and the derived hybrid samples (Llama-3.1-8B, Qwen3-4B,
 * Gemma-3-12B with 1024-token sliding windows, GPT-OSS-20B with 128-token windows on a
 * tensor-parallel rank, Qwen2.5-7B with 4 KV heads). Host configs use 4-element f32 heads so that
 * every token's K/V is written and read back; simulated configs keep the real geometry.
 */
inline std::vector<storm_config> storm_configs() {
  std::vector<storm_config> out;
  out.push_back(make_storm_config("tiny-global-P4-Hp2",
                                  tiny_plan(tiny_budgets(), 4, 2, 10, grouping_scope::global),
                                  true,
                                  5,
                                  8,
                                  40,
                                  24,
                                  16));
  out.push_back(make_storm_config("tiny-layer-P3-Hp1-small-index",
                                  tiny_plan(tiny_budgets(), 3, 1, 7, grouping_scope::layer),
                                  true,
                                  4,
                                  6,
                                  30,
                                  20,
                                  9,
                                  true));
  out.push_back(make_storm_config(
      "tiny-adjacent-P5-Hp2",
      tiny_plan({0.9, 0.05, 0.3, 1.0, 0.15, 0.6, 0.42, 0.08}, 5, 2, 12, grouping_scope::adjacent),
      true,
      6,
      10,
      60,
      30,
      25));
  // Prompts up to 10,240 tokens: the profile protects 4,128 (sink + window), so shorter prompts
  // would never compress.
  out.push_back(make_storm_config("llama-3.1-8b-snapkv-P16-Hp4-global",
                                  llama_plan("snapkv", 16, 4),
                                  false,
                                  6,
                                  12,
                                  10240,
                                  128,
                                  2048));
  out.push_back(make_storm_config("qwen3-4b-ea-P32-Hp2-layer-data",
                                  real_plan(with_small_heads(model_preset("qwen3-4b")),
                                            "profiles/ea/qwen3-4b-instruct-2507.json",
                                            32,
                                            2,
                                            grouping_scope::layer),
                                  true,
                                  5,
                                  8,
                                  192,
                                  48,
                                  96));
  out.push_back(make_storm_config("gemma-3-12b-derived-P16-Hp4-adjacent",
                                  real_plan(model_preset("gemma-3-12b"),
                                            "derived/gemma-3-12b-it.derived.json",
                                            16,
                                            4,
                                            grouping_scope::adjacent),
                                  false,
                                  5,
                                  10,
                                  1200,
                                  96,
                                  400));
  out.push_back(make_storm_config("gpt-oss-20b-derived-tp2-rank1-P16-Hp4-data",
                                  real_plan(with_small_heads(model_preset("gpt-oss-20b")),
                                            "derived/gpt-oss-20b.derived.json",
                                            16,
                                            4,
                                            grouping_scope::global,
                                            2,
                                            1),
                                  true,
                                  5,
                                  8,
                                  300,
                                  80,
                                  128));
  out.push_back(make_storm_config("qwen2.5-7b-derived-P8-Hp4-layer-small-index",
                                  real_plan(model_preset("qwen2.5-7b"),
                                            "derived/qwen2.5-7b-instruct.derived.json",
                                            8,
                                            4,
                                            grouping_scope::layer),
                                  false,
                                  4,
                                  8,
                                  512,
                                  64,
                                  256,
                                  true));
  out.push_back(make_storm_config("llama-3.1-8b-keydiff-P64-Hp8-global",
                                  llama_plan("keydiff", 64, 8),
                                  false,
                                  6,
                                  16,
                                  2048,
                                  256,
                                  1024));
  // Elastic reservation: the compressed groups share one budget, each chunk's eviction picks the
  // groups' lengths within the turn's limit (engine_sim), chunks stage up to max_chunk tokens.
  out.push_back(make_elastic_storm_config(
      "tiny-elastic-global-P4-Hp2-m0.15-chunk8",
      tiny_plan(tiny_budgets(), 4, 2, 10, grouping_scope::global, elastic_reservation(0.15)),
      true,
      5,
      8,
      40,
      24,
      8));
  out.push_back(make_elastic_storm_config(
      "tiny-elastic-adjacent-P3-Hp2-m0-chunk12",
      tiny_plan(tiny_budgets(), 3, 2, 7, grouping_scope::adjacent, elastic_reservation(0.0)),
      true,
      5,
      8,
      36,
      20,
      12));
  // Prompts past the profile's 4128 protected tokens (32 sink + 4096 window), so that the
  // scorer's share, not the protection, sets the limit and the selection clips.
  out.push_back(make_elastic_storm_config("llama-3.1-8b-snapkv-elastic-P16-Hp4-m0.15",
                                          llama_plan("snapkv", 16, 4, elastic_reservation(0.15)),
                                          false,
                                          5,
                                          8,
                                          10240,
                                          128,
                                          1024));
  return out;
}

/**
 * One storm over one config: owns its resource, its manager and the engine_sim model.
 * Deterministic for a given (config, seed): a violation is reproduced by the same seed and the
 * same number of steps.
 */
class storm {
 public:
  storm(storm_config const& cfg, std::uint64_t seed, std::int64_t check_every = 1)
      : cfg_(cfg),
        rng_(static_cast<std::mt19937::result_type>(seed ^ (seed >> 32))),
        check_every_(std::max<std::int64_t>(1, check_every)) {
    if (cfg_.host)
      resource_ = std::make_unique<host_memory_resource>();
    else
      resource_ = std::make_unique<simulated_memory_resource>();
    manager_ = std::make_unique<kv_cache_manager>(cfg_.plan, *resource_, cfg_.options);
    sim_     = std::make_unique<engine_sim>(*manager_, static_cast<std::uint32_t>(rng_()), 0.25);
    G_       = manager_->num_groups();
    LH_      = cfg_.plan.num_layers * cfg_.plan.num_kv_heads;
    mirror_full_resync();
  }

  storm_totals const& totals() const { return t_; }

  /// One random step (op). Checks everything every `check_every` steps.
  void step() {
    int op = static_cast<int>(rng_() % 1000);
    if (op < 110) {
      admit();
    } else if (op < 310) {
      chunk();
    } else if (op < 640) {
      decode();
    } else if (op < 690) {
      end_turn();
    } else if (op < 750) {
      continue_turn();
    } else if (op < 790) {
      fork();
    } else if (op < 850) {
      free_one();
    } else if (op < 868) {
      abort_mid_chunk();
    } else if (op < 898) {
      misuse();
    } else if (op < 901) {
      full_pool_burst();
    } else if (op < 902) {
      drain();
    } else if (op < 940) {
      speculate();
    } else if (op < 965) {
      extend();
    } else if (op < 995) {
      park_op();
    } else {
      decode();
    }
    ++t_.ops;
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
    // Nothing leaked in the page-id arena either: the largest request fits again.
    auto big = manager_->try_admit(cfg_.max_prompt, cfg_.max_new);
    REQUIRE(big.has_value());
    manager_->free(*big);
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
    check_journal();
    check_export();
    ++t_.full_checks;
  }

 private:
  // ----- helpers -------------------------------------------------------------------------------

  std::int64_t uniform(std::int64_t lo, std::int64_t hi) {
    return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng_);
  }
  std::vector<sequence_id> phase(sequence_phase ph) const {
    std::vector<sequence_id> out;
    for (auto const& [s, q] : sim_->sequences())
      if (q.phase == ph) out.push_back(q.id);
    return out;
  }
  sequence_id pick(std::vector<sequence_id> const& v) { return v[rng_() % v.size()]; }
  void graveyard(sequence_id id) {
    if (graveyard_.size() < 64)
      graveyard_.push_back(id);
    else
      graveyard_[rng_() % graveyard_.size()] = id;
  }
  bool index_is_small() const { return cfg_.options.index_capacity != 0; }
  /// The page-id arena may refuse a request whose pages fit: when it was made small, or while
  /// forks share pages (each holder's page list has its own entries, so the lists of forked
  /// sequences can hold more entries than the pool has pages; the default arena, 2 x pages +
  /// 4 x slots x groups, is sized for unshared lists).
  bool arena_may_refuse() {
    if (index_is_small()) return true;
    auto& m = *manager_;
    forked_.erase(
        std::remove_if(
            forked_.begin(), forked_.end(), [&](sequence_id id) { return !m.contains(id); }),
        forked_.end());
    return !forked_.empty();
  }
  /// Counts a refusal although pages and a slot were free (the arena's answer).
  void note_refusal(bool fits, bool ok) {
    if (fits && !ok) ++t_.index_refusals;
  }

  /// Runs a call expected to answer "does not fit" or to succeed; when it may not fit, the whole
  /// observable state must be unchanged after a refusal.
  template <class Call>
  bool fits_or_unchanged(bool may_fail, Call&& call) {
    ++t_.calls;
    if (!may_fail) return call();
    auto ids    = sim_->ids();
    auto before = snapshot(*manager_, ids);
    bool ok     = call();
    if (!ok) {
      auto after = snapshot(*manager_, ids);
      // Only the rejection counters (admit, continue, fork) may move.
      REQUIRE(after.numbers.size() == before.numbers.size());
      for (std::size_t k = 0; k < before.numbers.size(); ++k)
        if (k != 1 && k != 3 && k != 5) REQUIRE(after.numbers[k] == before.numbers[k]);
      ++t_.unchanged_checks;
    }
    return ok;
  }

  // ----- operations ----------------------------------------------------------------------------

  bool admit_one(std::int64_t N, std::int64_t T) {
    auto& m    = *manager_;
    auto need  = m.admission_pages(N, T);
    bool slots = m.live_sequences() < m.max_sequences();
    bool fits  = slots && need <= m.pool().available_pages();
    bool arena = arena_may_refuse();
    std::optional<sequence_id> id;
    bool ok = fits_or_unchanged(!fits || arena, [&] {
      id = sim_->admit(N, T);
      return id.has_value();
    });
    // A request whose footprint fits the unreserved pages, with a free slot, is admitted.
    if (fits && !arena) REQUIRE(ok);
    if (!fits) REQUIRE(!ok);
    // The reason: the pool or the arena can never hold it, else the slot, the pages, the arena.
    auto const& r = sim_->last_admit();
    REQUIRE(r.pages_needed == need);
    if (!ok && r.reason != admit_failure::never_fits) {
      REQUIRE(need <= m.pool().capacity());
      if (!slots)
        REQUIRE(r.reason == admit_failure::no_free_slot);
      else if (!fits)
        REQUIRE((r.reason == admit_failure::not_enough_pages &&
                 r.pages_missing == need - m.pool().available_pages()));
      else
        REQUIRE(r.reason == admit_failure::page_table_arena_full);
    }
    if (!ok && r.reason == admit_failure::never_fits)
      REQUIRE(r.pages_missing == std::max<std::int64_t>(0, need - m.pool().capacity()));
    if (ok) REQUIRE(r.reason == admit_failure::none);
    note_refusal(fits, ok);
    if (ok)
      ++t_.admitted;
    else
      ++t_.admit_rejected;
    return ok;
  }

  void admit() { (void)admit_one(uniform(1, cfg_.max_prompt), uniform(0, cfg_.max_new)); }

  void do_chunk(sequence_id id) {
    auto rem = sim_->sequences().at(id.slot).prompt_remaining;
    sim_->chunk(id, uniform(1, std::min(rem, cfg_.max_chunk)));
    ++t_.chunks;
    t_.calls += 2;
    note_elastic();
  }
  void note_elastic() {
    t_.elastic_evictions = sim_->elastic_evictions();
    t_.elastic_clipped   = sim_->elastic_clipped();
  }
  void chunk() {
    auto pre = phase(sequence_phase::prefill);
    if (pre.empty()) return admit();
    do_chunk(pick(pre));
  }

  void do_decode(std::vector<sequence_id> const& batch) {
    sim_->decode(batch);
    ++t_.decode_steps;
    t_.decode_tokens += static_cast<std::int64_t>(batch.size());
    t_.calls += 2;
  }
  void decode() {
    // A changing batch: a random subset of the requests that may still decode.
    std::vector<sequence_id> batch;
    for (auto id : phase(sequence_phase::decode)) {
      auto const& q = sim_->sequences().at(id.slot);
      if (q.decoded < q.max_new && rng_() % 4 != 0) batch.push_back(id);
    }
    if (batch.empty()) return chunk();
    std::shuffle(batch.begin(), batch.end(), rng_);
    do_decode(batch);
  }

  /// Speculative decoding: a batch whose members append random counts (0 allowed) in one step,
  /// or a draft for one sequence through append_tokens; then a member rolls back a random part
  /// of what it decoded (up to max_rollback), and sometimes tries one token more than allowed.
  void speculate() {
    std::vector<sequence_id> batch;
    std::vector<std::int32_t> counts;
    for (auto id : phase(sequence_phase::decode)) {
      auto const& q = sim_->sequences().at(id.slot);
      if (q.decoded < q.max_new && rng_() % 3 != 0) {
        batch.push_back(id);
        counts.push_back(static_cast<std::int32_t>(
            uniform(0, std::min<std::int64_t>(4, q.max_new - q.decoded))));
      }
    }
    if (!batch.empty()) {
      if (batch.size() == 1 && counts[0] > 0 && rng_() % 2 == 0)
        sim_->append(batch[0], counts[0]);
      else
        sim_->decode(batch, counts);
      ++t_.speculative_steps;
      t_.calls += 2;
    }
    auto dec = phase(sequence_phase::decode);
    if (dec.empty()) return decode();
    auto id    = pick(dec);
    auto limit = manager_->max_rollback(id);
    REQUIRE(limit <= sim_->sequences().at(id.slot).decoded);
    if (limit > 0) {
      auto k = uniform(1, limit);
      sim_->rollback(id, k);
      ++t_.rollbacks;
      t_.rolled_back += k;
      ++t_.calls;
    }
    if (rng_() % 8 == 0) {
      auto over = manager_->max_rollback(id) + 1;
      expect_misuse<logic_error>("exceeds max_rollback", [&] { manager_->rollback(id, over); });
    }
  }

  /// Grows a decoding turn by a random count: it fits exactly when the model's page count is
  /// available (the page-id arena may refuse while forks share pages); a refusal changes nothing.
  void extend() {
    auto dec = phase(sequence_phase::decode);
    if (dec.empty()) return decode();
    auto id    = pick(dec);
    auto more  = uniform(1, std::max<std::int64_t>(1, cfg_.max_new));
    auto pages = sim_->extension_pages(sim_->sequences().at(id.slot), more).total();
    bool fits  = pages <= manager_->pool().available_pages();
    bool arena = arena_may_refuse();
    bool ok    = fits_or_unchanged(!fits || arena, [&] { return sim_->extend(id, more); });
    if (fits && !arena) REQUIRE(ok);
    if (!fits) REQUIRE(!ok);
    note_refusal(fits, ok);
    if (ok)
      ++t_.extended;
    else
      ++t_.extend_rejected;
  }

  void do_end_turn(sequence_id id) {
    auto const& q = sim_->sequences().at(id.slot);
    if (q.decoded == q.max_new) ++t_.completed_turns;
    sim_->end_turn(id);
    ++t_.calls;
  }
  void end_turn() {
    // Mostly requests that decoded their T tokens; sometimes an early stop.
    std::vector<sequence_id> done, all = phase(sequence_phase::decode);
    for (auto id : all) {
      auto const& q = sim_->sequences().at(id.slot);
      if (q.decoded == q.max_new) done.push_back(id);
    }
    if (!done.empty() && rng_() % 4 != 0) return do_end_turn(pick(done));
    if (!all.empty()) return do_end_turn(pick(all));
    decode();
  }

  void continue_turn() {
    auto ended = phase(sequence_phase::ended);
    if (ended.empty()) return end_turn();
    auto id = pick(ended);
    auto N  = uniform(1, std::max<std::int64_t>(1, cfg_.max_prompt / 2));
    auto T  = uniform(0, cfg_.max_new);
    // Upper bound of what the turn reserves: the whole footprint after n + N tokens (elastic:
    // the compressed groups' whole target, held pages not deducted).
    bool fits = sim_->continue_reservation_bound(sim_->sequences().at(id.slot), N, T) <=
                manager_->pool().available_pages();
    bool arena = arena_may_refuse();
    bool ok    = fits_or_unchanged(!fits || arena, [&] { return sim_->continue_turn(id, N, T); });
    if (fits && !arena) REQUIRE(ok);
    note_refusal(fits, ok);
    if (ok)
      ++t_.continued;
    else
      ++t_.continue_rejected;
  }

  void fork() {
    auto cand  = phase(sequence_phase::decode);
    auto ended = phase(sequence_phase::ended);
    cand.insert(cand.end(), ended.begin(), ended.end());
    if (cand.empty()) return admit();
    auto id = pick(cand);
    // Upper bound of the child's reservation: the parent's targets (or pages in use when ended).
    std::int64_t ub = sim_->fork_reservation_bound(sim_->sequences().at(id.slot));
    auto& m         = *manager_;
    bool slot_free  = m.live_sequences() < m.max_sequences();
    bool fits       = slot_free && ub <= m.pool().available_pages();
    bool arena      = arena_may_refuse();
    std::optional<sequence_id> child;
    bool ok = fits_or_unchanged(!fits || arena, [&] {
      child = sim_->fork(id);
      return child.has_value();
    });
    if (fits && !arena) REQUIRE(ok);
    if (!slot_free) REQUIRE(!ok);
    note_refusal(fits, ok);
    if (child) {
      forked_.push_back(id);
      forked_.push_back(*child);
    }
    if (ok)
      ++t_.forks;
    else
      ++t_.fork_rejected;
  }

  /// Host offload: park an ended session or a running turn (its copy-out now or just before
  /// complete_park), complete or cancel a park, restore a parked session with a next turn or
  /// resume a parked turn, or grow a turn parking victims until it fits. A restore or resume fits
  /// exactly when `unpark_pages` / `resume_pages` are available with a free slot (the page-id
  /// arena may refuse while forks share pages); a refusal changes nothing. On host pools the
  /// restored history is read back token by token at the next check.
  void park_op() {
    auto& m = *manager_;
    parking_.erase(std::remove_if(parking_.begin(),
                                  parking_.end(),
                                  [&](parking_entry const& e) { return !m.contains(e.id); }),
                   parking_.end());
    switch (rng_() % 4) {
      case 0: {
        auto ended = phase(rng_() % 3 == 0 ? sequence_phase::decode : sequence_phase::ended);
        if (ended.empty()) return end_turn();
        auto id = pick(ended);
        start_park(id);
        return;
      }
      case 1: {
        if (parking_.empty()) return;
        auto k  = rng_() % parking_.size();
        auto& e = parking_[k];
        if (rng_() % 6 == 0) {
          sim_->cancel_park(e.id);
          ++t_.park_cancels;
        } else {
          finish_park(k);
        }
        ++t_.calls;
        parking_.erase(parking_.begin() + static_cast<long>(k));
        return;
      }
      case 2:
        return grow_or_park();
      default: {
        if (parked_.empty()) return;
        auto k         = rng_() % parked_.size();
        auto const& ps = parked_[k].session;
        auto N         = uniform(1, std::max<std::int64_t>(1, cfg_.max_prompt / 2));
        auto T     = ps.mid_turn ? ps.max_new + uniform(0, cfg_.max_new) : uniform(0, cfg_.max_new);
        auto need  = ps.mid_turn ? m.resume_pages(ps, T) : m.unpark_pages(ps, N, T);
        bool fits  = m.live_sequences() < m.max_sequences() && need <= m.pool().available_pages();
        bool arena = arena_may_refuse();
        std::optional<sequence_id> back;
        bool ok = fits_or_unchanged(!fits || arena, [&] {
          back = ps.mid_turn ? sim_->resume(parked_[k], T) : sim_->unpark(parked_[k], N, T);
          return back.has_value();
        });
        if (fits && !arena) REQUIRE(ok);
        if (!fits) REQUIRE(!ok);
        note_refusal(fits, ok);
        if (ok) {
          REQUIRE(m.info(*back).reserved_pages == need - ps.host_pages());
          ++(ps.mid_turn ? t_.resumes : t_.unparks);
          if (rng_() % 2) parked_.erase(parked_.begin() + static_cast<long>(k));
        } else {
          ++(parked_[k].session.mid_turn ? t_.resume_rejected : t_.unpark_rejected);
        }
        return;
      }
    }
  }

  /// `park(id)` (ended or in decode), its copy-out now or later.
  void start_park(sequence_id id) {
    t_.running_parks += manager_->info(id).phase == sequence_phase::decode;
    parking_entry e{id, sim_->park(id), {}, false};
    if (rng_() % 2) {
      e.host   = sim_->copy_out(e.session);
      e.copied = true;
    }
    parking_.push_back(std::move(e));
    ++t_.calls;
  }
  /// The copy-out of `parking_[k]` (if not done yet) and `complete_park`: the session lives on in
  /// host memory (the entry stays in `parking_`: the caller removes it).
  void finish_park(std::size_t k) {
    auto& e = parking_[k];
    if (!e.copied) e.host = sim_->copy_out(e.session);
    parked_.push_back(sim_->complete_park(e.id, std::move(e.session), std::move(e.host)));
    graveyard(e.id);
    ++t_.parks;
    if (parked_.size() > 8) parked_.erase(parked_.begin() + static_cast<long>(rng_() % 8));
  }

  /// The engine loop's growth (memory/answer_window.hpp): a turn in decode grows by a window;
  /// while that does not fit, the victim the answer window names (an ended session first, then
  /// the newest running turn, the growing one included; random clocks) is parked and completed.
  /// Every growth either fits or ends with the growing turn parked: nothing is recomputed.
  void grow_or_park() {
    auto dec = phase(sequence_phase::decode);
    if (dec.empty()) return decode();
    auto id   = pick(dec);
    auto more = uniform(1, std::max<std::int64_t>(1, cfg_.max_new));
    answer_window window;
    for (;;) {
      auto before = sim_->sequences().at(id.slot).max_new;
      if (sim_->extend(id, more)) {
        REQUIRE(sim_->sequences().at(id.slot).max_new == before + more);
        ++t_.extended;
        return;
      }
      ++t_.extend_rejected;
      std::vector<park_candidate> candidates;
      for (auto const& [s, q] : sim_->sequences())
        candidates.push_back({q.id,
                              q.phase,
                              static_cast<std::int64_t>(rng_() % 1000),
                              manager_->info(q.id).held_pages});
      auto k = window.choose_victim(
          candidates, manager_->pool().page_bytes(), std::numeric_limits<std::int64_t>::max());
      REQUIRE(k.has_value());  // the growing turn itself is a candidate
      auto victim = candidates[*k].id;
      REQUIRE((candidates[*k].phase == sequence_phase::ended ||
               candidates[*k].phase == sequence_phase::decode));
      start_park(victim);
      finish_park(parking_.size() - 1);
      parking_.pop_back();
      ++t_.growth_parks;
      if (victim == id) return;  // the growing turn left the GPU; it resumes later
    }
  }

  void free_one() {
    auto ids = sim_->ids();
    if (ids.empty()) return admit();
    auto id = pick(ids);
    sim_->free(id);
    graveyard(id);
    ++t_.frees;
    ++t_.calls;
  }

  void abort_mid_chunk() {
    auto pre = phase(sequence_phase::prefill);
    if (pre.empty()) return admit();
    auto id  = pick(pre);
    auto rem = sim_->sequences().at(id.slot).prompt_remaining;
    sim_->abort_mid_chunk(id, uniform(1, std::min(rem, cfg_.max_chunk)));
    graveyard(id);
    ++t_.aborts;
    t_.calls += 2;
  }

  /// Admits requests (small and large) until the pool refused several in a row; every refusal
  /// must leave the state unchanged. The pool then stays full for the following steps.
  void full_pool_burst() {
    int refusals = 0;
    for (int k = 0; k < 256 && refusals < 6; ++k) {
      bool small = rng_() % 2 == 0;
      auto N     = small ? uniform(1, 4) : uniform(1, cfg_.max_prompt);
      auto T     = small ? uniform(0, 2) : uniform(0, cfg_.max_new);
      if (admit_one(N, T))
        refusals = 0;
      else
        ++refusals;
    }
    ++t_.full_pool_bursts;
  }

  /// One misuse; it must throw `Exception` whose message holds `piece`, with nothing changed.
  template <class Exception, class Call>
  void expect_misuse(char const* piece, Call&& call) {
    auto ids    = sim_->ids();
    auto before = snapshot(*manager_, ids);
    bool threw  = false;
    std::string msg;
    try {
      call();
    } catch (Exception const& e) {
      msg   = e.what();
      threw = true;
    }
    INFO("misuse expected to throw with \"" << piece << "\", got: " << msg);
    REQUIRE(threw);
    REQUIRE(msg.find(piece) != std::string::npos);
    REQUIRE(snapshot(*manager_, ids) == before);
    ++t_.misuses;
    ++t_.misuse_by_kind[misuse_kind_];
    ++t_.calls;
  }

  void misuse() {
    auto& m      = *manager_;
    auto pre     = phase(sequence_phase::prefill);
    auto dec     = phase(sequence_phase::decode);
    auto end     = phase(sequence_phase::ended);
    auto live    = sim_->ids();
    misuse_kind_ = static_cast<std::size_t>(rng_() % storm_totals::misuse_kinds);
    switch (misuse_kind_) {
      case 0:  // stale handle (a freed sequence): every entry point refuses it
        if (!graveyard_.empty()) {
          auto id = graveyard_[rng_() % graveyard_.size()];
          if (m.contains(id)) break;
          switch (rng_() % 6) {
            case 0:
              expect_misuse<logic_error>("unknown sequence", [&] { m.free(id); });
              break;
            case 1:
              expect_misuse<logic_error>("unknown sequence", [&] { m.prepare_chunk(id, 1); });
              break;
            case 2:
              expect_misuse<logic_error>("unknown sequence", [&] { m.end_turn(id); });
              break;
            case 3:
              expect_misuse<logic_error>("unknown sequence",
                                         [&] { (void)m.continue_turn(id, 1, 1); });
              break;
            case 4:
              expect_misuse<logic_error>("unknown sequence", [&] { (void)m.fork(id); });
              break;
            default:
              expect_misuse<logic_error>("unknown sequence", [&] { m.set_batch({id}); });
              break;
          }
        }
        break;
      case 1: {  // unknown slot
        std::int32_t slot = rng_() % 2 ? -1 - static_cast<std::int32_t>(rng_() % 5)
                                       : m.max_sequences() + static_cast<std::int32_t>(rng_() % 5);
        expect_misuse<logic_error>("out of range", [&] { m.free(sequence_id{slot, 1}); });
        break;
      }
      case 2:  // commit without prepare
        if (!pre.empty()) {
          auto id = pick(pre);
          expect_misuse<logic_error>("no prepared chunk", [&] {
            m.commit_chunk(id, std::vector<std::int32_t>(static_cast<std::size_t>(LH_), 0));
          });
        }
        break;
      case 3:  // kept above the rule (or off the exact count), a second prepare, a wrong count;
               // then the engine aborts the request
        if (!pre.empty()) {
          auto id  = pick(pre);
          auto rem = sim_->sequences().at(id.slot).prompt_remaining;
          auto c   = uniform(1, std::min(rem, cfg_.max_chunk));
          m.prepare_chunk(id, c);
          ++t_.calls;
          std::vector<std::int32_t> kept(static_cast<std::size_t>(LH_));
          m.expected_kept(id, c, kept.data());
          auto h   = static_cast<std::size_t>(rng_() % kept.size());
          auto hk  = cfg_.plan.rules[h].kind;
          auto bad = kept;
          bad[h] += (hk == layer_kind::compressed || rng_() % 2) ? 1 : -1;
          if (bad[h] < 0) bad[h] = kept[h] + 1;
          expect_misuse<logic_error>(hk == layer_kind::compressed ? "between 0 and " : "exactly ",
                                     [&] { m.commit_chunk(id, bad); });
          expect_misuse<logic_error>("already has a prepared chunk",
                                     [&] { m.prepare_chunk(id, 1); });
          expect_misuse<invalid_argument>("counts (layers x KV heads)", [&] {
            m.commit_chunk(id, std::vector<std::int32_t>(kept.size() + 1, 0));
          });
          sim_->free(id);  // abort mid-chunk after the engine's failed commit
          graveyard(id);
          ++t_.aborts;
          ++t_.calls;
        }
        break;
      case 4:  // decode past T
        for (auto id : dec) {
          auto const& q = sim_->sequences().at(id.slot);
          if (q.decoded != q.max_new) continue;
          m.set_batch({id});
          expect_misuse<logic_error>("past the reservation", [&] { m.decode_step(); });
          break;
        }
        break;
      case 5:  // a batch listing a sequence twice
        if (!live.empty()) {
          auto id    = pick(live);
          auto batch = live;
          batch.push_back(id);
          std::shuffle(batch.begin(), batch.end(), rng_);
          if (batch.size() <= static_cast<std::size_t>(m.options().max_batch))
            expect_misuse<logic_error>("listed twice", [&] { m.set_batch(batch); });
        }
        break;
      case 6:  // a chunk longer than the prompt left
        if (!pre.empty()) {
          auto id  = pick(pre);
          auto rem = sim_->sequences().at(id.slot).prompt_remaining;
          if (sim_->elastic() && rem + 1 > m.options().max_chunk_tokens)  // the size check first
            expect_misuse<invalid_argument>("max_chunk_tokens",
                                            [&] { m.prepare_chunk(id, rem + 1); });
          else
            expect_misuse<logic_error>("prompt tokens left", [&] { m.prepare_chunk(id, rem + 1); });
        }
        break;
      case 7:  // turn calls in the wrong phase
        if (!pre.empty()) {
          auto id = pick(pre);
          switch (rng_() % 3) {
            case 0:
              expect_misuse<logic_error>("phase prefill", [&] { m.end_turn(id); });
              break;
            case 1:
              expect_misuse<logic_error>("end_turn first",
                                         [&] { (void)m.continue_turn(id, 1, 1); });
              break;
            default:
              expect_misuse<logic_error>("fork after the prompt", [&] { (void)m.fork(id); });
              break;
          }
        }
        break;
      case 8:  // decode with a member still in prefill
        if (!pre.empty()) {
          std::vector<sequence_id> batch;
          for (auto id : dec) {
            auto const& q = sim_->sequences().at(id.slot);
            if (q.decoded < q.max_new) batch.push_back(id);
          }
          batch.push_back(pick(pre));
          m.set_batch(batch);
          expect_misuse<logic_error>("not decode", [&] { m.decode_step(); });
        }
        break;
      case 9:  // double free
        if (!live.empty()) {
          auto id = pick(live);
          sim_->free(id);
          ++t_.frees;
          ++t_.calls;
          graveyard(id);
          expect_misuse<logic_error>("unknown sequence", [&] { m.free(id); });
        }
        break;
      case 10:  // a batch member freed after set_batch
        if (!dec.empty()) {
          auto id = pick(dec);
          std::vector<sequence_id> batch{id};
          for (auto d : dec)
            if (d != id && rng_() % 2) batch.push_back(d);
          m.set_batch(batch);
          sim_->free(id);
          ++t_.frees;
          ++t_.calls;
          graveyard(id);
          // Every entry point that reads the batch refuses it (freed pages, or another
          // sequence's once the slot is reused).
          switch (rng_() % 3) {
            case 0:
              expect_misuse<logic_error>("no longer a live sequence", [&] { m.decode_step(); });
              break;
            case 1:
              expect_misuse<logic_error>("no longer a live sequence", [&] { (void)m.view(); });
              break;
            default:
              expect_misuse<logic_error>("no longer a live sequence",
                                         [&] { export_flashinfer_layer(m, 0, fi_); });
              break;
          }
        }
        break;
      case 11:  // prepare in the wrong phase
        if (!end.empty())
          expect_misuse<logic_error>("phase ended", [&] { m.prepare_chunk(pick(end), 1); });
        else if (!dec.empty())
          expect_misuse<logic_error>("phase decode", [&] { m.prepare_chunk(pick(dec), 1); });
        break;
      case 12:  // bad and hostile sizes (zero, negative, near INT64_MAX): nothing changes
        bad_sizes(pre, end);
        break;
      case 14:  // elastic: a chunk above max_chunk_tokens; kept counts past the limit
        if (sim_->elastic() && !pre.empty()) elastic_misuse(pick(pre));
        break;
      case 15:  // parking: the wrong phase, a session of another plan or corrupted
        parking_misuse(pre, end);
        break;
      default:  // a stale generation on a live slot
        if (!live.empty()) {
          auto id = pick(live);
          sequence_id stale{id.slot, id.generation + 1 + static_cast<std::uint32_t>(rng_() % 3)};
          expect_misuse<logic_error>("generation", [&] { m.end_turn(stale); });
        }
        break;
    }
  }

  /// Parking misuse: park in prefill, complete or cancel a park that was never started, turn
  /// calls on a parking sequence (logic_error naming the phase), and a session whose
  /// fingerprint, page size or counts are wrong (invalid_argument naming the field).
  void parking_misuse(std::vector<sequence_id> const& pre, std::vector<sequence_id> const& end) {
    auto& m = *manager_;
    switch (rng_() % 4) {
      case 0:
        if (!pre.empty())
          expect_misuse<logic_error>("only an ended session or a turn in decode can be parked",
                                     [&, id = pick(pre)] { (void)m.park(id); });
        break;
      case 1:
        if (!end.empty()) {
          auto id = pick(end);
          if (rng_() % 2)
            expect_misuse<logic_error>("not parking", [&] { m.complete_park(id); });
          else
            expect_misuse<logic_error>("not parking", [&] { m.cancel_park(id); });
        }
        break;
      case 2: {
        std::vector<sequence_id> parking;
        for (auto const& e : parking_)
          if (m.contains(e.id)) parking.push_back(e.id);
        if (parking.empty()) break;
        auto id = pick(parking);
        if (rng_() % 2)
          expect_misuse<logic_error>("phase parking", [&] { (void)m.continue_turn(id, 1, 1); });
        else
          expect_misuse<logic_error>("phase parking", [&] { (void)m.fork(id); });
        break;
      }
      default:
        if (!parked_.empty()) {
          auto c = parked_[rng_() % parked_.size()].session;
          switch (rng_() % 3) {
            case 0:
              c.plan_fingerprint ^= 1;
              expect_misuse<invalid_argument>("session.plan_fingerprint",
                                              [&] { (void)m.try_unpark(c, 1, 0); });
              break;
            case 1:
              c.page_bytes *= 2;
              expect_misuse<invalid_argument>("session.page_bytes",
                                              [&] { (void)m.try_unpark(c, 1, 0); });
              break;
            default:
              c.group_pages[rng_() % c.group_pages.size()] += 1;
              expect_misuse<invalid_argument>("session.group_pages[",
                                              [&] { (void)m.try_unpark(c, 1, 0); });
              break;
          }
        }
        break;
    }
  }

  /// Elastic misuse on a prefilling request: a chunk above max_chunk_tokens (invalid_argument);
  /// then a prepared chunk whose commit keeps every candidate of every head when that makes the
  /// compressed groups exceed elastic_page_limit (logic_error "would hold"; when every candidate
  /// fits the limit there is no such commit to try); nothing changes, and the engine then commits
  /// a valid eviction of the same prepared chunk.
  void elastic_misuse(sequence_id id) {
    auto& m  = *manager_;
    auto mc  = m.options().max_chunk_tokens;
    auto big = mc + 1 + static_cast<std::int64_t>(rng_() % 5);
    expect_misuse<invalid_argument>("max_chunk_tokens", [&] { m.prepare_chunk(id, big); });
    auto rem = sim_->sequences().at(id.slot).prompt_remaining;
    auto c   = uniform(1, std::min(rem, cfg_.max_chunk));
    m.prepare_chunk(id, c);
    ++t_.calls;
    std::vector<std::int32_t> kept(static_cast<std::size_t>(LH_));
    m.expected_kept(id, c, kept.data());  // compressed heads: all their candidates
    auto P           = cfg_.plan.geometry.page_tokens;
    std::int64_t all = 0;
    for (auto const& grp : sim_->pooled_members()) {
      std::int32_t longest = 0;
      for (auto h : grp) longest = std::max(longest, kept[static_cast<std::size_t>(h)]);
      all += ceil_div(longest, P);
    }
    auto limit = m.elastic_page_limit(id);
    if (all > limit) {
      auto piece = "would hold " + std::to_string(all) + " pages";
      expect_misuse<logic_error>(piece.c_str(), [&] { m.commit_chunk(id, kept); });
      ++t_.limit_refusals;
    }
    sim_->chunk(id, c, true);  // the engine's valid eviction of the chunk still prepared
    ++t_.chunks;
    ++t_.calls;
    note_elastic();
  }

  /// A size from the edges of int64 (or just past a limit): sums with it overflow or exceed
  /// 2^31 - 1.
  std::int64_t hostile_size() {
    constexpr auto top = std::numeric_limits<std::int64_t>::max();
    switch (rng_() % 5) {
      case 0:
        return top;
      case 1:
        return top - static_cast<std::int64_t>(rng_() % 64);
      case 2:
        return (std::int64_t{1} << 62) + static_cast<std::int64_t>(rng_() % 64);
      case 3:
        return std::int64_t{1} << 31;
      default:  // past the cap with any N >= 1 or history n >= 1
        return std::numeric_limits<std::int32_t>::max();
    }
  }
  std::int64_t negative_size() {
    return rng_() % 2
               ? -1 - static_cast<std::int64_t>(rng_() % 8)
               : std::numeric_limits<std::int64_t>::min() + static_cast<std::int64_t>(rng_() % 8);
  }

  /// try_admit / continue_turn / prepare_chunk / expected_kept with sizes no sequence may have:
  /// each throws invalid_argument (or logic_error for a chunk past the prompt) and changes nothing
  /// (a rejected admission used to leak its slot; an overflowing N + T used to be admitted).
  void bad_sizes(std::vector<sequence_id> const& pre, std::vector<sequence_id> const& end) {
    auto& m         = *manager_;
    auto misuses_at = t_.misuses;
    switch (rng_() % 9) {
      case 0:
        expect_misuse<invalid_argument>("prompt_tokens", [&] { (void)m.try_admit(0, 1); });
        break;
      case 1: {
        auto T = negative_size();
        expect_misuse<invalid_argument>("max_new_tokens", [&] { (void)m.try_admit(1, T); });
        break;
      }
      case 2: {
        auto N = negative_size();
        expect_misuse<invalid_argument>("prompt_tokens", [&] { (void)m.try_admit(N, 1); });
        break;
      }
      case 3: {  // hostile prompt, max_new or both
        auto N = rng_() % 3 == 0 ? uniform(1, cfg_.max_prompt) : hostile_size();
        auto T = N <= cfg_.max_prompt || rng_() % 2 ? hostile_size() : uniform(1, cfg_.max_new + 1);
        expect_misuse<invalid_argument>("prompt_tokens + max_new_tokens",
                                        [&] { (void)m.try_admit(N, T); });
        break;
      }
      case 4:
        if (!end.empty()) {
          auto id = pick(end);
          auto N  = rng_() % 3 == 0 ? std::int64_t{1} : hostile_size();
          auto T  = N == 1 || rng_() % 2 ? hostile_size() : std::int64_t{0};
          expect_misuse<invalid_argument>("prompt_tokens + max_new_tokens",
                                          [&] { (void)m.continue_turn(id, N, T); });
        }
        break;
      case 5:
        if (!end.empty()) {
          auto id = pick(end);
          if (rng_() % 2)
            expect_misuse<invalid_argument>("prompt_tokens",
                                            [&] { (void)m.continue_turn(id, 0, 1); });
          else
            expect_misuse<invalid_argument>("max_new_tokens",
                                            [&] { (void)m.continue_turn(id, 1, negative_size()); });
        }
        break;
      case 6:
        if (!pre.empty()) {
          auto id = pick(pre);
          auto c  = rng_() % 2 ? std::int64_t{0} : negative_size();
          expect_misuse<invalid_argument>("chunk_tokens", [&] { m.prepare_chunk(id, c); });
        }
        break;
      case 7:
        if (!pre.empty()) {
          auto id = pick(pre);
          auto c  = hostile_size();
          if (sim_->elastic())  // beyond max_chunk_tokens: refused before the prompt check
            expect_misuse<invalid_argument>("max_chunk_tokens", [&] { m.prepare_chunk(id, c); });
          else
            expect_misuse<logic_error>("prompt tokens left", [&] { m.prepare_chunk(id, c); });
        }
        break;
      default:
        if (!pre.empty()) {
          auto id = pick(pre);
          std::vector<std::int32_t> kept(static_cast<std::size_t>(LH_));
          if (rng_() % 2)
            expect_misuse<invalid_argument>(
                "chunk_tokens", [&] { m.expected_kept(id, negative_size(), kept.data()); });
          else
            expect_misuse<logic_error>("prompt tokens left",
                                       [&] { m.expected_kept(id, hostile_size(), kept.data()); });
        }
        break;
    }
    t_.bad_sizes += t_.misuses - misuses_at;
  }

  // ----- journal mirror and FlashInfer export --------------------------------------------------

  void mirror_full_resync() {
    auto v = manager_->view();
    auto e = manager_->view_extents();
    m_offset_.assign(v.page_offset, v.page_offset + e.page_offset);
    m_pages_.assign(v.pages, v.pages + e.pages);
    m_base_.assign(v.head_base_len, v.head_base_len + e.head_base_len);
    m_appended_.assign(v.appended, v.appended + e.slots);
    m_tokens_.assign(v.seq_tokens, v.seq_tokens + e.slots);
    // Sized once for every batch: the largest set_batch accepts.
    REQUIRE(e.batch == manager_->options().max_batch);
    REQUIRE(e.batch >= 1);
    manager_->clear_view_changes();
  }

  /// An engine that mirrors the page tables from view_changes() only must see what the manager
  /// sees, for every live sequence.
  void check_journal() {
    auto& m = *manager_;
    auto c  = m.changes();
    auto v  = m.view();
    if (c.full_resync) {
      mirror_full_resync();
    } else {
      for (std::size_t k = 0; k < c.num_page_entries; ++k)
        m_pages_[static_cast<std::size_t>(c.page_entries[k])] = v.pages[c.page_entries[k]];
      for (std::size_t k = 0; k < c.num_slots; ++k) {
        auto s = static_cast<std::size_t>(c.slots[k]);
        for (std::size_t g = 0; g < static_cast<std::size_t>(G_); ++g)
          m_offset_[s * static_cast<std::size_t>(G_) + g] =
              v.page_offset[s * static_cast<std::size_t>(G_) + g];
        for (std::size_t h = 0; h < static_cast<std::size_t>(LH_); ++h)
          m_base_[s * static_cast<std::size_t>(LH_) + h] =
              v.head_base_len[s * static_cast<std::size_t>(LH_) + h];
      }
      for (std::size_t k = 0; k < c.num_counter_slots; ++k) {
        auto s         = static_cast<std::size_t>(c.counter_slots[k]);
        m_appended_[s] = v.appended[s];
        m_tokens_[s]   = v.seq_tokens[s];
      }
      m.clear_view_changes();
    }
    for (auto id : sim_->ids()) {
      auto s = static_cast<std::size_t>(id.slot);
      REQUIRE(m_appended_[s] == v.appended[s]);
      REQUIRE(m_tokens_[s] == v.seq_tokens[s]);
      for (std::int32_t h = 0; h < LH_; ++h)
        REQUIRE(m_base_[s * static_cast<std::size_t>(LH_) + static_cast<std::size_t>(h)] ==
                v.head_base_len[s * static_cast<std::size_t>(LH_) + static_cast<std::size_t>(h)]);
      for (std::int32_t g = 0; g < G_; ++g) {
        auto off = m_offset_[s * static_cast<std::size_t>(G_) + static_cast<std::size_t>(g)];
        REQUIRE(off ==
                v.page_offset[s * static_cast<std::size_t>(G_) + static_cast<std::size_t>(g)]);
        auto n     = m.group_page_count(id, g);
        auto pages = m.group_pages(id, g);
        for (std::int32_t p = 0; p < n; ++p)
          REQUIRE(m_pages_[static_cast<std::size_t>(off + p)] == pages[p]);
      }
    }
  }

  /// The FlashInfer CSR of a random layer lists, per (request, head), the head's length and the
  /// pages of its group (growing heads) at its column.
  void check_export() {
    auto& m  = *manager_;
    auto ids = sim_->ids();
    if (ids.empty()) return;
    m.set_batch(ids);
    auto layer =
        static_cast<std::int32_t>(check_rng_() % static_cast<std::uint32_t>(cfg_.plan.num_layers));
    export_flashinfer_layer(m, layer, fi_);
    auto H  = cfg_.plan.num_kv_heads;
    auto Hp = cfg_.plan.geometry.group_size;
    auto v  = m.view();
    REQUIRE(fi_.indptr.size() == ids.size() * static_cast<std::size_t>(H) + 1);
    for (std::size_t r = 0; r < ids.size(); ++r) {
      for (std::int32_t h = 0; h < H; ++h) {
        auto j   = r * static_cast<std::size_t>(H) + static_cast<std::size_t>(h);
        auto len = m.head_len(ids[r], layer, h);
        REQUIRE(fi_.kv_len(j) - fi_.first_page_skip[j] == len);
        auto hs = v.slot_of(layer, h);
        if (v.group_window[hs.group] > 0) continue;
        REQUIRE(fi_.first_page_skip[j] == 0);
        auto pages = m.group_pages(ids[r], hs.group);
        for (auto k = fi_.indptr[j]; k < fi_.indptr[j + 1]; ++k) {
          auto virt = fi_.indices[static_cast<std::size_t>(k)];
          REQUIRE(virt % (2 * Hp) == hs.column);
          REQUIRE(virt / (2 * Hp) == pages[k - fi_.indptr[j]]);
        }
      }
    }
  }

  storm_config const& cfg_;
  std::mt19937 rng_;
  std::mt19937 check_rng_{7};  ///< the checks' own draws: the walk is the same for any check_every
  std::int64_t check_every_;
  std::unique_ptr<memory_resource> resource_;
  std::unique_ptr<kv_cache_manager> manager_;
  std::unique_ptr<engine_sim> sim_;
  std::int32_t G_ = 0, LH_ = 0;
  std::vector<sequence_id> graveyard_;
  std::vector<sequence_id> forked_;  ///< parents and children of forks (may share pages)
  std::size_t misuse_kind_ = 0;
  struct parking_entry {  ///< a sequence between park and complete_park
    sequence_id id;
    parked_session session;
    std::vector<std::byte> host;
    bool copied = false;  ///< copied out already (else just before complete_park)
  };
  std::vector<parking_entry> parking_;
  std::vector<engine_sim::parked> parked_;  ///< sessions in host memory (restorable again)
  std::vector<std::int32_t> m_offset_, m_pages_, m_base_, m_appended_, m_tokens_;
  flashinfer_paged_kv fi_;
  storm_totals t_;
};

}  // namespace tangram::test
