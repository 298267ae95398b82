// SPDX-License-Identifier: Apache-2.0
/**
 * @file test/gpu/decode_cases.hpp
 * @brief The decode attention scenarios and their check against the split CPU reference.
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
#include "tangram/kernels/decode_attention.hpp"
#include "tangram/reference/decode_attention.hpp"

namespace tangram::test {

// ---------------------------------------------------------------------------------------------
// Decode.
// ---------------------------------------------------------------------------------------------

/// One decode scenario: a ragged batch (test::ragged_sequences) over `layers` layers of `heads`
/// KV heads, run for every layer with split maps of `ctas` CTAs (random shares).
struct decode_case {
  dtype kv_dtype = dtype::bf16;
  std::int32_t d = 128, P = 16, Hp = 2, group = 4, layers = 2, heads = 4;
  std::vector<std::int32_t> lens;
  std::vector<std::int32_t> sliding = {1};
  std::int32_t window = 40, ring_pages = 4;
  bool sinks         = false;
  dtype o_dtype      = dtype::f32;
  std::uint64_t seed = 1;
  std::vector<std::int32_t> ctas;                    ///< N_CTA values; empty: {heads, 264, 535}
  bool tensor_cores             = true;              ///< decode_params::tensor_cores
  scale_mode scales             = scale_mode::none;  ///< fp8 only
  std::int32_t invariant_pieces = 0;                 ///< decode_params::invariant_pieces
  float scale_magnitude         = 1.f;  ///< fp8 scales in [0.5, 2] x this (scale_arrays)
  bool fold_merge = false;       ///< decode_params::merge_counters (checked zero after each launch)
  dtype q_dtype   = dtype::f32;  ///< decode_params::q_dtype
  /// > 0: the queries start this many elements into their buffer and request rows are
  /// `num_q_heads * d + q_misalign` elements apart (decode_params::q_stride): rows that are and
  /// are not aligned to the kernels' query vector loads (vec.cuh load_runs)
  std::int32_t q_misalign = 0;
  /// The layer-stream split (layer_stream_split: CTAs cross head boundaries) instead of random
  /// per-head maps; N_CTA may then be below the heads.
  bool layer_stream = false;

  [[nodiscard]] std::string describe() const {
    std::ostringstream s;
    s << to_string(kv_dtype) << " d " << d << " P " << P << " Hp " << Hp << " group " << group
      << " batch " << lens.size() << " seed " << seed;
    if (scales != scale_mode::none) s << ", " << to_string(scales);
    if (invariant_pieces != 0) s << ", batch-invariant K " << invariant_pieces;
    if (fold_merge) s << ", merge folded";
    if (layer_stream) s << ", layer stream";
    if (q_dtype != dtype::f32 || q_misalign != 0)
      s << ", q " << to_string(q_dtype) << " misaligned by " << q_misalign;
    return s.str();
  }
};

/// The GQA sweep: f32, d 64, groups 1..8.
inline std::vector<decode_case> decode_cases_gqa() {
  std::vector<decode_case> out;
  for (std::int32_t g = 1; g <= 8; ++g) {
    decode_case c;
    c.kv_dtype = dtype::f32;
    c.d        = 64;
    c.group    = g;
    c.lens     = {1, 15, 54, 97, 1000};
    c.sinks    = g % 2 == 1;
    c.seed     = 10 + static_cast<std::uint64_t>(g);
    out.push_back(c);
  }
  return out;
}

/// Every 32- and 16-bit K/V dtype x head dim, each with page sizes 1, 16 and 32 (fp8:
/// decode_cases_fp8).
inline std::vector<decode_case> decode_cases_shapes() {
  std::vector<decode_case> out;
  std::uint64_t seed = 100;
  for (dtype t : {dtype::f32, dtype::f16, dtype::bf16})
    for (std::int32_t d : {64, 128, 256})
      for (std::int32_t P : {1, 16, 32}) {
        decode_case c;
        c.kv_dtype   = t;
        c.d          = d;
        c.P          = P;
        c.ring_pages = (40 + P - 1) / P + 1;
        c.group      = 1 + static_cast<std::int32_t>(seed % 8);
        c.lens       = {97, 3, 1000, 54};
        c.sinks      = seed % 2 == 0;
        c.o_dtype    = seed % 3 == 0 ? dtype::bf16 : dtype::f32;
        c.seed       = ++seed;
        out.push_back(c);
      }
  return out;
}

/// fp8 K/V (e4m3 and e5m2) x every head dim, page sizes 1/16/32 and GQA groups 1..8 spread over
/// them (every group bucket 1/2/4/8 among them), bf16 outputs in some: the decode_config of
/// one-byte types (8 bytes per lane, 16-byte copies).
inline std::vector<decode_case> decode_cases_fp8() {
  std::vector<decode_case> out;
  std::uint64_t seed = 600;
  for (dtype t : {dtype::fp8_e4m3, dtype::fp8_e5m2})
    for (std::int32_t d : {64, 128, 256}) {
      decode_case c;
      c.kv_dtype   = t;
      c.d          = d;
      c.P          = std::int32_t{1} << (seed % 3 == 0 ? 0 : 3 + seed % 3);  // 1, 16, 32
      c.ring_pages = (40 + c.P - 1) / c.P + 1;
      c.group      = 1 + static_cast<std::int32_t>((seed * 3) % 8);
      c.lens       = {97, 3, 1000, 54};
      c.sinks      = seed % 2 == 0;
      c.o_dtype    = seed % 3 == 1 ? dtype::bf16 : dtype::f32;
      c.seed       = ++seed;
      out.push_back(c);
    }
  return out;
}

/// The tensor-core decode instances (16-bit and fp8 K/V, GQA group buckets 4 and 8): bf16 and
/// f16 x head dims 64/128/256 x groups 3, 4, 6, 8 (full and part-filled buckets), fp8 e4m3 and
/// e5m2 x head dims x groups 3 and 8 (fp8 scales per head, some of vLLM's magnitude), with empty
/// and single-token heads, lengths around the 16-token warp tile, a sliding-window ring layer,
/// page sizes that are and are not powers of two, sinks, f32 and 16-bit outputs and three split
/// maps.
inline std::vector<decode_case> decode_cases_mma() {
  std::vector<decode_case> out;
  std::uint64_t seed = 300;
  for (dtype t : {dtype::bf16, dtype::f16, dtype::fp8_e4m3, dtype::fp8_e5m2})
    for (std::int32_t d : {64, 128, 256})
      for (std::int32_t group : {3, 4, 6, 8}) {
        const bool fp8 = t == dtype::fp8_e4m3 || t == dtype::fp8_e5m2;
        if (fp8 && (group == 4 || group == 6)) continue;
        decode_case c;
        if (fp8) {
          c.scales          = scale_mode::per_head;
          c.scale_magnitude = group == 8 ? 1.f / 256 : 1.f;
        }
        c.kv_dtype   = t;
        c.d          = d;
        c.group      = group;
        c.P          = group == 6 ? 24 : group == 3 ? 1 : 16;
        c.ring_pages = (40 + c.P - 1) / c.P + 1;
        c.lens       = {0, 1, 16, 17, 33, 250, 0, 700};
        c.sinks      = group % 2 == 0;
        c.o_dtype    = group == 8 ? dtype::bf16 : dtype::f32;
        c.seed       = ++seed;
        out.push_back(c);
      }
  return out;
}

/// decode_cases_mma with the tensor-core kernel switched off: the CUDA-core kernel on the same
/// instances (every other case).
inline std::vector<decode_case> decode_cases_mma_cuda_core() {
  std::vector<decode_case> out;
  auto all = decode_cases_mma();
  for (std::size_t i = 0; i < all.size(); i += 2) {
    all[i].tensor_cores = false;
    out.push_back(all[i]);
  }
  return out;
}

/// The query layouts: f32, bf16 and f16 queries whose rows start one element past a vector
/// boundary and lie an odd number of elements apart, so that the kernels' vector query loads
/// (vec.cuh load_runs) take their one-element fallback on most rows and vector loads on the rows
/// that happen to be aligned (9 requests; runs of 8: rows 3 and 7 of f32 queries, row 7 of 16-bit
/// ones); on the tensor-core kernel (bf16 d 128 GQA 4, f16 d 256 GQA 3, fp8 d 64 GQA 8) and the
/// CUDA-core one (f32 d 64 GQA 2, fp8 d 256 GQA 1, bf16 d 128 GQA 4 with tensor cores off).
inline std::vector<decode_case> decode_cases_query_layout() {
  struct shape {
    dtype kv;
    std::int32_t d, group;
    bool tensor_cores;
  };
  const shape shapes[] = {{dtype::bf16, 128, 4, true},
                          {dtype::f16, 256, 3, true},
                          {dtype::fp8_e4m3, 64, 8, true},
                          {dtype::f32, 64, 2, true},
                          {dtype::fp8_e5m2, 256, 1, true},
                          {dtype::bf16, 128, 4, false}};
  std::vector<decode_case> out;
  std::uint64_t seed = 900;
  for (dtype q : {dtype::f32, dtype::bf16, dtype::f16})
    for (shape const& sh : shapes) {
      decode_case c;
      c.kv_dtype     = sh.kv;
      c.d            = sh.d;
      c.group        = sh.group;
      c.tensor_cores = sh.tensor_cores;
      c.q_dtype      = q;
      c.q_misalign   = 1;
      c.lens         = {1, 17, 40, 3, 65, 9, 33, 2, 20};
      c.layers       = 1;
      c.sinks        = seed % 2 == 0;
      c.seed         = seed++;
      out.push_back(c);
    }
  return out;
}

/// fp8 K/V with scales: e4m3 and e5m2 x per-tensor and per-head scales, head dims 64/128/256
/// and group buckets 1/2/4/8 among them, split over several CTAs (partials merged: the V scale
/// folded into partials must survive the merge).
inline std::vector<decode_case> decode_cases_fp8_scaled() {
  decode_case base;
  base.lens = {97, 3, 400, 54};
  return fp8_scaled_cases(base, 650);
}

/// The merge folded into the split kernels (decode_params::merge_counters): the CUDA-core kernel
/// (f32 GQA 2, fp8 e5m2 GQA 1), the tensor-core kernel (bf16 GQA 4, fp8 e4m3 GQA 8) and
/// batch-invariant pieces, with empty heads, single-piece requests and requests over many CTAs.
inline std::vector<decode_case> decode_cases_folded() {
  std::vector<decode_case> out;
  std::uint64_t seed = 800;
  for (dtype t : {dtype::f32, dtype::bf16, dtype::fp8_e4m3, dtype::fp8_e5m2}) {
    decode_case c;
    c.kv_dtype   = t;
    c.d          = t == dtype::f32 ? 64 : 128;
    c.group      = t == dtype::f32 ? 2 : t == dtype::bf16 ? 4 : t == dtype::fp8_e4m3 ? 8 : 1;
    c.lens       = {0, 1, 1500, 17, 0, 700, 2600};
    c.layers     = 1;
    c.sinks      = seed % 2 == 0;
    c.fold_merge = true;
    c.seed       = seed++;
    out.push_back(c);
  }
  decode_case inv      = out[1];
  inv.invariant_pieces = 16;
  inv.seed             = seed++;
  out.push_back(inv);
  return out;
}

/// Per-head pages (Hp 1, the plans' default: every head its own page list, so a page holds one
/// head's column): the CUDA-core kernel (f32 GQA 1, f16 d 256 GQA 2 on one-token pages), the
/// tensor-core kernel (bf16 GQA 4 with a sliding ring layer, fp8 e4m3 GQA 8 with per-head
/// scales), the merge folded into the split kernels and batch-invariant pieces.
inline std::vector<decode_case> decode_cases_per_head() {
  std::vector<decode_case> out;
  decode_case c;
  c.Hp       = 1;
  c.kv_dtype = dtype::f32;
  c.d        = 64;
  c.group    = 1;
  c.lens     = {1, 15, 54, 97, 1000, 0};
  c.sinks    = true;
  c.seed     = 900;
  out.push_back(c);
  c.kv_dtype   = dtype::f16;
  c.d          = 256;
  c.group      = 2;
  c.P          = 1;
  c.ring_pages = 41;
  c.sinks      = false;
  c.o_dtype    = dtype::bf16;
  c.seed       = 901;
  out.push_back(c);
  c.kv_dtype   = dtype::bf16;
  c.d          = 128;
  c.group      = 4;
  c.P          = 16;
  c.ring_pages = 4;
  c.lens       = {0, 1, 16, 17, 33, 250, 700};
  c.o_dtype    = dtype::f32;
  c.seed       = 902;
  out.push_back(c);
  c.kv_dtype        = dtype::fp8_e4m3;
  c.group           = 8;
  c.scales          = scale_mode::per_head;
  c.scale_magnitude = 1.f / 256;
  c.sinks           = true;
  c.seed            = 903;
  out.push_back(c);
  decode_case f = out[2];
  f.layers      = 1;
  f.lens        = {0, 1, 1500, 17, 700, 2600};
  f.fold_merge  = true;
  f.seed        = 904;
  out.push_back(f);
  f.fold_merge       = false;
  f.invariant_pieces = 16;
  f.seed             = 905;
  out.push_back(f);
  return out;
}

/// A long context (32769 tokens: many tiles per CTA) and a batch of 300.
inline std::vector<decode_case> decode_cases_long() {
  decode_case c;
  c.lens   = {32769, 4000, 1, 15};
  c.layers = 1;
  c.sliding.clear();
  c.sinks = true;
  c.seed  = 7;
  decode_case b;
  b.lens.assign(300, 0);
  for (std::size_t i = 0; i < b.lens.size(); ++i)
    b.lens[i] = 1 + static_cast<std::int32_t>(i * 7 % 500);
  b.group = 5;
  b.seed  = 8;
  return {c, b};
}

/// Batches above one prefix-scan tile (512 requests): 1100 and decode_max_batch (4096), short
/// and empty heads included, one layer, two KV heads (the scan and merge are what they test).
inline std::vector<decode_case> decode_cases_large_batch() {
  std::vector<decode_case> out;
  for (std::int32_t batch : {1100, decode_max_batch}) {
    decode_case c;
    c.kv_dtype = dtype::bf16;
    c.d        = 64;
    c.group    = 2;
    c.layers   = 1;
    c.heads    = 2;
    c.sliding.clear();
    c.lens.resize(static_cast<std::size_t>(batch));
    for (std::int32_t i = 0; i < batch; ++i)
      c.lens[static_cast<std::size_t>(i)] = i * 7 % (batch > 2000 ? 13 : 61);  // zeros included
    c.sinks = true;
    c.seed  = 5 + static_cast<std::uint64_t>(batch);
    c.ctas  = {2, 264, 535};
    out.push_back(c);
  }
  return out;
}

/// The layer-stream split (CTAs cut the layer's stream across heads, N_CTA 1 and 3 below the
/// heads, 264 and 535 above): the CUDA-core kernel (f32 GQA 2 on per-head pages with a sliding
/// ring layer), the tensor-core kernel (bf16 GQA 4, fp8 e4m3 GQA 8 with per-head scales), empty
/// and single-token heads, the merge folded into the split kernels, batch-invariant pieces, a
/// batch of 1100 (multi-tile scans) and a layer that holds no token at all.
inline std::vector<decode_case> decode_cases_layer_stream() {
  std::vector<decode_case> out;
  decode_case c;
  c.layer_stream = true;
  c.ctas         = {1, 3, 264, 535};
  c.kv_dtype     = dtype::f32;
  c.d            = 64;
  c.group        = 2;
  c.Hp           = 1;
  c.lens         = {0, 1, 15, 54, 97, 1000, 0};
  c.sinks        = true;
  c.seed         = 1200;
  out.push_back(c);
  c.kv_dtype = dtype::bf16;
  c.d        = 128;
  c.group    = 4;
  c.Hp       = 2;
  c.lens     = {0, 1, 16, 17, 33, 250, 700};
  c.sinks    = false;
  c.seed     = 1201;
  out.push_back(c);
  c.kv_dtype        = dtype::fp8_e4m3;
  c.group           = 8;
  c.scales          = scale_mode::per_head;
  c.scale_magnitude = 1.f / 256;
  c.sinks           = true;
  c.o_dtype         = dtype::bf16;
  c.seed            = 1202;
  out.push_back(c);
  decode_case f = out[1];
  f.layers      = 1;
  f.lens        = {0, 1, 1500, 17, 0, 700, 2600};
  f.fold_merge  = true;
  f.seed        = 1203;
  out.push_back(f);
  f.kv_dtype = dtype::f32;
  f.d        = 64;
  f.group    = 2;
  f.seed     = 1204;
  out.push_back(f);
  f.fold_merge       = false;
  f.invariant_pieces = 16;
  f.seed             = 1205;
  out.push_back(f);
  decode_case none = out[0];
  none.lens        = {0, 0, 0};  // layer 0 holds no token (the sliding layer 1 its window)
  none.seed        = 1206;
  out.push_back(none);
  none.fold_merge = true;
  none.seed       = 1207;
  out.push_back(none);
  decode_case big = out[1];
  big.layers      = 1;
  big.heads       = 3;
  big.sliding.clear();
  big.lens.resize(1100);
  for (std::int32_t i = 0; i < 1100; ++i) big.lens[static_cast<std::size_t>(i)] = i * 7 % 61;
  big.ctas = {2, 264};
  big.seed = 1208;
  out.push_back(big);
  return out;
}

/// The cache, batch view, queries, sinks and fp8 scales of a decode case.
struct decode_scenario {
  std::mt19937_64 rng;
  test_cache cache;
  kv_cache_view view;
  std::vector<float> q, sinks;
  scale_arrays scales;

  explicit decode_scenario(decode_case const& c)
      : rng(c.seed),
        cache(make_cache(c, rng), make_seqs(c, rng), c.seed + 3),
        scales(c.scales, c.heads, c.seed, c.scale_magnitude) {
    std::vector<std::int32_t> batch(c.lens.size());
    std::iota(batch.begin(), batch.end(), 0);
    std::shuffle(batch.begin(), batch.end(), rng);
    view            = cache.view(batch);
    std::int32_t Hq = c.heads * c.group;
    q.resize(static_cast<std::size_t>(view.batch_size) * Hq * c.d);
    sinks.resize(static_cast<std::size_t>(Hq));
    for (auto& x : q) x = std::uniform_real_distribution<float>(-3.f, 3.f)(rng);
    for (auto& x : sinks) x = std::uniform_real_distribution<float>(-2.f, 4.f)(rng);
  }

 private:
  static cache_layout make_cache(decode_case const& c, std::mt19937_64&) {
    return adjacent_layout(page_geometry{c.P, c.Hp, c.d, c.kv_dtype},
                           c.layers,
                           c.heads,
                           c.sliding,
                           c.window,
                           c.ring_pages);
  }
  static std::vector<sequence_spec> make_seqs(decode_case const& c, std::mt19937_64& rng) {
    std::vector<std::int32_t> appended, seq_tokens;
    for (std::size_t r = 0; r < c.lens.size(); ++r) {
      appended.push_back(std::min(static_cast<std::int32_t>(r % 3), c.lens[r]));
      seq_tokens.push_back(c.lens[r] + 50);
    }
    return ragged_sequences(c.lens, appended, seq_tokens, c.layers, c.heads, rng);
  }
};

/// Runs `c` on `backend` and the split CPU reference for every layer and split map; compares
/// outputs (f32: 5e-5 absolute; f16/bf16 outputs: 1e-2 relative) and LSEs (1e-4 relative).
template <class Backend>
std::string check_decode(decode_case const& c, Backend& backend) {
  decode_scenario s(c);
  const std::int32_t B = s.view.batch_size, Hq = c.heads * c.group;
  const std::size_t out_elems = s.q.size(), out_bytes = out_elems * size_of(c.o_dtype);
  std::vector<std::int32_t> ctas = c.ctas;
  if (ctas.empty()) ctas = {c.heads, 2 * 132, 4 * 132 + 7};
  for (std::int32_t n : ctas)
    if (!c.layer_stream && n < c.heads) return c.describe() + ": N_CTA below the heads";
  // The queries in c.q_dtype, laid out as c.q_misalign says (the buffer 16-byte aligned).
  const std::int64_t q_row    = static_cast<std::int64_t>(Hq) * c.d;
  const std::int64_t q_stride = q_row + c.q_misalign;
  std::vector<float> q_words(
      (static_cast<std::size_t>(c.q_misalign + B * q_stride) * size_of(c.q_dtype) + 3) / 4);
  auto* q_buf = reinterpret_cast<unsigned char*>(q_words.data());
  for (std::int64_t r = 0; r < B; ++r)
    for (std::int64_t i = 0; i < q_row; ++i)
      reference::detail::store_from_float(q_buf,
                                          c.q_dtype,
                                          c.q_misalign + r * q_stride + i,
                                          s.q[static_cast<std::size_t>(r * q_row + i)]);
  for (std::int32_t n_cta : ctas) {
    std::vector<std::int32_t> begin;
    if (!c.layer_stream) begin = random_cta_begin(c.layers, c.heads, n_cta, s.rng);
    for (std::int32_t layer = 0; layer < c.layers; ++layer) {
      decode_params p;
      p.kv               = s.view;
      p.layer            = layer;
      p.group            = c.group;
      p.q_dtype          = c.q_dtype;
      p.q_stride         = c.q_misalign != 0 ? q_stride : 0;
      p.o_dtype          = c.o_dtype;
      p.splits           = c.layer_stream ? layer_stream_split(c.layers, c.heads, n_cta)
                                          : split_map_view{c.layers, c.heads, n_cta, begin.data()};
      p.q                = q_buf + c.q_misalign * size_of(c.q_dtype);
      p.sinks            = c.sinks ? s.sinks.data() : nullptr;
      p.tensor_cores     = c.tensor_cores;
      p.scales           = s.scales.view();
      p.invariant_pieces = c.invariant_pieces;
      std::vector<unsigned char> o_ref(out_bytes), o_run(out_bytes, 0x7f);
      std::vector<float> lse_ref(static_cast<std::size_t>(B) * Hq), lse_run(lse_ref.size(), 777.f);
      p.o   = o_ref.data();
      p.lse = lse_ref.data();
      reference::decode_attention(p, reference::split_mode::split);
      p.o   = o_run.data();
      p.lse = lse_run.data();
      std::vector<std::int32_t> counters(static_cast<std::size_t>(B) * c.heads, 0);
      if (c.fold_merge) p.merge_counters = counters.data();
      backend.decode(s.cache, p);
      std::ostringstream where;
      where << c.describe() << ", N_CTA " << n_cta << ", layer " << layer << ": ";
      for (std::size_t i = 0; i < counters.size(); ++i)
        if (counters[i] != 0) {
          where << "merge counter " << i << " is " << counters[i] << " after the launch, not 0";
          return where.str();
        }
      for (std::size_t i = 0; i < out_elems; ++i) {
        const auto at = static_cast<std::int64_t>(i);
        float a       = reference::detail::load_as_float(o_run.data(), c.o_dtype, at);
        float b       = reference::detail::load_as_float(o_ref.data(), c.o_dtype, at);
        float tol     = c.o_dtype == dtype::f32 ? 5e-5f : 1e-2f * std::max(1.f, std::abs(b));
        if (!(std::abs(a - b) <= tol)) {
          where << "output element " << i << " is " << a << ", reference " << b;
          return where.str();
        }
      }
      for (std::size_t i = 0; i < lse_run.size(); ++i)
        if (!(lse_run[i] == lse_ref[i] ||
              std::abs(lse_run[i] - lse_ref[i]) <= 1e-4f * std::max(1.f, std::abs(lse_ref[i])))) {
          where << "lse " << i << " is " << lse_run[i] << ", reference " << lse_ref[i];
          return where.str();
        }
    }
  }
  return {};
}

}  // namespace tangram::test
