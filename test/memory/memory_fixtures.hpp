// SPDX-License-Identifier: Apache-2.0
// Plans shared by the memory, reliability and replay tests: a tiny hybrid model worked by hand,
// and the real Llama-3.1-8B plan from the bundled profiles (mu + 2 sigma budgets).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "tangram/io/retention_samples.hpp"
#include "tangram/memory/host_memory_resource.hpp"
#include "tangram/memory/kv_cache_manager.hpp"
#include "tangram/model/presets.hpp"
#include "tangram/plan/build_static_plan.hpp"
#include "tangram/plan/calibration.hpp"
#include "tangram/plan/static_plan.hpp"
#include "tangram/profile/budget_profile.hpp"
#include "tangram/profile/retention_samples.hpp"
#include "test_support.hpp"

namespace tangram::test {

/// Static per-group budgets. The fixtures' plans default to it (not to the library's default,
/// elastic): most memory tests check static reservation; elastic ones pass elastic_reservation.
inline reservation_options static_reservation() {
  reservation_options r;
  r.mode = reservation_mode::static_budgets;
  return r;
}

/// The plan of `model` from bundled samples (`samples_rel` under data/), budgets calibrated by the
/// library (mu + 2 sigma).
inline static_plan real_plan(model_spec const& model,
                             std::string const& samples_rel,
                             std::int32_t page_tokens,
                             std::int32_t group_size,
                             grouping_scope scope,
                             std::int32_t tp_size            = 1,
                             std::int32_t tp_rank            = 0,
                             reservation_options reservation = static_reservation()) {
  plan_options o;
  o.reservation = reservation;
  o.page_tokens = page_tokens;
  o.group_size  = group_size;
  o.scope       = scope;
  o.tp_size     = tp_size;
  o.tp_rank     = tp_rank;
  return build_static_plan(model, calibrate(load_retention_samples(data_path(samples_rel))), o);
}

/// The Llama-3.1-8B plan for one bundled scorer (P = 16, Hp = 4, global grouping by default).
inline static_plan llama_plan(std::string const& scorer,
                              std::int32_t page_tokens        = 16,
                              std::int32_t group_size         = 4,
                              reservation_options reservation = static_reservation()) {
  return real_plan(model_preset("llama-3.1-8b"),
                   "profiles/" + scorer + "/llama-3.1-8b-instruct.json",
                   page_tokens,
                   group_size,
                   grouping_scope::global,
                   1,
                   0,
                   reservation);
}

/// Elastic reservation at margin m (keep-ratio basis: all tokens).
inline reservation_options elastic_reservation(double margin) {
  reservation_options r;
  r.mode   = reservation_mode::elastic;
  r.margin = margin;
  return r;
}

/// Manager options with `pages` pages and `slots` sequence slots; everything else default.
inline manager_options opts(std::int64_t pages, std::int32_t slots) {
  manager_options o;
  o.num_pages     = pages;
  o.max_sequences = slots;
  return o;
}

/// Entries in the page lists of the compressed groups of `id` (`group_page_count`).
inline std::int64_t compressed_pages_held(kv_cache_manager const& m, sequence_id id) {
  std::int64_t pages = 0;
  for (std::int32_t g = 0; g < m.num_groups(); ++g)
    if (m.plan().grouping.groups[static_cast<std::size_t>(g)].rule.kind == layer_kind::compressed)
      pages += m.group_page_count(id, g);
  return pages;
}

/// Pages the compressed groups of `id` use: ceil(longest member's length / P) each, from the head
/// lengths (under elastic reservation, what `elastic_page_limit` bounds).
inline std::int64_t compressed_pages_used(kv_cache_manager const& m, sequence_id id) {
  auto const& plan = m.plan();
  std::int64_t P = plan.geometry.page_tokens, pages = 0;
  for (auto const& g : plan.grouping.groups) {
    if (g.rule.kind != layer_kind::compressed) continue;
    std::int64_t longest = 0;
    for (auto mem : g.members) longest = std::max(longest, m.head_len(id, mem.layer, mem.head));
    pages += (longest + P - 1) / P;
  }
  return pages;
}

/// Prefills `n` tokens of sequence `id` in one chunk and commits the kept counts the plan's rules
/// give (what a compressor at exactly its static budgets would produce).
inline void prefill(kv_cache_manager& m, sequence_id id, std::int64_t n) {
  std::vector<std::int32_t> kept(m.plan().rules.size());
  m.prepare_chunk(id, n);
  m.expected_kept(id, n, kept.data());
  m.commit_chunk(id, kept);
}

/// A sequence admitted with (N, T) and prefilled in one chunk (see prefill): in the decode phase.
inline sequence_id decoding(kv_cache_manager& m, std::int64_t N, std::int64_t T) {
  auto id = m.try_admit(N, T);
  REQUIRE(id);
  prefill(m, *id, N);
  REQUIRE(m.info(*id).phase == sequence_phase::decode);
  return *id;
}

/**
 * A tiny hybrid model, small enough to work by hand and to check token by token:
 * 4 layers x 4 KV heads, d = 4, f32; layer 0 and 3 compressed (profiled, protect = 1 sink + 2
 * window = 3), layer 1 sliding window W, layer 2 full attention left uncompressed.
 */
inline model_spec tiny_model(std::int32_t window = 10) {
  model_spec m;
  m.name            = "tiny";
  m.num_layers      = 4;
  m.num_query_heads = 8;
  m.num_kv_heads    = 4;
  m.head_dim        = 4;
  m.kv_dtype        = dtype::f32;
  m.layers          = uniform_layers(4);
  m.layers[1]       = {layer_kind::sliding_window, window};
  return m;
}

inline static_plan tiny_plan(std::vector<double> budgets,
                             std::int32_t page_tokens        = 4,
                             std::int32_t group_size         = 2,
                             std::int32_t window             = 10,
                             grouping_scope scope            = grouping_scope::global,
                             reservation_options reservation = static_reservation(),
                             double keep_ratio               = 0.5) {
  budget_profile p;
  p.target_keep_ratio = keep_ratio;
  p.model             = "tiny";
  p.num_model_layers  = 4;
  p.num_kv_heads      = 4;
  p.layer_ids         = {0, 3};
  p.sink_tokens       = 1;
  p.window_tokens     = 2;
  p.budgets           = std::move(budgets);
  plan_options o;
  o.page_tokens = page_tokens;
  o.group_size  = group_size;
  o.scope       = scope;
  o.reservation = reservation;
  return build_static_plan(tiny_model(window), p, o);
}

/// Default tiny budgets (8 compressed heads: layer 0 then layer 3).
inline std::vector<double> tiny_budgets() {
  return {0.5, 0.25, 0.75, 0.3, 0.45, 0.2, 0.6, 0.35};
}

/// The set-up most manager tests start from: a manager of the tiny plan (default budgets) over a
/// `Resource` (default-constructed), with options `o`. Owns the plan and the resource the manager
/// refers to; not copyable or movable (the manager holds references into it).
template <class Resource>
struct tiny_manager_on {
  static_plan plan = tiny_plan(tiny_budgets());
  Resource mr;
  kv_cache_manager m;

  explicit tiny_manager_on(manager_options const& o) : m(plan, mr, o) {}
  tiny_manager_on(tiny_manager_on const&)            = delete;
  tiny_manager_on& operator=(tiny_manager_on const&) = delete;
};

/// tiny_manager_on host memory.
using tiny_manager = tiny_manager_on<host_memory_resource>;

/// The tiny model's plans for 2 tensor-parallel ranks (P = 4, Hp = 2), static budgets: the
/// profile has no keep ratio, which elastic reservation needs.
inline std::vector<static_plan> tiny_tp_plans() {
  budget_profile p;
  p.num_model_layers = 4;
  p.num_kv_heads     = 4;
  p.layer_ids        = {0, 3};
  p.sink_tokens      = 1;
  p.window_tokens    = 2;
  p.budgets          = tiny_budgets();
  std::vector<static_plan> plans;
  for (std::int32_t rank = 0; rank < 2; ++rank) {
    plan_options o;
    o.reservation = static_reservation();
    o.page_tokens = 4;
    o.group_size  = 2;
    o.tp_size     = 2;
    o.tp_rank     = rank;
    plans.push_back(build_static_plan(tiny_model(), p, o));
  }
  return plans;
}

/// Pages each group of `id` holds, group by group.
template <class Manager>
std::vector<std::int32_t> group_page_counts(Manager const& m, sequence_id id) {
  std::vector<std::int32_t> out;
  for (std::int32_t g = 0; g < m.num_groups(); ++g) out.push_back(m.group_page_count(id, g));
  return out;
}

/// Each group's page target of `id`, group by group.
template <class Manager>
std::vector<std::int32_t> group_page_targets(Manager const& m, sequence_id id) {
  std::vector<std::int32_t> out;
  for (std::int32_t g = 0; g < m.num_groups(); ++g) out.push_back(m.group_target(id, g));
  return out;
}

}  // namespace tangram::test
