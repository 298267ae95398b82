// SPDX-License-Identifier: Apache-2.0
// kv_view_mirror on a real device: a random storm of manager operations with one sync per step
// (the stream delayed now and then, so uploads are still pending when the next syncs run), the
// device block read back and compared with every host array; decode attention launched through
// mirror.view() against the CPU reference; and the documented errors. Host code only (the class
// is host-compilable), built by the host compiler into the GPU test runner.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "device_buffer.cuh"
#include "gpu_test.hpp"
#include "tangram/device/kv_view_mirror.hpp"
#include "tangram/kernels/decode_attention.hpp"
#include "tangram/memory/cuda_memory_resource.hpp"
#include "tangram/memory/host_memory_resource.hpp"
#include "tangram/memory/kv_cache_manager.hpp"
#include "tangram/model/model_spec.hpp"
#include "tangram/plan/build_static_plan.hpp"
#include "tangram/reference/decode_attention.hpp"

using namespace tangram;
using tangram::test::cuda_check;
using tangram::test::device_buffer;

namespace {

/// 4 layers x 4 KV heads, GQA 2, f32: layers 0 and 3 compressed, 1 sliding (W = 24), 2 full.
static_plan hybrid_plan(std::int32_t head_dim, std::int32_t page_tokens) {
  model_spec m;
  m.name            = "mirror";
  m.num_layers      = 4;
  m.num_query_heads = 8;
  m.num_kv_heads    = 4;
  m.head_dim        = head_dim;
  m.kv_dtype        = dtype::f32;
  m.layers          = uniform_layers(4);
  m.layers[1]       = {layer_kind::sliding_window, 24};
  budget_profile p;
  p.target_keep_ratio = 0.5;
  p.model             = "mirror";
  p.num_model_layers  = 4;
  p.num_kv_heads      = 4;
  p.layer_ids         = {0, 3};
  p.sink_tokens       = 1;
  p.window_tokens     = 2;
  p.budgets           = {0.5, 0.25, 0.75, 0.3, 0.45, 0.2, 0.6, 0.35};
  plan_options o;
  o.page_tokens      = page_tokens;
  o.group_size       = 2;
  o.reservation.mode = reservation_mode::static_budgets;  // the rules' kept counts are committed
  return build_static_plan(m, p, o);
}

/// Waits for `stream`, downloads the mirror's block and compares every array with the host view.
void require_mirrored(kv_view_mirror const& mirror, kv_cache_manager const& kv, cudaStream_t s) {
  cuda_check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
  auto layout = detail::mirror_layout::of(kv.view_extents());
  GPU_REQUIRE(mirror.bytes() == static_cast<std::size_t>(layout.total));
  std::vector<std::byte> dev(mirror.bytes());
  // head_slots is the block's first array: its pointer is the block's start.
  cuda_check(cudaMemcpy(dev.data(), mirror.view().head_slots, dev.size(), cudaMemcpyDeviceToHost),
             "cudaMemcpy D2H");
  auto v = kv.view(batch_kind::decode), pv = kv.view(batch_kind::prefill);
  for (std::size_t a = 0; a < detail::mirror_array_count; ++a) {
    auto const* host =
        detail::mirror_layout::host_array(v, pv, static_cast<detail::mirror_array>(a));
    auto n           = static_cast<std::size_t>(layout.bytes[a]);
    GPU_REQUIRE_MSG(n == 0 || std::memcmp(host, dev.data() + layout.offset[a], n) == 0,
                    "array " << a << " of the device block differs from the host view");
  }
  GPU_REQUIRE(mirror.view().batch_size == kv.batch_size());
  GPU_REQUIRE(mirror.view(batch_kind::prefill).batch_size == kv.batch_size(batch_kind::prefill));
  GPU_REQUIRE(mirror.view(batch_kind::prefill).pages == mirror.view().pages);
}

void CUDART_CB sleep_1ms(void*) {
  std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

std::int64_t uniform(std::mt19937& rng, std::int64_t lo, std::int64_t hi) {
  return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng);
}

/// Prefills one chunk of `c` tokens with the kept counts the plan's rules give.
void chunk(kv_cache_manager& kv, sequence_id id, std::int64_t c) {
  std::vector<std::int32_t> kept(kv.plan().rules.size());
  kv.prepare_chunk(id, c);
  kv.expected_kept(id, c, kept.data());
  kv.commit_chunk(id, kept);
}

struct stream_guard {
  cudaStream_t s = nullptr;
  stream_guard() { cuda_check(cudaStreamCreate(&s), "cudaStreamCreate"); }
  ~stream_guard() { (void)cudaStreamDestroy(s); }
};

}  // namespace

TANGRAM_GPU_TEST("kv_view_mirror: a random storm keeps the device arrays equal to the host view",
                 "[gpu][mirror]") {
  auto plan = hybrid_plan(4, 4);
  cuda_memory_resource gpu(0);
  manager_options o;
  o.num_pages        = 300;
  o.max_sequences    = 8;
  o.max_batch        = 6;
  o.index_capacity   = 340;  // small: the arena repacks (full resync) now and then
  o.max_view_changes = 24;   // small: a long chunk overflows the journal (full resync)
  kv_cache_manager kv(plan, gpu, o);
  kv_view_mirror mirror(kv, 0);
  GPU_REQUIRE(mirror.device_id() == 0);
  GPU_REQUIRE(mirror.pool_kind() == memory_kind::device);
  GPU_REQUIRE(mirror.view().pool == kv.pool().base());
  GPU_REQUIRE(mirror.pinned_bytes() == 2 * mirror.bytes());
  kv_cache_view const first = mirror.view();
  stream_guard stream;
  std::mt19937 rng(11);
  std::vector<sequence_id> live;
  auto in_phase = [&](sequence_phase ph) {
    std::vector<sequence_id> out;
    for (auto id : live)
      if (kv.info(id).phase == ph) out.push_back(id);
    return out;
  };
  auto pick         = [&](std::vector<sequence_id> const& v) { return v[rng() % v.size()]; };
  auto random_batch = [&] {
    auto ids = live;
    std::shuffle(ids.begin(), ids.end(), rng);
    ids.resize(std::min<std::size_t>(ids.size(), static_cast<std::size_t>(uniform(rng, 0, 6))));
    kv.set_batch(ids);
  };
  std::int64_t incremental = 0, checks = 0, resyncs = 0;
  for (int step = 0; step < 800; ++step) {
    int op = static_cast<int>(rng() % 100);
    if (op < 15) {
      if (auto id = kv.try_admit(uniform(rng, 1, 40), uniform(rng, 0, 20))) live.push_back(*id);
    } else if (op < 35) {
      auto pre = in_phase(sequence_phase::prefill);
      if (!pre.empty()) {
        auto id = pick(pre);
        chunk(kv, id, uniform(rng, 1, kv.info(id).prompt_remaining));
      }
    } else if (op < 62) {
      std::vector<sequence_id> batch;
      for (auto id : in_phase(sequence_phase::decode)) {
        auto i = kv.info(id);
        if (i.decoded < i.max_new && batch.size() < 6 && rng() % 3 != 0) batch.push_back(id);
      }
      if (!batch.empty()) {
        kv.set_batch(batch);
        kv.decode_step();
      }
    } else if (op < 68) {
      auto dec = in_phase(sequence_phase::decode);
      if (!dec.empty()) kv.end_turn(pick(dec));
    } else if (op < 74) {
      auto ended = in_phase(sequence_phase::ended);
      if (!ended.empty() && kv.continue_turn(pick(ended), uniform(rng, 1, 20), uniform(rng, 0, 15)))
        kv.complete_page_copies();  // page contents are not checked here
    } else if (op < 80) {
      auto cand  = in_phase(sequence_phase::decode);
      auto ended = in_phase(sequence_phase::ended);
      cand.insert(cand.end(), ended.begin(), ended.end());
      if (!cand.empty())
        if (auto child = kv.fork(pick(cand))) {
          live.push_back(*child);
          kv.complete_page_copies();
        }
    } else if (op < 88) {
      if (!live.empty()) {
        auto k = rng() % live.size();
        kv.free(live[k]);
        live.erase(live.begin() + static_cast<std::ptrdiff_t>(k));
      }
    } else {
      random_batch();
    }
    bool stale = false;
    for (std::int32_t r = 0; r < kv.batch_size(); ++r) stale |= !kv.contains(kv.batch_sequence(r));
    if (stale) random_batch();
    // Hold the stream back now and then: this sync's upload is still pending when the next two
    // syncs write the shadows (the second must wait for it).
    if (rng() % 4 == 0) cuda_check(cudaLaunchHostFunc(stream.s, sleep_1ms, nullptr), "host func");
    resyncs += kv.changes().full_resync;
    mirror.sync(kv, stream.s);
    GPU_REQUIRE(kv.changes().num_page_entries == 0 && kv.changes().num_counter_slots == 0 &&
                !kv.changes().full_resync);  // the journal was cleared
    incremental += mirror.last_sync_bytes() < static_cast<std::int64_t>(mirror.bytes());
    // The pointers never move.
    GPU_REQUIRE(mirror.view().pages == first.pages &&
                mirror.view().batch_slots == first.batch_slots);
    if (step % 3 == 2) {
      require_mirrored(mirror, kv, stream.s);
      ++checks;
    }
  }
  require_mirrored(mirror, kv, stream.s);
  GPU_CHECK_MSG(incremental > 300, incremental << " incremental syncs");
  GPU_CHECK_MSG(resyncs > 0, "no full resync");
  GPU_CHECK(checks > 200);
}

TANGRAM_GPU_TEST("kv_view_mirror: decode attention through mirror.view() equals the CPU reference",
                 "[gpu][mirror][decode]") {
  auto plan = hybrid_plan(64, 16);
  cuda_memory_resource gpu(0);
  manager_options o;
  o.num_pages     = 400;  // 16 KiB pages; the 300-token request alone holds ~90
  o.max_sequences = 4;
  kv_cache_manager kv(plan, gpu, o);
  kv_view_mirror mirror(kv, 0);
  stream_guard stream;
  std::vector<sequence_id> ids;
  for (std::int64_t n : {300, 37, 129}) {
    auto id = kv.try_admit(n, 12);
    GPU_REQUIRE(id.has_value());
    for (std::int64_t done = 0; done < n; done += 64)
      chunk(kv, *id, std::min<std::int64_t>(64, n - done));
    ids.push_back(*id);
  }
  // Every page random (the kernel and the reference read the same bytes, held or not).
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  auto pool_floats = static_cast<std::size_t>(kv.pool().capacity()) *
                     static_cast<std::size_t>(plan.geometry.page_bytes()) / 4;
  std::vector<float> pool(pool_floats);
  for (auto& x : pool) x = u(rng);
  cuda_check(cudaMemcpy(kv.pool().base(), pool.data(), pool.size() * 4, cudaMemcpyHostToDevice),
             "pool upload");
  auto splits = plan.splits.view();
  device_buffer dbegin(plan.splits.cta_begin);
  const std::int32_t Hq = plan.num_kv_heads * 2, d = plan.geometry.head_dim;

  auto compare = [&](char const* when) {
    mirror.sync(kv, stream.s);
    auto host    = kv.view();
    const auto B = static_cast<std::size_t>(host.batch_size);
    std::vector<float> q(B * static_cast<std::size_t>(Hq * d));
    for (auto& x : q) x = u(rng);
    device_buffer dq(q), dout(q.size() * 4), dlse(B * static_cast<std::size_t>(Hq) * 4);
    for (std::int32_t layer = 0; layer < plan.num_layers; ++layer) {
      decode_params p;
      p.kv     = mirror.view();
      p.splits = {
          splits.num_layers, splits.num_kv_heads, splits.num_ctas, dbegin.get<std::int32_t>()};
      p.layer   = layer;
      p.group   = 2;
      p.q       = dq.get();
      p.q_dtype = p.o_dtype = dtype::f32;
      p.o                   = dout.get();
      p.lse                 = dlse.get<float>();
      device_buffer ws(decode_workspace_bytes(p));
      decode_attention(p, ws.get(), ws.bytes(), stream.s);
      cuda_check(cudaStreamSynchronize(stream.s), "decode_attention");
      auto o_gpu      = dout.download<float>();
      auto lse_gpu    = dlse.download<float>();
      decode_params r = p;
      r.kv            = host;
      r.kv.pool       = reinterpret_cast<std::byte*>(pool.data());
      r.splits        = splits;
      r.q             = q.data();
      std::vector<float> o_ref(q.size()), lse_ref(lse_gpu.size());
      r.o   = o_ref.data();
      r.lse = lse_ref.data();
      reference::decode_attention(r, reference::split_mode::split);
      for (std::size_t i = 0; i < o_ref.size(); ++i)
        GPU_REQUIRE_MSG(std::abs(o_gpu[i] - o_ref[i]) <= 5e-5f,
                        when << ", layer " << layer << ": output " << i << " is " << o_gpu[i]
                             << ", reference " << o_ref[i]);
      for (std::size_t i = 0; i < lse_ref.size(); ++i)
        GPU_REQUIRE_MSG(lse_gpu[i] == lse_ref[i] || std::abs(lse_gpu[i] - lse_ref[i]) <=
                                                        1e-4f * std::max(1.f, std::abs(lse_ref[i])),
                        when << ", layer " << layer << ": lse " << i);
      // Padding requests (the last batch_padding of the batch): zeros, no NaN.
      auto first_pad = static_cast<std::size_t>(kv.batch_size() - kv.batch_padding(batch_kind::decode));
      for (std::size_t i = first_pad * static_cast<std::size_t>(Hq * d); i < o_gpu.size(); ++i)
        GPU_REQUIRE_MSG(o_gpu[i] == 0.f, when << ", layer " << layer << ": padding output " << i);
    }
  };
  kv.set_batch({ids[2], ids[0], ids[1]});
  kv.decode_step();
  compare("after the first sync");
  // Incremental syncs: more decode tokens (pages cross), a smaller batch in another order.
  for (int k = 0; k < 5; ++k) kv.decode_step();
  compare("after five decode steps");
  kv.set_batch({ids[1], ids[2]});
  kv.decode_step();
  compare("after a batch change");
  GPU_CHECK(mirror.last_sync_bytes() < static_cast<std::int64_t>(mirror.bytes()));
  // A fixed-capacity batch (CUDA graphs): one member padded to max_batch 4.
  kv.set_batch(batch_kind::decode, {ids[0]}, 4);
  kv.decode_step();
  compare("one member padded to 4");
  GPU_CHECK(mirror.view().batch_size == 4);
}

TANGRAM_GPU_TEST("kv_view_mirror: errors name the value; moves keep the device view",
                 "[gpu][mirror]") {
  auto plan = hybrid_plan(4, 4);
  cuda_memory_resource gpu(0);
  host_memory_resource host;
  manager_options small;
  small.num_pages     = 64;
  small.max_sequences = 4;
  kv_cache_manager kv(plan, gpu, small);
  kv_cache_manager other(plan, host, small);
  int count = 0;
  cuda_check(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
  for (std::int32_t bad : {-1, count}) {
    std::string what;
    try {
      kv_view_mirror m(kv, bad);
    } catch (cuda_error const& e) {
      what = e.what();
    }
    GPU_CHECK_MSG(
        what.find("device_id must be in [0, " + std::to_string(count) + ")") != std::string::npos &&
            what.find("got " + std::to_string(bad)) != std::string::npos,
        "device_id " << bad << ": '" << what << "'");
  }
  // A host pool mirrors fine: its pool pointer stays the host arena.
  kv_view_mirror hm(other, 0);
  GPU_CHECK(hm.pool_kind() == memory_kind::host);
  GPU_CHECK(hm.view().pool == other.pool().base());
  hm.sync(other, nullptr);
  cuda_check(cudaDeviceSynchronize(), "sync");

  kv_view_mirror a(kv, 0);
  std::string what;
  try {
    a.sync(other, nullptr);
  } catch (logic_error const& e) {
    what = e.what();
  }
  GPU_CHECK_MSG(what.find("not the manager this mirror was built for") != std::string::npos, what);
  // A freed batch member: view() refuses, nothing is enqueued and the journal is kept.
  auto id = kv.try_admit(10, 2);
  GPU_REQUIRE(id.has_value());
  kv.set_batch({*id});
  kv.free(*id);
  auto pending = kv.changes().num_counter_slots;
  GPU_REQUIRE(pending > 0);
  bool threw = false;
  try {
    a.sync(kv, nullptr);
  } catch (logic_error const&) {
    threw = true;
  }
  GPU_CHECK(threw);
  GPU_CHECK(kv.changes().num_counter_slots == pending);
  kv.set_batch({});
  a.sync(kv, nullptr);
  auto v = a.view();
  kv_view_mirror b(std::move(a));
  GPU_CHECK(b.view().pages == v.pages && b.view().pool == v.pool);
  threw = false;
  try {
    a.sync(kv, nullptr);  // NOLINT(bugprone-use-after-move): the documented moved-from error
  } catch (logic_error const& e) {
    threw = std::string(e.what()).find("moved-from") != std::string::npos;
  }
  GPU_CHECK(threw);
  b.sync(kv, nullptr);
  require_mirrored(b, kv, nullptr);
}
