// SPDX-License-Identifier: Apache-2.0
/**
 * @file kernels/decode_attention.hpp
 * @brief Ragged paged decode attention over a `kv_cache_view`: parameters, the split-KV index
 * math shared by the CUDA kernel and the CPU reference, the workspace contract and the launcher.
 *
 * One launch computes one layer for a batch of requests, one new query token each. Every KV head
 * attends over its own held tokens (`kv_cache_view::head_len` / `locate`, sliding-window rings
 * included) for the `group` query heads that share it (GQA). The work follows the static split
 * map (core/split_view.hpp): the layer's N_CTA CTAs are shared among its KV heads; CTA `j` of head
 * `h` covers stream positions `[j * W / S, (j + 1) * W / S)` of the head's token stream
 * concatenated over the batch (`W` tokens, `S` CTAs). Each (CTA, request) piece yields a partial
 * result at slot `j + r` of the head; a merge combines a request's partials by log-sum-exp in CTA
 * order. A request covered by a single CTA is written directly (no merge). The mapping and the
 * merge order are fixed, so results are deterministic. With a layer-stream split
 * (`layer_stream_split`) the CTAs cut the layer's stream over every head instead, so a CTA may
 * serve two or more heads and every CTA holds the same tokens to one.
 *
 * Batch-invariant mode (`decode_params::invariant_pieces` = K > 0): a request's tokens on a head
 * are cut into pieces whose size depends on its length alone (`invariant_piece_tokens`: at most K
 * pieces, each at least `decode_invariant_min_piece` tokens); the CTA whose stream range holds a
 * piece's first token processes the whole piece, every piece has its own partial slot, and the
 * merge folds a request's pieces in order. So a request's output, bit for bit, does not depend on
 * the other requests of the batch nor on the split map (for deterministic and RL serving).
 *
 * Launchers are defined in `tangram::kernels` (kernels/decode_attention*.cu); the CPU reference
 * is in reference/decode_attention.hpp. This header compiles without CUDA.
 */
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>

#include "tangram/core/config.hpp"
#include "tangram/core/detail/checked_math.hpp"
#include "tangram/core/device_limits.hpp"
#include "tangram/core/dtype.hpp"
#include "tangram/core/error.hpp"
#include "tangram/core/kv_shape.hpp"
#include "tangram/core/kv_view.hpp"
#include "tangram/core/split_view.hpp"
#include "tangram/core/stream.hpp"
#include "tangram/kernels/kv_scales.hpp"
#include "tangram/kernels/math.hpp"

namespace tangram {

/// Largest GQA group (query heads per KV head) the decode kernels support.
inline constexpr std::int32_t decode_max_group = 8;
static_assert(decode_max_group == kv_shape_query_groups[std::size(kv_shape_query_groups) - 1],
              "decode_max_group is the largest compiled query-group bucket (core/kv_shape.hpp)");
/// Largest batch one decode launch accepts (the per-head length prefix lives in shared memory).
inline constexpr std::int32_t decode_max_batch = 4096;
/// Largest `decode_params::invariant_pieces` (pieces per (request, KV head) in batch-invariant
/// mode).
inline constexpr std::int32_t decode_max_invariant_pieces = 64;
/// Smallest piece of batch-invariant mode, in tokens: shorter requests are one piece (no merge).
inline constexpr std::int64_t decode_invariant_min_piece = 256;
/// Piece sizes of batch-invariant mode are multiples of this many tokens (whole decode tiles).
inline constexpr std::int64_t decode_invariant_piece_align = 64;

// ---------------------------------------------------------------------------------------------
// Split-KV index math (host/device; the CUDA kernels and the CPU reference both use these).
// ---------------------------------------------------------------------------------------------

/// @brief Half-open range of stream positions.
struct stream_range {
  std::int64_t begin = 0;
  std::int64_t end   = 0;
  TANGRAM_HOST_DEVICE bool empty() const { return begin >= end; }
};

/// Stream positions covered by local CTA `j` of a head split over `share` CTAs, `total` tokens.
TANGRAM_HOST_DEVICE stream_range split_range(std::int64_t j,
                                             std::int64_t share,
                                             std::int64_t total) {
  return {split_bound(j, share, total), split_bound(j + 1, share, total)};
}

/// @brief Local CTAs `[first, last]` whose ranges cover a request's tokens.
struct cta_span {
  std::int64_t first = 0;
  std::int64_t last  = -1;
  TANGRAM_HOST_DEVICE bool single() const { return first == last; }
};

/**
 * The CTAs that cover stream positions `[prefix, prefix + len)` of a head (`len >= 1`). CTAs in
 * between with empty ranges are included; they write no partial and the merge skips them.
 */
TANGRAM_HOST_DEVICE cta_span request_ctas(std::int64_t prefix,
                                          std::int64_t len,
                                          std::int64_t share,
                                          std::int64_t total) {
  return {split_cta_of(prefix, share, total), split_cta_of(prefix + len - 1, share, total)};
}

/**
 * Tokens `[begin, end)` of a request (local token indices) that local CTA `j` processes, given
 * the request's stream prefix and length; empty when the CTA does not reach the request.
 */
TANGRAM_HOST_DEVICE stream_range piece_of(
    std::int64_t j, std::int64_t share, std::int64_t total, std::int64_t prefix, std::int64_t len) {
  stream_range cta = split_range(j, share, total);
  std::int64_t lo  = cta.begin > prefix ? cta.begin : prefix;
  std::int64_t hi  = cta.end < prefix + len ? cta.end : prefix + len;
  return {lo - prefix, (hi > lo ? hi : lo) - prefix};
}

/**
 * Tokens per piece of a request holding `len` tokens on a head, in batch-invariant mode with at
 * most `pieces` (>= 1) pieces: `ceil(len / pieces)` rounded up to `decode_invariant_piece_align`,
 * at least `decode_invariant_min_piece`. A function of (len, pieces) only, so it does not change
 * with the batch; `ceil(len / result) <= pieces`.
 */
TANGRAM_HOST_DEVICE std::int64_t invariant_piece_tokens(std::int64_t len, std::int32_t pieces) {
  const std::int64_t even    = (len + pieces - 1) / pieces;
  const std::int64_t aligned = (even + decode_invariant_piece_align - 1) /
                               decode_invariant_piece_align * decode_invariant_piece_align;
  return aligned > decode_invariant_min_piece ? aligned : decode_invariant_min_piece;
}

/// Number of pieces of a request holding `len` (>= 0) tokens on a head in batch-invariant mode.
TANGRAM_HOST_DEVICE std::int64_t invariant_piece_count(std::int64_t len, std::int32_t pieces) {
  const std::int64_t c = invariant_piece_tokens(len, pieces);
  return (len + c - 1) / c;
}

/**
 * @brief One piece a decode CTA processes: tokens `[begin, end)` of request `r` on its head,
 * stored at partial slot `slot`, or written as the output when `whole` (the request's only piece).
 */
struct decode_piece {
  std::int64_t begin = 0;
  std::int64_t end   = 0;
  std::int64_t slot  = 0;
  bool whole         = false;
};

/**
 * @brief Byte layout of the decode workspace (offsets from its start, 256-byte aligned).
 *
 * - `partial_o`:   float `[slots][group][head_dim]`, a CTA's normalised partial output
 * - `partial_lse`: float `[slots][group]`, its log2-sum-exp (base-2 logits)
 * - `prefix`:      int64 `[num_kv_heads][batch + 1]`, each head's exclusive length prefix over
 *                  the batch (written on the device by local CTA 0 of the head; read by the merge)
 *
 * `slots = split_map_view::partial_slots(batch) = N_CTA + num_kv_heads * batch`, or in
 * batch-invariant mode `num_kv_heads * batch * invariant_pieces` (slot `(h * batch + r) * K + i`
 * holds piece i of request r on head h).
 */
struct decode_workspace_layout {
  std::int64_t partial_o   = 0;
  std::int64_t partial_lse = 0;
  std::int64_t prefix      = 0;
  std::int64_t bytes       = 0;  ///< total size
};

/// Partial slot of piece `i` of request `r` on KV head `h` in batch-invariant mode.
TANGRAM_HOST_DEVICE std::int64_t invariant_slot(
    std::int32_t h, std::int32_t r, std::int64_t i, std::int32_t batch, std::int32_t pieces) {
  return (static_cast<std::int64_t>(h) * batch + r) * pieces + i;
}

/**
 * Workspace layout for one launch (`invariant_pieces` = 0: the split map's slots; K > 0:
 * batch-invariant mode's); grows monotonically with each argument for a fixed mode (from 0 to
 * K > 0 invariant pieces the slot count changes from N_CTA + H * batch to H * batch * K). All
 * arguments are bounded by `decode_params::validate` (KV heads and head dim by the view), so the
 * sizes fit in int64.
 */
TANGRAM_HOST_DEVICE decode_workspace_layout decode_workspace(std::int32_t num_ctas,
                                                             std::int32_t num_kv_heads,
                                                             std::int32_t batch,
                                                             std::int32_t group,
                                                             std::int32_t head_dim,
                                                             std::int32_t invariant_pieces = 0) {
  auto align = [](std::int64_t x) { return (x + 255) / 256 * 256; };
  std::int64_t slots =
      invariant_pieces > 0
          ? static_cast<std::int64_t>(num_kv_heads) * batch * invariant_pieces
          : static_cast<std::int64_t>(num_ctas) + static_cast<std::int64_t>(num_kv_heads) * batch;
  decode_workspace_layout w;
  w.partial_o   = 0;
  w.partial_lse = align(slots * group * head_dim * 4);
  w.prefix      = w.partial_lse + align(slots * group * 4);
  w.bytes       = w.prefix + align(static_cast<std::int64_t>(num_kv_heads) * (batch + 1) * 8);
  return w;
}

// ---------------------------------------------------------------------------------------------
// Parameters.
// ---------------------------------------------------------------------------------------------

/**
 * @brief One decode-attention launch: one layer, one query token per request of `kv`'s batch.
 *
 * Non-owning POD. For the CUDA launcher every pointer (including those inside `kv` and
 * `splits`) is device memory; for the CPU reference every pointer is host memory.
 *
 * Query head `h * group + g` (g < group) uses KV head `h`. Layouts (row-major):
 * - `q`:  `[batch][num_kv_heads * group][head_dim]` in `q_dtype`; request rows `q_stride`
 *         elements apart (0 = dense, `num_q_heads * head_dim`)
 * - `o`:  `[batch][num_kv_heads * group][head_dim]` in `o_dtype`, dense
 * - `lse` (optional): `[batch][num_kv_heads * group]` natural-log sum-exp of the scaled logits,
 *         sink included
 * - `sinks` (optional): `[num_kv_heads * group]` per-query-head sink logits (GPT-OSS): the sink
 *         enters the softmax denominator only, `o = sum_i e^{s_i} v_i / (e^{sink} + sum_i
 * e^{s_i})`.
 *
 * A head that holds no tokens for a request outputs zeros (and lse = sink or -inf): so does every
 * head of a padding request (`kv_cache_view::is_padding`, fixed-capacity batches for CUDA graphs).
 */
struct decode_params {
  kv_cache_view kv;       ///< batch view (its `batch_size` and `batch_slots` define the batch)
  split_map_view splits;  ///< the static split map; `splits.num_ctas` is the grid size
  std::int32_t layer    = 0;
  std::int32_t group    = 1;  ///< query heads per KV head, 1..decode_max_group
  const void* q         = nullptr;
  dtype q_dtype         = dtype::bf16;
  std::int64_t q_stride = 0;  ///< elements between consecutive requests' query rows; 0: dense
  void* o               = nullptr;
  dtype o_dtype         = dtype::bf16;
  float* lse            = nullptr;  ///< optional
  const float* sinks    = nullptr;  ///< optional
  float sm_scale        = 0.f;      ///< logit scale; 0 means 1/sqrt(head_dim)
  /// bf16/f16 K/V with group >= 3 run the tensor-core split kernel (kernels/detail/decode_mma.cuh);
  /// false runs the CUDA-core one there too (to compare them; decode_device_limits reports the
  /// occupancy of either, see its `tensor_cores`)
  bool tensor_cores = true;
  /// fp8 pages only: K/V of KV head h hold `to_float(stored) * s_h` (kv_scales.hpp; device
  /// arrays for the launcher). The CUDA-core kernel folds the K scale into the pre-scaled query,
  /// the tensor-core kernel multiplies its scores by it; both apply the V scale to the output;
  /// the reference dequantises every element.
  kv_scales scales;
  /// 0: the split map's pieces (balanced, but a request's pieces, and so its output's rounding,
  /// depend on the rest of the batch). K in [1, decode_max_invariant_pieces]: batch-invariant
  /// mode, at most K pieces per (request, KV head) of `invariant_piece_tokens` tokens each; the
  /// workspace holds `num_kv_heads * batch * K` partials (decode_workspace).
  std::int32_t invariant_pieces = 0;
  /// Programmatic dependent launch (sm_90+, launcher only): the split kernel is launched so that
  /// it may start while the previous kernel in the stream finishes, and the merge kernel so that
  /// it is scheduled while the split kernel runs; each waits (`griddepcontrol.wait`) before it
  /// reads q, K/V or the workspace. Before that wait the split kernel reads the split map and the
  /// view's arrays (lengths, slots), so the kernel just before it in the stream must not write
  /// them. Off by default; results are identical either way.
  bool pdl = false;
  /// Optional (null: off): device int32 array of at least `num_kv_heads * batch` entries (size it
  /// for the largest batch), all zero before the first launch that uses it (cudaMemset once after
  /// allocating it); every launch leaves it zero again. With it, the last CTA to store a piece of
  /// a request on a head merges that request's partials (an atomic count per (request, head),
  /// fences around it) and the head's first CTA writes the heads that hold no tokens, so no merge
  /// kernel is launched. Owned by the caller; one launch at a time, like the workspace.
  std::int32_t* merge_counters = nullptr;

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
   * @brief Checks everything that can be checked on the host without reading the arrays (the
   * scale values are not read: see kv_scales).
   * @throw invalid_argument naming the field and the value.
   */
  void validate() const {
    validate_view(kv, "decode_params", layer, decode_max_batch);
    scales.validate("decode_params", kv.num_kv_heads, kv.geometry.kv_dtype);
    TANGRAM_EXPECTS(group >= 1 && group <= decode_max_group,
                    invalid_argument,
                    "decode_params.group: must be in [1, ",
                    decode_max_group,
                    "], got ",
                    group);
    TANGRAM_EXPECTS(invariant_pieces >= 0 && invariant_pieces <= decode_max_invariant_pieces,
                    invalid_argument,
                    "decode_params.invariant_pieces: must be in [0, ",
                    decode_max_invariant_pieces,
                    "] (0: off), got ",
                    invariant_pieces);
    TANGRAM_EXPECTS(splits.layer_stream || splits.cta_begin != nullptr,
                    invalid_argument,
                    "decode_params.splits.cta_begin: null (set it, or layer_stream)");
    TANGRAM_EXPECTS(splits.num_layers == kv.num_layers,
                    invalid_argument,
                    "decode_params.splits.num_layers: ",
                    splits.num_layers,
                    " does not match kv.num_layers ",
                    kv.num_layers);
    TANGRAM_EXPECTS(splits.num_kv_heads == kv.num_kv_heads,
                    invalid_argument,
                    "decode_params.splits.num_kv_heads: ",
                    splits.num_kv_heads,
                    " does not match kv.num_kv_heads ",
                    kv.num_kv_heads);
    TANGRAM_EXPECTS(!splits.layer_stream || splits.num_ctas >= 1,
                    invalid_argument,
                    "decode_params.splits.num_ctas: must be >= 1, got ",
                    splits.num_ctas);
    TANGRAM_EXPECTS(!splits.layer_stream || kv.num_kv_heads <= decode_max_batch,
                    invalid_argument,
                    "decode_params.kv.num_kv_heads: a layer-stream split takes at most ",
                    decode_max_batch,
                    " KV heads a layer (their totals live in shared memory), got ",
                    kv.num_kv_heads);
    TANGRAM_EXPECTS(splits.layer_stream || splits.num_ctas >= splits.num_kv_heads,
                    invalid_argument,
                    "decode_params.splits.num_ctas: ",
                    splits.num_ctas,
                    " is smaller than the ",
                    splits.num_kv_heads,
                    " KV heads of a layer");
    TANGRAM_EXPECTS(q != nullptr || kv.batch_size == 0, invalid_argument, "decode_params.q: null");
    TANGRAM_EXPECTS(o != nullptr || kv.batch_size == 0, invalid_argument, "decode_params.o: null");
    TANGRAM_EXPECTS(q_stride == 0 ||
                        q_stride >= static_cast<std::int64_t>(num_q_heads()) * kv.geometry.head_dim,
                    invalid_argument,
                    "decode_params.q_stride: must be 0 or >= num_q_heads * head_dim = ",
                    static_cast<std::int64_t>(num_q_heads()) * kv.geometry.head_dim,
                    ", got ",
                    q_stride);
    TANGRAM_EXPECTS(std::isfinite(sm_scale) && sm_scale >= 0.f,
                    invalid_argument,
                    "decode_params.sm_scale: must be finite and >= 0 (0: 1/sqrt(head_dim)), got ",
                    sm_scale);
  }
};

namespace detail {
/// decode_workspace(...).bytes, after checking that its largest product fits in int64.
inline std::size_t checked_decode_workspace_bytes(std::int32_t num_ctas,
                                                  std::int32_t num_kv_heads,
                                                  std::int32_t batch,
                                                  std::int32_t group,
                                                  std::int32_t head_dim,
                                                  std::int32_t invariant_pieces) {
  const char* what = "decode workspace bytes";
  std::int64_t slots =
      invariant_pieces > 0
          ? mul_or_throw<std::int64_t>(
                mul_or_throw<std::int64_t>(num_kv_heads, batch, what), invariant_pieces, what)
          : add_or_throw<std::int64_t>(
                num_ctas, mul_or_throw<std::int64_t>(num_kv_heads, batch, what), what);
  // partial_o is the largest array; the others are smaller by a factor of head_dim or more.
  (void)mul_or_throw<std::int64_t>(
      mul_or_throw<std::int64_t>(slots, static_cast<std::int64_t>(group) * 4, what),
      head_dim + 2,
      what);
  return static_cast<std::size_t>(
      decode_workspace(num_ctas, num_kv_heads, batch, group, head_dim, invariant_pieces).bytes);
}
}  // namespace detail

/// Bytes of workspace `decode_attention` needs for `p` (its batch size and mode).
/// @throw invalid_argument when the size does not fit in int64.
inline std::size_t decode_workspace_bytes(decode_params const& p) {
  return detail::checked_decode_workspace_bytes(p.splits.num_ctas,
                                                p.kv.num_kv_heads,
                                                p.kv.batch_size,
                                                p.group,
                                                p.kv.geometry.head_dim,
                                                p.invariant_pieces);
}

/**
 * @brief Bytes of workspace for any batch up to `max_batch` (and, for batch-invariant mode, the
 * `invariant_pieces` it will run with; 0 for the split map's mode): what an engine allocates once.
 * @throw invalid_argument for a negative or too large `max_batch` or `invariant_pieces`, or a size
 *        that does not fit in int64.
 */
inline std::size_t decode_workspace_bytes(split_map_view const& splits,
                                          std::int32_t max_batch,
                                          std::int32_t group,
                                          std::int32_t head_dim,
                                          std::int32_t invariant_pieces = 0) {
  TANGRAM_EXPECTS(max_batch >= 0 && max_batch <= decode_max_batch,
                  invalid_argument,
                  "decode_workspace_bytes: max_batch must be in [0, ",
                  decode_max_batch,
                  "], got ",
                  max_batch);
  TANGRAM_EXPECTS(invariant_pieces >= 0 && invariant_pieces <= decode_max_invariant_pieces,
                  invalid_argument,
                  "decode_workspace_bytes: invariant_pieces must be in [0, ",
                  decode_max_invariant_pieces,
                  "], got ",
                  invariant_pieces);
  return detail::checked_decode_workspace_bytes(
      splits.num_ctas, splits.num_kv_heads, max_batch, group, head_dim, invariant_pieces);
}

// ---------------------------------------------------------------------------------------------
// CUDA launchers (defined in tangram::kernels).
// ---------------------------------------------------------------------------------------------

/// Head dims the CUDA decode kernels are instantiated for (the list of core/kv_shape.hpp).
inline constexpr auto const& decode_head_dims = kv_shape_head_dims;

/// True when the CUDA kernels support this (KV dtype, head dim): the compiled list of
/// core/kv_shape.hpp, every dtype (f32, f16, bf16, fp8_e4m3, fp8_e5m2; fp8 widened to f32, times
/// its kv_scales) x head dims 64/128/256.
constexpr bool decode_kernel_supports(dtype kv_dtype, std::int32_t head_dim) noexcept {
  return kv_shape_supported(kv_dtype, head_dim);
}

/**
 * @brief Launches decode attention for one layer on `stream`: the split kernel (grid =
 * `p.splits.num_ctas` CTAs, fixed by the plan, so the launch can be captured in a CUDA graph) and
 * the merge kernel (grid = batch x KV heads).
 *
 * Stream-ordered and asynchronous: no host synchronisation, no allocation, no host reads of
 * device arrays. Inputs must stay valid and unchanged until the work on `stream` completes.
 * Requires `tangram::kernels` (a CUDA build).
 *
 * @param workspace device memory of at least `decode_workspace_bytes(p)` bytes, 256-byte
 *        aligned, owned by the caller; not to be used concurrently by another launch.
 * @throw invalid_argument for invalid parameters (see `decode_params::validate`), an unsupported
 *        (dtype, head dim), misaligned pointers or a too small workspace.
 * @throw cuda_error when a launch fails.
 */
void decode_attention(decode_params const& p,
                      void* workspace,
                      std::size_t workspace_bytes,
                      cuda_stream_t stream);

/**
 * @brief Occupancy of the decode split kernel for (KV dtype, head dim, GQA group) on `device`:
 * `{sm_count, ctas_per_sm}` (N_CTA = their product) as the CUDA runtime reports it, for the
 * kernel that `decode_attention` launches with `decode_params::tensor_cores == tensor_cores`:
 * the lower figure of its plain and folded-merge (`merge_counters` set) variants, whichever
 * `folded_merge` is, so a plan made with either runs as planned (no extra wave) with both. (The
 * variants are compiled for the same minimum occupancy; one may still hold more CTAs per SM.)
 *
 * Returns nullopt when there is no usable device, the configuration is unsupported, or the
 * runtime reports an error (which is cleared). Never throws; queries through cudart only.
 */
std::optional<device_limits> decode_device_limits(dtype kv_dtype,
                                                  std::int32_t head_dim,
                                                  std::int32_t group,
                                                  std::int32_t device = 0,
                                                  bool tensor_cores   = true,
                                                  bool folded_merge   = false) noexcept;

}  // namespace tangram
