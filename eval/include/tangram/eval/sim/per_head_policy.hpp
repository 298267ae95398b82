// SPDX-License-Identifier: Apache-2.0
/**
 * @file eval/sim/per_head_policy.hpp
 * @brief `per_head_dynamic`: the strongest dynamic compressor the replay compares Tangram with,
 * given every advantage a competent engine would have (issue 30):
 *
 * - per-head pages: every (layer, KV head) has its own page table and holds only its own length
 *   (no head is padded to its layer's longest), so memory is each input's exact per-head
 *   retention rounded up to a page per head;
 * - each input's own retention (`retention_needs`, from the samples: what a dynamic compressor
 *   keeps), compressed at every chunk, with dynamic reclamation (a chunk's pages are allocated
 *   whole, the tail beyond each head's kept length is freed after the eviction);
 * - admission by the estimated compressed size: the prompt's compressed footprint (the scorer's
 *   per-head share kbar(n), plan/elastic_reservation.hpp, for compressed heads; the rule's tokens
 *   for the others) plus one chunk in flight must fit, not the uncompressed prompt nor only its
 *   first chunk; decode allocates as tokens arrive (nothing reserved);
 * - a preempted request keeps its blocks as cache (as full_kv's do in vLLM v1): it resumes where it
 *   stopped unless they had to be evicted; idle sessions stay resident, and new sessions are
 *   admitted with the same continuation headroom as the other compressed policies.
 *
 * Its decode balance, re-planning and reads are priced by eval/sim/serving_costs.hpp like the
 * unified baseline's, on its own per-head lengths (`per_head_dynamic_name`).
 */
#pragma once

#include <cstdint>
#include <memory>

#include "tangram/eval/sim/policies.hpp"
#include "tangram/eval/sim/retention_needs.hpp"
#include "tangram/eval/sim/serving_costs.hpp"
#include "tangram/plan/elastic_reservation.hpp"
#include "tangram/plan/static_plan.hpp"

namespace tangram::sim {

/**
 * @brief The `per_head_dynamic` policy over `plan`'s model and rules (file comment): `own` gives
 * each input's retention (null: the plan's budgets), `estimate` the scorer's total for
 * admission, `scheduled_chunk` the largest prefill chunk that runs.
 * @throw invalid_argument as `unified_policy`, or for a bad `estimate`.
 */
inline std::unique_ptr<unified_policy> make_per_head_dynamic_policy(
    static_plan const& plan,
    double kv_bytes,
    std::int32_t max_sessions,
    std::int32_t num_sessions,
    std::int64_t max_tokens,
    std::shared_ptr<retention_needs const> own,
    scorer_total estimate,
    std::int64_t scheduled_chunk) {
  estimate.validate();
  unified_policy_options o;
  o.name           = per_head_dynamic_name;
  o.per_head       = true;
  o.estimate       = estimate;
  o.keep_preempted = true;
  auto p           = std::make_unique<unified_policy>(plan,
                                            unified_mode::compressed_reclaim,
                                            kv_bytes,
                                            max_sessions,
                                            num_sessions,
                                            max_tokens,
                                            std::move(own),
                                            std::move(o));
  p->set_scheduled_chunk(scheduled_chunk);
  return p;
}

/// The scorer's total per request of `plan`'s profile at keep ratio `keep` (the estimate a
/// per-head engine admits by): rho = keep, the profile's protected tokens, all tokens.
inline scorer_total estimated_scorer(static_plan const& plan, double keep) {
  return {keep, plan.profile.protected_tokens(), keep_ratio_basis::all_tokens};
}

}  // namespace tangram::sim
