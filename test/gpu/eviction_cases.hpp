// SPDX-License-Identifier: Apache-2.0
/**
 * @file test/gpu/eviction_cases.hpp
 * @brief The eviction scenarios (supplied, SnapKV, key-norm, fp8, LSE, per-head) and their check
 * against the CPU reference.
 * Part of test/gpu/kernel_cases.hpp (read its overview: backends, checks). Host-only C++.
 */
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "../reference/kv_test_cache.hpp"
#include "scale_cases.hpp"
#include "tangram/kernels/eviction.hpp"
#include "tangram/reference/eviction.hpp"
#include "tangram/reference/prefill_attention.hpp"

namespace tangram::test {

// ---------------------------------------------------------------------------------------------
// Eviction.
// ---------------------------------------------------------------------------------------------

/// One eviction scenario on test::make_eviction_scenario, every layer in turn.
struct eviction_case {
  dtype kv_dtype = dtype::bf16;
  std::int32_t d = 128, P = 16, group = 4, sink = 4, recent = 8, window = 24;
  std::int32_t Hp         = 2;  ///< heads per page: 2 or 1 (per-head pages; make_eviction_scenario)
  score_source source     = score_source::supplied;
  std::int32_t obs_window = 32;
  std::int32_t long_len   = 1500;  ///< tokens seen by the longest request before its chunk
  std::int32_t long_chunk = 600;   ///< that request's chunk (several compaction tiles)
  std::uint64_t seed      = 1;
  scale_mode scales       = scale_mode::none;  ///< fp8 only: drawn per layer (scale_arrays)
  /// SnapKV from the prefill's log-sum-exp (the CPU reference prefill of the same chunk)
  bool lse          = false;
  bool sinks        = false;  ///< the prefill has GPT-OSS sink logits (with lse)
  dtype q_dtype     = dtype::f32;
  bool tensor_cores = true;
  /// Leading pages of every growing group pinned as a shared prefix's (kv_cache_view::pinned,
  /// at most what the group's shortest head fills); their supplied scores are the lowest.
  std::int32_t pin_pages = 0;

  [[nodiscard]] std::string describe() const {
    std::ostringstream s;
    s << to_string(kv_dtype) << " d " << d << " P " << P << " Hp " << Hp << " source "
      << to_string(source) << " seed " << seed;
    if (scales != scale_mode::none) s << ", " << to_string(scales);
    if (pin_pages > 0) s << ", " << pin_pages << " pinned pages";
    if (lse)
      s << ", from lse" << (sinks ? " with sinks" : "") << ", q " << to_string(q_dtype)
        << (tensor_cores ? "" : ", CUDA cores");
    return s.str();
  }
};

/// Supplied scores in every instantiated dtype x head dim.
inline std::vector<eviction_case> eviction_cases_supplied() {
  std::vector<eviction_case> out;
  std::uint64_t seed = 1;
  for (dtype t : {dtype::f32, dtype::f16, dtype::bf16})
    for (std::int32_t d : {64, 128, 256}) {
      eviction_case c;
      c.kv_dtype = t;
      c.d        = d;
      c.P        = d == 64 ? 1 : 16;
      c.seed     = ++seed;
      out.push_back(c);
    }
  return out;
}

/// The built-in score sources: SnapKV (bf16/128 GQA 4, f32/64 GQA 7) and key norm (f16/256).
inline std::vector<eviction_case> eviction_cases_builtin() {
  std::vector<eviction_case> out;
  eviction_case c;
  c.source = score_source::snapkv;
  c.seed   = 40;
  out.push_back(c);
  c.group      = 7;
  c.obs_window = 64;
  c.kv_dtype   = dtype::f32;
  c.d          = 64;
  c.seed       = 41;
  out.push_back(c);
  c.source   = score_source::key_norm;
  c.kv_dtype = dtype::f16;
  c.d        = 256;
  c.seed     = 42;
  out.push_back(c);
  return out;
}

/// fp8 caches: e4m3 and e5m2 x every score source x no scales and per-head scales (per-tensor:
/// the same k_of path with count 1, covered by the reference tests), head dims 64/128/256 and
/// GQA groups 4 and 7 among them.
inline std::vector<eviction_case> eviction_cases_fp8() {
  std::vector<eviction_case> out;
  std::uint64_t seed = 60;
  int i              = 0;
  for (dtype t : {dtype::fp8_e4m3, dtype::fp8_e5m2})
    for (score_source src : {score_source::supplied, score_source::snapkv, score_source::key_norm})
      for (scale_mode m : {scale_mode::none, scale_mode::per_head}) {
        eviction_case c;
        c.kv_dtype = t;
        c.source   = src;
        c.scales   = m;
        c.d        = std::array<std::int32_t, 3>{64, 128, 256}[(i + i / 6) % 3];
        c.P        = c.d == 64 ? 1 : 16;
        c.group    = i % 2 == i / 6 ? 4 : 7;
        c.seed     = ++seed;
        out.push_back(c);
        ++i;
      }
  return out;
}

/// SnapKV from the prefill's log-sum-exp: tensor cores with split (f32 / bf16 queries on
/// 16-bit or f16-read fp8 K) and exact (queries in the mma type) query rows, sinks, GQA 7 with
/// a 64-query window (several query tiles per warp), every head dim, the CUDA-core scorer (f32
/// K, and bf16 with tensor cores off).
inline std::vector<eviction_case> eviction_cases_lse() {
  std::vector<eviction_case> out;
  eviction_case c;
  c.source     = score_source::snapkv;
  c.lse        = true;
  c.long_len   = 800;  // the reference prefill that gives the lse is quadratic in the chunk
  c.long_chunk = 160;
  c.seed       = 80;
  out.push_back(c);  // bf16 d 128, f32 queries: split rows
  c.d          = 64;
  c.P          = 1;
  c.group      = 7;
  c.obs_window = 64;
  c.q_dtype    = dtype::bf16;
  c.sinks      = true;
  c.seed       = 81;
  out.push_back(c);  // exact rows, sinks
  c.group      = 4;
  c.obs_window = 32;
  c.sinks      = false;
  c.kv_dtype   = dtype::f16;
  c.d          = 256;
  c.q_dtype    = dtype::f16;
  c.seed       = 82;
  out.push_back(c);
  c.kv_dtype = dtype::f32;
  c.d        = 64;
  c.P        = 1;
  c.q_dtype  = dtype::f32;
  c.seed     = 83;
  out.push_back(c);  // CUDA cores (no tensor-core path for f32 K)
  c.kv_dtype = dtype::fp8_e4m3;
  c.d        = 128;
  c.P        = 16;
  c.q_dtype  = dtype::bf16;
  c.scales   = scale_mode::per_head;
  c.seed     = 84;
  out.push_back(c);  // f16-read fp8, bf16 queries: split rows
  c.kv_dtype = dtype::fp8_e5m2;
  c.d        = 256;
  c.group    = 7;
  c.q_dtype  = dtype::f16;
  c.sinks    = true;
  c.seed     = 85;
  out.push_back(c);  // exact rows
  c.kv_dtype     = dtype::bf16;
  c.d            = 128;
  c.group        = 4;
  c.sinks        = false;
  c.scales       = scale_mode::none;
  c.q_dtype      = dtype::bf16;
  c.tensor_cores = false;
  c.seed         = 86;
  out.push_back(c);
  // (From the review of the scorer.) Split rows on f16 mma (f32 queries, f16 K), split rows
  // on bf16 mma with f16 queries at d 256, fp8 at d 64 (4 lanes stage a token), a one-query
  // window, and GQA 5 x window 7 (35 queries: a partial query tile) with sinks.
  c.tensor_cores = true;
  c.kv_dtype     = dtype::f16;
  c.q_dtype      = dtype::f32;
  c.seed         = 180;
  out.push_back(c);
  c.kv_dtype = dtype::bf16;
  c.d        = 256;
  c.q_dtype  = dtype::f16;
  c.seed     = 181;
  out.push_back(c);
  c.kv_dtype = dtype::fp8_e4m3;
  c.d        = 64;
  c.P        = 1;
  c.scales   = scale_mode::per_head;
  c.seed     = 182;
  out.push_back(c);
  c.kv_dtype   = dtype::fp8_e5m2;
  c.q_dtype    = dtype::f32;
  c.group      = 1;
  c.obs_window = 1;
  c.seed       = 183;
  out.push_back(c);
  c.kv_dtype   = dtype::bf16;
  c.d          = 128;
  c.P          = 16;
  c.scales     = scale_mode::none;
  c.q_dtype    = dtype::bf16;
  c.group      = 5;
  c.obs_window = 7;
  c.sinks      = true;
  c.seed       = 184;
  out.push_back(c);
  return out;
}

/// The top-k's one-slice / multi-slice boundary (select_slice = 4096 candidates): a request with
/// no held tokens and a chunk of 4096 (one slice: every key in the CTA's registers), 4097 (a
/// second slice of one key) and 8192 (two full slices). (From the review of the one-slice path.)
inline std::vector<eviction_case> eviction_cases_slice_boundary() {
  std::vector<eviction_case> out;
  std::uint64_t seed = 190;
  for (std::int32_t chunk : {4096, 4097, 8192}) {
    eviction_case c;
    c.source     = chunk == 8192 ? score_source::key_norm : score_source::supplied;
    c.long_len   = 0;
    c.long_chunk = chunk;
    c.seed       = ++seed;
    out.push_back(c);
  }
  return out;
}

/// Per-head pages (Hp 1): supplied scores (bf16 d 128, f32 d 64 on one-token pages), SnapKV
/// (bf16 GQA 4), key norm (f16 d 256), SnapKV from the prefill's log-sum-exp on tensor cores and
/// fp8 e4m3 with per-head scales.
inline std::vector<eviction_case> eviction_cases_per_head() {
  std::vector<eviction_case> out;
  eviction_case c;
  c.Hp   = 1;
  c.seed = 70;
  out.push_back(c);
  c.kv_dtype = dtype::f32;
  c.d        = 64;
  c.P        = 1;
  c.seed     = 71;
  out.push_back(c);
  c.kv_dtype = dtype::bf16;
  c.d        = 128;
  c.P        = 16;
  c.source   = score_source::snapkv;
  c.seed     = 72;
  out.push_back(c);
  c.kv_dtype = dtype::f16;
  c.d        = 256;
  c.source   = score_source::key_norm;
  c.seed     = 73;
  out.push_back(c);
  c.kv_dtype   = dtype::bf16;
  c.d          = 128;
  c.source     = score_source::snapkv;
  c.lse        = true;
  c.long_len   = 800;
  c.long_chunk = 160;
  c.seed       = 74;
  out.push_back(c);
  c.kv_dtype = dtype::fp8_e4m3;
  c.q_dtype  = dtype::bf16;
  c.scales   = scale_mode::per_head;
  c.seed     = 75;
  out.push_back(c);
  return out;
}

/// Pinned shared-prefix pages (kv_cache_view::pinned): supplied scores (the pinned candidates
/// scored lowest, so that only the pin keeps them), key norm and SnapKV from the log-sum-exp,
/// with layer-shared groups (Hp 2) and per-head pages; one and several pinned pages.
inline std::vector<eviction_case> eviction_cases_pinned() {
  std::vector<eviction_case> out;
  eviction_case c;
  c.pin_pages = 1;
  c.seed      = 90;
  out.push_back(c);
  c.pin_pages = 40;  // up to every page the shortest head fills
  c.seed      = 91;
  out.push_back(c);
  c.Hp       = 1;
  c.kv_dtype = dtype::f32;
  c.d        = 64;
  c.seed     = 92;
  out.push_back(c);
  c.Hp       = 2;
  c.kv_dtype = dtype::f16;
  c.d        = 128;
  c.source   = score_source::key_norm;
  c.seed     = 93;
  out.push_back(c);
  c.kv_dtype   = dtype::bf16;
  c.source     = score_source::snapkv;
  c.lse        = true;
  c.long_len   = 800;
  c.long_chunk = 160;
  c.pin_pages  = 3;
  c.seed       = 94;
  out.push_back(c);
  return out;
}

/// A long candidate list (several radix and compaction tiles).
inline eviction_case eviction_case_long() {
  eviction_case c;
  c.long_len = 20000;
  c.seed     = 50;
  return c;
}

/// Every pinned token of `layer` (kv_cache_view::pinned) is still held, at its position, with the
/// bytes `before` (the cache before the launch) had there; "" when so.
inline std::string check_pinned_kept(test_cache& before,
                                     test_cache& after,
                                     std::vector<std::int32_t> const& batch,
                                     std::int32_t layer,
                                     std::vector<std::int32_t> const& new_len) {
  auto bv = before.view(batch), av = after.view(batch);
  auto const& geo = bv.geometry;
  auto row        = static_cast<std::size_t>(geo.head_dim * geo.element_bytes());
  auto at         = [&](kv_cache_view const& v, token_location loc, head_slot slot, int kv) {
    return v.pool + loc.page * geo.page_bytes() +
           geo.element_offset(kv, slot.column, loc.token) * geo.element_bytes();
  };
  for (std::int32_t r = 0; r < bv.batch_size; ++r)
    for (std::int32_t h = 0; h < bv.num_kv_heads; ++h) {
      auto slot = bv.slot_of(layer, h);
      auto q    = bv.pinned(r, slot.group);
      if (q == 0) continue;
      std::ostringstream s;
      s << "request " << r << " head " << h << ": ";
      if (new_len[static_cast<std::size_t>(r * bv.num_kv_heads + h)] < q) {
        s << "keeps " << new_len[static_cast<std::size_t>(r * bv.num_kv_heads + h)] << " < " << q
          << " pinned tokens";
        return s.str();
      }
      for (std::int32_t i = 0; i < q; ++i)
        for (std::int32_t kv = 0; kv < 2; ++kv) {
          auto loc = bv.locate(r, layer, h, i);
          if (std::memcmp(at(bv, loc, slot, kv), at(av, loc, slot, kv), row) != 0) {
            s << "pinned token " << i << " of " << q << " changed";
            return s.str();
          }
        }
    }
  return {};
}

/// Runs `c` on `backend` and the CPU reference on identical caches, every layer: lengths and the
/// whole page pool must end byte-identical. Built-in scores are compared with a tolerance, then
/// the selection is checked exactly by replaying the reference on the kernel's own scores.
template <class Backend>
std::string check_eviction(eviction_case const& c, Backend& backend) {
  constexpr std::int32_t L = eviction_scenario::num_layers, H = eviction_scenario::num_kv_heads;
  std::mt19937_64 rng(c.seed);
  page_geometry geo{c.P, c.Hp, c.d, c.kv_dtype};
  auto sc = make_eviction_scenario(geo, c.window, c.sink + c.recent, c.long_len, c.long_chunk);
  std::int32_t rows = sc.chunk_indptr.back();
  for (std::int32_t layer = 0; layer < L; ++layer) {
    std::ostringstream where;
    where << c.describe() << ", layer " << layer << ": ";
    test_cache run_cache(sc.layout, sc.seqs, c.seed), ref_cache(sc.layout, sc.seqs, c.seed);
    test_cache before(sc.layout, sc.seqs, c.seed);  // pristine: the pinned tokens must stay
    if (c.pin_pages > 0) {
      run_cache.pin_leading_pages(c.pin_pages);
      ref_cache.pin_leading_pages(c.pin_pages);
      before.pin_leading_pages(c.pin_pages);
    }
    auto rv        = run_cache.view(sc.batch);
    auto cv        = ref_cache.view(sc.batch);
    std::int32_t B = rv.batch_size;
    std::size_t es = size_of(c.kv_dtype);
    std::vector<unsigned char> ck(static_cast<std::size_t>(rows * H * c.d) * es), cvv(ck.size());
    for (std::size_t i = 0; i < ck.size() / es; ++i) {
      reference::detail::store_from_float(
          ck.data(), c.kv_dtype, static_cast<std::int64_t>(i), run_cache.random_value());
      reference::detail::store_from_float(
          cvv.data(), c.kv_dtype, static_cast<std::int64_t>(i), run_cache.random_value());
    }
    std::vector<unsigned char> q(static_cast<std::size_t>(rows * H * c.group * c.d) *
                                 size_of(c.q_dtype));
    for (std::size_t i = 0; i < q.size() / size_of(c.q_dtype); ++i)
      reference::detail::store_from_float(q.data(),
                                          c.q_dtype,
                                          static_cast<std::int64_t>(i),
                                          std::uniform_real_distribution<float>(-2.f, 2.f)(rng));
    std::int32_t max_cand = 0;
    for (std::int32_t r = 0; r < B; ++r)
      for (std::int32_t h = 0; h < H; ++h)
        max_cand =
            std::max(max_cand,
                     rv.head_len(r, layer, h) + sc.chunk_indptr[static_cast<std::size_t>(r) + 1] -
                         sc.chunk_indptr[static_cast<std::size_t>(r)]);
    std::vector<float> scores(static_cast<std::size_t>(B * H * max_cand));
    for (auto& x : scores) x = static_cast<float>(rng() % 7);  // many ties
    for (std::int32_t r = 0; r < B; ++r)  // pinned candidates score lowest: only the pin keeps them
      for (std::int32_t h = 0; h < H; ++h)
        for (std::int32_t i = 0; i < rv.pinned(r, rv.slot_of(layer, h).group); ++i)
          scores[static_cast<std::size_t>((r * H + h) * max_cand + i)] = -5.f;
    const scale_arrays scales(c.scales, H, c.seed * 8 + static_cast<std::uint64_t>(layer));

    eviction_params p;
    p.scales         = scales.view();
    p.layer          = layer;
    p.sink           = c.sink;
    p.max_candidates = max_cand;
    p.source         = c.source;
    p.q_dtype        = c.q_dtype;
    p.group          = c.group;
    p.obs_window     = c.obs_window;
    p.tensor_cores   = c.tensor_cores;
    p.rules          = sc.rules.data() + layer * H;
    p.chunk_indptr   = sc.chunk_indptr.data();
    p.chunk_k        = ck.data();
    p.chunk_v        = cvv.data();
    p.q              = q.data();
    p.scores         = scores.data();
    // The prefill of the same chunk on the same (unchanged) pages gives the log-sum-exp.
    std::vector<float> lse(static_cast<std::size_t>(rows * H * c.group), 0.f);
    if (c.lse) {
      std::vector<float> o(static_cast<std::size_t>(rows * H * c.group * c.d));
      std::vector<float> sinks(static_cast<std::size_t>(H * c.group));
      for (auto& z : sinks) z = std::uniform_real_distribution<float>(-1.f, 3.f)(rng);
      prefill_params f;
      f.kv           = cv;
      f.layer        = layer;
      f.group        = c.group;
      f.chunk_indptr = sc.chunk_indptr.data();
      for (std::int32_t r = 0; r < B; ++r)
        f.max_chunk = std::max(f.max_chunk,
                               sc.chunk_indptr[static_cast<std::size_t>(r) + 1] -
                                   sc.chunk_indptr[static_cast<std::size_t>(r)]);
      f.q       = q.data();
      f.q_dtype = c.q_dtype;
      f.chunk_k = ck.data();
      f.chunk_v = cvv.data();
      f.o       = o.data();
      f.o_dtype = dtype::f32;
      f.lse     = lse.data();
      f.sinks   = c.sinks ? sinks.data() : nullptr;
      f.scales  = scales.view();
      reference::prefill_attention(f);
      p.q_lse = lse.data();
    }
    std::vector<std::int32_t> run_len(static_cast<std::size_t>(B * H), -9), ref_len(run_len);
    std::vector<float> run_scores(scores.size(), 0.f), ref_scores(scores.size(), 0.f);
    p.kv         = rv;
    p.new_len    = run_len.data();
    p.scores_out = run_scores.data();
    backend.evict(run_cache, p);

    p.kv         = cv;
    p.new_len    = ref_len.data();
    p.scores_out = ref_scores.data();
    if (c.source != score_source::supplied) {
      test_cache probe(sc.layout, sc.seqs, c.seed);
      auto pp = p;
      pp.kv   = probe.view(sc.batch);
      reference::evict_chunk(pp);
      for (std::size_t i = 0; i < ref_scores.size(); ++i)
        if (!(std::abs(run_scores[i] - ref_scores[i]) <=
              1e-5f * std::max(1.f, std::abs(ref_scores[i])) + 1e-7f)) {
          where << "score " << i << " is " << run_scores[i] << ", reference " << ref_scores[i];
          return where.str();
        }
      p.pool_kernel = p.pool();
      p.source      = score_source::supplied;
      p.q_lse       = nullptr;
      p.scores      = run_scores.data();
    }
    reference::evict_chunk(p);
    if (run_len != ref_len) return where.str() + "new_len differs";
    if (run_cache.pool() != ref_cache.pool()) {
      auto mm =
          std::mismatch(run_cache.pool().begin(), run_cache.pool().end(), ref_cache.pool().begin());
      where << "page pool differs at byte " << (mm.first - run_cache.pool().begin());
      return where.str();
    }
    if (c.source == score_source::supplied && run_scores != ref_scores)
      return where.str() + "scores_out differs";
    if (auto bad = check_pinned_kept(before, run_cache, sc.batch, layer, run_len); !bad.empty())
      return where.str() + bad;
  }
  return {};
}

}  // namespace tangram::test
