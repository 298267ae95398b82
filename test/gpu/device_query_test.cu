// SPDX-License-Identifier: Apache-2.0
#include "gpu_test.hpp"
#include "tangram/device/device.hpp"

TANGRAM_GPU_TEST("query_device reports the device the runtime sees", "[gpu][device]") {
  GPU_REQUIRE(tangram::cuda_device_count() >= 1);
  auto info = tangram::query_device(0);
  GPU_REQUIRE(info.has_value());
  GPU_CHECK(info->sm_count > 0);
  GPU_CHECK(info->total_memory_bytes > (std::size_t{1} << 30));
  GPU_CHECK(info->compute_major >= 7);
  GPU_CHECK(!tangram::query_device(-1).has_value());
  GPU_CHECK(!tangram::query_device(tangram::cuda_device_count()).has_value());
}
