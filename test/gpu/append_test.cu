// SPDX-License-Identifier: Apache-2.0
// The CUDA decode-step append against the CPU reference: identical page pools afterwards.
#include <cuda_runtime_api.h>

#include <cstring>
#include <random>
#include <vector>

#include "gpu_support.cuh"
#include "tangram/kernels/append.hpp"
#include "tangram/reference/append.hpp"

using namespace tangram;
using tangram::test::device_buffer;

TEST_CASE("append_decode_kv matches the reference for every cache dtype", "[gpu][append]") {
  for (dtype cache : {dtype::f32, dtype::f16, dtype::bf16, dtype::fp8_e4m3, dtype::fp8_e5m2}) {
    for (dtype src : {dtype::f32, dtype::bf16}) {
      INFO("cache " << to_string(cache) << " src " << to_string(src));
      page_geometry geo{16, 2, 128, cache};
      auto layout = test::adjacent_layout(geo, 2, 4, /*sliding=*/{1}, /*window=*/40, /*ring_pages=*/3);
      std::vector<test::sequence_spec> seqs;
      for (std::int32_t r = 0; r < 5; ++r) {
        test::sequence_spec s;
        s.seq_tokens = 30 + 17 * r;
        s.appended   = 1 + r;
        s.base_len.assign(8, 10 + 7 * r);
        seqs.push_back(s);
      }
      test::test_cache cache_state(layout, seqs, 42);
      std::vector<std::int32_t> batch = {3, 0, 4, 1};
      auto host_view = cache_state.view(batch);
      test::device_cache dev(cache_state, host_view);

      std::mt19937 rng(7);
      std::uniform_real_distribution<float> u(-2, 2);
      std::size_t n = batch.size() * 4 * 128;
      std::vector<float> kf(n), vf(n);
      for (auto& x : kf) x = u(rng);
      for (auto& x : vf) x = u(rng);
      std::vector<std::uint8_t> k_src(n * size_of(src)), v_src(n * size_of(src));
      for (std::size_t i = 0; i < n; ++i) {
        reference::detail::store_from_float(k_src.data(), src, static_cast<std::int64_t>(i), kf[i]);
        reference::detail::store_from_float(v_src.data(), src, static_cast<std::int64_t>(i), vf[i]);
      }
      device_buffer k_dev(k_src), v_dev(v_src);
      for (std::int32_t layer = 0; layer < 2; ++layer) {
        append_params hp;
        hp.kv        = host_view;
        hp.layer     = layer;
        hp.k         = k_src.data();
        hp.v         = v_src.data();
        hp.src_dtype = src;
        reference::append_decode_kv(hp);
        append_params dp = hp;
        dp.kv            = dev.view;
        dp.k             = k_dev.get();
        dp.v             = v_dev.get();
        append_decode_kv(dp, nullptr);
      }
      TANGRAM_TEST_CUDA(cudaDeviceSynchronize());
      auto gpu_pool = dev.pool.download<std::uint8_t>();
      REQUIRE(gpu_pool.size() == cache_state.pool().size());
      CHECK(std::memcmp(gpu_pool.data(), cache_state.pool().data(), gpu_pool.size()) == 0);
    }
  }
}
