// SPDX-License-Identifier: Apache-2.0
/**
 * @file kernels/kv_scales.hpp
 * @brief Quantisation scales of fp8 K/V pages (vLLM's `k_scale` / `v_scale`): one per tensor
 * (per layer) or one per KV head, K and V separately.
 *
 * A page stores `from_float(x / s)` and holds the value `to_float(stored) * s`, with `s` the
 * scale of the element's KV head `h` (`count == num_kv_heads`) or the single scale
 * (`count == 1`). The append writes with it; decode and prefill attention and the chunk
 * eviction's built-in scores read with it.
 *
 * It lives with the kernel parameters, not in `kv_cache_view`: the view describes where tokens
 * are (one per batch, shared by every layer), while scales are values of one layer's tensors
 * that an engine may update (calibration, dynamic scaling) without rebuilding the view. Every
 * operation that reads or writes a layer's fp8 pages takes the same `kv_scales` for that layer.
 */
#pragma once

#include <cmath>
#include <cstdint>

#include "tangram/core/config.hpp"
#include "tangram/core/dtype.hpp"
#include "tangram/core/error.hpp"

namespace tangram {

/**
 * @brief K and V dequantisation scales of one layer's fp8 pages. Non-owning POD.
 *
 * - `count == 0`: no scale (every scale is 1; `k` and `v` are ignored and may be null)
 * - `count == 1`: per tensor, `k[0]` / `v[0]` for every KV head
 * - `count == num_kv_heads`: per KV head, `k[h]` / `v[h]`
 *
 * Ownership and synchronisation: the arrays belong to the caller. For the CUDA launchers they
 * are device memory, read by the kernels when they run (never by the launcher on the host), so
 * an engine may rewrite them with stream-ordered work before the launch and a captured CUDA
 * graph picks up new values on replay; they must stay valid and unchanged until the launch's
 * work on its stream completes. For the CPU references they are host memory, read during the
 * call. Scales are only accepted with an fp8 KV dtype (`f32`/`f16`/`bf16` pages hold values
 * directly, and a scale there would be a second, untested number format); the launchers check
 * `count` and the pointers, the references also check the values (finite and > 0), which a
 * launcher cannot read without a host synchronisation.
 */
struct kv_scales {
  const float* k = nullptr;  ///< K scales: `count` floats (device for kernels, host for references)
  const float* v = nullptr;  ///< V scales: `count` floats
  std::int32_t count = 0;    ///< 0 (none), 1 (per tensor) or num_kv_heads (per KV head)

  /// K scale of KV head `h` (1 without scales).
  [[nodiscard]] TANGRAM_HOST_DEVICE float k_of(std::int32_t h) const {
    return count == 0 ? 1.f : k[count == 1 ? 0 : h];
  }
  /// V scale of KV head `h` (1 without scales).
  [[nodiscard]] TANGRAM_HOST_DEVICE float v_of(std::int32_t h) const {
    return count == 0 ? 1.f : v[count == 1 ? 0 : h];
  }

  /**
   * @brief Host check of the shape (no reads of the arrays): `count` is 0, 1 or
   * `num_kv_heads`, the pointers are non-null when `count > 0`, and scales come with an fp8
   * `kv_dtype` only.
   * @param owner the parameter struct's name for the messages, e.g. "decode_params".
   * @throw invalid_argument naming the field and the value.
   */
  void validate(const char* owner, std::int32_t num_kv_heads, dtype kv_dtype) const {
    TANGRAM_EXPECTS(count == 0 || count == 1 || count == num_kv_heads,
                    invalid_argument,
                    owner,
                    ".scales.count: must be 0, 1 or num_kv_heads (",
                    num_kv_heads,
                    "), got ",
                    count);
    if (count == 0) return;
    TANGRAM_EXPECTS(k != nullptr, invalid_argument, owner, ".scales.k: null with count ", count);
    TANGRAM_EXPECTS(v != nullptr, invalid_argument, owner, ".scales.v: null with count ", count);
    TANGRAM_EXPECTS(kv_dtype == dtype::fp8_e4m3 || kv_dtype == dtype::fp8_e5m2,
                    invalid_argument,
                    owner,
                    ".scales: only for fp8 KV dtypes, kv dtype is ",
                    to_string(kv_dtype),
                    " (count ",
                    count,
                    ")");
  }

  /**
   * @brief Host check of the values, for host arrays (the references): every scale finite and
   * > 0 (a zero or negative scale has no inverse the append could store with).
   * @throw invalid_argument naming the field, the index and the value.
   */
  void validate_values(const char* owner) const {
    for (std::int32_t i = 0; i < count; ++i) {
      TANGRAM_EXPECTS(std::isfinite(k[i]) && k[i] > 0.f,
                      invalid_argument,
                      owner,
                      ".scales.k[",
                      i,
                      "]: must be finite and > 0, got ",
                      k[i]);
      TANGRAM_EXPECTS(std::isfinite(v[i]) && v[i] > 0.f,
                      invalid_argument,
                      owner,
                      ".scales.v[",
                      i,
                      "]: must be finite and > 0, got ",
                      v[i]);
    }
  }
};

}  // namespace tangram
