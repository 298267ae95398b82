// SPDX-License-Identifier: Apache-2.0
// The CUDA eviction kernels against the CPU reference: the whole page pool must end up
// byte-identical. Built-in scores are compared with a tolerance, then the selection is checked
// exactly by replaying the reference with the GPU's own scores as supplied scores.
#include <cuda_runtime_api.h>

#include <cmath>
#include <random>
#include <vector>

#include "gpu_support.cuh"
#include "tangram/kernels/eviction.hpp"
#include "tangram/reference/eviction.hpp"

using namespace tangram;
using tangram::test::device_buffer;
using tangram::test::test_cache;

namespace {

struct gpu_eviction_case {
  dtype kv_dtype = dtype::bf16;
  std::int32_t d = 128, P = 16, group = 4, sink = 4, recent = 8, window = 24;
  score_source source     = score_source::supplied;
  std::int32_t obs_window = 32;
  std::int32_t long_len   = 3000;  ///< tokens seen by the longest request before its chunk
  std::uint64_t seed      = 1;
};

constexpr std::int32_t L = test::eviction_scenario::num_layers,
                       H = test::eviction_scenario::num_kv_heads;

void run_gpu_case(gpu_eviction_case const& c) {
  INFO("dtype " << to_string(c.kv_dtype) << " d " << c.d << " P " << c.P << " source "
                << to_string(c.source) << " seed " << c.seed);
  std::mt19937_64 rng(c.seed);
  page_geometry geo{c.P, 2, c.d, c.kv_dtype};
  auto sc = test::make_eviction_scenario(geo, c.window, c.sink + c.recent, c.long_len, 1500);
  std::int32_t rows = sc.chunk_indptr.back();
  for (std::int32_t layer = 0; layer < L; ++layer) {
    INFO("layer " << layer);
    test_cache gpu_cache(sc.layout, sc.seqs, c.seed), cpu_cache(sc.layout, sc.seqs, c.seed);
    auto hv        = gpu_cache.view(sc.batch);
    auto cv        = cpu_cache.view(sc.batch);
    std::int32_t B = hv.batch_size;
    std::size_t es = size_of(c.kv_dtype);
    std::vector<unsigned char> ck(static_cast<std::size_t>(rows * H * c.d) * es), cvv(ck.size());
    for (std::size_t i = 0; i < ck.size() / es; ++i) {
      reference::detail::store_from_float(
          ck.data(), c.kv_dtype, static_cast<std::int64_t>(i), gpu_cache.random_value());
      reference::detail::store_from_float(
          cvv.data(), c.kv_dtype, static_cast<std::int64_t>(i), gpu_cache.random_value());
    }
    std::vector<float> q(static_cast<std::size_t>(rows * H * c.group * c.d));
    for (auto& x : q) x = std::uniform_real_distribution<float>(-2.f, 2.f)(rng);
    std::int32_t max_cand = 0;
    for (std::int32_t r = 0; r < B; ++r)
      for (std::int32_t h = 0; h < H; ++h)
        max_cand =
            std::max(max_cand,
                     hv.head_len(r, layer, h) + sc.chunk_indptr[static_cast<std::size_t>(r) + 1] -
                         sc.chunk_indptr[static_cast<std::size_t>(r)]);
    std::vector<float> scores(static_cast<std::size_t>(B * H * max_cand));
    for (auto& x : scores) x = static_cast<float>(rng() % 7);  // many ties

    eviction_params p;
    p.layer          = layer;
    p.sink           = c.sink;
    p.max_candidates = max_cand;
    p.source         = c.source;
    p.q_dtype        = dtype::f32;
    p.group          = c.group;
    p.obs_window     = c.obs_window;
    // GPU run.
    test::device_cache dev(gpu_cache, hv);
    device_buffer drules(sc.rules), dindptr(sc.chunk_indptr), dck(ck), dcv(cvv), dq(q),
        dscores(scores), dnew(static_cast<std::size_t>(B * H) * 4),
        dscores_out(std::vector<float>(scores.size(), 0.f));
    p.kv           = dev.view;
    p.rules        = drules.get<head_rule>() + layer * H;
    p.chunk_indptr = dindptr.get<std::int32_t>();
    p.chunk_k      = dck.get();
    p.chunk_v      = dcv.get();
    p.q            = dq.get();
    p.scores       = dscores.get<float>();
    p.new_len      = dnew.get<std::int32_t>();
    p.scores_out   = dscores_out.get<float>();
    device_buffer ws(eviction_workspace_bytes(p));
    evict_chunk(p, ws.get(), ws.bytes(), nullptr);
    TANGRAM_TEST_CUDA(cudaDeviceSynchronize());
    auto gpu_pool   = dev.pool.download<std::byte>();
    auto gpu_len    = dnew.download<std::int32_t>();
    auto gpu_scores = dscores_out.download<float>();

    // CPU reference on an identical cache.
    std::vector<std::int32_t> cpu_len(static_cast<std::size_t>(B * H), -9);
    std::vector<float> cpu_scores(scores.size(), 0.f);
    p.kv           = cv;
    p.rules        = sc.rules.data() + layer * H;
    p.chunk_indptr = sc.chunk_indptr.data();
    p.chunk_k      = ck.data();
    p.chunk_v      = cvv.data();
    p.q            = q.data();
    p.scores       = scores.data();
    p.new_len      = cpu_len.data();
    p.scores_out   = cpu_scores.data();
    if (c.source != score_source::supplied) {
      // Scores agree within float tolerance; then select on the GPU's scores exactly.
      test_cache probe(sc.layout, sc.seqs, c.seed);
      auto probe_params = p;
      probe_params.kv   = probe.view(sc.batch);
      reference::evict_chunk(probe_params);
      for (std::size_t i = 0; i < cpu_scores.size(); ++i)
        REQUIRE(std::abs(gpu_scores[i] - cpu_scores[i]) <=
                1e-5f * std::max(1.f, std::abs(cpu_scores[i])) + 1e-7f);
      p.pool_kernel = p.pool();
      p.source      = score_source::supplied;
      p.scores      = gpu_scores.data();
    }
    reference::evict_chunk(p);
    REQUIRE(gpu_len == cpu_len);
    REQUIRE(gpu_pool == cpu_cache.pool());
    if (c.source == score_source::supplied) REQUIRE(gpu_scores == cpu_scores);
  }
}

}  // namespace

TEST_CASE("gpu eviction equals the CPU reference: supplied scores", "[gpu][eviction]") {
  std::uint64_t seed = 1;
  for (dtype t : {dtype::f32, dtype::f16, dtype::bf16})
    for (std::int32_t d : {64, 128, 256}) {
      gpu_eviction_case c;
      c.kv_dtype = t;
      c.d        = d;
      c.P        = d == 64 ? 1 : 16;
      c.seed     = ++seed;
      run_gpu_case(c);
    }
}

TEST_CASE("gpu eviction equals the CPU reference: built-in scores", "[gpu][eviction]") {
  gpu_eviction_case c;
  c.source = score_source::snapkv;
  c.seed   = 40;
  run_gpu_case(c);
  c.group      = 7;
  c.obs_window = 64;
  c.kv_dtype   = dtype::f32;
  c.d          = 64;
  c.seed       = 41;
  run_gpu_case(c);
  c.source   = score_source::key_norm;
  c.kv_dtype = dtype::f16;
  c.d        = 256;
  c.seed     = 42;
  run_gpu_case(c);
}

TEST_CASE("gpu eviction: long candidate lists (several radix tiles)", "[gpu][eviction]") {
  gpu_eviction_case c;
  c.long_len = 20000;
  c.seed     = 50;
  run_gpu_case(c);
}
