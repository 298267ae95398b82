// SPDX-License-Identifier: Apache-2.0
// Issue 30: full_kv with host offload (vLLM's offloading connector, LMCache): the blocks the
// prefix cache evicts are reloaded over the host link instead of recomputed, within the host
// memory given; hand-worked on the scenarios of vllm_v1_test.cpp.
#include "../memory/memory_fixtures.hpp"
#include "contended_replay.hpp"
#include "tangram/eval/sim/policies.hpp"
#include "tangram/eval/sim/replay.hpp"
#include "tangram/model/presets.hpp"
#include "test_support.hpp"

using namespace tangram;
using namespace tangram::sim;

namespace {

/// A (6P-token prompt, 2-token answer, 10 s of thinking, then a P-token follow-up) and B (arrives
/// at 1 s, 6P-token prompt) on 10 layer-wide pages a layer: B's admission evicts A's idle KV.
struct contended_pair {
  static_plan plan = test::llama_plan("snapkv");
  std::int64_t P   = plan.geometry.page_tokens;
  model_spec model = model_preset("llama-3.1-8b");
  cost_model cost{model, gpu_spec{}};
  workload work;

  contended_pair() {
    work.sessions.push_back({0.0, {{6 * P, 2, 10.0}, {P, 1, 0.0}}});
    work.sessions.push_back({1.0, {{6 * P, 2, 0.0}}});
  }
  /// One replay of `mode` on 10 pages a layer; full_kv evicting whole sessions or tail blocks.
  replay_result run(unified_mode mode,
                    bool offload,
                    double capacity_bytes = 256e9,
                    bool blocks           = false) {
    unified_policy p(plan, mode, test::unified_kv_bytes(plan, 10), 2, 2, 1 << 20);
    p.set_block_eviction(blocks);
    replay_options o;
    o.offload.enabled        = offload;
    o.offload.capacity_bytes = capacity_bytes;
    auto r                   = replay(work, p, cost, o);
    CHECK(p.baseline().pool().used_pages() == 0);
    CHECK(r.time.sum() == Approx(r.modelled_makespan_s));
    CHECK(r.generated_tokens == 5);
    CHECK(r.completed_requests == 3);
    return r;
  }
};

}  // namespace

TEST_CASE("full_kv with host offload reloads an evicted session instead of recomputing it",
          "[replay][offload][issue30]") {
  contended_pair fx;
  auto P = fx.P;
  // A's whole history (6P + 2 tokens) is evicted once (vllm_v1_test.cpp). Recomputed without an
  // offload; reloaded with one, so A's second turn prefills only its P-token prompt.
  double history_bytes = static_cast<double>((6 * P + 2) * fx.model.kv_bytes_per_token());
  auto none            = fx.run(unified_mode::full_kv, false);
  CHECK(none.idle_evictions == 1);
  CHECK(none.recomputed_tokens == 6 * P + 2);
  CHECK(none.reloaded_tokens == 0);
  auto off = fx.run(unified_mode::full_kv, true);
  CHECK(off.idle_evictions == 1);
  CHECK(off.recomputed_tokens == 0);
  CHECK(off.reloaded_tokens == 6 * P + 2);
  CHECK(off.prefilled_tokens == 6 * P + 6 * P + P);
  CHECK(off.host_offload_peak_bytes == Approx(history_bytes));
  CHECK(off.time.prefill_s < none.time.prefill_s);
  // Host memory that holds the history exactly is enough; one byte less and it is dropped whole.
  CHECK(fx.run(unified_mode::full_kv, true, history_bytes).reloaded_tokens == 6 * P + 2);
  auto tight = fx.run(unified_mode::full_kv, true, history_bytes - 1);
  CHECK(tight.reloaded_tokens == 0);
  CHECK(tight.recomputed_tokens == 6 * P + 2);
  CHECK(tight.prefilled_tokens == none.prefilled_tokens);
}

TEST_CASE("full_kv with block eviction and host offload reloads exactly the evicted tail blocks",
          "[replay][offload][blocks][issue30]") {
  contended_pair fx;
  auto P = fx.P;
  // vllm_v1_test.cpp: A loses 3P + 1 tokens of tail blocks; they come back over the host link.
  auto none = fx.run(unified_mode::full_kv, false, 256e9, true);
  auto off  = fx.run(unified_mode::full_kv, true, 256e9, true);
  CHECK(none.recomputed_tokens == 3 * P + 1);
  CHECK(off.prefix_blocks_evicted == none.prefix_blocks_evicted);
  CHECK(off.recomputed_tokens == 0);
  CHECK(off.reloaded_tokens == 3 * P + 1);
  CHECK(off.prefilled_tokens == none.prefilled_tokens - (3 * P + 1));
}

TEST_CASE("host offload applies to prefix caches only and its capacity is validated",
          "[replay][offload][issue30]") {
  contended_pair fx;
  // The unified baseline keeps idle sessions resident: nothing of its is offloaded.
  auto r = fx.run(unified_mode::compressed_reclaim, true);
  CHECK(r.reloaded_tokens == 0);
  CHECK(r.host_offload_peak_bytes == 0);
  unified_policy full(
      fx.plan, unified_mode::full_kv, test::unified_kv_bytes(fx.plan, 10), 2, 2, 1 << 20);
  replay_options o;
  o.offload.enabled        = true;
  o.offload.capacity_bytes = -1;
  CHECK_THROWS_WITH(replay(fx.work, full, fx.cost, o),
                    Catch::Contains("replay.offload.capacity_bytes"));
}
