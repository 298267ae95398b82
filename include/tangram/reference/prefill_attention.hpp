// SPDX-License-Identifier: Apache-2.0
/**
 * @file reference/prefill_attention.hpp
 * @brief CPU reference of chunked-prefill attention over ragged pages
 * (kernels/prefill_attention.hpp): the same parameters over host memory.
 *
 * For each query it computes the pages part (held tokens) and the chunk part (chunk rows
 * `0..t`) as two separate softmax states and merges them, with the sink, by log-sum-exp, as the
 * header describes. Arithmetic: fp32 throughout (K/V widened from their storage type, queries
 * from `q_dtype`), base-2 logits `(q * scale * log2 e) . k`, LSE reported in natural log.
 */
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "tangram/kernels/head_cursor.hpp"
#include "tangram/kernels/math.hpp"
#include "tangram/kernels/prefill_attention.hpp"
#include "tangram/reference/storage.hpp"

namespace tangram::reference {

namespace detail {

/// Unnormalised softmax state of one query over some keys (base-2 logits).
struct softmax_part {
  float m = -INFINITY;   ///< max logit
  float s = 0.f;         ///< sum of exp2(logit - m)
  std::vector<float> o;  ///< sum of exp2(logit - m) * v

  /// log2 of the sum of exp2(logit) over the part; -inf when empty.
  [[nodiscard]] float lse2() const { return s > 0.f ? m + log2_of(s) : -INFINITY; }
};

/// Adds the keys `keys[i]`/`values[i]` (float rows of `d`) for i in `[lo, hi)` to a fresh part.
inline softmax_part attend_rows(std::vector<float> const& q,
                                std::vector<float> const& keys,
                                std::vector<float> const& values,
                                std::int64_t lo,
                                std::int64_t hi,
                                std::int32_t d) {
  softmax_part part;
  part.o.assign(static_cast<std::size_t>(d), 0.f);
  std::vector<float> logits;
  for (std::int64_t i = lo; i < hi; ++i) {
    float dot = 0.f;
    for (std::int32_t x = 0; x < d; ++x)
      dot += q[static_cast<std::size_t>(x)] * keys[static_cast<std::size_t>(i * d + x)];
    logits.push_back(dot);
    if (dot > part.m) part.m = dot;
  }
  for (std::int64_t i = lo; i < hi; ++i) {
    float w = exp2_shifted(logits[static_cast<std::size_t>(i - lo)], part.m);
    part.s += w;
    for (std::int32_t x = 0; x < d; ++x)
      part.o[static_cast<std::size_t>(x)] += w * values[static_cast<std::size_t>(i * d + x)];
  }
  return part;
}

/// Host checks of `chunk_indptr` (host memory here): starts at 0, non-decreasing, every chunk
/// within `max_chunk`.
inline void validate_chunks(prefill_params const& p) {
  if (p.kv.batch_size == 0) return;
  TANGRAM_EXPECTS(p.chunk_indptr[0] == 0,
                  invalid_argument,
                  "prefill_params.chunk_indptr[0]: must be 0, got ",
                  p.chunk_indptr[0]);
  for (std::int32_t r = 0; r < p.kv.batch_size; ++r) {
    std::int64_t c = static_cast<std::int64_t>(p.chunk_indptr[r + 1]) - p.chunk_indptr[r];
    TANGRAM_EXPECTS(c >= 0 && c <= p.max_chunk,
                    invalid_argument,
                    "prefill_params.chunk_indptr: request ",
                    r,
                    " has a chunk of ",
                    c,
                    " rows, outside [0, max_chunk = ",
                    p.max_chunk,
                    "]");
  }
}

template <class T>
void prefill_request_head(prefill_params const& p, std::int32_t r, std::int32_t h) {
  auto const& kv          = p.kv;
  const std::int32_t d    = kv.geometry.head_dim;
  const std::int32_t G    = p.group;
  const std::int32_t H    = kv.num_kv_heads;
  const std::int32_t Hq   = p.num_q_heads();
  const std::int64_t row0 = p.chunk_indptr[r];
  const std::int64_t c    = p.chunk_indptr[r + 1] - row0;
  if (c == 0) return;
  const float scale2     = p.scale() * log2e;
  const head_cursor cur  = make_head_cursor(kv, r, p.layer, h);
  const std::int64_t len = cur.len;
  const std::int64_t W   = kv.group_window[kv.slot_of(p.layer, h).group];

  // Dequantised rows of the held tokens and of the chunk: each element times its head's scale,
  // literally (the kernel folds the scales instead; this is the independent check of that).
  const float sk = p.scales.k_of(h), sv = p.scales.v_of(h);
  std::vector<float> hk(static_cast<std::size_t>(len * d)), hv(hk.size());
  for (std::int64_t i = 0; i < len; ++i) {
    const T* k = cur.k<T>(static_cast<std::int32_t>(i));
    const T* v = cur.v<T>(static_cast<std::int32_t>(i));
    for (std::int32_t x = 0; x < d; ++x) {
      hk[static_cast<std::size_t>(i * d + x)] = to_float(k[x]) * sk;
      hv[static_cast<std::size_t>(i * d + x)] = to_float(v[x]) * sv;
    }
  }
  std::vector<float> ck(static_cast<std::size_t>(c * d)), cv(ck.size());
  const T* chunk_k = static_cast<const T*>(p.chunk_k);
  const T* chunk_v = static_cast<const T*>(p.chunk_v);
  for (std::int64_t u = 0; u < c; ++u)
    for (std::int32_t x = 0; x < d; ++x) {
      std::int64_t at                         = ((row0 + u) * H + h) * d + x;
      ck[static_cast<std::size_t>(u * d + x)] = to_float(chunk_k[at]) * sk;
      cv[static_cast<std::size_t>(u * d + x)] = to_float(chunk_v[at]) * sv;
    }

  std::vector<float> q(static_cast<std::size_t>(d));
  for (std::int64_t t = 0; t < c; ++t) {
    // Visible keys: [first, len + t], a contiguous range (prefill_visible).
    const std::int64_t first = prefill_first_key(t, len, W);
    for (std::int32_t g = 0; g < G; ++g) {
      const std::int64_t qh = (row0 + t) * Hq + static_cast<std::int64_t>(h) * G + g;
      for (std::int32_t x = 0; x < d; ++x)
        q[static_cast<std::size_t>(x)] =
            load_as_float(
                p.q,
                p.q_dtype,
                (row0 + t) * p.q_row_stride() + (static_cast<std::int64_t>(h) * G + g) * d + x) *
            scale2;
      softmax_part a = attend_rows(q, hk, hv, first < len ? first : len, len, d);
      softmax_part b = attend_rows(q, ck, cv, first > len ? first - len : 0, t + 1, d);
      const float la = a.lse2(), lb = b.lse2();
      const float z = p.sinks ? p.sinks[h * G + g] * log2e : -INFINITY;
      float mm      = la > lb ? la : lb;
      if (z > mm) mm = z;
      const float wa = exp2_shifted(la, mm), wb = exp2_shifted(lb, mm);
      const float den = wa + wb + exp2_shifted(z, mm);
      for (std::int32_t x = 0; x < d; ++x) {
        // Normalised part outputs o_x = o / s, weighted by e^{lse_x}.
        float oa = a.s > 0.f ? a.o[static_cast<std::size_t>(x)] / a.s : 0.f;
        float ob = b.s > 0.f ? b.o[static_cast<std::size_t>(x)] / b.s : 0.f;
        store_from_float(p.o, p.o_dtype, qh * d + x, (wa * oa + wb * ob) / den);
      }
      if (p.lse) p.lse[qh] = (mm + log2_of(den)) * ln2;
    }
  }
}

}  // namespace detail

/**
 * @brief Prefill attention on the CPU over host memory; writes `p.o` (and `p.lse` when set) for
 * every chunk row of the batch. Rows of requests with an empty chunk do not exist; nothing else
 * is written.
 *
 * Supports every KV dtype (fp8 included) and any head dim, groups 1..prefill_max_group.
 * Allocates scratch; not for hot paths. Thread-compatible: concurrent calls must not share
 * output arrays.
 * @throw invalid_argument from `prefill_params::validate`, for a scale that is not finite and
 *        > 0, or for a `chunk_indptr` that does not start at 0, decreases, or has a chunk longer
 *        than `max_chunk`.
 */
inline void prefill_attention(prefill_params const& p) {
  p.validate();
  p.scales.validate_values("prefill_params");
  detail::validate_chunks(p);
  detail::visit_storage(p.kv.geometry.kv_dtype, [&](auto tag) {
    using T = decltype(tag);
    for (std::int32_t r = 0; r < p.kv.batch_size; ++r)
      for (std::int32_t h = 0; h < p.kv.num_kv_heads; ++h) detail::prefill_request_head<T>(p, r, h);
  });
}

}  // namespace tangram::reference
