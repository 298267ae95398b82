// SPDX-License-Identifier: Apache-2.0
// One elastic chunk eviction on a test_cache, for any backend with
//   void evict(test_cache&, eviction_params const&);                  // the per-layer launch
//   void evict_elastic(test_cache&, elastic_eviction_params const&);  // the request-wide launch
// (the CPU reference here, the emulator in test/emu, the GPU in test/gpu): stage every layer with
// supplied scores, then select. Also the candidates' K/V rows, to identify survivors by content.
#pragma once

#include <cstdint>
#include <vector>

#include "kv_test_cache.hpp"
#include "tangram/kernels/elastic_eviction.hpp"
#include "tangram/kernels/eviction.hpp"
#include "tangram/reference/elastic_eviction.hpp"
#include "tangram/reference/eviction.hpp"

namespace tangram::test {

/// The inputs of one elastic chunk (held tokens come from the test_cache built from `seqs`).
struct elastic_setup {
  cache_layout layout;
  std::vector<head_rule> rules;      ///< [L * H]
  std::vector<sequence_spec> seqs;   ///< reserve >= chunk in every growing group
  std::vector<std::int32_t> batch;   ///< sequence of each request
  std::vector<std::int32_t> indptr;  ///< [batch + 1] chunk rows
  std::int32_t sink           = 0;
  std::int32_t max_candidates = 1;
  std::vector<unsigned char> chunk_k, chunk_v;   ///< [rows][H][d] in the KV dtype
  std::vector<float> scores;                     ///< [L][batch * H][max_candidates]
  std::vector<std::int64_t> wanted, limit;       ///< [batch]
  score_source source = score_source::supplied;  ///< of the stage launches
  std::vector<float> q;                          ///< snapkv: [rows][H * group][d] f32
  std::int32_t group       = 1;
  std::int32_t obs_window  = 32;
  std::int32_t pool_kernel = 0;
  std::vector<float> k_scale, v_scale;  ///< fp8: 0, 1 or H scales of every stage launch

  [[nodiscard]] std::int32_t L() const { return layout.num_layers; }
  [[nodiscard]] std::int32_t H() const { return layout.num_kv_heads; }
  [[nodiscard]] std::int32_t B() const { return static_cast<std::int32_t>(batch.size()); }
  [[nodiscard]] std::int32_t chunk(std::int32_t r) const {
    return indptr[static_cast<std::size_t>(r) + 1] - indptr[static_cast<std::size_t>(r)];
  }
  /// Supplied score of candidate i of (r, l, h).
  float& score(std::int32_t l, std::int32_t r, std::int32_t h, std::int32_t i) {
    return scores[((static_cast<std::size_t>(l) * static_cast<std::size_t>(B()) +
                    static_cast<std::size_t>(r)) *
                       static_cast<std::size_t>(H()) +
                   static_cast<std::size_t>(h)) *
                      static_cast<std::size_t>(max_candidates) +
                  static_cast<std::size_t>(i)];
  }
  /// Fills chunk K/V with random values of the cache's dtype and sizes the score array.
  void fill_chunk(test_cache& cache) {
    auto const& g  = layout.geometry;
    std::size_t es = size_of(g.kv_dtype);
    auto n         = static_cast<std::size_t>(indptr.back()) * static_cast<std::size_t>(H()) *
             static_cast<std::size_t>(g.head_dim);
    chunk_k.assign(n * es, 0);
    chunk_v.assign(n * es, 0);
    for (std::size_t i = 0; i < n; ++i) {
      reference::detail::store_from_float(
          chunk_k.data(), g.kv_dtype, static_cast<std::int64_t>(i), cache.random_value());
      reference::detail::store_from_float(
          chunk_v.data(), g.kv_dtype, static_cast<std::int64_t>(i), cache.random_value());
    }
    scores.assign(static_cast<std::size_t>(L() * B() * H() * max_candidates), 0.f);
  }
};

/// Initial value of every stage key word: a stage launch writes only its heads' candidates after
/// the protected lead, so any other word keeps it. Below every score key, so that a selection
/// reading an unwritten word (a lead's, say) instead of the implied protected key drops it.
inline constexpr std::uint32_t unwritten_key = 0u;

/// What a run produced besides the pool.
struct elastic_outcome {
  /// The stage keys (`stage_key_layout`; `unwritten_key` where no stage launch wrote).
  std::vector<std::uint32_t> keys;
  std::vector<std::int64_t> base;       ///< [batch * G] blocks of the keys
  std::int64_t words = 0;               ///< what stage_key_layout asked for
  std::vector<std::int32_t> stage_len;  ///< [L][batch * H] new_len of the stage launches
  std::vector<std::int32_t> new_len;    ///< [batch][L * H]
  std::vector<std::int64_t> pages_out;  ///< [batch]
  std::vector<float> scores_out;        ///< [L][batch * H][max_candidates] raw scores
};

/// The per-layer parameters of the stage launch of `layer` on `v`.
inline eviction_params stage_params(elastic_setup& s, kv_cache_view const& v, std::int32_t layer) {
  eviction_params p;
  p.kv             = v;
  p.layer          = layer;
  p.rules          = s.rules.data() + layer * s.H();
  p.sink           = s.sink;
  p.chunk_indptr   = s.indptr.data();
  p.chunk_k        = s.chunk_k.data();
  p.chunk_v        = s.chunk_v.data();
  p.max_candidates = s.max_candidates;
  p.source         = s.source;
  p.scores         = &s.score(layer, 0, 0, 0);
  p.q              = s.q.data();
  p.q_dtype        = dtype::f32;
  p.group          = s.group;
  p.obs_window     = s.obs_window;
  p.pool_kernel    = s.pool_kernel;
  p.scales.count   = static_cast<std::int32_t>(s.k_scale.size());
  p.scales.k       = s.k_scale.empty() ? nullptr : s.k_scale.data();
  p.scales.v       = s.v_scale.empty() ? nullptr : s.v_scale.data();
  return p;
}

/// Stages every layer, then runs the elastic selection, through `backend`.
template <class Backend>
elastic_outcome run_elastic(elastic_setup& s, test_cache& cache, Backend& backend) {
  elastic_outcome o;
  auto v  = cache.view(s.batch);
  auto BH = static_cast<std::size_t>(s.B() * s.H());
  o.base.assign(static_cast<std::size_t>(s.B() * s.layout.num_groups()), -9);
  o.words = stage_key_layout(v, s.rules.data(), s.indptr.data(), o.base.data());
  o.keys.assign(static_cast<std::size_t>(o.words), unwritten_key);
  o.stage_len.assign(static_cast<std::size_t>(s.L()) * BH, -9);
  auto BHC = BH * static_cast<std::size_t>(s.max_candidates);
  o.scores_out.assign(static_cast<std::size_t>(s.L()) * BHC, 0.f);
  for (std::int32_t l = 0; l < s.L(); ++l) {
    auto p       = stage_params(s, v, l);
    p.new_len    = o.stage_len.data() + static_cast<std::size_t>(l) * BH;
    p.stage_keys     = o.keys.data();
    p.stage_key_base = o.base.data();
    p.scores_out = o.scores_out.data() + static_cast<std::size_t>(l) * BHC;
    backend.evict(cache, p);
  }
  o.new_len.assign(static_cast<std::size_t>(s.B() * s.L() * s.H()), -9);
  o.pages_out.assign(static_cast<std::size_t>(s.B()), -9);
  elastic_eviction_params e;
  e.kv             = v;
  e.rules          = s.rules.data();
  e.sink           = s.sink;
  e.chunk_indptr   = s.indptr.data();
  e.max_candidates = s.max_candidates;
  e.stage_keys     = o.keys.data();
  e.stage_key_base = o.base.data();
  e.wanted         = s.wanted.data();
  e.page_limit     = s.limit.data();
  e.new_len        = o.new_len.data();
  e.pages_out      = o.pages_out.data();
  backend.evict_elastic(cache, e);
  return o;
}

/// The CPU reference as a backend.
struct reference_backend {
  void evict(test_cache&, eviction_params const& p) { reference::evict_chunk(p); }
  void evict_elastic(test_cache&, elastic_eviction_params const& p) { reference::evict_elastic(p); }
};

/// K (kv == 0) or V rows of the candidates of (request r, layer l, head h) before the chunk's
/// eviction: the held tokens (from the cache's dense copy) then the chunk rows.
inline std::vector<std::vector<float>> candidate_rows(
    elastic_setup& s, test_cache& cache, std::int32_t r, std::int32_t l, std::int32_t h, int kv) {
  auto const& g  = s.layout.geometry;
  std::int32_t d = g.head_dim, seq = s.batch[static_cast<std::size_t>(r)];
  std::int32_t len  = cache.len(seq, l, h);
  auto const& dense = cache.dense(kv, seq, l, h);
  std::vector<std::vector<float>> rows;
  for (std::int32_t i = 0; i < len; ++i)
    rows.emplace_back(dense.begin() + i * d, dense.begin() + (i + 1) * d);
  auto const& src = kv == 0 ? s.chunk_k : s.chunk_v;
  for (std::int32_t t = 0; t < s.chunk(r); ++t) {
    std::vector<float> row(static_cast<std::size_t>(d));
    for (std::int32_t x = 0; x < d; ++x)
      row[static_cast<std::size_t>(x)] = reference::detail::load_as_float(
          src.data(),
          g.kv_dtype,
          (static_cast<std::int64_t>(s.indptr[static_cast<std::size_t>(r)] + t) * s.H() + h) * d +
              x);
    rows.push_back(row);
  }
  return rows;
}

/// The row stored at column position `pos` of (request r, layer l, head h).
inline std::vector<float> stored_row(elastic_setup& s,
                                     test_cache& cache,
                                     std::int32_t r,
                                     std::int32_t l,
                                     std::int32_t h,
                                     std::int32_t pos,
                                     int kv) {
  std::vector<float> row;
  for (std::int32_t x = 0; x < s.layout.geometry.head_dim; ++x)
    row.push_back(cache.stored(s.batch[static_cast<std::size_t>(r)], l, h, pos, x, kv));
  return row;
}

}  // namespace tangram::test
