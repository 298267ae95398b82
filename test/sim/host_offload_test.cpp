// SPDX-License-Identifier: Apache-2.0
// Issue 30: full_kv with host offload (vLLM's offloading connector, LMCache): the blocks the
// prefix cache evicts are reloaded over the host link instead of recomputed, within the host
// memory given; hand-worked on the scenarios of vllm_v1_test.cpp.
#include "../memory/memory_fixtures.hpp"
#include "tangram/eval/baselines/unified_paging.hpp"
#include "tangram/eval/sim/policies.hpp"
#include "tangram/eval/sim/replay.hpp"
#include "tangram/model/presets.hpp"
#include "test_support.hpp"

using namespace tangram;
using namespace tangram::sim;

namespace {

/// KV bytes that hold exactly `pages_per_layer` layer-wide pages for every layer of the plan.
double unified_kv_bytes(static_plan const& plan, std::int64_t pages_per_layer) {
  auto page = static_cast<double>(unified_paging_baseline::layer_geometry(plan).page_bytes());
  return page * static_cast<double>(pages_per_layer * plan.num_layers);
}

/// A (6P-token prompt, 2-token answer, 10 s of thinking, then a P-token follow-up) and B (arrives
/// at 1 s, 6P-token prompt) on 10 layer-wide pages a layer: B's admission evicts A's idle KV.
workload contended(std::int64_t P) {
  workload w;
  w.sessions.push_back({0.0, {{6 * P, 2, 10.0}, {P, 1, 0.0}}});
  w.sessions.push_back({1.0, {{6 * P, 2, 0.0}}});
  return w;
}

}  // namespace

TEST_CASE("full_kv with host offload reloads an evicted session instead of recomputing it",
          "[replay][offload][issue30]") {
  auto plan      = test::llama_plan("snapkv");
  std::int64_t P = plan.geometry.page_tokens;
  auto m         = model_preset("llama-3.1-8b");
  cost_model cost(m, gpu_spec{});
  auto w   = contended(P);
  auto run = [&](bool offload, double capacity_bytes) {
    unified_policy full(plan, unified_mode::full_kv, unified_kv_bytes(plan, 10), 2, 2, 1 << 20);
    replay_options o;
    o.offload.enabled        = offload;
    o.offload.capacity_bytes = capacity_bytes;
    auto r                   = replay(w, full, cost, o);
    CHECK(full.baseline().pool().used_pages() == 0);
    CHECK(r.time.sum() == Approx(r.modelled_makespan_s));
    CHECK(r.generated_tokens == 5);
    CHECK(r.completed_requests == 3);
    return r;
  };
  // A's whole history (6P + 2 tokens) is evicted once (vllm_v1_test.cpp). Recomputed without an
  // offload; reloaded with one, so A's second turn prefills only its P-token prompt.
  double history_bytes = static_cast<double>((6 * P + 2) * m.kv_bytes_per_token());
  auto none            = run(false, 256e9);
  CHECK(none.idle_evictions == 1);
  CHECK(none.recomputed_tokens == 6 * P + 2);
  CHECK(none.reloaded_tokens == 0);
  auto off = run(true, 256e9);
  CHECK(off.idle_evictions == 1);
  CHECK(off.recomputed_tokens == 0);
  CHECK(off.reloaded_tokens == 6 * P + 2);
  CHECK(off.prefilled_tokens == 6 * P + 6 * P + P);
  CHECK(off.host_offload_peak_bytes == Approx(history_bytes));
  CHECK(off.time.prefill_s < none.time.prefill_s);
  // Host memory that holds the history exactly is enough; one token less and it is dropped whole.
  CHECK(run(true, history_bytes).reloaded_tokens == 6 * P + 2);
  auto tight = run(true, history_bytes - 1);
  CHECK(tight.reloaded_tokens == 0);
  CHECK(tight.recomputed_tokens == 6 * P + 2);
  CHECK(tight.prefilled_tokens == none.prefilled_tokens);
}

TEST_CASE("full_kv with block eviction and host offload reloads exactly the evicted tail blocks",
          "[replay][offload][blocks][issue30]") {
  auto plan      = test::llama_plan("snapkv");
  std::int64_t P = plan.geometry.page_tokens;
  auto m         = model_preset("llama-3.1-8b");
  cost_model cost(m, gpu_spec{});
  auto run = [&](bool offload) {
    unified_policy full(plan, unified_mode::full_kv, unified_kv_bytes(plan, 10), 2, 2, 1 << 20);
    full.set_block_eviction(true);
    replay_options o;
    o.offload.enabled = offload;
    return replay(contended(P), full, cost, o);
  };
  // vllm_v1_test.cpp: A loses 3P + 1 tokens of tail blocks; they come back over the host link.
  auto none = run(false), off = run(true);
  CHECK(none.recomputed_tokens == 3 * P + 1);
  CHECK(off.prefix_blocks_evicted == none.prefix_blocks_evicted);
  CHECK(off.recomputed_tokens == 0);
  CHECK(off.reloaded_tokens == 3 * P + 1);
  CHECK(off.prefilled_tokens == none.prefilled_tokens - (3 * P + 1));
}

TEST_CASE("host offload applies to prefix caches only and its capacity is validated",
          "[replay][offload][issue30]") {
  auto plan      = test::llama_plan("snapkv");
  std::int64_t P = plan.geometry.page_tokens;
  auto m         = model_preset("llama-3.1-8b");
  cost_model cost(m, gpu_spec{});
  // The unified baseline keeps idle sessions resident: nothing of its is offloaded.
  unified_policy nonu(
      plan, unified_mode::compressed_reclaim, unified_kv_bytes(plan, 10), 2, 2, 1 << 20);
  replay_options o;
  o.offload.enabled = true;
  auto r            = replay(contended(P), nonu, cost, o);
  CHECK(r.reloaded_tokens == 0);
  CHECK(r.host_offload_peak_bytes == 0);
  o.offload.capacity_bytes = -1;
  unified_policy full(plan, unified_mode::full_kv, unified_kv_bytes(plan, 10), 2, 2, 1 << 20);
  CHECK_THROWS_WITH(replay(contended(P), full, cost, o),
                    Catch::Contains("replay.offload.capacity_bytes"));
}
