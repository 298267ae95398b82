// SPDX-License-Identifier: Apache-2.0
// kv_view_mirror's CUDA code (kernels/kv_view_mirror.cu, compiled here by the host compiler)
// against a fake CUDA runtime (shim/cuda_runtime_api.h) whose asynchronous copies run only when
// something waits for them and read their source then, as a DMA engine does. So these tests
// check, without a GPU, what the GPU tests check with one, and more: every sync's upload, when it
// finally runs on the "stream", leaves the device block equal to the host view as it was at that
// sync (a shadow rewritten under a pending copy would show), the waits the class documents, the
// error paths (no device, bad device_id, a pool on another device, a failed allocation, a failed
// copy) and moves.
#include <cuda_runtime_api.h>  // the fake: shim/ comes first on the include path

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "../../kernels/cuda_memory_resource.cu"
#include "../../kernels/kv_view_mirror.cu"
#include "../memory/memory_fixtures.hpp"
#include "storm/mirror_storms.hpp"
#include "tangram/eval/sim/simulated_memory_resource.hpp"
#include "tangram/memory/host_memory_resource.hpp"

using namespace tangram;
using namespace tangram::test;

namespace {

/// The packed image of the host view now (what the device block must hold after this sync).
std::vector<std::byte> image_of(kv_cache_manager const& m) {
  auto l = detail::mirror_layout::of(m.view_extents());
  std::vector<std::byte> out(static_cast<std::size_t>(l.total), std::byte{0});
  l.copy_from(m.view(batch_kind::decode), m.view(batch_kind::prefill), {0, l.total}, out.data());
  return out;
}

std::byte const* block_of(kv_view_mirror const& mirror) {
  return reinterpret_cast<std::byte const*>(mirror.view().head_slots);  // the first array
}

/// A mirror whose every upload is checked when the fake stream runs it.
class checked_mirror {
 public:
  checked_mirror(kv_cache_manager& m, std::uint32_t seed) : s_(std::make_unique<state>(m, seed)) {
    fake_cuda::state().on_record_run = [s = s_.get()](CUevent_st*) { s->record_ran(); };
  }
  checked_mirror(checked_mirror&&) = default;
  ~checked_mirror() {
    if (!s_) return;
    fake_cuda::run();  // every pending check, while this object is still whole
    CHECK(s_->expected.empty());
    fake_cuda::state().on_record_run = nullptr;
  }

  mirror_sync_kind sync(kv_cache_manager& m) {
    auto& s = *s_;
    s.mirror.sync(m, nullptr);
    // This sync's event record is the last op enqueued: when it runs, the block must be `now`.
    s.expected[fake_cuda::state().enqueued - 1] = image_of(m);
    // Let uploads pile up now and then: the class waits for the one two syncs back itself.
    if (s.rng() % 3 == 0) fake_cuda::run();
    return {s.mirror.last_sync_bytes() == static_cast<std::int64_t>(s.mirror.bytes()), false};
  }

 private:
  struct state {
    state(kv_cache_manager& m, std::uint32_t seed) : mirror(m, 0), rng(seed) {}
    kv_view_mirror mirror;
    std::mt19937 rng;
    std::map<std::int64_t, std::vector<std::byte>> expected;  ///< record position -> image
    // CHECK, not REQUIRE: this may run inside a destructor, which must not throw.
    void record_ran() {
      CHECK(!expected.empty());
      if (expected.empty()) return;
      auto it = expected.begin();  // records run in order: the oldest pending one
      auto n  = it->second.size();
      CHECK(n == mirror.bytes());
      if (n == mirror.bytes()) CHECK(std::memcmp(block_of(mirror), it->second.data(), n) == 0);
      expected.erase(it);
    }
  };
  std::unique_ptr<state> s_;
};

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (std::exception const& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace

TEST_CASE("kv_view_mirror (fake runtime): every upload leaves the block equal to its sync's view",
          "[fake_cuda][mirror]") {
  auto& fs    = fake_cuda::state();
  auto before = fs.waits_that_ran_work;
  auto t      = mirror_storms(6, 600, 9100, [](kv_cache_manager& m, std::mt19937& rng) {
    return checked_mirror(m, static_cast<std::uint32_t>(rng()));
  });
  INFO("syncs " << t.syncs << " full " << t.full << " incremental " << t.incremental);
  CHECK(t.incremental > 1000);
  CHECK(t.full >= 6);
  // The class had to wait for uploads two syncs back (the fake ran them then, checked).
  CHECK(fs.waits_that_ran_work - before > 100);
  CHECK(fs.queue.empty());
  CHECK(fs.device_blocks.empty());  // everything freed
  CHECK(fs.pinned_blocks.empty());
}

TEST_CASE("kv_view_mirror (fake runtime): construction errors name the call or the value",
          "[fake_cuda][mirror]") {
  tiny_manager_on<simulated_memory_resource> fx(opts(200, 8));
  auto& m          = fx.m;
  auto const& plan = fx.plan;
  auto& fs   = fake_cuda::state();
  fs.devices = 0;
  CHECK(error_of([&] { kv_view_mirror x(m, 0); }) ==
        "kv_view_mirror: cudaGetDeviceCount (no usable CUDA device) failed: cudaErrorNoDevice "
        "(fake failure)");
  fs.devices = 1;
  CHECK(error_of([&] { kv_view_mirror x(m, 1); }) ==
        "kv_view_mirror: device_id must be in [0, 1) (the CUDA devices of this process), got 1");
  CHECK(error_of([&] { kv_view_mirror x(m, -2); }).find("got -2") != std::string::npos);
  fs.fail_malloc_in = 0;
  CHECK(error_of([&] { kv_view_mirror x(m, 0); }) ==
        "kv_view_mirror: cudaMalloc of the mirror's device block failed: "
        "cudaErrorMemoryAllocation (fake failure)");
  CHECK(fs.device_blocks.empty());
  CHECK(fs.pinned_blocks.empty());

  // A device pool on device 1 mirrored on device 0.
  fs.devices = 2;
  {
    cuda_memory_resource gpu1(1);
    kv_cache_manager on1(plan, gpu1, opts(64, 4));
    CHECK(error_of([&] { kv_view_mirror x(on1, 0); }) ==
          "kv_view_mirror: the manager's pool is device memory on device 1 but device_id is 0");
    kv_view_mirror ok(on1, 1);
    CHECK(ok.view().pool == on1.pool().base());
    CHECK(ok.pool_kind() == memory_kind::device);
    CHECK(fs.current == 0);  // the caller's device is restored
  }
  fs.devices = 1;
  CHECK(fs.device_blocks.empty());
}

TEST_CASE("kv_view_mirror (fake runtime): sync errors, the documented waits, and moves",
          "[fake_cuda][mirror]") {
  auto plan = tiny_plan(tiny_budgets());
  host_memory_resource host;
  kv_cache_manager m(plan, host, opts(200, 8));
  kv_cache_manager other(plan, host, opts(200, 8));
  auto& fs = fake_cuda::state();
  kv_view_mirror mirror(m, 0);
  CHECK(mirror.bytes() == static_cast<std::size_t>(image_of(m).size()));
  CHECK(mirror.pinned_bytes() == 2 * mirror.bytes());
  CHECK(mirror.view().pool == m.pool().base());  // a host pool: its host pointer
  CHECK(mirror.pool_kind() == memory_kind::host);
  CHECK(mirror.view().batch_size == 0);
  auto check_block = [&] {
    fake_cuda::run();
    REQUIRE(std::memcmp(block_of(mirror), image_of(m).data(), mirror.bytes()) == 0);
  };

  auto a = *m.try_admit(20, 8);
  prefill(m, a, 20);
  m.set_batch({a});
  auto copies = fs.copies;
  mirror.sync(m, nullptr);  // the first: everything, one copy
  CHECK(fs.copies - copies == 1);
  CHECK(mirror.last_sync_copies() == 1);
  CHECK(mirror.last_sync_bytes() == static_cast<std::int64_t>(mirror.bytes()));
  CHECK(mirror.view().batch_size == 1);
  CHECK(fs.queue.size() == 2);  // the copy and the event: nothing ran, nothing waited
  check_block();

  // One sync per step waits only for the upload two syncs back.
  auto waits = fs.waits_that_ran_work;
  m.decode_step();
  mirror.sync(m, nullptr);
  m.decode_step();
  mirror.sync(m, nullptr);
  CHECK(fs.waits_that_ran_work == waits);  // both shadows were free
  CHECK(mirror.last_sync_copies() == 1);   // counters and page entries: one span
  CHECK(mirror.last_sync_bytes() < static_cast<std::int64_t>(mirror.bytes()));
  m.decode_step();
  mirror.sync(m, nullptr);  // shadow 1 again: its last upload (two syncs back) is still queued
  CHECK(fs.waits_that_ran_work == waits + 1);
  CHECK(fs.queue.size() == 4);  // the last two syncs' copy and event each
  check_block();

  // A mixed step: a prefill batch beside a decode batch padded to 4 (CUDA-graph capacity). Each
  // device view has its own slot list and batch size; every other array is shared.
  auto c = *m.try_admit(6, 2);
  m.set_batch(batch_kind::prefill, {c});
  m.set_batch(batch_kind::decode, {a}, 4);
  m.prepare_chunk(c, 6);
  m.decode_step();
  mirror.sync(m, nullptr);
  auto const& dv = mirror.view(batch_kind::decode);
  auto const& pv = mirror.view(batch_kind::prefill);
  CHECK(&dv == &mirror.view());
  CHECK(dv.batch_size == 4);
  CHECK(pv.batch_size == 1);
  CHECK(dv.padding_slot == 8);
  CHECK(pv.padding_slot == 8);
  CHECK(pv.pages == dv.pages);
  CHECK(pv.seq_tokens == dv.seq_tokens);
  CHECK(pv.batch_slots != dv.batch_slots);
  check_block();
  std::int32_t got[4];
  std::memcpy(got, dv.batch_slots, sizeof got);  // host memory in the fake runtime
  CHECK(got[0] == a.slot);
  CHECK(got[1] == 8);
  CHECK(got[3] == 8);
  std::memcpy(got, pv.batch_slots, sizeof(std::int32_t));
  CHECK(got[0] == c.slot);
  CHECK_THROWS_AS(mirror.view(static_cast<batch_kind>(2)), invalid_argument);
  // A freed prefill member: sync refuses (as for the decode batch) until the batch is set again.
  m.free(c);
  CHECK(error_of([&] { mirror.sync(m, nullptr); }).find("no longer a live sequence") !=
        std::string::npos);
  m.set_batch(batch_kind::prefill, {});
  m.set_batch({a});
  mirror.sync(m, nullptr);
  CHECK(mirror.view(batch_kind::prefill).batch_size == 0);
  CHECK(mirror.view().batch_size == 1);
  check_block();

  // Another manager; a freed batch member (nothing enqueued, the journal kept).
  CHECK(error_of([&] { mirror.sync(other, nullptr); }) ==
        "kv_view_mirror::sync: kv is not the manager this mirror was built for");
  auto b = *m.try_admit(4, 2);
  m.set_batch({b, a});
  m.free(b);
  auto pending = m.changes().num_counter_slots;
  REQUIRE(pending > 0);
  CHECK(error_of([&] { mirror.sync(m, nullptr); }).find("no longer a live sequence") !=
        std::string::npos);
  CHECK(fs.queue.empty());
  CHECK(m.changes().num_counter_slots == pending);
  m.set_batch({a});

  // A failed copy: cuda_error naming the call, journal kept, the next sync uploads everything.
  m.decode_step();
  fs.fail_memcpy_async_in = 0;
  CHECK(error_of([&] { mirror.sync(m, nullptr); }) ==
        "kv_view_mirror: sync: cudaMemcpyAsync failed: cudaErrorLaunchFailure (fake failure)");
  CHECK(m.changes().num_counter_slots > 0);
  mirror.sync(m, nullptr);
  CHECK(mirror.last_sync_bytes() == static_cast<std::int64_t>(mirror.bytes()));
  check_block();
  m.decode_step();
  mirror.sync(m, nullptr);  // the other shadow is refreshed in full too
  check_block();
  CHECK(mirror.last_sync_bytes() < static_cast<std::int64_t>(mirror.bytes()));

  // invalidate(): the next sync uploads everything.
  mirror.invalidate();
  mirror.sync(m, nullptr);
  CHECK(mirror.last_sync_bytes() == static_cast<std::int64_t>(mirror.bytes()));

  // Moves keep the device view; a moved-from mirror refuses to sync.
  auto v = mirror.view();
  kv_view_mirror moved(std::move(mirror));
  CHECK(moved.view().pages == v.pages);
  CHECK(moved.view().batch_size == v.batch_size);
  CHECK(error_of([&] { mirror.sync(m, nullptr); }) ==  // NOLINT(bugprone-use-after-move)
        "kv_view_mirror::sync: moved-from mirror");
  kv_view_mirror second(other, 0);
  second = std::move(moved);  // second's own block is freed, moved's taken over
  CHECK(second.view().pages == v.pages);
  m.decode_step();
  second.sync(m, nullptr);
  fake_cuda::run();
  CHECK(std::memcmp(block_of(second), image_of(m).data(), second.bytes()) == 0);
}
