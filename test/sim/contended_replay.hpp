// SPDX-License-Identifier: Apache-2.0
// The replay the sim tests share: Llama-3.1-8B with the bundled SnapKV plan on a 40 GB GPU, where
// 24 mid-context sessions of 3 turns contend for KV memory; and pools sized in layer-wide pages.
#pragma once

#include <cstdint>

#include "../memory/memory_fixtures.hpp"
#include "tangram/eval/baselines/unified_paging.hpp"
#include "tangram/eval/sim/cost_model.hpp"
#include "tangram/eval/sim/workload.hpp"
#include "tangram/model/presets.hpp"

namespace tangram::test {

/// KV bytes that hold exactly `pages_per_layer` layer-wide pages for every layer of the plan.
inline double unified_kv_bytes(static_plan const& plan, std::int64_t pages_per_layer) {
  auto page = static_cast<double>(unified_paging_baseline::layer_geometry(plan).page_bytes());
  return page * static_cast<double>(pages_per_layer * plan.num_layers);
}

struct contended_replay {
  static_plan plan  = llama_plan("snapkv");
  model_spec model  = model_preset("llama-3.1-8b");
  sim::gpu_spec gpu = small_gpu();
  sim::cost_model cost{model, gpu};
  double kv            = gpu.kv_budget_bytes(model);
  sim::workload work   = sim::generate_workload(options());
  std::int64_t outputs = output_tokens(work);  ///< tokens the whole workload generates

  static sim::gpu_spec small_gpu() {
    sim::gpu_spec g;
    g.memory_bytes = 40e9;  // small GPU: memory is contended
    return g;
  }
  static sim::workload_options options() {
    sim::workload_options wo;
    wo.kind     = sim::workload_kind::mid_context;
    wo.sessions = 24;
    wo.turns    = 3;
    return wo;
  }
  static std::int64_t output_tokens(sim::workload const& w) {
    std::int64_t n = 0;
    for (auto const& s : w.sessions)
      for (auto const& t : s.turns) n += t.output_tokens;
    return n;
  }
};

}  // namespace tangram::test
