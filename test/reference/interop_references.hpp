// SPDX-License-Identifier: Apache-2.0
// CPU references of the attention calls Tangram's exports feed, written from those libraries'
// documented semantics (not from Tangram's kernels): FlashInfer's block-sparse
// `trtllm_batch_decode_with_kv_cache` (per-KV-head block tables, PR #3955) and FlashAttention's
// paged varlen decode (`flash_attn_with_kvcache` / `flash_attn_varlen_func` with a block table).
// Both read K/V from the raw pool bytes through strided tensors, in double precision.
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <vector>

#include "tangram/core/dtype.hpp"
#include "tangram/reference/storage.hpp"

namespace tangram::test {

/// A paged K or V tensor over raw memory: element (page, head, token, x) at
/// `page * page_stride + head * head_stride + token * token_stride + x` (elements of `type`).
struct strided_cache {
  const void* base         = nullptr;
  dtype type               = dtype::f32;
  std::int64_t page_stride = 0, head_stride = 0, token_stride = 0;
  float scale = 1.f;  ///< dequantisation scale (fp8 k_scale / v_scale)

  [[nodiscard]] double at(std::int64_t page,
                          std::int64_t head,
                          std::int64_t token,
                          std::int64_t x) const {
    return static_cast<double>(reference::detail::load_as_float(
               base, type, page * page_stride + head * head_stride + token * token_stride + x)) *
           scale;
  }
};

/// Softmax attention of G query rows (`q`, [G][d]) over the keys `rows` lists as (page, token)
/// pairs, with optional sinks (natural-log logits joining the denominator); o [G][d], zeros when
/// there are no keys (what a padding row's output is taken to be).
inline void attend(std::vector<double> const& q,
                   std::int32_t G,
                   std::int32_t d,
                   double scale,
                   strided_cache const& k,
                   strided_cache const& v,
                   std::int64_t kv_head,
                   std::vector<std::pair<std::int64_t, std::int64_t>> const& rows,
                   const float* sinks,
                   std::vector<double>& o) {
  o.assign(static_cast<std::size_t>(G) * d, 0.0);
  if (rows.empty()) return;
  for (std::int32_t g = 0; g < G; ++g) {
    std::vector<double> logit(rows.size());
    double m = sinks ? sinks[g] : -INFINITY;
    for (std::size_t i = 0; i < rows.size(); ++i) {
      double dot = 0;
      for (std::int32_t x = 0; x < d; ++x)
        dot += q[static_cast<std::size_t>(g * d + x)] *
               k.at(rows[i].first, kv_head, rows[i].second, x);
      logit[i] = dot * scale;
      m        = std::max(m, logit[i]);
    }
    double den = sinks ? std::exp(sinks[g] - m) : 0.0;
    for (std::size_t i = 0; i < rows.size(); ++i) {
      double p = std::exp(logit[i] - m);
      den += p;
      for (std::int32_t x = 0; x < d; ++x)
        o[static_cast<std::size_t>(g * d + x)] +=
            p * v.at(rows[i].first, kv_head, rows[i].second, x);
    }
    for (std::int32_t x = 0; x < d; ++x) o[static_cast<std::size_t>(g * d + x)] /= den;
  }
}

/**
 * FlashInfer block-sparse decode (`enable_block_sparse_attention=True`, q_len 1): for request b
 * and KV head h, the keys are tokens t < seq_lens[h][b] of pages block_tables[h][b][t / P] (only
 * the last page partial), K read at head h of the cache; query heads h * G .. h * G + G - 1 attend
 * with `bmm1_scale` (sm_scale times the K scale) and sinks[h * G + g]. q, o: [B][H * G][d].
 */
inline std::vector<double> flashinfer_block_sparse_decode(
    std::vector<float> const& q,
    std::int32_t B,
    std::int32_t H,
    std::int32_t G,
    std::int32_t d,
    std::int32_t P,
    std::vector<std::int32_t> const& block_tables,
    std::int32_t max_pages,
    std::vector<std::int32_t> const& seq_lens,
    strided_cache const& k,
    strided_cache const& v,
    double sm_scale,
    const float* sinks) {
  std::vector<double> out(static_cast<std::size_t>(B) * H * G * d);
  std::vector<double> qh, o;
  for (std::int32_t b = 0; b < B; ++b)
    for (std::int32_t h = 0; h < H; ++h) {
      std::vector<std::pair<std::int64_t, std::int64_t>> rows;
      std::int32_t n = seq_lens[static_cast<std::size_t>(h * B + b)];
      for (std::int32_t t = 0; t < n; ++t)
        rows.emplace_back(block_tables[static_cast<std::size_t>((h * B + b) * max_pages + t / P)],
                          t % P);
      qh.assign(q.begin() + (static_cast<std::ptrdiff_t>(b) * H + h) * G * d,
                q.begin() + (static_cast<std::ptrdiff_t>(b) * H + h + 1) * G * d);
      attend(qh, G, d, sm_scale, k, v, h, rows, sinks ? sinks + h * G : nullptr, o);
      std::copy(o.begin(), o.end(), out.begin() + (static_cast<std::ptrdiff_t>(b) * H + h) * G * d);
    }
  return out;
}

/**
 * FlashAttention paged varlen decode, one query row per sequence j with G query heads and one KV
 * head (`k_cache [pages, P, 1, d]`), `causal=True`, `window_size=(window_left, 0)`: the query sits
 * at position seqused_k[j] - 1 and sees keys t with t >= seqused_k[j] - 1 - window_left (all when
 * window_left < 0). q, o: [J][G][d]; sinks [G] per sequence's KV head via `sinks_of(j)`;
 * `k_scale_of(j)` is FlashAttention 3's per-(batch, KV head) descale.
 */
inline std::vector<double> flash_attn_paged_decode(
    std::vector<float> const& q,
    std::int32_t J,
    std::int32_t G,
    std::int32_t d,
    std::int32_t P,
    std::vector<std::int32_t> const& block_table,
    std::int32_t max_pages,
    std::vector<std::int32_t> const& seqused_k,
    std::int32_t window_left,
    strided_cache k,
    strided_cache v,
    double sm_scale,
    std::function<const float*(std::int32_t)> const& sinks_of,
    std::function<std::pair<float, float>(std::int32_t)> const& scales_of) {
  std::vector<double> out(static_cast<std::size_t>(J) * G * d);
  std::vector<double> qj, o;
  for (std::int32_t j = 0; j < J; ++j) {
    std::vector<std::pair<std::int64_t, std::int64_t>> rows;
    std::int32_t n = seqused_k[static_cast<std::size_t>(j)];
    for (std::int32_t t = 0; t < n; ++t)
      if (window_left < 0 || t >= n - 1 - window_left)
        rows.emplace_back(block_table[static_cast<std::size_t>(j * max_pages + t / P)], t % P);
    qj.assign(q.begin() + static_cast<std::ptrdiff_t>(j) * G * d,
              q.begin() + static_cast<std::ptrdiff_t>(j + 1) * G * d);
    auto [ks, vs] = scales_of(j);
    k.scale       = ks;
    v.scale       = vs;
    attend(qj, G, d, sm_scale, k, v, 0, rows, sinks_of(j), o);
    std::copy(o.begin(), o.end(), out.begin() + static_cast<std::ptrdiff_t>(j) * G * d);
  }
  return out;
}

}  // namespace tangram::test
