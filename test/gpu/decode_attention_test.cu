// SPDX-License-Identifier: Apache-2.0
// The CUDA decode kernels against the CPU reference on the same views and split maps (the
// scenarios of kernel_cases.hpp, which the host emulation tests in test/emu run too).
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gpu_support.cuh"
#include "invariant_cases.hpp"
#include "tangram/device/device.hpp"
#include "tangram/kernels/decode_attention.hpp"
#include "tangram/plan/split_planner.hpp"
#include "tangram/reference/decode_attention.hpp"

using namespace tangram;
using tangram::test::device_buffer;
using tangram::test::test_cache;

TANGRAM_GPU_TEST("gpu decode equals the CPU reference: GQA 1..8", "[gpu][decode]") {
  test::gpu_backend gpu;
  for (auto const& c : test::decode_cases_gqa()) GPU_REQUIRE_AGREES(test::check_decode(c, gpu));
}

TANGRAM_GPU_TEST("gpu decode equals the CPU reference: dtypes x head dims x page sizes",
                 "[gpu][decode]") {
  test::gpu_backend gpu;
  for (auto const& c : test::decode_cases_shapes()) GPU_REQUIRE_AGREES(test::check_decode(c, gpu));
}

TANGRAM_GPU_TEST("gpu decode equals the CPU reference: fp8 e4m3 / e5m2 x head dims",
                 "[gpu][decode][fp8]") {
  test::gpu_backend gpu;
  for (auto const& c : test::decode_cases_fp8()) GPU_REQUIRE_AGREES(test::check_decode(c, gpu));
}

TANGRAM_GPU_TEST("gpu decode equals the CPU reference: per-head pages (Hp 1)",
                 "[gpu][decode][per_head]") {
  test::gpu_backend gpu;
  for (auto const& c : test::decode_cases_per_head())
    GPU_REQUIRE_AGREES(test::check_decode(c, gpu));
}

TANGRAM_GPU_TEST("gpu decode equals the CPU reference: tensor-core path: 16-bit K/V x GQA 3..8",
                 "[gpu][decode]") {
  test::gpu_backend gpu;
  for (auto const& c : test::decode_cases_mma()) GPU_REQUIRE_AGREES(test::check_decode(c, gpu));
}

TANGRAM_GPU_TEST(
    "gpu decode equals the CPU reference: CUDA-core kernel on the tensor-core instances",
    "[gpu][decode]") {
  test::gpu_backend gpu;
  for (auto const& c : test::decode_cases_mma_cuda_core())
    GPU_REQUIRE_AGREES(test::check_decode(c, gpu));
}

TANGRAM_GPU_TEST("gpu decode equals the CPU reference: fp8 with per-tensor and per-head scales",
                 "[gpu][decode][fp8][scales]") {
  test::gpu_backend gpu;
  for (auto const& c : test::decode_cases_fp8_scaled())
    GPU_REQUIRE_AGREES(test::check_decode(c, gpu));
}

TANGRAM_GPU_TEST("gpu decode with the merge folded into the split kernels equals the reference",
                 "[gpu][decode][fold]") {
  test::gpu_backend gpu;
  for (auto const& c : test::decode_cases_folded()) GPU_REQUIRE_AGREES(test::check_decode(c, gpu));
}

TANGRAM_GPU_TEST("gpu decode equals the CPU reference: layer-stream split across heads",
                 "[gpu][decode][layer_stream]") {
  test::gpu_backend gpu;
  for (auto const& c : test::decode_cases_layer_stream())
    GPU_REQUIRE_AGREES(test::check_decode(c, gpu));
}

TANGRAM_GPU_TEST("gpu decode equals the CPU reference: query dtypes, misaligned query rows",
                 "[gpu][decode][query]") {
  // The upload puts the queries at an aligned device address; the odd row stride still leaves
  // most rows misaligned for the vector query loads (a misaligned vector load would fault).
  test::gpu_backend gpu;
  for (auto const& c : test::decode_cases_query_layout())
    GPU_REQUIRE_AGREES(test::check_decode(c, gpu));
}

TANGRAM_GPU_TEST("gpu decode equals the CPU reference: long and batched", "[gpu][decode]") {
  test::gpu_backend gpu;
  for (auto const& c : test::decode_cases_long()) GPU_REQUIRE_AGREES(test::check_decode(c, gpu));
}

TANGRAM_GPU_TEST("gpu batch-invariant decode equals the CPU reference: both kernels x K 1, 3, 16",
                 "[gpu][decode][invariant]") {
  test::gpu_backend gpu;
  for (auto const& c : test::decode_cases_invariant())
    GPU_REQUIRE_AGREES(test::check_decode(c, gpu));
}

TANGRAM_GPU_TEST(
    "gpu batch-invariant decode: a request's bits do not depend on the batch or split map",
    "[gpu][decode][invariant]") {
  test::gpu_backend gpu;
  for (auto const& c : test::decode_cases_invariant())
    if (c.invariant_pieces != 1)
      GPU_REQUIRE_AGREES(test::check_decode_batch_invariance(c, c.invariant_pieces, gpu));
}

TANGRAM_GPU_TEST(
    "gpu decode equals the CPU reference: batch 1100 and 4096 (multi-tile prefix scan)",
    "[gpu][decode]") {
  test::gpu_backend gpu;
  for (auto const& c : test::decode_cases_large_batch())
    GPU_REQUIRE_AGREES(test::check_decode(c, gpu));
}

TANGRAM_GPU_TEST("gpu decode replays from a CUDA graph", "[gpu][decode][graph]") {
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
  GPU_CHECK(dout.download<float>() == direct);
  (void)cudaGraphExecDestroy(exec);
  (void)cudaGraphDestroy(graph);
  (void)cudaStreamDestroy(stream);
}

namespace {
/// Waits about `cycles` clock cycles, then copies n floats: a slow producer of a decode's q, so a
/// PDL decode launched right after it must wait for it before reading q.
__global__ void slow_copy(float* dst, const float* src, int n, long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
  for (int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x); i < n;
       i += static_cast<int>(gridDim.x * blockDim.x))
    dst[i] = src[i];
}
}  // namespace

TANGRAM_GPU_TEST("gpu decode with PDL: back-to-back launches on one workspace, and a graph",
                 "[gpu][decode][graph][pdl]") {
  // Two launches enqueued back to back share the workspace: with programmatic dependent launch
  // the second split kernel starts while the first merge may still read the partials, so its
  // prologue must not write the workspace before its grid_dependency_wait.
  page_geometry geo{16, 2, 128, dtype::bf16};
  auto layout = test::adjacent_layout(geo, 1, 2);
  std::vector<test::sequence_spec> seqs(4);
  for (int i = 0; i < 4; ++i) {
    seqs[static_cast<std::size_t>(i)].seq_tokens = 900 * (i + 1);
    seqs[static_cast<std::size_t>(i)].base_len   = {900 * (i + 1), 301 * (i + 1)};
  }
  test_cache cache(layout, seqs, 9);
  auto hv = cache.view({3, 0, 2, 1});
  test::device_cache dev(cache, hv);
  const std::size_t n = 4 * 2 * 4 * 128;
  std::vector<float> q1(n), q2(n);
  for (std::size_t i = 0; i < n; ++i) {
    q1[i] = std::sin(0.37f * static_cast<float>(i));
    q2[i] = std::cos(0.11f * static_cast<float>(i));
  }
  device_buffer dq1(q1), dq2(q2), do1(n * 4), do2(n * 4);
  std::vector<std::int32_t> begin = {0, 150, 264};
  device_buffer dbegin(begin);
  decode_params p;
  p.kv      = dev.view;
  p.splits  = {1, 2, 264, dbegin.get<std::int32_t>()};
  p.group   = 4;
  p.q_dtype = p.o_dtype = dtype::f32;
  device_buffer ws(decode_workspace_bytes(p));
  auto run = [&](bool pdl, cudaStream_t stream) {
    p.pdl = pdl;
    p.q   = dq1.get();
    p.o   = do1.get();
    decode_attention(p, ws.get(), ws.bytes(), stream);
    p.q = dq2.get();
    p.o = do2.get();
    decode_attention(p, ws.get(), ws.bytes(), stream);
  };
  cudaStream_t stream;
  TANGRAM_TEST_CUDA(cudaStreamCreate(&stream));
  run(false, stream);
  TANGRAM_TEST_CUDA(cudaStreamSynchronize(stream));
  const auto plain1 = do1.download<float>(), plain2 = do2.download<float>();
  for (int rep = 0; rep < 20; ++rep) {
    TANGRAM_TEST_CUDA(cudaMemsetAsync(do1.get(), 0, do1.bytes(), stream));
    TANGRAM_TEST_CUDA(cudaMemsetAsync(do2.get(), 0, do2.bytes(), stream));
    run(true, stream);
    TANGRAM_TEST_CUDA(cudaStreamSynchronize(stream));
    GPU_REQUIRE(do1.download<float>() == plain1);
    GPU_REQUIRE(do2.download<float>() == plain2);
  }
  // A slow kernel writes q right before each PDL decode (the one edge where the decode could
  // read before its producer finished), with and without the folded merge.
  device_buffer dq_late(n * 4), counters(std::size_t{2} * 4 * 4);
  TANGRAM_TEST_CUDA(cudaMemset(counters.get(), 0, counters.bytes()));
  for (bool fold : {false, true}) {
    TANGRAM_TEST_CUDA(cudaMemsetAsync(dq_late.get(), 0, dq_late.bytes(), stream));
    TANGRAM_TEST_CUDA(cudaMemsetAsync(do1.get(), 0, do1.bytes(), stream));
    slow_copy<<<4, 128, 0, stream>>>(
        dq_late.get<float>(), dq1.get<float>(), static_cast<int>(n), 2000000);
    TANGRAM_TEST_CUDA(cudaGetLastError());
    p.pdl            = true;
    p.q              = dq_late.get();
    p.o              = do1.get();
    p.merge_counters = fold ? counters.get<std::int32_t>() : nullptr;
    decode_attention(p, ws.get(), ws.bytes(), stream);
    TANGRAM_TEST_CUDA(cudaStreamSynchronize(stream));
    GPU_REQUIRE(do1.download<float>() == plain1);
  }
  p.merge_counters = nullptr;
  GPU_CHECK(counters.download<std::int32_t>() == std::vector<std::int32_t>(8, 0));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  TANGRAM_TEST_CUDA(cudaMemset(do2.get(), 0, do2.bytes()));
  TANGRAM_TEST_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  run(true, stream);
  TANGRAM_TEST_CUDA(cudaStreamEndCapture(stream, &graph));
  TANGRAM_TEST_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  TANGRAM_TEST_CUDA(cudaGraphLaunch(exec, stream));
  TANGRAM_TEST_CUDA(cudaStreamSynchronize(stream));
  GPU_CHECK(do2.download<float>() == plain2);
  (void)cudaGraphExecDestroy(exec);
  (void)cudaGraphDestroy(graph);
  (void)cudaStreamDestroy(stream);
}

TANGRAM_GPU_TEST("decode_device_limits reports the occupancy the runtime sees", "[gpu][decode]") {
  auto info = query_device(0);
  GPU_REQUIRE(info.has_value());
  for (dtype t : all_dtypes)
    for (std::int32_t d : {64, 128, 256})
      for (std::int32_t g : {1, 4, 5, 8}) {
        auto lim = decode_device_limits(t, d, g);
        GPU_REQUIRE(lim.has_value());
        GPU_CHECK(lim->sm_count == info->sm_count);
        GPU_CHECK(lim->ctas_per_sm >= 1);
        bool valid = true;
        try {
          lim->validate();
        } catch (std::exception const&) {
          valid = false;
        }
        GPU_CHECK(valid);
        // Every launched variant (tensor cores on / off, folded merge or not) holds at least the
        // CTAs per SM of the plan made with its query: the query reports the lowest figure of the
        // plain and folded-merge variants, each per-head and layer-stream
        // (decode_split_occupancy), whichever is asked for.
        for (bool tc : {true, false}) {
          auto plain = decode_device_limits(t, d, g, 0, tc, false);
          auto fold  = decode_device_limits(t, d, g, 0, tc, true);
          GPU_REQUIRE(plain.has_value() && fold.has_value());
          GPU_CHECK_MSG(fold->ctas_per_sm == plain->ctas_per_sm,
                        to_string(t) << " d " << d << " group " << g << " tensor_cores " << tc
                                     << ": folded " << fold->ctas_per_sm << ", plain "
                                     << plain->ctas_per_sm << " CTAs per SM");
          if (tc) GPU_CHECK(plain->ctas_per_sm == lim->ctas_per_sm);
        }
      }
  GPU_CHECK(!decode_device_limits(dtype::fp8_e4m3, 96, 4).has_value());
  GPU_CHECK(!decode_device_limits(dtype::bf16, 96, 4).has_value());
  GPU_CHECK(!decode_device_limits(dtype::bf16, 128, 9).has_value());
  GPU_CHECK(!decode_device_limits(dtype::bf16, 128, 4, 99).has_value());
}

namespace {

// Launches decode on one layer of `kv_dtype` pages with head dim d and queries in q_dtype;
// returns the launcher's invalid_argument message ("(no error)" when it launched).
std::string decode_launch_error(std::int32_t d, dtype kv_dtype, dtype q_dtype) {
  page_geometry geo{16, 2, d, kv_dtype};
  test::sequence_spec s;
  s.seq_tokens = 4;
  s.base_len   = {4, 4};
  test_cache cache(test::adjacent_layout(geo, 1, 2), {s}, 1);
  auto hv = cache.view({0});
  test::device_cache dev(cache, hv);
  std::int32_t begin[3] = {0, 1, 2};
  device_buffer dbegin(std::vector<std::int32_t>(begin, begin + 3)), dq(4096), dout(4096),
      ws(1 << 20);
  decode_params p;
  p.kv      = dev.view;
  p.splits  = {1, 2, 2, dbegin.get<std::int32_t>()};
  p.q       = dq.get();
  p.q_dtype = q_dtype;
  p.o       = dout.get();
  try {
    decode_attention(p, ws.get(), ws.bytes(), nullptr);
  } catch (invalid_argument const& e) {
    return std::string(e.what());
  }
  return std::string("(no error)");
}

}  // namespace

TANGRAM_GPU_TEST("gpu decode launcher rejects what it cannot run", "[gpu][decode][errors]") {
  GPU_CHECK(decode_launch_error(96, dtype::bf16, dtype::bf16).find("head_dim 96") !=
            std::string::npos);
}

TANGRAM_GPU_TEST("gpu decode launcher names the field for fp8 it cannot run",
                 "[gpu][decode][fp8][errors]") {
  // Head dim 96 has no fp8 instantiation: the dtype and the head dim are named.
  GPU_CHECK(decode_launch_error(96, dtype::fp8_e5m2, dtype::bf16)
                .find("head_dim 96 with kv dtype fp8_e5m2") != std::string::npos);
  // fp8 is a K/V storage type only: fp8 queries are rejected by field and value.
  const std::string q_error = decode_launch_error(64, dtype::fp8_e5m2, dtype::fp8_e4m3);
  GPU_CHECK(q_error.find("decode_params.q_dtype/o_dtype") != std::string::npos);
  GPU_CHECK(q_error.find("fp8_e4m3") != std::string::npos);
}

TANGRAM_GPU_TEST("gpu decode launcher names the field for invalid fp8 scales",
                 "[gpu][decode][fp8][scales][errors]") {
  // Launches on 8 KV heads of `kv_dtype` with `count` device scales (K null when `null_k`);
  // returns the error message.
  auto message = [](dtype kv_dtype, std::int32_t count, bool null_k) {
    page_geometry geo{16, 2, 64, kv_dtype};
    test::sequence_spec s;
    s.seq_tokens = 4;
    s.base_len.assign(8, 4);
    test_cache cache(test::adjacent_layout(geo, 1, 8), {s}, 1);
    auto hv = cache.view({0});
    test::device_cache dev(cache, hv);
    std::vector<std::int32_t> begin(9);
    std::iota(begin.begin(), begin.end(), 0);
    device_buffer dbegin(begin), dq(1 << 16), dout(1 << 16), ws(1 << 20),
        dscale(std::vector<float>(8, 1.f));
    decode_params p;
    p.kv      = dev.view;
    p.splits  = {1, 8, 8, dbegin.get<std::int32_t>()};
    p.q       = dq.get();
    p.q_dtype = p.o_dtype = dtype::f32;
    p.o                   = dout.get();
    p.scales              = {null_k ? nullptr : dscale.get<float>(), dscale.get<float>(), count};
    try {
      decode_attention(p, ws.get(), ws.bytes(), nullptr);
    } catch (invalid_argument const& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  GPU_CHECK(message(dtype::fp8_e4m3, 8, false) == "(no error)");  // the control
  GPU_CHECK(message(dtype::fp8_e4m3, 2, false)
                .find("decode_params.scales.count: must be 0, 1 or num_kv_heads (8), got 2") !=
            std::string::npos);
  GPU_CHECK(message(dtype::fp8_e4m3, 8, true).find("decode_params.scales.k: null") !=
            std::string::npos);
  GPU_CHECK(message(dtype::bf16, 1, false)
                .find("decode_params.scales: only for fp8 KV dtypes, kv dtype is bf16") !=
            std::string::npos);
}
