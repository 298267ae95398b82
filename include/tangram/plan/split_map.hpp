// SPDX-License-Identifier: Apache-2.0
/**
 * @file plan/split_map.hpp
 * @brief The static Workload Split Map (the paper's Algorithm 1), owning: the CTA boundaries of
 * every layer's decode launch. Its non-owning view and the per-step arithmetic that maps a decode
 * CTA to its work, shared by the CPU reference and the kernels: core/split_view.hpp.
 */
#pragma once

#include <cstdint>
#include <vector>

#include "tangram/core/config.hpp"
#include "tangram/core/device_limits.hpp"
#include "tangram/core/error.hpp"
#include "tangram/core/split_view.hpp"

namespace tangram {

/**
 * @brief A static split map (owning). Built by `build_split_map` (plan/split_planner.hpp).
 */
struct split_map {
  std::int32_t num_layers   = 0;
  std::int32_t num_kv_heads = 0;
  device_limits limits;                ///< sm_count and ctas_per_sm it was planned for
  std::vector<std::int32_t> cta_begin;  ///< [num_layers * (num_kv_heads + 1)]
  std::vector<double> phi;              ///< [num_layers * num_kv_heads] weights the shares follow

  [[nodiscard]] std::int32_t num_ctas() const { return limits.max_ctas(); }
  [[nodiscard]] split_map_view view() const {
    return {num_layers, num_kv_heads, num_ctas(), cta_begin.data()};
  }

  /// @throw invalid_argument when boundaries are not increasing, a head has no CTA, or a layer's
  /// shares do not sum to N_CTA.
  void validate() const {
    limits.validate();
    auto H = static_cast<std::size_t>(num_kv_heads);
    TANGRAM_EXPECTS(cta_begin.size() == static_cast<std::size_t>(num_layers) * (H + 1),
                    invalid_argument, "split_map.cta_begin: expected ", num_layers * (num_kv_heads + 1),
                    " entries, got ", cta_begin.size());
    for (std::int32_t l = 0; l < num_layers; ++l) {
      auto v = view();
      TANGRAM_EXPECTS(v.begin(l, 0) == 0 && v.begin(l, num_kv_heads) == num_ctas(), invalid_argument,
                      "split_map: layer ", l, " shares sum to ", v.begin(l, num_kv_heads) - v.begin(l, 0),
                      ", expected N_CTA = ", num_ctas());
      for (std::int32_t h = 0; h < num_kv_heads; ++h)
        TANGRAM_EXPECTS(v.share(l, h) >= 1, invalid_argument, "split_map: layer ", l, " head ", h,
                        " has ", v.share(l, h), " CTAs (at least 1 required)");
    }
  }
};

}  // namespace tangram
