// SPDX-License-Identifier: Apache-2.0
/**
 * @file device/device.hpp
 * @brief Device queries. Declared here (host-compilable), defined in `tangram::kernels`, which
 * links only the CUDA runtime: on a machine without a driver or GPU these report "no device"
 * instead of failing.
 */
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "tangram/core/device_limits.hpp"

namespace tangram {

/// @brief Properties of one CUDA device.
struct device_info {
  std::int32_t device_id           = 0;
  std::string name;                     ///< e.g. "NVIDIA H200"
  std::int32_t sm_count            = 0;
  std::int32_t compute_major       = 0;
  std::int32_t compute_minor       = 0;
  std::size_t total_memory_bytes   = 0;
  std::int32_t max_threads_per_sm  = 0;
  std::size_t shared_memory_per_sm = 0;
};

/**
 * @brief Number of usable CUDA devices; 0 when there is no driver, no device, or the runtime
 * reports any error (which is then cleared). Never throws. Requires `tangram::kernels`.
 */
std::int32_t cuda_device_count() noexcept;

/**
 * @brief Properties of device `device_id`, or nullopt when it does not exist or there is no
 * usable driver. Never throws. Requires `tangram::kernels`.
 */
std::optional<device_info> query_device(std::int32_t device_id = 0) noexcept;

}  // namespace tangram
