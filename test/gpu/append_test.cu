// SPDX-License-Identifier: Apache-2.0
// The CUDA decode-step append against the CPU reference (the scenario of kernel_cases.hpp, which
// the host emulation tests in test/emu run too): identical page pools afterwards.
#include "gpu_support.cuh"

using namespace tangram;

TANGRAM_GPU_TEST("append_decode_kv matches the reference for every cache and source dtype",
                 "[gpu][append]") {
  test::gpu_backend gpu;
  for (dtype cache : test::append_cache_dtypes())
    for (dtype src : test::append_source_dtypes())
      GPU_CHECK_MSG(test::check_append(cache, src, gpu).empty(),
                    "cache " << to_string(cache) << " src " << to_string(src));
}

TANGRAM_GPU_TEST("append_decode_kv matches the reference for fp8 caches with scales",
                 "[gpu][append][fp8][scales]") {
  test::gpu_backend gpu;
  for (dtype cache : {dtype::fp8_e4m3, dtype::fp8_e5m2})
    for (auto m : {test::scale_mode::per_tensor, test::scale_mode::per_head})
      for (dtype src : test::append_source_dtypes())
        GPU_CHECK_MSG(test::check_append(cache, src, gpu, m).empty(),
                      "cache " << to_string(cache) << " src " << to_string(src) << ", "
                               << test::to_string(m));
}

TANGRAM_GPU_TEST("append_decode_kv matches the reference on per-head pages (Hp 1)",
                 "[gpu][append][per_head]") {
  test::gpu_backend gpu;
  for (dtype cache : test::append_cache_dtypes()) {
    auto scales = cache == dtype::fp8_e4m3 ? test::scale_mode::per_head : test::scale_mode::none;
    GPU_CHECK_MSG(test::check_append(cache, dtype::bf16, gpu, scales, 1).empty(),
                  "cache " << to_string(cache) << ", Hp 1");
  }
}
