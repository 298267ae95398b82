// SPDX-License-Identifier: Apache-2.0
// Argument checks shared by the CPU reference bindings and the CUDA launchers.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

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

/// The batch's chunk rows: chunk_indptr (`n` entries: batch + 1, host memory) from 0, each
/// request's rows equal to the chunk it prepared (prepare_chunk) in the manager's batch of `kind`.
inline void expect_prepared_chunks(kv_cache_manager const& kv, std::int32_t const* ptr,
                                   std::size_t n, batch_kind kind) {
  auto view = kv.view(kind);
  TANGRAM_EXPECTS(static_cast<std::int64_t>(n) == std::int64_t{view.batch_size} + 1,
                  invalid_argument, "chunk_indptr: expected ", view.batch_size + 1,
                  " elements, got ", n);
  TANGRAM_EXPECTS(ptr[0] == 0, invalid_argument, "chunk_indptr[0]: must be 0, got ", ptr[0]);
  for (std::int32_t r = 0; r < view.batch_size; ++r) {
    std::int64_t rows_r  = static_cast<std::int64_t>(ptr[r + 1]) - ptr[r];
    std::int64_t pending = kv.info(kv.batch_sequence(kind, r)).chunk_pending;
    TANGRAM_EXPECTS(rows_r == pending, invalid_argument, "chunk_indptr: request ", r, " has ",
                    rows_r, " rows but its prepared chunk (prepare_chunk) has ", pending,
                    " tokens");
  }
}

/// The elastic stage-key blocks of the manager's batch of `kind` (`tangram::stage_key_layout`
/// over the host view, the plan's rules and `chunk_indptr`, checked against the prepared chunks
/// first): `base` resized to [batch * G]. @return the words the stage keys must hold.
inline std::int64_t stage_key_layout_of(kv_cache_manager const& kv, std::int32_t const* ptr,
                                        std::size_t n, batch_kind kind,
                                        std::vector<std::int64_t>& base) {
  expect_prepared_chunks(kv, ptr, n, kind);
  auto view = kv.view(kind);
  base.assign(static_cast<std::size_t>(view.batch_size) * static_cast<std::size_t>(view.num_groups),
              0);
  return tangram::stage_key_layout(view, kv.plan().rules.data(), ptr, base.data());
}

/// The same with each request's chunk its prepared one (chunk_pending): for the CUDA launchers,
/// whose chunk_indptr lives on the device.
inline std::int64_t stage_key_layout_prepared(kv_cache_manager const& kv, batch_kind kind,
                                              std::vector<std::int64_t>& base) {
  auto view = kv.view(kind);
  std::vector<std::int32_t> ptr(static_cast<std::size_t>(view.batch_size) + 1, 0);
  for (std::int32_t r = 0; r < view.batch_size; ++r)
    ptr[static_cast<std::size_t>(r) + 1] =
        ptr[static_cast<std::size_t>(r)] +
        static_cast<std::int32_t>(kv.info(kv.batch_sequence(kind, r)).chunk_pending);
  return stage_key_layout_of(kv, ptr.data(), ptr.size(), kind, base);
}

/// Stage keys belong to elastic plans only: they must be given exactly when the plan reserves
/// elastically (`next` names the request-wide call that follows the staging).
inline void expect_stage_keys_rule(static_plan const& plan, bool given, char const* next) {
  bool elastic = plan.options.reservation.mode == reservation_mode::elastic;
  TANGRAM_EXPECTS(elastic == given, invalid_argument, "stage_keys: ",
                  elastic ? "the plan reserves elastically: pass stage_keys (uint32 "
                            "[KVCacheManager.stage_key_words(chunk_indptr, kind)], laid out like "
                            "the staged groups' page lists), then "
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
