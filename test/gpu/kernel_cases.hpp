// SPDX-License-Identifier: Apache-2.0
/**
 * @file test/gpu/kernel_cases.hpp
 * @brief The kernel test scenarios, shared by the GPU tests (test/gpu) and the host emulation
 * tests (test/emu): one way to build each scenario and to compare a kernel run with the CPU
 * reference. Host-only C++; no test framework.
 *
 * A backend runs the kernels on host-side parameters (every pointer host memory, as for the
 * reference) and leaves the results in those host arrays:
 *
 *     void decode(test_cache&, decode_params const&);   // writes p.o and p.lse
 *     void evict(test_cache&, eviction_params const&);  // updates the cache's pool in place,
 *                                                       // writes p.new_len and p.scores_out
 *     void append(test_cache&, append_params const&);   // updates the cache's pool in place
 *
 * (the GPU backend uploads, launches and downloads; the emulator runs on the host arrays). Each
 * check returns an empty string when the kernel agrees with the reference, else a description of
 * the first difference.
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
#include "tangram/kernels/append.hpp"
#include "tangram/kernels/decode_attention.hpp"
#include "tangram/kernels/eviction.hpp"
#include "tangram/reference/append.hpp"
#include "tangram/reference/decode_attention.hpp"
#include "tangram/reference/eviction.hpp"
#include "tangram/reference/prefill_attention.hpp"

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
  bool fold_merge = false;  ///< decode_params::merge_counters (checked zero after each launch)

  [[nodiscard]] std::string describe() const {
    std::ostringstream s;
    s << to_string(kv_dtype) << " d " << d << " P " << P << " Hp " << Hp << " group " << group
      << " batch " << lens.size() << " seed " << seed;
    if (scales != scale_mode::none) s << ", " << to_string(scales);
    if (invariant_pieces != 0) s << ", batch-invariant K " << invariant_pieces;
    if (fold_merge) s << ", merge folded";
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

/// fp8 K/V with scales: e4m3 and e5m2 x per-tensor and per-head scales, head dims 64/128/256
/// and group buckets 1/2/4/8 among them, split over several CTAs (partials merged: the V scale
/// folded into partials must survive the merge).
inline std::vector<decode_case> decode_cases_fp8_scaled() {
  std::vector<decode_case> out;
  std::uint64_t seed = 650;
  for (dtype t : {dtype::fp8_e4m3, dtype::fp8_e5m2})
    for (scale_mode m : {scale_mode::per_tensor, scale_mode::per_head}) {
      decode_case c;
      c.kv_dtype   = t;
      c.scales     = m;
      c.d          = std::int32_t{64} << (seed % 3);
      c.P          = seed % 2 == 0 ? 16 : 1;
      c.ring_pages = (40 + c.P - 1) / c.P + 1;
      c.group      = std::int32_t{1} << (seed % 4);
      c.lens       = {97, 3, 400, 54};
      c.sinks      = seed % 2 == 1;
      c.o_dtype    = seed % 3 == 2 ? dtype::bf16 : dtype::f32;
      c.seed       = ++seed;
      out.push_back(c);
    }
  return out;
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
  for (std::int32_t n_cta : ctas) {
    auto begin = random_cta_begin(c.layers, c.heads, n_cta, s.rng);
    for (std::int32_t layer = 0; layer < c.layers; ++layer) {
      decode_params p;
      p.kv               = s.view;
      p.layer            = layer;
      p.group            = c.group;
      p.q_dtype          = dtype::f32;
      p.o_dtype          = c.o_dtype;
      p.splits           = {c.layers, c.heads, n_cta, begin.data()};
      p.q                = s.q.data();
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

  [[nodiscard]] std::string describe() const {
    std::ostringstream s;
    s << to_string(kv_dtype) << " d " << d << " P " << P << " Hp " << Hp << " source "
      << to_string(source) << " seed " << seed;
    if (scales != scale_mode::none) s << ", " << to_string(scales);
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
  c.kv_dtype = dtype::f16;
  c.d        = 256;
  c.q_dtype  = dtype::f16;
  c.seed     = 82;
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

/// A long candidate list (several radix and compaction tiles).
inline eviction_case eviction_case_long() {
  eviction_case c;
  c.long_len = 20000;
  c.seed     = 50;
  return c;
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
  }
  return {};
}

// ---------------------------------------------------------------------------------------------
// Append.
// ---------------------------------------------------------------------------------------------

/// Cache dtypes the append kernel is instantiated for, and its source dtypes.
inline std::vector<dtype> append_cache_dtypes() {
  return {dtype::f32, dtype::f16, dtype::bf16, dtype::fp8_e4m3, dtype::fp8_e5m2};
}
inline std::vector<dtype> append_source_dtypes() {
  return {dtype::f32, dtype::f16, dtype::bf16};
}

/// Appends one token to every head of both layers of a 5-sequence cache (a sliding layer
/// included; `Hp` heads per page, 2 or 1) with `backend` and with the reference: the page pools
/// must end byte-identical. `scales` (fp8 caches only) are drawn per layer (scale_arrays: in
/// [0.5, 2], K and V apart): the kernel's `x / s_h` must store the reference's bytes for every
/// head.
template <class Backend>
std::string check_append(dtype cache_dtype,
                         dtype src,
                         Backend& backend,
                         scale_mode scales = scale_mode::none,
                         std::int32_t Hp   = 2) {
  page_geometry geo{16, Hp, 128, cache_dtype};
  auto layout = adjacent_layout(geo, 2, 4, /*sliding=*/{1}, /*window=*/40, /*ring_pages=*/3);
  std::vector<sequence_spec> seqs;
  for (std::int32_t r = 0; r < 5; ++r) {
    sequence_spec s;
    s.seq_tokens = 30 + 17 * r;
    s.appended   = 1 + r;
    s.base_len.assign(8, 10 + 7 * r);
    seqs.push_back(s);
  }
  test_cache run_cache(layout, seqs, 42), ref_cache(layout, seqs, 42);
  std::vector<std::int32_t> batch = {3, 0, 4, 1};
  auto run_view = run_cache.view(batch), ref_view = ref_cache.view(batch);
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-2, 2);
  std::size_t n = batch.size() * 4 * 128;
  std::vector<std::uint8_t> k_src(n * size_of(src)), v_src(n * size_of(src));
  for (std::size_t i = 0; i < n; ++i) {
    reference::detail::store_from_float(k_src.data(), src, static_cast<std::int64_t>(i), u(rng));
    reference::detail::store_from_float(v_src.data(), src, static_cast<std::int64_t>(i), u(rng));
  }
  for (std::int32_t layer = 0; layer < 2; ++layer) {
    append_params p;
    p.kv        = ref_view;
    p.layer     = layer;
    p.k         = k_src.data();
    p.v         = v_src.data();
    p.src_dtype = src;
    const scale_arrays sc(scales, 4, static_cast<std::uint64_t>(layer) + 11);
    p.scales = sc.view();
    reference::append_decode_kv(p);
    p.kv = run_view;
    backend.append(run_cache, p);
  }
  if (run_cache.pool() != ref_cache.pool())
    return "append cache " + std::string(to_string(cache_dtype)) + " src " +
           std::string(to_string(src)) + " " + to_string(scales) + " Hp " + std::to_string(Hp) +
           ": page pool differs";
  return {};
}

}  // namespace tangram::test
