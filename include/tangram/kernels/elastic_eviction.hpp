// SPDX-License-Identifier: Apache-2.0
/**
 * @file kernels/elastic_eviction.hpp
 * @brief The eviction of one prefill chunk under elastic reservation, after the last layer:
 * parameters, the decisions shared by the CUDA kernels and the CPU reference, the workspace
 * contract and the launcher.
 *
 * Per chunk (docs/memory.md#elastic-reservation, docs/integration.md):
 *
 * 1. `kv_cache_manager::prepare_chunk(seq, c)` backs positions `[len_h, len_h + c)` of every
 *    compressed head's column with pages.
 * 2. Each layer's forward pass calls `evict_chunk` (kernels/eviction.hpp) with `stage_keys` and
 *    `stage_key_base` set: compressed heads append the chunk at `[len_h, len_h + c)` and write
 *    every candidate's selection key (candidates = held tokens then chunk tokens;
 *    `candidate_key`; the protected lead is implied, `staged_key`) into their group's block of
 *    `stage_keys`, laid out like the group's page list (`stage_key_layout`: the staged groups'
 *    pages' worth of words, no padding). Other heads behave as without it.
 * 3. `evict_elastic` (this file), once per chunk. For each request `r` with a chunk:
 *    a. **wanted tokens**: the `wanted[r]` largest keys over all candidates of all its compressed
 *       heads (every layer), ties broken by (layer, head, position), lower first: the flat index
 *       `(layer * H + head) * max_candidates + position` in ascending order. need_h = the head's
 *       candidates among them. `wanted[r]` is the caller's K, normally
 *       `scorer_total::tokens(compressed heads, n_seen)` (plan/elastic_reservation.hpp) at
 *       `n_seen` = tokens seen after the chunk; it is clamped to [0, all candidates].
 *    b. **group lengths**: `elastic::select_lengths_above` (core/elastic_lengths.hpp, the
 *       optimal greedy of plan/elastic_selection.hpp) over the compressed groups, in group index
 *       order, each group above its floor: lo = max over the compressed heads of
 *       ceil(min(sink + window, candidates) / P), or, for a group whose heads lead with pinned
 *       tokens (`kv_cache_view::pinned`, a shared prefix's pages), the larger
 *       ceil(min(pinned + window, candidates) / P) of its heads; `page_limit[r]` less the floors
 *       above them. When the floors alone exceed `page_limit[r]` the request "does not fit":
 *       nothing changes and `pages_out[r] = -1`.
 *    c. **compaction**: each compressed head keeps its best min(pages_g P, candidates) candidates
 *       by key (ties to the earlier position), in order, at column positions `[0, keep)`; pinned
 *       candidates carry the protected key and lead, so they stay in place, never written.
 *
 * `new_len[r][layer * H + h]` receives every head's count for `commit_chunk`: compressed heads
 * their kept tokens (-1: not decided, see `pages_out`); other heads what the per-layer launch
 * left (`plan_eviction`: the chunk appended, or the ring's length). An empty chunk leaves a
 * request unchanged (`new_len` = current lengths, `pages_out` = 0).
 */
#pragma once

#include <cstddef>
#include <cstdint>

#include "tangram/core/config.hpp"
#include "tangram/core/detail/checked_math.hpp"
#include "tangram/core/elastic_lengths.hpp"
#include "tangram/core/error.hpp"
#include "tangram/core/kv_view.hpp"
#include "tangram/core/retention.hpp"
#include "tangram/core/stream.hpp"
#include "tangram/kernels/eviction.hpp"
#include "tangram/kernels/head_cursor.hpp"

namespace tangram {

/// `pages_out` value: the protected floors alone exceed the request's page limit.
inline constexpr std::int64_t elastic_does_not_fit = -1;
/// `pages_out` value: a head of the request (any kind) had more candidates than
/// `max_candidates`, or a rule kind disagreed with its group's window (`plan_eviction`'s
/// `invalid`); its compressed heads get `new_len = -1` and nothing of them changed.
inline constexpr std::int64_t elastic_invalid_head = -2;

/**
 * @brief One elastic selection launch: every layer, one prefill chunk per request of `kv`'s batch.
 *
 * Non-owning POD; all pointers device memory for the CUDA launcher, host memory for the CPU
 * reference. The view describes the state before the chunk (as the per-layer launches saw it);
 * the chunk is staged after each compressed head's held tokens. The pool pages of compressed heads
 * are compacted in place.
 */
struct elastic_eviction_params {
  kv_cache_view kv;                            ///< state before the chunk, chunk staged
  const head_rule* rules           = nullptr;  ///< [num_layers * num_kv_heads] (layer-major)
  std::int32_t sink                = 0;        ///< the stage launches' (leads are re-derived)
  const std::int32_t* chunk_indptr = nullptr;  ///< [batch + 1] rows of each request's chunk
  std::int32_t max_candidates        = 0;        ///< as in the stage launches
  const std::uint32_t* stage_keys    = nullptr;  ///< the stage launches' keys
  const std::int64_t* stage_key_base = nullptr;  ///< [batch * G] their blocks (stage_key_layout)
  const std::int64_t* wanted       = nullptr;  ///< [batch] K: tokens the scorer keeps, all heads
  const std::int64_t* page_limit   = nullptr;  ///< [batch] `elastic_page_limit(seq)`
  std::int32_t* new_len            = nullptr;  ///< out: [batch][L * H]
  std::int64_t* pages_out          = nullptr;  ///< optional out: [batch] pages of the groups

  /// @throw invalid_argument naming the field and the value.
  void validate() const {
    validate_view(kv, "elastic_eviction_params", 0);
    TANGRAM_EXPECTS(rules != nullptr, invalid_argument, "elastic_eviction_params.rules: null");
    TANGRAM_EXPECTS(
        sink >= 0, invalid_argument, "elastic_eviction_params.sink: must be >= 0, got ", sink);
    TANGRAM_EXPECTS(
        chunk_indptr != nullptr, invalid_argument, "elastic_eviction_params.chunk_indptr: null");
    TANGRAM_EXPECTS(max_candidates >= 1,
                    invalid_argument,
                    "elastic_eviction_params.max_candidates: must be >= 1, got ",
                    max_candidates);
    TANGRAM_EXPECTS(
        stage_keys != nullptr, invalid_argument, "elastic_eviction_params.stage_keys: null");
    TANGRAM_EXPECTS(stage_key_base != nullptr,
                    invalid_argument,
                    "elastic_eviction_params.stage_key_base: null");
    TANGRAM_EXPECTS(wanted != nullptr, invalid_argument, "elastic_eviction_params.wanted: null");
    TANGRAM_EXPECTS(
        page_limit != nullptr, invalid_argument, "elastic_eviction_params.page_limit: null");
    TANGRAM_EXPECTS(new_len != nullptr, invalid_argument, "elastic_eviction_params.new_len: null");
  }

  /// Heads of all layers, L * H.
  [[nodiscard]] TANGRAM_HOST_DEVICE std::int32_t heads() const {
    return kv.num_layers * kv.num_kv_heads;
  }

  /// The per-layer parameters of `layer` whose `plan_eviction` this launch shares (a compressed
  /// head with a chunk plans `stage`).
  [[nodiscard]] TANGRAM_HOST_DEVICE eviction_params layer_params(std::int32_t layer) const {
    eviction_params q;
    q.kv             = kv;
    q.layer          = layer;
    q.rules          = rules + static_cast<std::int64_t>(layer) * kv.num_kv_heads;
    q.sink           = sink;
    q.chunk_indptr   = chunk_indptr;
    q.max_candidates = max_candidates;
    q.stage_keys     = const_cast<std::uint32_t*>(stage_keys);  // only marks the stage mode
    q.stage_key_base = stage_key_base;
    return q;
  }
};

/// Protected candidates of a staged head: the first `lead` (the sink, or its pinned prefix tokens
/// when more) and the last `window`, at most all.
TANGRAM_HOST_DEVICE std::int64_t elastic_protected(eviction_plan const& e) {
  std::int64_t p = e.lead + e.window;
  return p < e.candidates ? p : e.candidates;
}

/// Tokens a staged head keeps in a group of `pages` pages of `page_tokens`.
TANGRAM_HOST_DEVICE std::int64_t elastic_head_keep(std::int64_t pages,
                                                   std::int32_t page_tokens,
                                                   std::int64_t candidates) {
  std::int64_t len = pages * page_tokens;
  return len < candidates ? len : candidates;
}

/**
 * @brief Byte layout of the `evict_elastic` workspace (offsets, 256-byte aligned), per request:
 *
 * - `need`:    int64 `[batch][L * H]` above-threshold counts, then each head's need
 * - `ties`:    int64 `[batch][L * H]` keys equal to the threshold per head
 * - `grouped`: int64 `[batch][G * Hp]` needs of the compressed groups, in compact group order
 * - `index`:   int64 `[batch][G]` compact index of each compressed group, -1 for the others
 * - `pages`:   int64 `[batch][G]` pages of each compressed group (compact order)
 * - `status`:  int64 `[batch]` pages used, or elastic_does_not_fit / elastic_invalid_head
 * - `hist`:    uint32 `[batch][L * H][select_radix_bins]` the per-head compaction's multi-CTA
 *              top-k histogram (as in eviction_workspace_layout; zeroed by the launch itself)
 * - `state`:   uint32 `[batch][L * H][select_state_words]` its per-head state
 */
struct elastic_workspace_layout {
  std::int64_t need = 0, ties = 0, grouped = 0, index = 0, pages = 0, status = 0, hist = 0,
               state = 0, bytes = 0;
};

/// Workspace layout for `batch` requests of `heads` = L * H heads, G groups of Hp columns.
/// @throw invalid_argument when the size overflows.
inline elastic_workspace_layout elastic_workspace(std::int32_t batch,
                                                  std::int32_t heads,
                                                  std::int32_t groups,
                                                  std::int32_t group_size) {
  // Bytes of `per_request` elements of `size` bytes per request, rounded up to 256.
  auto arr = [&](std::int64_t per_request, char const* what, std::int64_t size = 8) {
    auto b = detail::mul_or_throw(static_cast<std::int64_t>(batch), per_request, what);
    b      = detail::mul_or_throw(b, size, what);
    return detail::add_or_throw(b, std::int64_t{255}, what) / 256 * 256;
  };
  elastic_workspace_layout w;
  w.need    = 0;
  w.ties    = w.need + arr(heads, "elastic workspace: need");
  w.grouped = w.ties + arr(heads, "elastic workspace: ties");
  w.index   = w.grouped + arr(detail::mul_or_throw(static_cast<std::int64_t>(groups),
                                                 static_cast<std::int64_t>(group_size),
                                                 "elastic workspace: groups * group_size"),
                            "elastic workspace: grouped");
  w.pages   = w.index + arr(groups, "elastic workspace: index");
  w.status  = w.pages + arr(groups, "elastic workspace: pages");
  w.hist    = w.status + arr(1, "elastic workspace: status");
  // The end of `per_head` uint32 words per head and request placed at `at` (hist, state).
  auto words_after = [&](std::int64_t at, std::int64_t per_head, char const* what) {
    return detail::add_or_throw(
        at, arr(detail::mul_or_throw(std::int64_t{heads}, per_head, what), what, 4), what);
  };
  w.state = words_after(w.hist, select_radix_bins, "elastic workspace: hist");
  w.bytes = words_after(w.state, select_state_words, "elastic workspace: state");
  return w;
}

/// Bytes of workspace `evict_elastic` needs for `p`.
inline std::size_t elastic_workspace_bytes(elastic_eviction_params const& p) {
  return static_cast<std::size_t>(
      elastic_workspace(p.kv.batch_size, p.heads(), p.kv.num_groups, p.kv.geometry.group_size)
          .bytes);
}

/**
 * @brief Step (b) for request `r`, from every head's need (`need[L * H]`, the stage plans'
 * heads only): each compressed group's pages. Host/device, sequential (one thread), no allocation;
 * the CPU reference and the CUDA kernel both call it.
 * @param grouped scratch `[G * Hp]`; @param index out `[G]` compact index of each compressed
 *        group, -1 for the others; @param pages out `[G]` pages per compact group.
 * @return pages the compressed groups use, elastic_does_not_fit, elastic_invalid_head, or 0 for
 *         an empty chunk.
 */
TANGRAM_HOST_DEVICE std::int64_t elastic_group_pages(elastic_eviction_params const& p,
                                                     std::int32_t r,
                                                     std::int64_t const* need,
                                                     std::int64_t* grouped,
                                                     std::int64_t* index,
                                                     std::int64_t* pages) {
  kv_cache_view const& kv = p.kv;
  const std::int32_t H = kv.num_kv_heads, Hp = kv.geometry.group_size;
  const std::int32_t P = kv.geometry.page_tokens;
  for (std::int32_t g = 0; g < kv.num_groups; ++g) index[g] = -1, pages[g] = 0;
  // Floors: lo = the protected pages of the heads without pinned tokens (the sink and the recent
  // window), for every group; a group whose heads lead with pinned tokens (a shared prefix's,
  // kept in place) at least its pinned and protected pages, gathered in pages[group] first.
  std::int64_t lo = 0;
  bool staged = false, invalid = false;
  for (std::int32_t l = 0; l < kv.num_layers; ++l) {
    eviction_params q = p.layer_params(l);
    for (std::int32_t h = 0; h < H; ++h) {
      eviction_plan e = plan_eviction(q, make_head_cursor(kv, r, l, h), r, h);
      if (e.action == eviction_action::invalid) invalid = true;
      if (e.action != eviction_action::stage) continue;
      staged                = true;
      std::int32_t g        = kv.slot_of(l, h).group;
      index[g]              = 0;
      std::int64_t unpinned = p.sink + e.window < e.candidates ? p.sink + e.window : e.candidates;
      std::int64_t f        = ceil_div(unpinned, P);
      lo                    = f > lo ? f : lo;
      if (e.lead > p.sink) {
        std::int64_t pin = ceil_div(elastic_protected(e), P);
        pages[g]         = pin > pages[g] ? pin : pages[g];
      }
    }
  }
  if (invalid) return elastic_invalid_head;
  if (!staged) return 0;
  // Compact group indices in group order; each floor moves down to its compact slot (k <= g, and
  // every slot below g was read already).
  std::int64_t groups = 0, floors = 0;
  for (std::int32_t g = 0; g < kv.num_groups; ++g)
    if (index[g] >= 0) {
      index[g]        = groups++;
      std::int64_t f  = pages[g] > lo ? pages[g] : lo;
      pages[index[g]] = f;
      floors += f;
    }
  for (std::int64_t i = 0; i < groups * Hp; ++i) grouped[i] = 0;
  for (std::int32_t l = 0; l < kv.num_layers; ++l)
    for (std::int32_t h = 0; h < H; ++h) {
      head_slot s = kv.slot_of(l, h);
      if (index[s.group] >= 0) grouped[index[s.group] * Hp + s.column] = need[l * H + h];
    }
  std::int64_t limit = p.page_limit[r];
  if (floors > limit) return elastic_does_not_fit;
  return floors + elastic::select_lengths_above(
                      grouped, static_cast<std::int32_t>(groups), Hp, P, limit - floors, pages);
}

/**
 * @brief Launches the elastic selection for one chunk on `stream` (file comment).
 *
 * Kernels: `elastic_need_kernel`, one CTA per request: 4-pass radix select (8 bits per pass,
 * block histograms) of the `wanted[r]`-th largest key over all the request's staged candidates,
 * per-head counts above and at the threshold (one warp per head), then one thread allots the
 * ties in (layer, head) order and runs `elastic_group_pages` (sequential: O(L H + G Hp log^2)).
 * Then the per-head multi-CTA threshold search (three histogram launches, grid: slices x L * H x
 * requests) and `elastic_compact_kernel`, up to 16 CTAs per (request, layer, head) (each a byte
 * range of every token): the per-head top-k
 * and in-place compaction of kernels/eviction.hpp with the keep count of its group, and
 * `new_len`. (Before them a reset kernel zeroes the per-head histograms of the workspace.)
 *
 * Stream-ordered and asynchronous: no host synchronisation or allocation. Inputs must stay valid
 * until the work on `stream` completes. Requires `tangram::kernels`.
 *
 * @param workspace device memory of at least `elastic_workspace_bytes(p)` bytes, 256-byte aligned,
 *        owned by the caller (its contents on entry do not matter).
 * @throw invalid_argument for invalid parameters, an unsupported (dtype, head dim), a misaligned
 *        pool or a too small workspace.
 * @throw cuda_error when a launch fails.
 */
void evict_elastic(elastic_eviction_params const& p,
                   void* workspace,
                   std::size_t workspace_bytes,
                   cuda_stream_t stream);

}  // namespace tangram
