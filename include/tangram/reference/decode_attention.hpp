// SPDX-License-Identifier: Apache-2.0
/**
 * @file reference/decode_attention.hpp
 * @brief CPU reference of ragged paged decode attention (kernels/decode_attention.hpp): the same
 * parameters over host memory, the same split-KV pieces and log-sum-exp merge (from the shared
 * host/device index math), and an unsplit path over each head's whole token range.
 *
 * Arithmetic: fp32 throughout (K/V widened from their storage type and multiplied by their
 * head's fp8 scale, element by element), base-2 logits
 * `(q * scale * log2 e) . k`, each piece accumulated with its own maximum; partials merge in CTA
 * order exactly as the CUDA merge does (in piece order in batch-invariant mode).
 */
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "tangram/kernels/decode_attention.hpp"
#include "tangram/kernels/head_cursor.hpp"
#include "tangram/reference/storage.hpp"

namespace tangram::reference {

/// @brief How the reference partitions each head's tokens.
enum class split_mode : std::uint8_t {
  split,    ///< the kernels' pieces and merge (split map, or batch-invariant pieces)
  unsplit,  ///< one pass over each (request, head)'s tokens; `splits` is ignored
};

namespace detail {

/// Unnormalised attention state of one query head over a range of tokens (base-2 logits).
struct piece_state {
  float m = -INFINITY;   ///< max logit
  float s = 0.f;         ///< sum of exp2(logit - m)
  std::vector<float> o;  ///< sum of exp2(logit - m) * v
};

template <class T>
void attend_piece(head_cursor const& cur,
                  std::vector<float> const& q,
                  std::int32_t group,
                  std::int32_t d,
                  std::int64_t t0,
                  std::int64_t t1,
                  float k_scale,
                  float v_scale,
                  std::vector<piece_state>& out) {
  std::int64_t n = t1 - t0;
  std::vector<float> logits(static_cast<std::size_t>(n * group));
  out.assign(static_cast<std::size_t>(group), piece_state{});
  for (auto& st : out) st.o.assign(static_cast<std::size_t>(d), 0.f);
  for (std::int64_t t = 0; t < n; ++t) {
    const T* k = cur.k<T>(static_cast<std::int32_t>(t0 + t));
    for (std::int32_t g = 0; g < group; ++g) {
      float dot = 0.f;
      for (std::int32_t x = 0; x < d; ++x)
        dot += q[static_cast<std::size_t>(g * d + x)] * (to_float(k[x]) * k_scale);
      logits[static_cast<std::size_t>(t * group + g)] = dot;
      auto& st                                        = out[static_cast<std::size_t>(g)];
      if (dot > st.m) st.m = dot;
    }
  }
  for (std::int64_t t = 0; t < n; ++t) {
    const T* v = cur.v<T>(static_cast<std::int32_t>(t0 + t));
    for (std::int32_t g = 0; g < group; ++g) {
      auto& st = out[static_cast<std::size_t>(g)];
      float p  = exp2_shifted(logits[static_cast<std::size_t>(t * group + g)], st.m);
      st.s += p;
      for (std::int32_t x = 0; x < d; ++x)
        st.o[static_cast<std::size_t>(x)] += p * (to_float(v[x]) * v_scale);
    }
  }
}

template <class T>
void decode_head(decode_params const& p, split_mode mode, std::int32_t h) {
  auto const& kv  = p.kv;
  std::int32_t B  = kv.batch_size;
  std::int32_t G  = p.group;
  std::int32_t d  = kv.geometry.head_dim;
  std::int32_t Hq = p.num_q_heads();
  float scale2    = p.scale() * log2e;
  // fp8 scales applied literally to every element (the kernel folds them into q and o).
  const float sk = p.scales.k_of(h), sv = p.scales.v_of(h);
  std::vector<std::int64_t> prefix(static_cast<std::size_t>(B) + 1, 0);
  for (std::int32_t r = 0; r < B; ++r)
    prefix[static_cast<std::size_t>(r) + 1] =
        prefix[static_cast<std::size_t>(r)] + kv.head_len(r, p.layer, h);
  std::int64_t W     = prefix[static_cast<std::size_t>(B)];
  std::int64_t share = mode == split_mode::split ? p.splits.head_ctas(p.layer, h) : 1;
  // A layer stream cuts every head's tokens in head order: this head's requests start at its
  // origin (the earlier heads' tokens) in a stream of the layer's W tokens.
  std::int64_t origin = 0;
  if (mode == split_mode::split && p.splits.layer_stream) {
    std::int64_t total = 0;
    for (std::int32_t hh = 0; hh < kv.num_kv_heads; ++hh) {
      if (hh == h) origin = total;
      for (std::int32_t r = 0; r < B; ++r) total += kv.head_len(r, p.layer, hh);
    }
    W = total;
  }

  std::vector<float> q(static_cast<std::size_t>(G * d));
  std::vector<piece_state> st;
  std::vector<std::vector<float>> part_o;    // [pieces][G * d] normalised
  std::vector<std::vector<float>> part_lse;  // [pieces][G]
  for (std::int32_t r = 0; r < B; ++r) {
    std::int64_t pre = prefix[static_cast<std::size_t>(r)];
    std::int64_t len = prefix[static_cast<std::size_t>(r) + 1] - pre;
    pre += origin;
    auto out_at      = [&](std::int32_t g, std::int32_t x) {
      return (static_cast<std::int64_t>(r) * Hq + h * G + g) * d + x;
    };
    auto write_lse = [&](std::int32_t g, float lse2) {
      if (p.lse) p.lse[static_cast<std::int64_t>(r) * Hq + h * G + g] = lse2 * ln2;
    };
    if (len == 0) {
      for (std::int32_t g = 0; g < G; ++g) {
        for (std::int32_t x = 0; x < d; ++x) store_from_float(p.o, p.o_dtype, out_at(g, x), 0.f);
        write_lse(g, p.sinks ? p.sinks[h * G + g] * log2e : -INFINITY);
      }
      continue;
    }
    for (std::int32_t g = 0; g < G; ++g)
      for (std::int32_t x = 0; x < d; ++x)
        q[static_cast<std::size_t>(g * d + x)] =
            load_as_float(p.q, p.q_dtype, r * p.q_row_stride() + (h * G + g) * d + x) * scale2;
    head_cursor cur = make_head_cursor(kv, r, p.layer, h);
    // The request's pieces in merge order: the split map's CTAs, or batch-invariant pieces.
    std::vector<stream_range> pieces;
    if (mode == split_mode::split && p.invariant_pieces > 0) {
      const std::int64_t size = invariant_piece_tokens(len, p.invariant_pieces);
      for (std::int64_t b = 0; b < len; b += size)
        pieces.push_back({b, b + size < len ? b + size : len});
    } else {
      cta_span span = request_ctas(pre, len, share, W);
      for (std::int64_t j = span.first; j <= span.last; ++j)
        if (stream_range piece = piece_of(j, share, W, pre, len); !piece.empty())
          pieces.push_back(piece);
    }
    if (pieces.size() == 1) {  // written directly by the CTA (the sink joins here)
      attend_piece<T>(cur, q, G, d, 0, len, sk, sv, st);
      for (std::int32_t g = 0; g < G; ++g) {
        auto const& s = st[static_cast<std::size_t>(g)];
        float m       = s.m;
        float sink2   = p.sinks ? p.sinks[h * G + g] * log2e : -INFINITY;
        float mm      = sink2 > m ? sink2 : m;
        float alpha   = exp2_shifted(m, mm);
        float den     = s.s * alpha + exp2_shifted(sink2, mm);
        for (std::int32_t x = 0; x < d; ++x)
          store_from_float(
              p.o, p.o_dtype, out_at(g, x), s.o[static_cast<std::size_t>(x)] * alpha / den);
        write_lse(g, mm + log2_of(den));
      }
      continue;
    }
    part_o.clear();
    part_lse.clear();
    for (stream_range const& piece : pieces) {
      attend_piece<T>(cur, q, G, d, piece.begin, piece.end, sk, sv, st);
      std::vector<float> po(static_cast<std::size_t>(G * d)), pl(static_cast<std::size_t>(G));
      for (std::int32_t g = 0; g < G; ++g) {
        auto const& s = st[static_cast<std::size_t>(g)];
        for (std::int32_t x = 0; x < d; ++x)
          po[static_cast<std::size_t>(g * d + x)] = s.o[static_cast<std::size_t>(x)] / s.s;
        pl[static_cast<std::size_t>(g)] = s.m + log2_of(s.s);
      }
      part_o.push_back(std::move(po));
      part_lse.push_back(std::move(pl));
    }
    for (std::int32_t g = 0; g < G; ++g) {
      float sink2 = p.sinks ? p.sinks[h * G + g] * log2e : -INFINITY;
      float mm    = sink2;
      for (auto const& pl : part_lse)
        if (pl[static_cast<std::size_t>(g)] > mm) mm = pl[static_cast<std::size_t>(g)];
      float den = exp2_shifted(sink2, mm);
      for (auto const& pl : part_lse) den += exp2_shifted(pl[static_cast<std::size_t>(g)], mm);
      for (std::int32_t x = 0; x < d; ++x) {
        float num = 0.f;
        for (std::size_t i = 0; i < part_o.size(); ++i)
          num += exp2_shifted(part_lse[i][static_cast<std::size_t>(g)], mm) *
                 part_o[i][static_cast<std::size_t>(g * d + x)];
        store_from_float(p.o, p.o_dtype, out_at(g, x), num / den);
      }
      write_lse(g, mm + log2_of(den));
    }
  }
}

}  // namespace detail

/**
 * @brief Decode attention on the CPU over host memory; writes `p.o` (and `p.lse` when set).
 *
 * Supports every KV dtype and any head dim (wider than the CUDA kernels), groups 1..8.
 * Allocates scratch; not for hot paths. Thread-compatible: concurrent calls must not share
 * output arrays.
 * @throw invalid_argument from `decode_params::validate` (the split map is validated in split
 *        mode only) or for a scale that is not finite and > 0.
 */
inline void decode_attention(decode_params const& p, split_mode mode = split_mode::split) {
  decode_params checked    = p;
  std::int32_t dummy_begin = 0;
  if (mode == split_mode::unsplit) {  // the split map is unused: validate the rest
    checked.splits.num_layers   = p.kv.num_layers;
    checked.splits.num_kv_heads = p.kv.num_kv_heads;
    checked.splits.num_ctas     = p.kv.num_kv_heads;
    checked.splits.cta_begin    = &dummy_begin;
  }
  checked.validate();
  p.scales.validate_values("decode_params");
  detail::visit_storage(p.kv.geometry.kv_dtype, [&](auto tag) {
    using T = decltype(tag);
    for (std::int32_t h = 0; h < p.kv.num_kv_heads; ++h) detail::decode_head<T>(p, mode, h);
  });
}

}  // namespace tangram::reference
