// SPDX-License-Identifier: Apache-2.0
#include <catch2/catch.hpp>

#include "tangram/device/device.hpp"

TEST_CASE("query_device reports the device the runtime sees", "[gpu][device]") {
  REQUIRE(tangram::cuda_device_count() >= 1);
  auto info = tangram::query_device(0);
  REQUIRE(info.has_value());
  CHECK(info->sm_count > 0);
  CHECK(info->total_memory_bytes > (std::size_t{1} << 30));
  CHECK(info->compute_major >= 7);
  CHECK_FALSE(tangram::query_device(-1).has_value());
  CHECK_FALSE(tangram::query_device(tangram::cuda_device_count()).has_value());
}
