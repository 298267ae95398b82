// SPDX-License-Identifier: Apache-2.0
// The counters of an operation storm (test/support/storm/driver.hpp): what the random walk did,
// so that each user can check it reached the paths it is meant to check.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

namespace tangram::test {

/// Counters of one storm (or a sum of storms).
struct storm_totals {
  std::int64_t ops      = 0;  ///< random steps (the op index of a violation counts these)
  std::int64_t calls    = 0;  ///< mutating manager calls issued (including misuse)
  std::int64_t admitted = 0, admit_rejected = 0;
  std::int64_t chunks = 0, decode_steps = 0, decode_tokens = 0;
  std::int64_t completed_turns = 0;  ///< turns ended with all T tokens decoded
  std::int64_t continued = 0, continue_rejected = 0;
  std::int64_t forks = 0, fork_rejected = 0;
  std::int64_t prefix_pins = 0, prefix_admits = 0, prefix_rejected = 0, prefix_misuses = 0;
  std::int64_t prefix_forks = 0;  ///< forks of a pinned prefix (their refusals: fork_rejected)
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
  std::int64_t parks = 0, park_cancels = 0;       ///< sessions parked (complete_park) / cancelled
  std::int64_t unparks = 0, unpark_rejected = 0;  ///< try_unpark that fit / did not
  std::int64_t running_parks = 0;                 ///< of the parks, turns parked in decode
  std::int64_t resumes = 0, resume_rejected = 0;  ///< try_resume that fit / did not
  std::int64_t growth_parks    = 0;               ///< victims parked so that a refused growth fits
  std::int64_t shared_parks    = 0;  ///< of the parks, sessions holding pages shared by a fork
  std::int64_t mixed_steps     = 0;  ///< steps with prefill chunks beside decodes
  std::int64_t padded_requests = 0;  ///< padding requests in the batches of mixed steps
  std::int64_t batch_changes   = 0;  ///< random set_batch calls (storm_op::set_batch)
  /// Misuse cases drawn by storm::misuse; padding misuse (after a padded mixed step) is counted
  /// at index misuse_kinds.
  static constexpr std::size_t misuse_kinds = 16;
  std::array<std::int64_t, misuse_kinds + 1> misuse_by_kind{};  ///< misuses per case

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
    prefix_pins += o.prefix_pins;
    prefix_admits += o.prefix_admits;
    prefix_rejected += o.prefix_rejected;
    prefix_misuses += o.prefix_misuses;
    prefix_forks += o.prefix_forks;
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
    shared_parks += o.shared_parks;
    mixed_steps += o.mixed_steps;
    padded_requests += o.padded_requests;
    batch_changes += o.batch_changes;
    for (std::size_t k = 0; k < misuse_by_kind.size(); ++k)
      misuse_by_kind[k] += o.misuse_by_kind[k];
  }
};

}  // namespace tangram::test
