// SPDX-License-Identifier: Apache-2.0
/**
 * @file kernels/prefill_attention.hpp
 * @brief Chunked-prefill attention over ragged head-group pages: parameters, the visibility rule
 * shared by the CUDA kernel and the CPU reference, the launch shape and the launcher.
 *
 * One launch computes one layer for a batch of requests, each with a chunk of `c_r >= 0` new
 * tokens (query rows `chunk_indptr[r] .. chunk_indptr[r + 1] - 1`). The view describes the state
 * *before* the chunk (as for the eviction, kernels/eviction.hpp, which runs after this kernel in
 * the same layer and writes the chunk into the pages). Query row `t` of request `r`, query head
 * `h * group + g` (GQA: `group` query heads per KV head `h`) attends over
 *
 * - (a) the `len = head_len(r, layer, h)` tokens KV head `h` holds in the pages (its compressed
 *   past; a sliding-window group's ring, oldest first), and
 * - (b) the chunk's own K/V rows `0..t` of KV head `h` (causal within the chunk).
 *
 * Number the keys `k = 0 .. len + c_r - 1`: held token `i` is key `i`, chunk row `u` is key
 * `len + u`; the query of row `t` is key `len + t`. The query sees key `k` when
 * `k <= len + t` (causal) and, for a sliding-window group of window `W`, `k > len + t - W`
 * (sequence position `p` sees positions `> p - W`: held token `i` of a ring is at position
 * `seq_tokens - len + i`, chunk row `u` at `seq_tokens + u`). Compressed and uncompressed heads
 * see every held token (their positions are not contiguous; no window applies).
 *
 * With base scores `s_k = sm_scale * q . k_k` over the visible keys and an optional sink logit
 * `z` of the query head (GPT-OSS; it enters the denominator only):
 *
 *     o   = sum_k e^{s_k} v_k / (e^{z} + sum_k e^{s_k})
 *     lse = ln(e^{z} + sum_k e^{s_k})            (natural log; z = -inf without sinks)
 *
 * The eviction's SnapKV scorer can reuse `lse` instead of recomputing the normaliser: the
 * attention weight of query row `t` on a visible key `k` is `exp(s_k - lse[t][head])`.
 *
 * The pages part (a) and the chunk part (b) are two partial softmaxes merged by log-sum-exp:
 * `lse = ln(e^{z} + e^{lse_a} + e^{lse_b})`, `o = (e^{lse_a} o_a + e^{lse_b} o_b) / e^{lse}` with
 * `o_x`, `lse_x` the normalised output and log-sum-exp of part x (the reference computes them
 * so; the kernel streams both parts through one online softmax, which is the same sum).
 *
 * Launchers are defined in `tangram::kernels` (kernels/prefill_attention.cu); the CPU reference
 * is in reference/prefill_attention.hpp. This header compiles without CUDA.
 */
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "tangram/core/config.hpp"
#include "tangram/core/detail/checked_math.hpp"
#include "tangram/core/dtype.hpp"
#include "tangram/core/error.hpp"
#include "tangram/core/kv_shape.hpp"
#include "tangram/core/kv_view.hpp"
#include "tangram/core/stream.hpp"
#include "tangram/kernels/kv_scales.hpp"

namespace tangram {

/// Largest GQA group (query heads per KV head) prefill attention accepts.
inline constexpr std::int32_t prefill_max_group = 32;
/// Largest batch one prefill launch accepts (the grid's z dimension).
inline constexpr std::int32_t prefill_max_batch = 65535;
/// Query rows x query heads (of one KV head) one CTA of the CUDA kernel computes.
inline constexpr std::int32_t prefill_rows_per_cta = 16;

// ---------------------------------------------------------------------------------------------
// Visibility (host/device; the CUDA kernel and the CPU reference both use these).
// ---------------------------------------------------------------------------------------------

/**
 * True when the query of chunk row `t` sees key `k` (held token `k < len`, chunk row `k - len`
 * otherwise) of a head holding `len` tokens; `window` is the group's sliding window, 0 if none.
 */
TANGRAM_HOST_DEVICE constexpr bool prefill_visible(std::int64_t k,
                                                   std::int64_t t,
                                                   std::int64_t len,
                                                   std::int64_t window) {
  return k <= len + t && (window <= 0 || k > len + t - window);
}

/// First key any query of chunk rows `[t_first, ...]` sees (keys below are masked for all).
TANGRAM_HOST_DEVICE constexpr std::int64_t prefill_first_key(std::int64_t t_first,
                                                             std::int64_t len,
                                                             std::int64_t window) {
  return window <= 0 || len + t_first - window + 1 < 0 ? 0 : len + t_first - window + 1;
}

// ---------------------------------------------------------------------------------------------
// Parameters.
// ---------------------------------------------------------------------------------------------

/**
 * @brief One prefill-attention launch: one layer, one chunk per request of `kv`'s batch.
 *
 * Non-owning POD. For the CUDA launcher every pointer (including those inside `kv`) is device
 * memory; for the CPU reference every pointer is host memory. Nothing is modified but `o` and
 * `lse`; the pages are only read.
 *
 * Query head `h * group + g` (g < group) uses KV head `h`; `Hq = num_kv_heads * group`. Layouts
 * (row-major), with chunk row `t` of request `r` at row `chunk_indptr[r] + t`:
 * - `q`:  `[rows][Hq][head_dim]` in `q_dtype`; rows `q_stride` elements apart (0: dense,
 *         `Hq * head_dim`)
 * - `chunk_k`, `chunk_v`: `[rows][num_kv_heads][head_dim]` in the KV dtype (the arrays the
 *         eviction then takes)
 * - `o`:  `[rows][Hq][head_dim]` in `o_dtype`, dense
 * - `lse` (optional): `[rows][Hq]`, natural-log sum-exp of the scaled logits, sink included
 * - `sinks` (optional): `[Hq]` per-query-head sink logits
 *
 * `max_chunk` bounds every request's chunk (`chunk_indptr[r + 1] - chunk_indptr[r]`); it sizes
 * the CUDA grid without reading `chunk_indptr` on the host. The reference checks the bound; the
 * kernel does not compute rows beyond it (a device check in debug builds and the emulator).
 */
struct prefill_params {
  kv_cache_view kv;  ///< state before the chunk; its `batch_size`/`batch_slots` define the batch
  std::int32_t layer               = 0;
  std::int32_t group               = 1;        ///< query heads per KV head, 1..prefill_max_group
  const std::int32_t* chunk_indptr = nullptr;  ///< [batch + 1], non-decreasing, starts at 0
  std::int32_t max_chunk           = 0;        ///< bound on any request's chunk rows (>= 0)
  const void* q                    = nullptr;
  dtype q_dtype                    = dtype::bf16;
  std::int64_t q_stride            = 0;  ///< elements between consecutive query rows; 0: dense
  const void* chunk_k              = nullptr;
  const void* chunk_v              = nullptr;
  void* o                          = nullptr;
  dtype o_dtype                    = dtype::bf16;
  float* lse                       = nullptr;  ///< optional
  const float* sinks               = nullptr;  ///< optional
  float sm_scale                   = 0.f;      ///< logit scale; 0 means 1/sqrt(head_dim)
  /// fp8 only: pages and `chunk_k`/`chunk_v` of KV head h hold `to_float(stored) * s_h`
  /// (kv_scales.hpp; device arrays for the launcher). The kernel folds the K scale into the
  /// pre-scaled queries and the V scale into the output; the reference dequantises every element.
  kv_scales scales;

  [[nodiscard]] TANGRAM_HOST_DEVICE std::int32_t num_q_heads() const {
    return kv.num_kv_heads * group;
  }
  [[nodiscard]] TANGRAM_HOST_DEVICE std::int64_t q_row_stride() const {
    return q_stride != 0 ? q_stride
                         : static_cast<std::int64_t>(num_q_heads()) * kv.geometry.head_dim;
  }
  [[nodiscard]] float scale() const {
    return sm_scale != 0.f ? sm_scale : 1.f / std::sqrt(static_cast<float>(kv.geometry.head_dim));
  }

  /**
   * @brief Checks everything that can be checked on the host without reading the arrays.
   * @throw invalid_argument naming the field and the value.
   */
  void validate() const {
    validate_view(kv, "prefill_params", layer, prefill_max_batch);
    scales.validate("prefill_params", kv.num_kv_heads, kv.geometry.kv_dtype);
    TANGRAM_EXPECTS(group >= 1 && group <= prefill_max_group,
                    invalid_argument,
                    "prefill_params.group: must be in [1, ",
                    prefill_max_group,
                    "], got ",
                    group);
    TANGRAM_EXPECTS(max_chunk >= 0,
                    invalid_argument,
                    "prefill_params.max_chunk: must be >= 0, got ",
                    max_chunk);
    const std::int32_t hq = detail::mul_or_throw<std::int32_t>(
        kv.num_kv_heads, group, "prefill_params: kv.num_kv_heads * group");
    const std::int64_t row = detail::mul_or_throw<std::int64_t>(
        hq, kv.geometry.head_dim, "prefill_params: num_q_heads * head_dim");
    // The grid's x dimension: ceil(max_chunk * group / prefill_rows_per_cta) CTAs.
    (void)detail::add_or_throw<std::int32_t>(
        detail::mul_or_throw<std::int32_t>(max_chunk, group, "prefill_params: max_chunk * group"),
        prefill_rows_per_cta,
        "prefill_params: max_chunk * group + rows per CTA");
    const bool work = kv.batch_size > 0 && max_chunk > 0;
    TANGRAM_EXPECTS(chunk_indptr != nullptr || kv.batch_size == 0,
                    invalid_argument,
                    "prefill_params.chunk_indptr: null");
    TANGRAM_EXPECTS(q != nullptr || !work, invalid_argument, "prefill_params.q: null");
    TANGRAM_EXPECTS((chunk_k != nullptr && chunk_v != nullptr) || !work,
                    invalid_argument,
                    "prefill_params.chunk_k/chunk_v: null");
    TANGRAM_EXPECTS(o != nullptr || !work, invalid_argument, "prefill_params.o: null");
    TANGRAM_EXPECTS(q_stride == 0 || q_stride >= row,
                    invalid_argument,
                    "prefill_params.q_stride: must be 0 or >= num_q_heads * head_dim = ",
                    row,
                    ", got ",
                    q_stride);
    TANGRAM_EXPECTS(std::isfinite(sm_scale) && sm_scale >= 0.f,
                    invalid_argument,
                    "prefill_params.sm_scale: must be finite and >= 0 (0: 1/sqrt(head_dim)), got ",
                    sm_scale);
  }
};

/// Query tiles (grid x) of a launch: `ceil(max_chunk * group / prefill_rows_per_cta)`.
TANGRAM_HOST_DEVICE constexpr std::int32_t prefill_query_tiles(std::int32_t max_chunk,
                                                               std::int32_t group) {
  return static_cast<std::int32_t>(
      (static_cast<std::int64_t>(max_chunk) * group + prefill_rows_per_cta - 1) /
      prefill_rows_per_cta);
}

/// Bytes of workspace `prefill_attention` needs for `p`: 0 today (no split over the keys); the
/// argument is kept so a split-KV version can use one without an interface change.
inline std::size_t prefill_workspace_bytes(prefill_params const&) {
  return 0;
}

// ---------------------------------------------------------------------------------------------
// CUDA launcher (defined in tangram::kernels).
// ---------------------------------------------------------------------------------------------

/// True when the CUDA kernel supports this (KV dtype, head dim): the compiled list of
/// core/kv_shape.hpp, every dtype (f32, f16, bf16, fp8_e4m3, fp8_e5m2; fp8 widened to f32, times
/// its kv_scales) x head dims 64/128/256.
constexpr bool prefill_kernel_supports(dtype kv_dtype, std::int32_t head_dim) noexcept {
  return kv_shape_supported(kv_dtype, head_dim);
}

/**
 * @brief Launches prefill attention for one layer on `stream`: one kernel, grid
 * (`prefill_query_tiles(max_chunk, group)`, num_kv_heads, batch) of 128 threads.
 *
 * Stream-ordered and asynchronous: no host synchronisation, no allocation, no host reads of
 * device arrays. Inputs must stay valid and unchanged until the work on `stream` completes; run
 * it before the layer's eviction (which rewrites the pages this kernel reads). Requires
 * `tangram::kernels` (a CUDA build).
 *
 * @param workspace device memory of at least `prefill_workspace_bytes(p)` bytes (0 today: may be
 *        null), owned by the caller.
 * @throw invalid_argument for invalid parameters (see `prefill_params::validate`), an
 *        unsupported (dtype, head dim), misaligned pointers or a too small workspace.
 * @throw cuda_error when the launch fails.
 */
void prefill_attention(prefill_params const& p,
                       void* workspace,
                       std::size_t workspace_bytes,
                       cuda_stream_t stream);

}  // namespace tangram
