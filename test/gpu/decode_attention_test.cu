// SPDX-License-Identifier: Apache-2.0
// The CUDA decode kernels against the CPU reference on the same views and split maps.
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "gpu_support.cuh"
#include "tangram/device/device.hpp"
#include "tangram/kernels/decode_attention.hpp"
#include "tangram/plan/split_planner.hpp"
#include "tangram/reference/decode_attention.hpp"

using namespace tangram;
using tangram::test::device_buffer;
using tangram::test::test_cache;

namespace {

struct gpu_decode_case {
  dtype kv_dtype = dtype::bf16;
  std::int32_t d = 128, P = 16, Hp = 2, group = 4, layers = 2, heads = 4;
  std::vector<std::int32_t> lens;
  std::vector<std::int32_t> sliding = {1};
  std::int32_t window = 40, ring_pages = 4;
  bool sinks         = false;
  dtype o_dtype      = dtype::f32;
  std::uint64_t seed = 1;
};

void run_gpu_case(gpu_decode_case const& c) {
  INFO("dtype " << to_string(c.kv_dtype) << " d " << c.d << " P " << c.P << " group " << c.group
                << " seed " << c.seed);
  std::mt19937_64 rng(c.seed);
  page_geometry geo{c.P, c.Hp, c.d, c.kv_dtype};
  auto layout = test::adjacent_layout(geo, c.layers, c.heads, c.sliding, c.window, c.ring_pages);
  std::vector<std::int32_t> appended, seq_tokens;
  for (std::size_t r = 0; r < c.lens.size(); ++r) {
    appended.push_back(static_cast<std::int32_t>(r % 3));
    seq_tokens.push_back(c.lens[r] + 50);
  }
  auto seqs = test::ragged_sequences(c.lens, appended, seq_tokens, c.layers, c.heads, rng);
  test_cache cache(layout, seqs, c.seed + 3);
  std::vector<std::int32_t> batch(c.lens.size());
  std::iota(batch.begin(), batch.end(), 0);
  std::shuffle(batch.begin(), batch.end(), rng);
  auto host_view = cache.view(batch);
  test::device_cache dev(cache, host_view);

  std::int32_t B = host_view.batch_size, Hq = c.heads * c.group;
  std::vector<float> q(static_cast<std::size_t>(B * Hq * c.d)), sinks(static_cast<std::size_t>(Hq));
  for (auto& x : q) x = std::uniform_real_distribution<float>(-3.f, 3.f)(rng);
  for (auto& x : sinks) x = std::uniform_real_distribution<float>(-2.f, 4.f)(rng);
  device_buffer dq(q), dsinks(sinks);
  std::size_t out_elems = q.size(), out_bytes = out_elems * size_of(c.o_dtype);
  device_buffer dout(out_bytes), dlse(static_cast<std::size_t>(B * Hq) * 4);

  for (std::int32_t n_cta : {c.heads, 2 * 132, 4 * 132 + 7}) {
    auto begin = test::random_cta_begin(c.layers, c.heads, n_cta, rng);
    device_buffer dbegin(begin);
    for (std::int32_t layer = 0; layer < c.layers; ++layer) {
      INFO("N_CTA " << n_cta << " layer " << layer);
      decode_params p;
      p.layer   = layer;
      p.group   = c.group;
      p.q_dtype = dtype::f32;
      p.o_dtype = c.o_dtype;
      // CPU reference.
      p.kv     = host_view;
      p.splits = {c.layers, c.heads, n_cta, begin.data()};
      p.q      = q.data();
      p.sinks  = c.sinks ? sinks.data() : nullptr;
      std::vector<unsigned char> o_ref(out_bytes);
      std::vector<float> lse_ref(static_cast<std::size_t>(B * Hq));
      p.o   = o_ref.data();
      p.lse = lse_ref.data();
      reference::decode_attention(p, reference::split_mode::split);
      // GPU.
      p.kv     = dev.view;
      p.splits = {c.layers, c.heads, n_cta, dbegin.get<std::int32_t>()};
      p.q      = dq.get();
      p.sinks  = c.sinks ? dsinks.get<float>() : nullptr;
      p.o      = dout.get();
      p.lse    = dlse.get<float>();
      device_buffer ws(decode_workspace_bytes(p));
      decode_attention(p, ws.get(), ws.bytes(), nullptr);
      TANGRAM_TEST_CUDA(cudaDeviceSynchronize());
      auto o_gpu   = dout.download<unsigned char>();
      auto lse_gpu = dlse.download<float>();
      for (std::size_t i = 0; i < out_elems; ++i) {
        float a =
            reference::detail::load_as_float(o_gpu.data(), c.o_dtype, static_cast<std::int64_t>(i));
        float b =
            reference::detail::load_as_float(o_ref.data(), c.o_dtype, static_cast<std::int64_t>(i));
        INFO("element " << i);
        REQUIRE(std::abs(a - b) <=
                (c.o_dtype == dtype::f32 ? 5e-5f : 1e-2f * std::max(1.f, std::abs(b))));
      }
      for (std::size_t i = 0; i < lse_gpu.size(); ++i)
        REQUIRE((lse_gpu[i] == lse_ref[i] ||
                 std::abs(lse_gpu[i] - lse_ref[i]) <= 1e-4f * std::max(1.f, std::abs(lse_ref[i]))));
      // Deterministic: a second launch gives the same bits.
      decode_attention(p, ws.get(), ws.bytes(), nullptr);
      TANGRAM_TEST_CUDA(cudaDeviceSynchronize());
      REQUIRE(dout.download<unsigned char>() == o_gpu);
    }
  }
}

}  // namespace

TEST_CASE("gpu decode equals the CPU reference: GQA 1..8", "[gpu][decode]") {
  for (std::int32_t g = 1; g <= 8; ++g) {
    gpu_decode_case c;
    c.kv_dtype = dtype::f32;
    c.d        = 64;
    c.group    = g;
    c.lens     = {1, 15, 54, 97, 1000};
    c.sinks    = g % 2 == 1;
    c.seed     = 10 + static_cast<std::uint64_t>(g);
    run_gpu_case(c);
  }
}

TEST_CASE("gpu decode equals the CPU reference: dtypes x head dims x page sizes", "[gpu][decode]") {
  std::uint64_t seed = 100;
  for (dtype t : {dtype::f32, dtype::f16, dtype::bf16})
    for (std::int32_t d : {64, 128, 256})
      for (std::int32_t P : {1, 16, 32}) {
        gpu_decode_case c;
        c.kv_dtype   = t;
        c.d          = d;
        c.P          = P;
        c.ring_pages = (40 + P - 1) / P + 1;
        c.group      = 1 + static_cast<std::int32_t>(seed % 8);
        c.lens       = {97, 3, 1000, 54};
        c.sinks      = seed % 2 == 0;
        c.o_dtype    = seed % 3 == 0 ? dtype::bf16 : dtype::f32;
        c.seed       = ++seed;
        run_gpu_case(c);
      }
}

TEST_CASE("gpu decode equals the CPU reference: long and batched", "[gpu][decode]") {
  gpu_decode_case c;
  c.lens   = {32769, 4000, 1, 15};
  c.layers = 1;
  c.sliding.clear();
  c.sinks = true;
  c.seed  = 7;
  run_gpu_case(c);
  gpu_decode_case b;
  b.lens.assign(300, 0);
  for (std::size_t i = 0; i < b.lens.size(); ++i)
    b.lens[i] = 1 + static_cast<std::int32_t>(i * 7 % 500);
  b.group = 5;
  b.seed  = 8;
  run_gpu_case(b);
}

TEST_CASE("gpu decode replays from a CUDA graph", "[gpu][decode][graph]") {
  page_geometry geo{16, 2, 128, dtype::bf16};
  auto layout = test::adjacent_layout(geo, 1, 2);
  std::vector<test::sequence_spec> seqs(3);
  for (int i = 0; i < 3; ++i) {
    seqs[static_cast<std::size_t>(i)].seq_tokens = 100 * (i + 1);
    seqs[static_cast<std::size_t>(i)].base_len   = {100 * (i + 1), 37 * (i + 1)};
  }
  test_cache cache(layout, seqs, 5);
  auto hv = cache.view({2, 0, 1});
  test::device_cache dev(cache, hv);
  std::vector<float> q(3 * 2 * 3 * 128, 0.25f);
  device_buffer dq(q), dout(q.size() * 4);
  std::vector<std::int32_t> begin = {0, 100, 264};
  device_buffer dbegin(begin);
  decode_params p;
  p.kv      = dev.view;
  p.splits  = {1, 2, 264, dbegin.get<std::int32_t>()};
  p.group   = 3;
  p.q       = dq.get();
  p.q_dtype = p.o_dtype = dtype::f32;
  p.o                   = dout.get();
  device_buffer ws(decode_workspace_bytes(p));
  cudaStream_t stream;
  TANGRAM_TEST_CUDA(cudaStreamCreate(&stream));
  decode_attention(p, ws.get(), ws.bytes(), stream);
  TANGRAM_TEST_CUDA(cudaStreamSynchronize(stream));
  auto direct = dout.download<float>();
  TANGRAM_TEST_CUDA(cudaMemset(dout.get(), 0, dout.bytes()));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  TANGRAM_TEST_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  decode_attention(p, ws.get(), ws.bytes(), stream);
  TANGRAM_TEST_CUDA(cudaStreamEndCapture(stream, &graph));
  TANGRAM_TEST_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  TANGRAM_TEST_CUDA(cudaGraphLaunch(exec, stream));
  TANGRAM_TEST_CUDA(cudaStreamSynchronize(stream));
  CHECK(dout.download<float>() == direct);
  (void)cudaGraphExecDestroy(exec);
  (void)cudaGraphDestroy(graph);
  (void)cudaStreamDestroy(stream);
}

TEST_CASE("decode_device_limits reports the occupancy the runtime sees", "[gpu][decode]") {
  auto info = query_device(0);
  REQUIRE(info.has_value());
  for (dtype t : {dtype::f32, dtype::f16, dtype::bf16})
    for (std::int32_t d : {64, 128, 256})
      for (std::int32_t g : {1, 4, 5, 8}) {
        auto lim = decode_device_limits(t, d, g);
        REQUIRE(lim.has_value());
        CHECK(lim->sm_count == info->sm_count);
        CHECK(lim->ctas_per_sm >= 1);
        CHECK_NOTHROW(lim->validate());
      }
  CHECK_FALSE(decode_device_limits(dtype::fp8_e4m3, 128, 4).has_value());
  CHECK_FALSE(decode_device_limits(dtype::bf16, 96, 4).has_value());
  CHECK_FALSE(decode_device_limits(dtype::bf16, 128, 9).has_value());
  CHECK_FALSE(decode_device_limits(dtype::bf16, 128, 4, 99).has_value());
}

TEST_CASE("gpu decode launcher rejects what it cannot run", "[gpu][decode][errors]") {
  page_geometry geo{16, 2, 96, dtype::bf16};
  test::sequence_spec s;
  s.seq_tokens = 4;
  s.base_len   = {4, 4};
  test_cache cache(test::adjacent_layout(geo, 1, 2), {s}, 1);
  auto hv = cache.view({0});
  test::device_cache dev(cache, hv);
  std::int32_t begin[3] = {0, 1, 2};
  device_buffer dbegin(std::vector<std::int32_t>(begin, begin + 3)), dq(1024), dout(1024),
      ws(1 << 20);
  decode_params p;
  p.kv       = dev.view;
  p.splits   = {1, 2, 2, dbegin.get<std::int32_t>()};
  p.q        = dq.get();
  p.o        = dout.get();
  bool threw = false;
  try {
    decode_attention(p, ws.get(), ws.bytes(), nullptr);
  } catch (invalid_argument const& e) {
    threw = std::string(e.what()).find("head_dim 96") != std::string::npos;
  }
  CHECK(threw);
}
