// SPDX-License-Identifier: Apache-2.0
/**
 * @file kernels/eviction.hpp
 * @brief Fused scoring + top-k eviction + compaction for one layer and one prefill chunk:
 * parameters, the selection rule shared by the CUDA kernels and the CPU reference, the workspace
 * contract and the launcher.
 *
 * For each request `r` of the view's batch with a chunk of `c > 0` tokens and each KV head `h`:
 *
 * - **compressed** head (rule kind `compressed`): the candidates are the head's held tokens
 *   (column positions `0..len-1`, in order) followed by the chunk's tokens. With
 *   `n_seen = seq_tokens + c` (the view describes the state *before* the chunk), the head keeps
 *   `k = min(retained_tokens(rule, n_seen), len + c)` candidates (at least the pinned ones): the
 *   protected ones (the first `max(sink, pinned)` and the last `rule.protect - sink` candidates)
 *   first, then the highest scores, ties to the earlier position. Survivors are written in their
 *   original order to column positions `[0, k)`; a held survivor already at its position is not
 *   written, so the `kv_cache_view::pinned` leading tokens (a shared prefix's read-only pages)
 *   are never written.
 * - **uncompressed** head: the chunk is appended at positions `[len, len + c)`.
 * - **sliding-window** head (the group has a window W in the view): the chunk tokens among the last
 *   W of the sequence are written into the ring; the head then holds `min(n_seen, W)` tokens.
 *
 * - **staged** compressed head (elastic reservation: `stage_keys` set): the chunk is appended at
 *   positions `[len, len + c)` (pages drawn by `kv_cache_manager::prepare_chunk`) and the
 *   selection key of every candidate after the protected lead is written to `stage_keys`, laid
 *   out like the head's page list (`stage_key_layout`); nothing is selected. The request-wide
 *   selection (kernels/elastic_eviction.hpp) runs after the last layer.
 *
 * `new_len[r * num_kv_heads + h]` receives the tokens the head holds afterwards (a staged head:
 * its candidates, `len + c`, which the elastic selection then reduces). Requests with an
 * empty chunk are left unchanged (`new_len` = current length); so are padding requests
 * (`kv_cache_view::is_padding`: `new_len` 0, whatever rows `chunk_indptr` gives them). The owner of
 * the view then records the new lengths and adds `c` to the sequence's `seq_tokens` (after all
 * layers ran).
 *
 * Scores: supplied by the engine, SnapKV-style (last `obs_window` queries of the chunk, softmax
 * over the candidates with causal masking inside the chunk, mean over the window and the GQA
 * group), or key norm (smaller L2 norm of K kept, as KNorm). SnapKV given the prefill's
 * log-sum-exp (`eviction_params::q_lse`, kernels/prefill_attention.hpp) computes each logit once:
 * the weight of a window query on a candidate is then `exp(s - lse)`, the model's own attention
 * probability (with GPT-OSS sink logits, the sink's share stays out of every candidate's weight;
 * without sinks it equals the softmax over the candidates). fp8 K is dequantised with
 * `eviction_params::scales` first. A max-pool of width `pool_kernel` along candidate order
 * follows (SnapKV default 7, others 1). NaN scores count as -inf.
 */
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "tangram/core/config.hpp"
#include "tangram/core/detail/checked_math.hpp"
#include "tangram/core/dtype.hpp"
#include "tangram/core/error.hpp"
#include "tangram/core/kv_shape.hpp"
#include "tangram/core/kv_view.hpp"
#include "tangram/core/numeric.hpp"
#include "tangram/core/retention.hpp"
#include "tangram/core/stream.hpp"
#include "tangram/kernels/head_cursor.hpp"
#include "tangram/kernels/kv_scales.hpp"
#include "tangram/kernels/math.hpp"

namespace tangram {

/// @brief Where the eviction scores come from.
enum class score_source : std::uint8_t {
  supplied,  ///< the engine supplies a float per candidate (higher is kept)
  snapkv,    ///< built in: SnapKV-style observation-window attention
  key_norm,  ///< built in: minus the L2 norm of K (smaller norms kept, KNorm)
};

constexpr std::string_view to_string(score_source s) noexcept {
  switch (s) {
    case score_source::supplied:
      return "supplied";
    case score_source::snapkv:
      return "snapkv";
    case score_source::key_norm:
      return "key_norm";
  }
  return "?";
}

/// Largest SnapKV observation window (queries of the chunk) the kernels accept.
inline constexpr std::int32_t eviction_max_obs_window = 64;
/// Largest GQA group the SnapKV scorer accepts.
inline constexpr std::int32_t eviction_max_group = 8;

// ---------------------------------------------------------------------------------------------
// Selection rule (host/device; the CUDA kernels and the CPU reference both use these).
// ---------------------------------------------------------------------------------------------

/// Key of a protected candidate: above every score key.
inline constexpr std::uint32_t protected_score_key = 0xffffffffu;

/// Order-preserving unsigned key of a score (larger score, larger key); NaN maps to 0 and -0 to
/// the key of +0 (equal scores tie, and ties go to the earlier position).
TANGRAM_HOST_DEVICE std::uint32_t score_key(float score) {
  std::uint32_t u = detail::float_bits(score);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0u;  // NaN
  if ((u & 0x7fffffffu) == 0u) u = 0u;             // -0 -> +0
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/// Candidates kept by a compressed head with `rule` after `n_seen` tokens, out of `candidates`.
TANGRAM_HOST_DEVICE std::int64_t eviction_keep(head_rule const& rule,
                                               std::int64_t n_seen,
                                               std::int64_t candidates) {
  std::int64_t k = retained_tokens(rule, n_seen);
  return k < candidates ? k : candidates;
}

/// True when candidate `i` of `n` is protected: one of the first `sink` or the last `window`.
TANGRAM_HOST_DEVICE bool eviction_protected(std::int64_t i,
                                            std::int64_t n,
                                            std::int64_t sink,
                                            std::int64_t window) {
  return i < sink || i >= n - window;
}

/// Max of `raw[i - kernel/2 .. i + kernel/2]` clipped to `[0, n)`; NaN entries are ignored
/// (an all-NaN neighbourhood gives -inf). `kernel` is odd and >= 1.
TANGRAM_HOST_DEVICE float pooled_score(const float* raw,
                                       std::int64_t n,
                                       std::int64_t i,
                                       std::int32_t kernel) {
  std::int64_t half = kernel / 2;
  std::int64_t lo   = i - half < 0 ? 0 : i - half;
  std::int64_t hi   = i + half >= n ? n - 1 : i + half;
  float best        = -INFINITY;
  for (std::int64_t x = lo; x <= hi; ++x)
    if (raw[x] > best) best = raw[x];
  return best;
}

/// Selection key of candidate `i` of `n`: `protected_score_key` or `score_key(pooled score)`.
TANGRAM_HOST_DEVICE std::uint32_t candidate_key(const float* raw,
                                                std::int64_t n,
                                                std::int64_t i,
                                                std::int32_t kernel,
                                                std::int64_t sink,
                                                std::int64_t window) {
  return eviction_protected(i, n, sink, window) ? protected_score_key
                                                : score_key(pooled_score(raw, n, i, kernel));
}

/// Start of request `r`'s block of stage keys for the group holding head (`layer`, `head`):
/// `stage_key_base[r * G + g]` (`stage_key_layout` filled it).
TANGRAM_HOST_DEVICE std::int64_t stage_key_block(const std::int64_t* stage_key_base,
                                                 kv_cache_view const& kv,
                                                 std::int32_t r,
                                                 std::int32_t layer,
                                                 std::int32_t head) {
  return stage_key_base[static_cast<std::int64_t>(r) * kv.num_groups +
                        kv.slot_of(layer, head).group];
}

/// Selection key of staged candidate `i` of a head (`cur`, its plan's `lead`) whose group's block
/// of `stage_keys` starts at `base`: the protected key for the lead (never written), else the
/// stored word.
TANGRAM_HOST_DEVICE std::uint32_t staged_key(const std::uint32_t* stage_keys,
                                             std::int64_t base,
                                             head_cursor const& cur,
                                             std::int64_t lead,
                                             std::int64_t i) {
  return i < lead ? protected_score_key
                  : stage_keys[base + cur.list_offset(static_cast<std::int32_t>(i))];
}

/// Keys per candidate tile of the SnapKV scorer (a function of the head dim only).
TANGRAM_HOST_DEVICE constexpr std::int32_t snapkv_key_tile(std::int32_t head_dim) {
  return head_dim >= 256 ? 16 : 4096 / head_dim;
}

/// Radix digit widths of the multi-CTA top-k: 11, 11 and 10 bits from the top of the 32-bit key.
inline constexpr std::int32_t select_radix_passes = 3;
/// Bins of the widest digit: the size of each head's global histogram.
inline constexpr std::int32_t select_radix_bins = 2048;
/// Candidates one histogram CTA covers (256 threads x 16 keys): the grid has
/// ceil(max_candidates / select_slice) CTAs per head.
inline constexpr std::int32_t select_slice = 4096;
/// 32-bit words of one head's selection state (threshold prefix, remaining rank, ticket, spare).
inline constexpr std::int32_t select_state_words = 4;

/**
 * @brief Byte layout of the eviction workspace (offsets, 256-byte aligned).
 *
 * - `keys`:  uint32 `[batch * num_kv_heads][max_candidates]` selection keys
 * - `raw`:   float  `[batch * num_kv_heads][max_candidates]` built-in raw scores (snapkv, key_norm)
 * - `stats`: float2 `[batch * num_kv_heads][key tiles][obs_window * group]` SnapKV per-tile (max,
 *            sum) of each query's base-2 logits
 * - `norm`:  float2 `[batch * num_kv_heads][obs_window * group]` SnapKV softmax (max, sum)
 *   (`stats` and `norm` are empty when the scorer reads the prefill's log-sum-exp)
 * - `hist`:  uint32 `[batch * num_kv_heads][select_radix_bins]` the multi-CTA top-k's histogram of
 *            the current radix pass (zeroed by the launch itself, see evict_chunk)
 * - `state`: uint32 `[batch * num_kv_heads][select_state_words]` the top-k's per-head state
 */
struct eviction_workspace_layout {
  std::int64_t keys  = 0;
  std::int64_t raw   = 0;
  std::int64_t stats = 0;
  std::int64_t norm  = 0;
  std::int64_t hist  = 0;
  std::int64_t state = 0;
  std::int64_t bytes = 0;
};

/// Workspace layout for a launch; grows monotonically with every size argument. `from_lse`:
/// SnapKV reads the prefill's log-sum-exp (`eviction_params::q_lse`) and needs no statistics.
/// @throw invalid_argument when a size overflows 64 bits.
inline eviction_workspace_layout eviction_workspace(std::int32_t batch,
                                                    std::int32_t num_kv_heads,
                                                    std::int32_t max_candidates,
                                                    score_source source,
                                                    std::int32_t group,
                                                    std::int32_t obs_window,
                                                    std::int32_t head_dim,
                                                    bool from_lse = false) {
  using detail::add_or_throw;
  using detail::mul_or_throw;
  // Bytes of `count` elements of `size` bytes, rounded up to 256.
  auto region = [](std::int64_t count, std::int64_t size, char const* what) {
    return add_or_throw(mul_or_throw(count, size, what), std::int64_t{255}, what) / 256 * 256;
  };
  std::int64_t heads = static_cast<std::int64_t>(batch) * num_kv_heads;
  std::int64_t tiles = (max_candidates + snapkv_key_tile(head_dim) - 1) / snapkv_key_tile(head_dim);
  std::int64_t nq = source == score_source::snapkv && !from_lse
                        ? static_cast<std::int64_t>(obs_window) * group
                        : 0;
  char const* what        = "eviction workspace size";
  std::int64_t cand       = mul_or_throw(heads, std::int64_t{max_candidates}, what);
  std::int64_t keys_bytes = region(cand, 4, what);
  std::int64_t raw_bytes  = source == score_source::supplied ? 0 : region(cand, 4, what);
  std::int64_t stats_bytes =
      region(mul_or_throw(mul_or_throw(heads, tiles, what), nq, what), 8, what);
  std::int64_t norm_bytes = region(mul_or_throw(heads, nq, what), 8, what);
  std::int64_t hist_bytes =
      region(mul_or_throw(heads, std::int64_t{select_radix_bins}, what), 4, what);
  std::int64_t state_bytes =
      region(mul_or_throw(heads, std::int64_t{select_state_words}, what), 4, what);
  eviction_workspace_layout w;
  w.keys  = 0;
  w.raw   = keys_bytes;
  w.stats = add_or_throw(w.raw, raw_bytes, what);
  w.norm  = add_or_throw(w.stats, stats_bytes, what);
  w.hist  = add_or_throw(w.norm, norm_bytes, what);
  w.state = add_or_throw(w.hist, hist_bytes, what);
  w.bytes = add_or_throw(w.state, state_bytes, what);
  return w;
}

// ---------------------------------------------------------------------------------------------
// Parameters.
// ---------------------------------------------------------------------------------------------

/**
 * @brief One eviction launch: one layer, one prefill chunk per request of `kv`'s batch.
 *
 * Non-owning POD; all pointers device memory for the CUDA launcher, host memory for the CPU
 * reference. The pool pages the view names are modified in place: the (group, column) cells of
 * this layer's heads. The view must already hold enough pages for the new lengths (reserved by the
 * memory manager at admission) and describe the state before the chunk.
 *
 * Layouts (row-major), with chunk token `t` of request `r` at row `chunk_indptr[r] + t`:
 * - `chunk_k`, `chunk_v`: `[rows][num_kv_heads][head_dim]` in the KV dtype (fp8 chunks are
 *   quantised with the same `scales` as the pages: they are copied into them byte for byte)
 * - `q` (snapkv only): `[rows][num_kv_heads * group][head_dim]` in `q_dtype`; only the last
 *   `obs_window` rows of each request are read
 * - `q_lse` (snapkv, optional): `[rows][num_kv_heads * group]` float, the natural-log sum-exp
 *   prefill attention wrote for the same chunk, view and `sm_scale` (`prefill_params::lse`)
 * - `scores` (supplied), `scores_out`: `[batch * num_kv_heads][max_candidates]`, candidate `i` of
 *   (r, h) at `(r * num_kv_heads + h) * max_candidates + i`
 */
struct eviction_params {
  kv_cache_view kv;  ///< state before the chunk
  std::int32_t layer               = 0;
  const head_rule* rules           = nullptr;  ///< [num_kv_heads] rules of this layer's heads
  std::int32_t sink                = 0;  ///< protected leading candidates (the profile's sink)
  const std::int32_t* chunk_indptr = nullptr;  ///< [batch + 1] rows of each request's chunk
  const void* chunk_k              = nullptr;
  const void* chunk_v              = nullptr;
  std::int32_t max_candidates = 0;  ///< bound on held + chunk tokens of any head (workspace size)
  score_source source         = score_source::snapkv;
  const float* scores         = nullptr;  ///< supplied scores
  const void* q               = nullptr;  ///< snapkv queries
  dtype q_dtype               = dtype::bf16;
  std::int32_t group          = 1;        ///< query heads per KV head (snapkv)
  std::int32_t obs_window     = 32;       ///< SnapKV observation window (last queries of the chunk)
  float sm_scale              = 0.f;      ///< SnapKV logit scale; 0 means 1/sqrt(head_dim)
  /// SnapKV only, optional: the prefill's log-sum-exp of these queries. Set, the scorer computes
  /// every logit once and weighs it `exp(s - lse)` (no statistics pass; tensor cores for 16-bit
  /// and fp8 K); null, it computes each query's softmax normaliser itself first.
  const float* q_lse = nullptr;
  /// SnapKV from `q_lse` with bf16/f16/fp8 K runs on tensor cores (kernels/detail/snapkv_mma.cuh);
  /// false runs the CUDA-core scorer there too (to compare them).
  bool tensor_cores = true;
  std::int32_t pool_kernel    = 0;        ///< odd max-pool width; 0: 7 for snapkv, 1 otherwise
  std::int32_t* new_len       = nullptr;  ///< out: [batch * num_kv_heads]; -1 marks an invalid head
  float* scores_out           = nullptr;  ///< optional out: raw scores of heads that selected
  /// fp8 caches: the layer's K/V dequantisation scales (kv_scales.hpp), the ones its append
  /// wrote with. The built-in scores read K as `to_float(stored) * scales.k_of(h)` (SnapKV
  /// logits and key norms change with it); compaction copies bytes and never reads V's scale.
  kv_scales scales;
  /// Elastic reservation only (null otherwise): compressed heads stage instead of selecting and
  /// write each candidate's selection key to `stage_keys`, in the block of its (request, group):
  /// candidate at column position `pos` of (request r, group g, column c) at
  /// `stage_key_base[r * G + g] + ((pos / P) * Hp + c) * P + pos % P` (`head_cursor::list_offset`),
  /// the blocks and their total from `stage_key_layout` (the host view of the same batch: the
  /// staged groups' pages, no padding). Candidates in the protected lead (`eviction_plan::lead`:
  /// the sink, a shared prefix's pinned tokens) are not written (`staged_key`). Caller-owned, as
  /// is `stage_key_base` (int64 [batch * G], device memory for the CUDA launcher): the input of
  /// `evict_elastic`, which takes the same two arrays.
  std::uint32_t* stage_keys          = nullptr;
  const std::int64_t* stage_key_base = nullptr;  ///< [batch * G], set with stage_keys

  [[nodiscard]] TANGRAM_HOST_DEVICE std::int32_t pool() const {
    return pool_kernel != 0 ? pool_kernel : (source == score_source::snapkv ? 7 : 1);
  }
  [[nodiscard]] float scale() const {
    return sm_scale != 0.f ? sm_scale : 1.f / std::sqrt(static_cast<float>(kv.geometry.head_dim));
  }

  /**
   * @brief Checks everything that can be checked on the host without reading the arrays.
   * @throw invalid_argument naming the field and the value.
   */
  void validate() const {
    validate_view(kv, "eviction_params", layer);
    scales.validate("eviction_params", kv.num_kv_heads, kv.geometry.kv_dtype);
    TANGRAM_EXPECTS(rules != nullptr, invalid_argument, "eviction_params.rules: null");
    TANGRAM_EXPECTS(sink >= 0, invalid_argument, "eviction_params.sink: must be >= 0, got ", sink);
    TANGRAM_EXPECTS(
        chunk_indptr != nullptr, invalid_argument, "eviction_params.chunk_indptr: null");
    TANGRAM_EXPECTS(chunk_k != nullptr && chunk_v != nullptr,
                    invalid_argument,
                    "eviction_params.chunk_k/chunk_v: null");
    TANGRAM_EXPECTS(new_len != nullptr, invalid_argument, "eviction_params.new_len: null");
    TANGRAM_EXPECTS(stage_keys == nullptr || stage_key_base != nullptr,
                    invalid_argument,
                    "eviction_params.stage_key_base: null with stage_keys set (stage_key_layout)");
    TANGRAM_EXPECTS(max_candidates >= 1,
                    invalid_argument,
                    "eviction_params.max_candidates: must be >= 1, got ",
                    max_candidates);
    auto k = pool();
    TANGRAM_EXPECTS(k >= 1 && k % 2 == 1 && k <= 63,
                    invalid_argument,
                    "eviction_params.pool_kernel: must be odd and in [1, 63] (0: default), got ",
                    pool_kernel);
    TANGRAM_EXPECTS(q_lse == nullptr || source == score_source::snapkv,
                    invalid_argument,
                    "eviction_params.q_lse: set with source \"",
                    to_string(source),
                    "\" (only snapkv reads it)");
    if (source == score_source::supplied)
      TANGRAM_EXPECTS(scores != nullptr,
                      invalid_argument,
                      "eviction_params.scores: null with source \"supplied\"");
    if (source == score_source::snapkv) {
      TANGRAM_EXPECTS(
          q != nullptr, invalid_argument, "eviction_params.q: null with source \"snapkv\"");
      TANGRAM_EXPECTS(group >= 1 && group <= eviction_max_group,
                      invalid_argument,
                      "eviction_params.group: must be in [1, ",
                      eviction_max_group,
                      "], got ",
                      group);
      TANGRAM_EXPECTS(obs_window >= 1 && obs_window <= eviction_max_obs_window,
                      invalid_argument,
                      "eviction_params.obs_window: must be in [1, ",
                      eviction_max_obs_window,
                      "], got ",
                      obs_window);
      TANGRAM_EXPECTS(
          std::isfinite(sm_scale) && sm_scale >= 0.f,
          invalid_argument,
          "eviction_params.sm_scale: must be finite and >= 0 (0: 1/sqrt(head_dim)), got ",
          sm_scale);
    }
  }
};

/// @brief What eviction does to one (request, KV head).
enum class eviction_action : std::uint8_t {
  unchanged,  ///< empty chunk: nothing to do
  invalid,    ///< too many candidates, or rule kind and group window disagree: left unchanged
  ring,       ///< sliding window: chunk tokens among the last W go into the ring
  append,     ///< uncompressed, or a compressed head that keeps every candidate
  select,     ///< compressed: keep `keep` of `candidates`
  stage,      ///< compressed under elastic reservation: append the chunk, write the keys
};

/// True for the actions that need the candidates' scores (select and stage).
TANGRAM_HOST_DEVICE bool eviction_scores(eviction_action a) {
  return a == eviction_action::select || a == eviction_action::stage;
}

/// @brief The decision for one (request, KV head) and the numbers behind it.
struct eviction_plan {
  eviction_action action  = eviction_action::unchanged;
  std::int64_t len        = 0;  ///< held before the chunk
  std::int64_t chunk      = 0;  ///< chunk tokens
  std::int64_t candidates = 0;  ///< len + chunk
  std::int64_t keep       = 0;  ///< tokens held afterwards (new length), -1 when invalid
  std::int64_t n_before   = 0;  ///< sequence tokens before the chunk
  std::int64_t n_seen     = 0;  ///< sequence tokens after the chunk
  std::int64_t window     = 0;  ///< ring window W (sliding) or protected recent window (select)
  /// Protected leading candidates (select, stage): max(sink, pinned), the pinned ones
  /// (`kv_cache_view::pinned`) kept at their positions and never written.
  std::int64_t lead = 0;
};

/**
 * @brief Decides what happens to head `h` of request `r` (`cur` = its cursor). Host/device: the
 * reference and every CUDA kernel of the launch take the same decision.
 */
TANGRAM_HOST_DEVICE eviction_plan plan_eviction(eviction_params const& p,
                                                head_cursor const& cur,
                                                std::int32_t r,
                                                std::int32_t h) {
  eviction_plan e;
  e.len        = cur.len;
  // A padding request (kv_cache_view::is_padding) has no chunk whatever its rows say: it holds no
  // page, so nothing may be written for it.
  e.chunk      = p.kv.is_padding(r) ? 0 : p.chunk_indptr[r + 1] - p.chunk_indptr[r];
  e.candidates = e.len + e.chunk;
  e.keep       = e.len;
  if (e.chunk <= 0) return e;
  head_rule rule = p.rules[h];
  std::int32_t w = p.kv.group_window[p.kv.slot_of(p.layer, h).group];
  e.n_before     = p.kv.seq_tokens[p.kv.seq_slot(r)];
  e.n_seen       = e.n_before + e.chunk;
  if ((rule.kind == layer_kind::sliding_window) != (w > 0) || (w > 0 && w > cur.ring)) {
    e.action = eviction_action::invalid;
    e.keep   = -1;
    return e;
  }
  if (w > 0) {
    e.action = eviction_action::ring;
    e.window = w;
    e.keep   = e.n_seen < w ? e.n_seen : w;
    return e;
  }
  if (e.candidates > p.max_candidates) {
    e.action = eviction_action::invalid;
    e.keep   = -1;
    return e;
  }
  e.window = rule.protect - p.sink > 0 ? rule.protect - p.sink : 0;
  // Pinned tokens (a shared prefix's read-only pages) lead the candidates: protected, so kept
  // first (ties go to the earlier position) and, being a leading run of survivors, never moved.
  std::int64_t pin = p.kv.pinned(r, p.kv.slot_of(p.layer, h).group);
  pin              = pin < e.len ? pin : e.len;
  e.lead           = pin > p.sink ? pin : p.sink;
  if (rule.kind == layer_kind::compressed && p.stage_keys != nullptr) {
    e.action = eviction_action::stage;
    e.keep   = e.candidates;
    return e;
  }
  e.keep   = rule.kind == layer_kind::compressed ? eviction_keep(rule, e.n_seen, e.candidates)
                                                 : e.candidates;
  if (e.keep < pin) e.keep = pin;  // the budget counts pinned tokens; never drop one
  e.action = e.keep >= e.candidates ? eviction_action::append : eviction_action::select;
  return e;
}

/**
 * @brief The blocks of the elastic stage keys for one chunk batch (`eviction_params::stage_keys`):
 * for each request r and group g that holds a compressed head (a growing group), a block of
 * `ceil(extent / P) * Hp * P` words at `base[r * G + g]`, extent = the group's longest compressed
 * column after the chunk (held + chunk tokens), laid out like the group's page list; other groups
 * and empty chunks get no words (their base, the running total, is never read). Host-only: reads
 * `kv` (the host view of the batch, as `kv_cache_manager::view(batch_kind::prefill)` gives it after
 * every `prepare_chunk`), `rules` ([L * H]) and `chunk_indptr` ([batch + 1]) from host memory.
 * O(batch * L * H), no allocation.
 * So the keys take the staged groups' own pages' worth of words (4 bytes a token slot), with no
 * padding to the longest request, and nothing between chunks. Per chunk batch: an engine that
 * evicts several requests' chunks in one launch needs the sum over them.
 * @param base out: [batch * G]
 * @return the words `stage_keys` must hold, at least 1 (a batch with nothing staged still gets a
 *         word, so that its buffer is never empty: a null `stage_keys` would take `evict_chunk`
 *         out of stage mode and is refused by `evict_elastic`).
 * @throw invalid_argument naming the argument for a null array (batch > 0) or a page geometry
 *        below 1, or when the count overflows int64.
 */
inline std::int64_t stage_key_layout(kv_cache_view const& kv,
                                     head_rule const* rules,
                                     std::int32_t const* chunk_indptr,
                                     std::int64_t* base) {
  const std::int32_t G = kv.num_groups, H = kv.num_kv_heads, HH = kv.num_layers * H;
  const std::int64_t P = kv.geometry.page_tokens, Hp = kv.geometry.group_size;
  TANGRAM_EXPECTS(P >= 1 && Hp >= 1,
                  invalid_argument,
                  "stage_key_layout: kv.geometry page_tokens and group_size must be >= 1, got ",
                  P,
                  " and ",
                  Hp);
  TANGRAM_EXPECTS(kv.batch_size == 0 || (rules && chunk_indptr && base),
                  invalid_argument,
                  "stage_key_layout: rules, chunk_indptr and base must not be null (batch ",
                  kv.batch_size,
                  ")");
  std::int64_t words = 0;
  for (std::int32_t r = 0; r < kv.batch_size; ++r) {
    std::int64_t* b      = base + static_cast<std::int64_t>(r) * G;
    const std::int64_t c = kv.is_padding(r) ? 0 : chunk_indptr[r + 1] - chunk_indptr[r];
    for (std::int32_t g = 0; g < G; ++g) b[g] = -1;  // extent + 1 while scanning: -1 = none
    for (std::int32_t i = 0; c > 0 && i < HH; ++i) {
      const head_slot s = kv.slot_of(i / H, i % H);
      if (rules[i].kind != layer_kind::compressed || kv.group_window[s.group] > 0) continue;
      const std::int64_t extent = std::int64_t{kv.head_len(r, i / H, i % H)} + c;
      b[s.group]                = extent + 1 > b[s.group] ? extent + 1 : b[s.group];
    }
    for (std::int32_t g = 0; g < G; ++g) {
      const std::int64_t extent = b[g] - 1;
      b[g]                      = words;
      if (extent < 0) continue;
      const std::int64_t block = detail::mul_or_throw(
          detail::mul_or_throw((extent + P - 1) / P, Hp, "stage_key_layout: pages * Hp"),
          P,
          "stage_key_layout: words of a group");
      words = detail::add_or_throw(words, block, "stage_key_layout: words");
    }
  }
  return words > 0 ? words : 1;
}

/// @brief Refuses a cache the eviction kernels are not compiled for (the list of
/// core/kv_shape.hpp: f32/f16/bf16/fp8_e4m3/fp8_e5m2 x head dims 64/128/256), naming the launcher
/// `who`. Shared by evict_chunk and evict_elastic.
/// @throw invalid_argument naming the field (kv.geometry.kv_dtype or kv.geometry.head_dim) and
///        the value.
inline void expect_eviction_kernel(page_geometry const& g, char const* who) {
  expect_kv_shape(g.kv_dtype, g.head_dim, who);
}

/// Bytes of workspace `evict_chunk` needs for `p`.
inline std::size_t eviction_workspace_bytes(eviction_params const& p) {
  return static_cast<std::size_t>(eviction_workspace(p.kv.batch_size,
                                                     p.kv.num_kv_heads,
                                                     p.max_candidates,
                                                     p.source,
                                                     p.group,
                                                     p.obs_window,
                                                     p.kv.geometry.head_dim,
                                                     p.q_lse != nullptr)
                                      .bytes);
}

/**
 * @brief Launches the fused eviction for one layer and one chunk on `stream`.
 *
 * Kernels: a reset of the top-k histograms (one CTA per head); for snapkv without `q_lse`, a
 * per-tile logit-statistics kernel, a per-head reduction and a scoring kernel (grid: key tiles x
 * batch x KV heads); for snapkv with `q_lse`, the scoring kernel alone (on tensor cores for
 * 16-bit and fp8 K: grid key blocks x heads); for key_norm, a norm kernel; then the multi-CTA
 * threshold search: three radix passes (11, 11 and 10 bits; grid: slices of select_slice
 * candidates x heads) whose CTAs build the keys (pass 0), histogram their slice in shared memory
 * and add it to the head's histogram in the workspace, the head's last CTA finding the digit (a
 * head of one slice does all three in pass 0); then a compaction kernel (up to 16 CTAs per
 * (request, KV head), each a byte range of every token) that moves the survivors into the column
 * in order, tile by tile (loads of a tile precede its stores; every survivor moves to a position
 * at or before its source). The workspace
 * needs no initialisation: the launch zeroes the histograms itself.
 *
 * Stream-ordered and asynchronous: no host synchronisation or allocation. Inputs must stay valid
 * until the work on `stream` completes. A head whose candidates exceed `max_candidates`, or whose
 * rule kind disagrees with its group's window, is left unchanged with `new_len = -1`.
 * Requires `tangram::kernels`.
 *
 * @param workspace device memory of at least `eviction_workspace_bytes(p)` bytes, 256-byte
 *        aligned, owned by the caller.
 * @throw invalid_argument for invalid parameters, an unsupported (dtype, head dim), misaligned
 *        pointers or a too small workspace.
 * @throw cuda_error when a launch fails.
 */
void evict_chunk(eviction_params const& p,
                 void* workspace,
                 std::size_t workspace_bytes,
                 cuda_stream_t stream);

}  // namespace tangram
