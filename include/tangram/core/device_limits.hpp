// SPDX-License-Identifier: Apache-2.0
/**
 * @file core/device_limits.hpp
 * @brief Hardware facts the planners take as plain inputs, so planning is pure host code.
 */
#pragma once

#include <cstdint>

#include "tangram/core/error.hpp"

namespace tangram {

/**
 * @brief How many CTAs of a kernel can be resident at once: `sm_count * ctas_per_sm`.
 *
 * Fill it by hand (planning for a GPU you do not have) or from `query_device` /
 * the kernels' occupancy queries on a machine with a GPU.
 */
struct device_limits {
  std::int32_t sm_count    = 132;  ///< streaming multiprocessors (H100/H200 SXM: 132)
  std::int32_t ctas_per_sm = 2;    ///< resident CTAs per SM for the kernel (occupancy)

  /// N_CTA, the grid size of one wave.
  [[nodiscard]] std::int32_t max_ctas() const { return sm_count * ctas_per_sm; }

  /// @throw invalid_argument naming the field and the value.
  void validate() const {
    TANGRAM_EXPECTS(sm_count >= 1 && sm_count <= 65536,
                    invalid_argument,
                    "device_limits.sm_count: must be in [1, 65536], got ",
                    sm_count);
    TANGRAM_EXPECTS(ctas_per_sm >= 1 && ctas_per_sm <= 64,
                    invalid_argument,
                    "device_limits.ctas_per_sm: must be in [1, 64], got ",
                    ctas_per_sm);
  }
};

}  // namespace tangram
