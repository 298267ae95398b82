// SPDX-License-Identifier: Apache-2.0
/**
 * @file kernels/append.hpp
 * @brief Writes the K/V of a decode step's new token into every head of one layer.
 *
 * After `kv_cache_manager::decode_step()` every head holds one more token; its newest held token
 * (index `head_len - 1`: the end of a growing column, or the ring slot of position
 * `seq_tokens - 1` in a sliding-window group) is the one to fill. The engine calls this once per
 * layer, after computing that layer's new keys (rotary applied) and values and before the layer's
 * `decode_attention`, which then attends over the new token too.
 */
#pragma once

#include <cstdint>

#include "tangram/core/dtype.hpp"
#include "tangram/core/error.hpp"
#include "tangram/core/kv_view.hpp"
#include "tangram/core/stream.hpp"
#include "tangram/kernels/head_cursor.hpp"
#include "tangram/kernels/kv_scales.hpp"

namespace tangram {

/**
 * @brief Parameters of `append_decode_kv`. Non-owning POD; every pointer (including those inside
 * `kv`) is device memory for the CUDA launcher and host memory for the reference.
 */
struct append_params {
  kv_cache_view kv;           ///< the view after decode_step (new token counted in every head)
  std::int32_t layer = 0;     ///< layer whose heads receive the token
  const void* k      = nullptr;  ///< new keys, rows [batch][H * d] (row r = request r)
  const void* v      = nullptr;  ///< new values, same layout
  dtype src_dtype    = dtype::bf16;  ///< element type of k and v (converted to the cache dtype)
  std::int64_t src_stride = 0;   ///< elements between consecutive rows; 0 means H * d
  /// fp8 caches only: element x of KV head h is stored as `from_float(x / s_h)` (K and V with
  /// their own scales; see kv_scales.hpp). The conversion saturates: `|x / s_h|` above the
  /// format's largest finite value (448 e4m3, 57344 e5m2), infinities included, stores that value
  /// with x's sign; NaN stays NaN.
  kv_scales scales;

  [[nodiscard]] TANGRAM_HOST_DEVICE std::int64_t row_stride() const {
    return src_stride > 0 ? src_stride
                          : static_cast<std::int64_t>(kv.num_kv_heads) * kv.geometry.head_dim;
  }

  /// @throw invalid_argument naming the field and the value.
  void validate() const {
    validate_view(kv, "append_params", layer);
    TANGRAM_EXPECTS(k != nullptr && v != nullptr, invalid_argument,
                    "append_params.k/v: null (batch_size ", kv.batch_size, ")");
    TANGRAM_EXPECTS(src_stride == 0 ||
                        src_stride >= static_cast<std::int64_t>(kv.num_kv_heads) * kv.geometry.head_dim,
                    invalid_argument, "append_params.src_stride: must be 0 or >= H * d = ",
                    kv.num_kv_heads * kv.geometry.head_dim, ", got ", src_stride);
    scales.validate("append_params", kv.num_kv_heads, kv.geometry.kv_dtype);
  }
};

/**
 * @brief CUDA: writes the new token's K/V of layer `p.layer` for every request of the batch.
 * One block per (request, head); a head holding no token is skipped (so is every head of a
 * padding request, `kv_cache_view::is_padding`: it holds none). Stream-ordered, no host
 * synchronisation, no allocation; graph-capturable (grid = batch x H).
 * @throw invalid_argument for invalid parameters or an unsupported dtype pair (source f32, f16
 * or bf16; cache f32, f16, bf16, fp8_e4m3 or fp8_e5m2); cuda_error when the launch fails.
 * @note Requires `tangram::kernels`.
 */
void append_decode_kv(append_params const& p, cuda_stream_t stream);

/// Shared by the kernel and the reference: where request r's new token of head h goes.
TANGRAM_HOST_DEVICE bool append_target(kv_cache_view const& kv, std::int32_t r, std::int32_t layer,
                                       std::int32_t h, head_cursor& cursor, std::int32_t& position) {
  cursor = make_head_cursor(kv, r, layer, h);
  if (cursor.len == 0) return false;
  position = cursor.position(cursor.len - 1);
  return true;
}

}  // namespace tangram
