// SPDX-License-Identifier: Apache-2.0
// Helpers for the GPU tests: a device mirror of a test_cache view (buffers: device_buffer.cuh).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstring>
#include <memory>
#include <vector>

#include <catch2/catch.hpp>

#include "../reference/kv_test_cache.hpp"
#include "device_buffer.cuh"
#include "tangram/memory/kv_view.hpp"

namespace tangram::test {

#define TANGRAM_TEST_CUDA(call)                              \
  do {                                                       \
    cudaError_t tangram_err_ = (call);                       \
    INFO(#call << ": " << cudaGetErrorString(tangram_err_)); \
    REQUIRE(tangram_err_ == cudaSuccess);                    \
  } while (0)

/// The arrays of a test_cache's view, copied to the device, and the device view over them.
struct device_cache : device_kv_arrays {
  kv_cache_view view;

  explicit device_cache(test_cache& c, kv_cache_view const& host)
      : device_kv_arrays{device_buffer(c.pool()),
                         device_buffer(c.head_slots()),
                         device_buffer(c.layout().group_window),
                         device_buffer(c.layout().group_ring_pages),
                         device_buffer(c.page_offset()),
                         device_buffer(c.pages()),
                         device_buffer(c.base_len()),
                         device_buffer(c.appended()),
                         device_buffer(c.seq_tokens()),
                         device_buffer(c.batch_slots())},
        view(host) {
    attach(view);
  }
};

}  // namespace tangram::test
