// SPDX-License-Identifier: Apache-2.0
// stream_epochs' CUDA code (kernels/stream_epochs.cu, compiled here by the host compiler) against
// the fake CUDA runtime (shim/cuda_runtime_api.h), whose queued work runs only when something
// waits for it or fake_cuda::run(n) runs it, and whose cudaEventQuery never runs anything: so
// "the GPU has not reached this event yet" is a state the test holds as long as it likes. Checks
// that a page freed before an epoch's event is released exactly when that event ran (never
// before, never a wait in poll), the full-ring merge, the error paths, moves, and that no event
// leaks.
#include <cuda_runtime_api.h>  // the fake: shim/ comes first on the include path

#include <string>
#include <vector>

#include "../../kernels/stream_epochs.cu"
#include "../memory/memory_fixtures.hpp"
#include "tangram/eval/sim/simulated_memory_resource.hpp"

using namespace tangram;
using namespace tangram::test;

namespace {

template <class F>
std::string epochs_error_of(F&& f) {
  try {
    f();
  } catch (std::exception const& e) {
    return e.what();
  }
  return "no error";
}

manager_options deferred(std::int64_t pages, std::int32_t slots) {
  auto o           = opts(pages, slots);
  o.deferred_reuse = true;
  return o;
}

/// Admits and prefills a (20, 5) request on the tiny plan, then frees it: its pages retire.
std::int64_t admit_and_free(kv_cache_manager& m) {
  auto a = m.try_admit(20, 5);
  REQUIRE(a);
  prefill(m, *a, 20);
  auto used = m.pool().used_pages();
  m.free(*a);
  return used;
}

}  // namespace

TEST_CASE("stream_epochs (fake runtime): pages wait for their epoch's event, poll never waits",
          "[fake_cuda][stream_epochs]") {
  tiny_manager_on<simulated_memory_resource> fx(deferred(200, 4));
  auto& m  = fx.m;
  auto& fs = fake_cuda::state();
  fake_cuda::run();
  auto live0 = fs.events_live;
  {
    stream_epochs epochs(m, 4);
    CHECK(fs.events_live == live0 + 4);
    CHECK(epochs.capacity() == 4);
    CHECK(epochs.in_flight() == 0);
    CHECK(epochs.poll(m) == 0);  // nothing in flight

    // Step 0: pages freed, the step's work queued (one op standing for the kernels), end_step.
    auto freed0 = admit_and_free(m);
    REQUIRE(freed0 > 0);
    int src = 1, dst = 0;
    REQUIRE(cudaMemcpyAsync(&dst, &src, sizeof src, cudaMemcpyHostToDevice, nullptr) ==
            cudaSuccess);
    CHECK(epochs.end_step(m, nullptr) == 0);
    CHECK(m.current_epoch() == 1);
    CHECK(epochs.in_flight() == 1);

    // Step 1: more pages freed, its own event.
    auto freed1 = admit_and_free(m);
    CHECK(epochs.end_step(m, nullptr) == 1);
    CHECK(epochs.in_flight() == 2);
    CHECK(m.retired_pages() == freed0 + freed1);

    // The "GPU" has run nothing: poll releases nothing and runs nothing.
    auto executed = fs.executed, syncs = fs.event_syncs;
    CHECK(epochs.poll(m) == 0);
    CHECK(fs.executed == executed);
    CHECK(fs.event_syncs == syncs);
    CHECK(m.retired_pages() == freed0 + freed1);
    CHECK(m.released_epoch() == -1);

    // The copy and step 0's event ran: epoch 0 only.
    fake_cuda::run(2);
    CHECK(dst == 1);
    CHECK(epochs.poll(m) == freed0);
    CHECK(m.released_epoch() == 0);
    CHECK(m.retired_pages() == freed1);
    CHECK(epochs.in_flight() == 1);
    CHECK(epochs.poll(m) == 0);  // again: nothing more

    // Step 1's event ran.
    fake_cuda::run();
    CHECK(epochs.poll(m) == freed1);
    CHECK(m.released_epoch() == 1);
    CHECK(m.retired_pages() == 0);
    CHECK(epochs.in_flight() == 0);
    CHECK(fs.event_syncs == syncs);  // poll never waited
    CHECK(m.pool().free_pages() == 200);
    m.check_invariants();
  }
  CHECK(fs.events_live == live0);
}

TEST_CASE("stream_epochs (fake runtime): a full ring merges into its newest event, drain waits",
          "[fake_cuda][stream_epochs]") {
  tiny_manager_on<simulated_memory_resource> fx(deferred(200, 4));
  auto& m  = fx.m;
  auto& fs = fake_cuda::state();
  fake_cuda::run();
  auto waits0 = fs.stream_waits;
  stream_epochs epochs(m, 2);
  std::vector<std::int64_t> freed;
  for (int step = 0; step < 5; ++step) {
    freed.push_back(admit_and_free(m));
    CHECK(epochs.end_step(m, nullptr) == step);
  }
  // Two events: epoch 0, then epochs 1..4 merged into the second one (the stream waited on it
  // before each re-record); nothing ran, so nothing was released.
  CHECK(epochs.in_flight() == 2);
  CHECK(epochs.merged() == 3);
  CHECK(fs.stream_waits == waits0 + 3);
  CHECK(m.released_epoch() == -1);
  // Only epoch 0's event ran: epoch 0 alone.
  fake_cuda::run(1);
  CHECK(epochs.poll(m) == freed[0]);
  CHECK(m.released_epoch() == 0);
  // drain waits for the rest and releases epochs 1..4.
  auto syncs = fs.event_syncs;
  CHECK(epochs.drain(m) == freed[1] + freed[2] + freed[3] + freed[4]);
  CHECK(fs.event_syncs == syncs + 1);
  CHECK(m.released_epoch() == 4);
  CHECK(m.retired_pages() == 0);
  CHECK(epochs.in_flight() == 0);
  CHECK(epochs.drain(m) == 0);
  m.check_invariants();
}

TEST_CASE("stream_epochs (fake runtime): errors name the call or the value and change nothing",
          "[fake_cuda][stream_epochs]") {
  tiny_manager_on<simulated_memory_resource> fx(deferred(200, 4));
  auto& m          = fx.m;
  auto const& plan = fx.plan;
  auto& sim        = fx.mr;
  kv_cache_manager other(plan, sim, deferred(200, 4));
  auto& fs = fake_cuda::state();
  fake_cuda::run();
  auto live0 = fs.events_live;

  CHECK(epochs_error_of([&] { stream_epochs x(m, 0); }) ==
        "stream_epochs.max_in_flight: must be in [1, 65536], got 0");
  CHECK(epochs_error_of([&] { stream_epochs x(m, 65537); }).find("got 65537") != std::string::npos);
  fs.devices = 0;
  CHECK(epochs_error_of([&] { stream_epochs x(m); }) ==
        "stream_epochs: cudaGetDeviceCount (no usable CUDA device) failed: cudaErrorNoDevice "
        "(fake failure)");
  fs.devices = 1;
  CHECK(epochs_error_of([&] { stream_epochs x(m, 4, 1); }) ==
        "stream_epochs: device_id must be in [0, 1) (the CUDA devices of this process), got 1");
  fs.fail_event_create_in = 2;  // the third event fails: the two made are destroyed
  CHECK(epochs_error_of([&] { stream_epochs x(m, 4); }) ==
        "stream_epochs: cudaEventCreateWithFlags failed: cudaErrorMemoryAllocation (fake failure)");
  CHECK(fs.events_live == live0);
  CHECK(cudaGetLastError() == cudaSuccess);  // the error was cleared

  stream_epochs epochs(m, 3);
  // Another manager.
  CHECK(epochs_error_of([&] { epochs.end_step(other, nullptr); }) ==
        "stream_epochs::end_step: kv is not the manager this object was built for");
  CHECK(epochs_error_of([&] { epochs.poll(other); }) ==
        "stream_epochs::poll: kv is not the manager this object was built for");
  // A failed record: the epoch stays open, nothing is in flight.
  auto freed              = admit_and_free(m);
  fs.fail_event_record_in = 0;
  CHECK(epochs_error_of([&] { epochs.end_step(m, nullptr); }) ==
        "stream_epochs: cudaEventRecord failed: cudaErrorLaunchFailure (fake failure)");
  CHECK(m.current_epoch() == 0);
  CHECK(epochs.in_flight() == 0);
  CHECK(epochs.end_step(m, nullptr) == 0);
  // A failed query: nothing released, the epoch still in flight; the next poll releases it.
  fake_cuda::run();
  fs.fail_event_query_in = 0;
  CHECK(epochs_error_of([&] { epochs.poll(m); }) ==
        "stream_epochs: cudaEventQuery failed: cudaErrorLaunchFailure (fake failure)");
  CHECK(m.retired_pages() == freed);
  CHECK(epochs.in_flight() == 1);
  CHECK(epochs.poll(m) == freed);

  // Moves: the moved-to object carries the in-flight epochs; the moved-from one refuses calls.
  (void)admit_and_free(m);
  CHECK(epochs.end_step(m, nullptr) == 1);
  stream_epochs moved(std::move(epochs));
  CHECK(moved.in_flight() == 1);
  CHECK(epochs_error_of([&] { epochs.poll(m); }) ==
        "stream_epochs::poll: the object was moved from (it owns no events)");
  fake_cuda::run();
  CHECK(moved.poll(m) > 0);
  stream_epochs assigned(m, 1);
  assigned = std::move(moved);
  CHECK(assigned.capacity() == 3);
  CHECK(fs.events_live == live0 + 3);
}
