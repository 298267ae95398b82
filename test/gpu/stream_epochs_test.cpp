// SPDX-License-Identifier: Apache-2.0
// stream_epochs on a real device: pages a manager retired in an epoch stay retired while the
// stream has not reached that epoch's event (the stream is held at a host function behind a
// gate, so "not reached" is certain, not a matter of timing), and are released by the first poll
// after the stream passed it. Host code only, built by the host compiler into the GPU runner.
#include <cuda_runtime_api.h>

#include <atomic>
#include <vector>

#include "gpu_test.hpp"
#include "tangram/device/stream_epochs.hpp"
#include "tangram/memory/cuda_memory_resource.hpp"
#include "tangram/memory/kv_cache_manager.hpp"
#include "tangram/model/model_spec.hpp"
#include "tangram/plan/build_static_plan.hpp"

using namespace tangram;

namespace {

/// 2 layers x 2 KV heads, f32, layer 0 compressed, layer 1 full; static budgets.
static_plan epochs_plan() {
  model_spec m;
  m.name            = "epochs";
  m.num_layers      = 2;
  m.num_query_heads = 4;
  m.num_kv_heads    = 2;
  m.head_dim        = 8;
  m.kv_dtype        = dtype::f32;
  m.layers          = uniform_layers(2);
  budget_profile p;
  p.target_keep_ratio = 0.5;
  p.model             = "epochs";
  p.num_model_layers  = 2;
  p.num_kv_heads      = 2;
  p.layer_ids         = {0};
  p.sink_tokens       = 1;
  p.window_tokens     = 2;
  p.budgets           = {0.5, 0.25};
  plan_options o;
  o.page_tokens      = 4;
  o.group_size       = 2;
  o.reservation.mode = reservation_mode::static_budgets;
  return build_static_plan(m, p, o);
}

/// Holds a stream at a host function until `open()` (or destruction, so a failed check never
/// leaves the stream blocked).
class stream_gate {
 public:
  explicit stream_gate(cudaStream_t s) : stream_(s) {
    ok_ = cudaLaunchHostFunc(
              s,
              [](void* g) {
                auto* flag = static_cast<std::atomic<bool>*>(g);
                while (!flag->load()) {
                }
              },
              &open_) == cudaSuccess;
  }
  ~stream_gate() {
    open();
    (void)cudaStreamSynchronize(stream_);
  }
  void open() { open_.store(true); }
  [[nodiscard]] bool ok() const { return ok_; }

 private:
  cudaStream_t stream_;
  std::atomic<bool> open_{false};
  bool ok_ = false;
};

/// Admits and prefills a (20, 4) request, then frees it: its pages retire. @return the pages.
std::int64_t admit_and_free(kv_cache_manager& m) {
  auto a = m.try_admit(20, 4);
  GPU_REQUIRE(a.has_value());
  std::vector<std::int32_t> kept(m.plan().rules.size());
  m.prepare_chunk(*a, 20);
  m.expected_kept(*a, 20, kept.data());
  m.commit_chunk(*a, kept);
  auto used = m.pool().used_pages();
  m.free(*a);
  return used;
}

}  // namespace

TANGRAM_GPU_TEST("stream_epochs: retired pages wait for their epoch's event on the stream",
                 "[stream_epochs]") {
  cuda_memory_resource gpu(0);
  manager_options o;
  o.num_pages      = 64;
  o.max_sequences  = 4;
  o.deferred_reuse = true;
  kv_cache_manager m(epochs_plan(), gpu, o);
  cudaStream_t stream = nullptr;
  GPU_REQUIRE(cudaStreamCreate(&stream) == cudaSuccess);
  {
    stream_epochs epochs(m, 4, 0);
    stream_gate gate(stream);
    GPU_REQUIRE(gate.ok());
    auto freed0 = admit_and_free(m);
    GPU_REQUIRE(freed0 > 0);
    GPU_CHECK(epochs.end_step(m, stream) == 0);
    auto freed1 = admit_and_free(m);
    GPU_CHECK(epochs.end_step(m, stream) == 1);
    // The stream is held before both events: polling releases nothing (and does not wait).
    for (int k = 0; k < 3; ++k) GPU_CHECK(epochs.poll(m) == 0);
    GPU_CHECK(m.retired_pages() == freed0 + freed1);
    gate.open();
    GPU_REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
    GPU_CHECK(epochs.poll(m) == freed0 + freed1);
    GPU_CHECK(m.retired_pages() == 0);
    GPU_CHECK(m.released_epoch() == 1);
    GPU_CHECK(epochs.in_flight() == 0);
    GPU_CHECK(m.pool().free_pages() == 64);
    m.check_invariants();
  }
  GPU_CHECK(cudaStreamDestroy(stream) == cudaSuccess);
}
