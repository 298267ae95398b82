// SPDX-License-Identifier: Apache-2.0
// Argument checks shared by the CPU reference bindings and the CUDA launchers.
#pragma once

#include <cstdint>
#include <string>

#include "tangram/core/detail/str.hpp"
#include "tangram/core/error.hpp"
#include "tangram/kernels/eviction.hpp"
#include "tangram/memory/kv_cache_manager.hpp"
#include "tangram/plan/static_plan.hpp"

namespace tangram::python {

/// The layer index, checked before anything is indexed with it.
inline void expect_layer(static_plan const& plan, std::int32_t layer) {
  TANGRAM_EXPECTS(layer >= 0 && layer < plan.num_layers, invalid_argument,
                  "layer: must be in [0, ", plan.num_layers, "), got ", layer);
}

/// The eviction score source named `name` (supplied, snapkv, key_norm).
inline score_source source_named(std::string const& name) {
  for (auto s : {score_source::supplied, score_source::snapkv, score_source::key_norm})
    if (to_string(s) == name) return s;
  TANGRAM_FAIL(invalid_argument, "source: unknown score source ", detail::quoted(name),
               " (expected supplied, snapkv or key_norm)");
}

/// Words of the elastic slot-key array of `kv`'s pool (`tangram::slot_key_words` over the plan's
/// geometry and the pool's pages): one uint32 per pool slot, allocated once beside the pool.
inline std::int64_t pool_slot_key_words(kv_cache_manager const& kv) {
  return tangram::slot_key_words(kv.plan().geometry, kv.pool().capacity());
}

/// Slot keys belong to elastic plans only: they must be given exactly when the plan reserves
/// elastically (`next` names the request-wide call that follows the staging).
inline void expect_slot_keys_rule(static_plan const& plan, bool given, char const* next) {
  bool elastic = plan.options.reservation.mode == reservation_mode::elastic;
  TANGRAM_EXPECTS(elastic == given, invalid_argument, "slot_keys: ",
                  elastic ? "the plan reserves elastically: pass slot_keys (uint32 "
                            "[KVCacheManager.slot_key_words], one per pool slot, allocated once "
                            "beside the pool), then "
                          : "only for a plan with elastic reservation (this one is static)",
                  elastic ? next : "");
}

/// The request-wide elastic step (`who`) needs an elastic plan.
inline void expect_elastic_plan(static_plan const& plan, char const* who) {
  TANGRAM_EXPECTS(plan.options.reservation.mode == reservation_mode::elastic, invalid_argument,
                  who, ": the plan reserves static budgets (the per-layer eviction already "
                  "selected)");
}

/// Every head of `layer` that takes candidates (not a sliding-window ring) has at most
/// `max_candidates` of them (held tokens + its request's prepared chunk): the eviction would
/// otherwise skip it with new_len -1 after rewriting the others. Checked on the host, before any
/// launch, from the manager's batch of `kind`.
inline void expect_candidates_fit(kv_cache_manager const& kv, std::int32_t layer,
                                  std::int32_t max_candidates,
                                  batch_kind kind = batch_kind::decode) {
  TANGRAM_EXPECTS(max_candidates >= 1, invalid_argument, "max_candidates: must be >= 1, got ",
                  max_candidates);
  auto view = kv.view(kind);
  for (std::int32_t r = 0; r < view.batch_size; ++r) {
    auto seq           = kv.batch_sequence(kind, r);
    std::int64_t chunk = kv.info(seq).chunk_pending;
    if (chunk <= 0) continue;
    for (std::int32_t h = 0; h < view.num_kv_heads; ++h) {
      if (view.group_window[view.slot_of(layer, h).group] > 0) continue;
      std::int64_t candidates = static_cast<std::int64_t>(kv.head_len(seq, layer, h)) + chunk;
      TANGRAM_EXPECTS(candidates <= max_candidates, invalid_argument, "max_candidates: ",
                      max_candidates, " is below the ", candidates,
                      " candidates (held + chunk) of request ", r, ", layer ", layer, ", head ", h);
    }
  }
}

}  // namespace tangram::python
