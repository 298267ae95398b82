// SPDX-License-Identifier: Apache-2.0
/**
 * @file reference/eviction.hpp
 * @brief CPU reference of the fused scoring + top-k eviction + compaction of one prefill chunk
 * (kernels/eviction.hpp): same parameters over host memory, same selection keys (shared host/device
 * functions), survivors gathered and then written in order; fp8 K dequantised with the layer's
 * scales for the built-in scores. With `stage_keys` set (elastic reservation) compressed heads
 * stage the chunk and write their keys instead of selecting.
 */
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <vector>

#include "tangram/kernels/eviction.hpp"
#include "tangram/kernels/head_cursor.hpp"
#include "tangram/reference/storage.hpp"

namespace tangram::reference {

namespace detail {

/// Base element of chunk row `row` for KV head `h` in a `[rows][H][d]` staging array.
template <class T>
const T* chunk_row(
    const void* base, std::int64_t row, std::int32_t h, std::int32_t num_kv_heads, std::int32_t d) {
  return static_cast<const T*>(base) + (row * num_kv_heads + h) * d;
}

/// The K of the `len + c` candidates of (r, h) (held tokens, then chunk rows) as floats, [n][d],
/// the fp8 scale applied literally to every element (the kernels fold it into the queries or
/// scale the norm once).
template <class T>
std::vector<float> candidate_keys(eviction_params const& p,
                                  std::int32_t r,
                                  std::int32_t h,
                                  head_cursor const& cur,
                                  std::int64_t c) {
  std::int32_t d   = p.kv.geometry.head_dim;
  std::int64_t len = cur.len, n = len + c;
  const float sk = p.scales.k_of(h);
  std::vector<float> keys(static_cast<std::size_t>(n * d));
  for (std::int64_t i = 0; i < n; ++i) {
    const T* k =
        i < len ? cur.k<T>(static_cast<std::int32_t>(i))
                : chunk_row<T>(p.chunk_k, p.chunk_indptr[r] + i - len, h, p.kv.num_kv_heads, d);
    for (std::int32_t x = 0; x < d; ++x)
      keys[static_cast<std::size_t>(i * d + x)] = to_float(k[x]) * sk;
  }
  return keys;
}

/// Raw SnapKV scores of the `n` candidates of (r, h) (`keys`: candidate_keys) for a chunk of `c`
/// rows: mean over the last `obs_window` chunk queries and the GQA group of the causal softmax
/// over the candidates, or with `q_lse` of `exp(s - lse)`.
inline void snapkv_raw(eviction_params const& p,
                       std::int32_t r,
                       std::int32_t h,
                       std::vector<float> const& keys,
                       std::int64_t c,
                       std::vector<float>& raw) {
  std::int32_t d = p.kv.geometry.head_dim;
  std::int32_t H = p.kv.num_kv_heads;
  std::int32_t G = p.group;
  std::int64_t n = static_cast<std::int64_t>(keys.size()) / d, len = n - c;
  std::int64_t w    = std::min<std::int64_t>(p.obs_window, c);
  float scale2      = p.scale() * log2e;
  std::int64_t row0 = p.chunk_indptr[r];
  std::vector<float> acc(static_cast<std::size_t>(n), 0.f), logit(static_cast<std::size_t>(n));
  std::vector<float> q(static_cast<std::size_t>(d));
  std::int64_t q_stride = static_cast<std::int64_t>(H) * G * d;
  for (std::int64_t qi = 0; qi < w; ++qi) {
    std::int64_t iq      = c - w + qi;    // chunk position of the query
    std::int64_t visible = len + iq + 1;  // causal: held tokens and chunk tokens up to the query
    for (std::int32_t g = 0; g < G; ++g) {
      for (std::int32_t x = 0; x < d; ++x)
        q[static_cast<std::size_t>(x)] =
            load_as_float(p.q, p.q_dtype, (row0 + iq) * q_stride + (h * G + g) * d + x) * scale2;
      float m = -INFINITY;
      for (std::int64_t i = 0; i < visible; ++i) {
        float dot = 0.f;
        for (std::int32_t x = 0; x < d; ++x)
          dot += q[static_cast<std::size_t>(x)] * keys[static_cast<std::size_t>(i * d + x)];
        logit[static_cast<std::size_t>(i)] = dot;
        m                                  = std::max(m, dot);
      }
      float s = 0.f;
      if (p.q_lse != nullptr) {  // the prefill's normaliser, natural log -> base 2
        m = p.q_lse[(row0 + iq) * H * G + h * G + g] * log2e;
        s = 1.f;
      } else {
        for (std::int64_t i = 0; i < visible; ++i)
          s += exp2_shifted(logit[static_cast<std::size_t>(i)], m);
      }
      for (std::int64_t i = 0; i < visible; ++i)
        acc[static_cast<std::size_t>(i)] += exp2_shifted(logit[static_cast<std::size_t>(i)], m) / s;
    }
  }
  raw.resize(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i)
    raw[static_cast<std::size_t>(i)] = acc[static_cast<std::size_t>(i)] / static_cast<float>(w * G);
}

/// Raw key-norm scores: minus the L2 norm of each candidate's K (`keys`: candidate_keys, [n][d]).
inline void key_norm_raw(std::vector<float> const& keys, std::int32_t d, std::vector<float>& raw) {
  raw.assign(keys.size() / static_cast<std::size_t>(d), 0.f);
  for (std::size_t i = 0; i < raw.size(); ++i) {
    float ss = 0.f;
    for (std::int32_t x = 0; x < d; ++x) {
      const float v = keys[i * static_cast<std::size_t>(d) + static_cast<std::size_t>(x)];
      ss += v * v;
    }
    raw[i] = -std::sqrt(ss);
  }
}

template <class T>
std::int32_t evict_head(eviction_params const& p, std::int32_t r, std::int32_t h) {
  std::int32_t d    = p.kv.geometry.head_dim;
  std::int32_t H    = p.kv.num_kv_heads;
  std::int64_t row0 = p.chunk_indptr[r];
  head_cursor cur   = make_head_cursor(p.kv, r, p.layer, h);
  eviction_plan e   = plan_eviction(p, cur, r, h);
  auto copy_token   = [&](const T* k, const T* v, std::int64_t pos) {
    auto at = static_cast<std::int32_t>(pos);
    std::memcpy(cur.ptr_at_position<T>(at, 0), k, sizeof(T) * static_cast<std::size_t>(d));
    std::memcpy(cur.ptr_at_position<T>(at, 1), v, sizeof(T) * static_cast<std::size_t>(d));
  };
  auto chunk_k = [&](std::int64_t t) { return chunk_row<T>(p.chunk_k, row0 + t, h, H, d); };
  auto chunk_v = [&](std::int64_t t) { return chunk_row<T>(p.chunk_v, row0 + t, h, H, d); };
  switch (e.action) {
    case eviction_action::unchanged:
    case eviction_action::invalid:
      return static_cast<std::int32_t>(e.keep);
    case eviction_action::ring:  // the chunk tokens among the last W, at their ring positions
      for (std::int64_t t = std::max(e.n_before, e.n_seen - e.window); t < e.n_seen; ++t)
        copy_token(chunk_k(t - e.n_before), chunk_v(t - e.n_before), t % cur.ring);
      return static_cast<std::int32_t>(e.keep);
    case eviction_action::append:
      for (std::int64_t t = 0; t < e.chunk; ++t) copy_token(chunk_k(t), chunk_v(t), e.len + t);
      return static_cast<std::int32_t>(e.keep);
    case eviction_action::select:
    case eviction_action::stage:
      break;
  }
  std::int64_t len = e.len, c = e.chunk, n = e.candidates, k = e.keep;
  std::vector<float> raw;
  switch (p.source) {
    case score_source::supplied:
      raw.assign(p.scores + (static_cast<std::int64_t>(r) * H + h) * p.max_candidates,
                 p.scores + (static_cast<std::int64_t>(r) * H + h) * p.max_candidates + n);
      break;
    case score_source::snapkv:
      snapkv_raw(p, r, h, candidate_keys<T>(p, r, h, cur, c), c, raw);
      break;
    case score_source::key_norm:
      key_norm_raw(candidate_keys<T>(p, r, h, cur, c), d, raw);
      break;
  }
  if (p.scores_out)
    std::copy(raw.begin(),
              raw.end(),
              p.scores_out + (static_cast<std::int64_t>(r) * H + h) * p.max_candidates);
  std::vector<std::uint32_t> key(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i)
    key[static_cast<std::size_t>(i)] = candidate_key(raw.data(), n, i, p.pool(), e.lead, e.window);
  if (e.action == eviction_action::stage) {  // elastic: keys out, chunk appended, no selection
    std::uint32_t* block = p.stage_keys + stage_key_block(p.stage_key_base, p.kv, r, p.layer, h);
    for (std::int64_t i = e.lead; i < n; ++i)  // the lead's key is implied (staged_key)
      block[cur.list_offset(static_cast<std::int32_t>(i))] = key[static_cast<std::size_t>(i)];
    for (std::int64_t t = 0; t < e.chunk; ++t) copy_token(chunk_k(t), chunk_v(t), e.len + t);
    return static_cast<std::int32_t>(e.keep);
  }
  std::vector<std::int64_t> order(static_cast<std::size_t>(n));
  std::iota(order.begin(), order.end(), std::int64_t{0});
  std::stable_sort(order.begin(), order.end(), [&](std::int64_t a, std::int64_t b) {
    return key[static_cast<std::size_t>(a)] > key[static_cast<std::size_t>(b)];
  });
  order.resize(static_cast<std::size_t>(k));
  std::sort(order.begin(), order.end());
  // Gather every survivor first, then write positions [0, k).
  std::vector<T> keep_k(static_cast<std::size_t>(k * d)), keep_v(static_cast<std::size_t>(k * d));
  for (std::int64_t j = 0; j < k; ++j) {
    std::int64_t i = order[static_cast<std::size_t>(j)];
    const T* src_k = i < len ? cur.k<T>(static_cast<std::int32_t>(i)) : chunk_k(i - len);
    const T* src_v = i < len ? cur.v<T>(static_cast<std::int32_t>(i)) : chunk_v(i - len);
    std::memcpy(
        &keep_k[static_cast<std::size_t>(j * d)], src_k, sizeof(T) * static_cast<std::size_t>(d));
    std::memcpy(
        &keep_v[static_cast<std::size_t>(j * d)], src_v, sizeof(T) * static_cast<std::size_t>(d));
  }
  // A held survivor already at its position is not written (as the CUDA compaction): pinned
  // prefix pages, shared read-only with other requests, stay untouched.
  for (std::int64_t j = 0; j < k; ++j)
    if (order[static_cast<std::size_t>(j)] != j || j >= len)
      copy_token(
          &keep_k[static_cast<std::size_t>(j * d)], &keep_v[static_cast<std::size_t>(j * d)], j);
  return static_cast<std::int32_t>(k);
}

}  // namespace detail

/**
 * @brief Eviction of one prefill chunk on the CPU over host memory: modifies the pool pages of
 * this layer's heads in place and writes `p.new_len` (see kernels/eviction.hpp for the rule).
 *
 * Supports every KV dtype and head dim; fp8 K is read as `to_float(stored) * p.scales.k_of(h)`.
 * Allocates scratch; not for hot paths.
 * @throw invalid_argument from `eviction_params::validate`, or for a scale that is not finite
 *        and > 0.
 */
inline void evict_chunk(eviction_params const& p) {
  p.validate();
  p.scales.validate_values("eviction_params");
  detail::visit_storage(p.kv.geometry.kv_dtype, [&](auto tag) {
    using T = decltype(tag);
    for (std::int32_t r = 0; r < p.kv.batch_size; ++r)
      for (std::int32_t h = 0; h < p.kv.num_kv_heads; ++h)
        p.new_len[static_cast<std::int64_t>(r) * p.kv.num_kv_heads + h] =
            detail::evict_head<T>(p, r, h);
  });
}

}  // namespace tangram::reference
