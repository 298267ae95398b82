// SPDX-License-Identifier: Apache-2.0
/**
 * @file kernels/balanced_split.hpp
 * @brief A decode split map balanced per step on the device: parameters and the launcher.
 *
 * The plan's split map (core/split_view.hpp) gives each KV head a share of a layer's N_CTA CTAs
 * fixed ahead of time by its expected work; a batch whose heads hold other amounts runs its
 * fullest CTA above the mean (the AOT skew). `balance_decode_splits` reads the decode batch's head
 * lengths from the view, already on the device, and writes for every layer the shares that make
 * the fullest CTA as small as any shares can (core/balanced_split.hpp). The decode kernels take
 * any valid split map, so they do not change: pass `balanced_split_params::view()` as
 * `decode_params::splits`. No host planning, no synchronisation, no allocation.
 *
 * Once per decode step, after `mirror.sync` (the view of the step) and before the step's first
 * decode launch; one launch covers every layer (the lengths are per layer). N_CTA is the plan's,
 * so the decode workspace and the grid stay as sized. The launcher is in `tangram::kernels`
 * (kernels/balanced_split.cu); the CPU reference is reference/balanced_split.hpp. This header
 * compiles without CUDA.
 */
#pragma once

#include <cstdint>

#include "tangram/core/error.hpp"
#include "tangram/core/kv_view.hpp"
#include "tangram/core/split_view.hpp"
#include "tangram/core/stream.hpp"
#include "tangram/kernels/decode_attention.hpp"

namespace tangram {

/// Most KV heads per layer `balance_decode_splits` accepts (its per-head totals live in shared
/// memory: 8 bytes each).
inline constexpr std::int32_t balanced_split_max_heads = 4096;

/**
 * @brief Parameters of `balance_decode_splits`. Non-owning POD; `cta_begin` and every array of
 * `kv` are device memory for the launcher and host memory for the reference.
 */
struct balanced_split_params {
  kv_cache_view kv;           ///< the decode batch view of the step (after decode_step)
  std::int32_t num_ctas = 0;  ///< N_CTA of every layer's launch: the plan's `num_ctas()`
  std::int32_t* cta_begin =
      nullptr;  ///< out: [kv.num_layers * (kv.num_kv_heads + 1)], caller-owned

  /// The split map the launch writes, for `decode_params::splits`.
  [[nodiscard]] split_map_view view() const {
    return {kv.num_layers, kv.num_kv_heads, num_ctas, cta_begin};
  }

  /// @throw invalid_argument naming the field and the value.
  void validate() const {
    validate_view(kv, "balanced_split_params", 0, decode_max_batch);
    TANGRAM_EXPECTS(kv.num_kv_heads <= balanced_split_max_heads,
                    invalid_argument,
                    "balanced_split_params.kv.num_kv_heads: at most ",
                    balanced_split_max_heads,
                    ", got ",
                    kv.num_kv_heads);
    TANGRAM_EXPECTS(num_ctas >= kv.num_kv_heads,
                    invalid_argument,
                    "balanced_split_params.num_ctas: ",
                    num_ctas,
                    " cannot give each of the ",
                    kv.num_kv_heads,
                    " KV heads of a layer a CTA");
    TANGRAM_EXPECTS(
        cta_begin != nullptr, invalid_argument, "balanced_split_params.cta_begin: null");
  }
};

/**
 * @brief CUDA: writes `p.cta_begin` for every layer from the batch's head lengths (one block per
 * layer: warp sums of each head's tokens over the batch, then the bisection on one warp).
 * Stream-ordered, no host synchronisation, no allocation; graph-capturable (grid = layers).
 * With `decode_params::pdl`, a kernel launched without PDL (the library's append is one) must run
 * between this launch and the first decode launch: a PDL decode reads the split map before its
 * wait, and a PDL kernel between would let it start before this one finished.
 * @throw invalid_argument for invalid parameters; cuda_error when the launch fails.
 * @note Requires `tangram::kernels`.
 */
void balance_decode_splits(balanced_split_params const& p, cuda_stream_t stream);

}  // namespace tangram
