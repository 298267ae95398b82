// SPDX-License-Identifier: Apache-2.0
/**
 * @file eval/sim/chunk_eviction.hpp
 * @brief The eviction step of `tangram_policy` (eval/sim/policies.hpp), between a prefill chunk's
 * `prepare_chunk` and its `commit_chunk`: what each head keeps. Without one the policy keeps
 * `expected_kept` (the static budgets' fused eviction); the elastic policy
 * (eval/sim/elastic_policy.hpp) plugs in the group-length selection.
 */
#pragma once

#include <cstdint>
#include <vector>

#include "tangram/memory/kv_cache_manager.hpp"

namespace tangram::sim {

/// @brief Chooses the per-head kept counts of one prepared prefill chunk.
class chunk_eviction {
 public:
  virtual ~chunk_eviction() = default;

  /**
   * @brief Called after `prepare_chunk(seq, chunk_tokens)` of workload session `session`: `kept`
   * holds the manager's `expected_kept` (L * H counts, [layer * H + head]); overwrite it with the
   * counts to commit.
   * @return HBM bytes the eviction moves outside the forward pass (modelled; 0 when fused).
   */
  virtual double choose(kv_cache_manager const& manager,
                        sequence_id seq,
                        std::int32_t session,
                        std::int64_t chunk_tokens,
                        std::vector<std::int32_t>& kept) = 0;
};

}  // namespace tangram::sim
