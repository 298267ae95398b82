// SPDX-License-Identifier: Apache-2.0
/**
 * @file test/gpu/prefill_cases.hpp
 * @brief Chunked-prefill attention scenarios, shared by the CPU reference test (test/reference,
 * which checks the reference against a brute force), the host emulation tests (test/emu) and the
 * GPU tests (test/gpu), with one comparison of a backend run against the CPU reference.
 * Host-only C++; no test framework.
 *
 * A backend runs the kernel on host-side parameters and leaves the results in the host arrays:
 *
 *     void prefill(test_cache&, prefill_params const&);   // writes p.o and p.lse
 */
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "../reference/kv_test_cache.hpp"
#include "scale_cases.hpp"
#include "tangram/kernels/prefill_attention.hpp"
#include "tangram/reference/prefill_attention.hpp"

namespace tangram::test {

/// One prefill scenario: a ragged batch over `layers` layers of `heads` KV heads (test::
/// ragged_sequences; layers in `sliding` are sliding-window layers), each request with a chunk.
struct prefill_case {
  dtype kv_dtype = dtype::bf16;
  std::int32_t d = 64, P = 16, Hp = 2, group = 4, layers = 2, heads = 4;
  std::vector<std::int32_t> lens;        ///< held tokens of head 0 of every layer, per request
  std::vector<std::int32_t> chunks;      ///< chunk rows per request
  std::vector<std::int32_t> seen_extra;  ///< seq_tokens = lens + extra (empty: 50 for all)
  std::vector<std::int32_t> sliding = {1};
  std::int32_t window = 40, ring_pages = 4;
  bool sinks                   = false;
  dtype q_dtype                = dtype::f32;
  dtype o_dtype                = dtype::f32;
  std::int32_t max_chunk_slack = 0;  ///< max_chunk = longest chunk + slack
  std::uint64_t seed           = 1;
  scale_mode scales            = scale_mode::none;  ///< fp8 only

  [[nodiscard]] std::string describe() const {
    std::ostringstream s;
    s << to_string(kv_dtype) << " d " << d << " P " << P << " Hp " << Hp << " group " << group
      << " batch " << lens.size() << (sinks ? " sinks" : "") << " seed " << seed;
    if (scales != scale_mode::none) s << ", " << to_string(scales);
    return s.str();
  }
};

/// The cache, batch view, queries, chunk K/V and sinks of a prefill case.
struct prefill_scenario {
  std::mt19937_64 rng;
  test_cache cache;
  kv_cache_view view;
  std::vector<std::int32_t> batch;         ///< sequence slot of each request
  std::vector<std::int32_t> chunk_indptr;  ///< [batch + 1]
  std::int32_t max_chunk = 0;
  std::vector<std::byte> q, chunk_k, chunk_v;  ///< in q_dtype / the KV dtype
  std::vector<float> qf, kf, vf;               ///< the same values as float (rounded)
  std::vector<float> sinks;
  scale_arrays scales;

  explicit prefill_scenario(prefill_case const& c)
      : rng(c.seed),
        cache(make_cache(c), make_seqs(c, rng), c.seed + 3),
        scales(c.scales, c.heads, c.seed) {
    batch.resize(c.lens.size());
    std::iota(batch.begin(), batch.end(), 0);
    std::shuffle(batch.begin(), batch.end(), rng);
    view = cache.view(batch);
    chunk_indptr.assign(1, 0);
    for (auto s : batch) {
      std::int32_t n = c.chunks[static_cast<std::size_t>(s)];
      chunk_indptr.push_back(chunk_indptr.back() + n);
      max_chunk = std::max(max_chunk, n);
    }
    max_chunk += c.max_chunk_slack;
    const std::int64_t rows = chunk_indptr.back(), Hq = c.heads * c.group;
    fill(q, qf, c.q_dtype, rows * Hq * c.d, 3.f);
    fill(chunk_k, kf, c.kv_dtype, rows * c.heads * c.d, 1.f);
    fill(chunk_v, vf, c.kv_dtype, rows * c.heads * c.d, 1.f);
    sinks.resize(static_cast<std::size_t>(Hq));
    for (auto& x : sinks) x = std::uniform_real_distribution<float>(-2.f, 4.f)(rng);
  }

  /// Parameters for `layer` (outputs unset).
  [[nodiscard]] prefill_params params(prefill_case const& c, std::int32_t layer) const {
    prefill_params p;
    p.kv           = view;
    p.layer        = layer;
    p.group        = c.group;
    p.chunk_indptr = chunk_indptr.data();
    p.max_chunk    = max_chunk;
    p.q            = q.data();
    p.q_dtype      = c.q_dtype;
    p.chunk_k      = chunk_k.data();
    p.chunk_v      = chunk_v.data();
    p.o_dtype      = c.o_dtype;
    p.sinks        = c.sinks ? sinks.data() : nullptr;
    p.scales       = scales.view();
    return p;
  }

 private:
  void fill(std::vector<std::byte>& bytes,
            std::vector<float>& floats,
            dtype t,
            std::int64_t n,
            float range) {
    bytes.assign(static_cast<std::size_t>(std::max<std::int64_t>(n, 1)) * size_of(t), std::byte{0});
    floats.resize(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) {
      float x = std::uniform_real_distribution<float>(-range, range)(rng);
      reference::detail::store_from_float(bytes.data(), t, i, x);
      floats[static_cast<std::size_t>(i)] = reference::detail::load_as_float(bytes.data(), t, i);
    }
  }
  static cache_layout make_cache(prefill_case const& c) {
    return adjacent_layout(page_geometry{c.P, c.Hp, c.d, c.kv_dtype},
                           c.layers,
                           c.heads,
                           c.sliding,
                           c.window,
                           c.ring_pages);
  }
  static std::vector<sequence_spec> make_seqs(prefill_case const& c, std::mt19937_64& rng) {
    std::vector<std::int32_t> appended, seq_tokens;
    for (std::size_t r = 0; r < c.lens.size(); ++r) {
      appended.push_back(std::min(static_cast<std::int32_t>(r % 3), c.lens[r]));
      seq_tokens.push_back(c.lens[r] + (c.seen_extra.empty() ? 50 : c.seen_extra[r]));
    }
    return ragged_sequences(c.lens, appended, seq_tokens, c.layers, c.heads, rng);
  }
};

/// GQA 1 and 4, page sizes 1 and 16, with and without sinks; a sliding-window layer (rings full,
/// not yet full, and a chunk longer than the window); empty chunks and held lengths included.
inline std::vector<prefill_case> prefill_cases_basic() {
  std::vector<prefill_case> out;
  std::uint64_t seed = 200;
  for (std::int32_t group : {1, 4})
    for (std::int32_t P : {1, 16}) {
      prefill_case c;
      c.kv_dtype   = dtype::f32;
      c.group      = group;
      c.P          = P;
      c.ring_pages = (40 + P - 1) / P + 1;
      c.lens       = {0, 5, 37, 100, 3};
      c.chunks     = {9, 1, 17, 50, 0};
      c.seen_extra = {0, 50, 0, 50, 10};  // request 0/2: rings not full (seq_tokens < W or = len)
      c.sinks      = P == 16;
      c.seed       = ++seed;
      out.push_back(c);
    }
  return out;
}

/// Per-head pages (Hp 1): f32 GQA 1 on one-token pages and GQA 4 with sinks over a sliding ring
/// layer, bf16 d 128 GQA 8 with bf16 queries and outputs, fp8 e5m2 with per-head scales.
inline std::vector<prefill_case> prefill_cases_per_head() {
  std::vector<prefill_case> out;
  prefill_case c;
  c.Hp         = 1;
  c.kv_dtype   = dtype::f32;
  c.group      = 1;
  c.P          = 1;
  c.ring_pages = 41;
  c.lens       = {0, 5, 37, 100, 3};
  c.chunks     = {9, 1, 17, 50, 0};
  c.seen_extra = {0, 50, 0, 50, 10};
  c.seed       = 220;
  out.push_back(c);
  c.group      = 4;
  c.P          = 16;
  c.ring_pages = 4;
  c.sinks      = true;
  c.seed       = 221;
  out.push_back(c);
  c.kv_dtype = dtype::bf16;
  c.d        = 128;
  c.group    = 8;
  c.q_dtype  = dtype::bf16;
  c.o_dtype  = dtype::bf16;
  c.seed     = 222;
  out.push_back(c);
  c.kv_dtype = dtype::fp8_e5m2;
  c.scales   = scale_mode::per_head;
  c.q_dtype  = dtype::f32;
  c.o_dtype  = dtype::f32;
  c.sinks    = false;
  c.seed     = 223;
  out.push_back(c);
  return out;
}

/// The K/V dtype x head dim sweep of prefill_cases_shapes and prefill_cases_fp8: seeds from `seed`
/// + 1, bf16 queries and outputs in some, a slack max_chunk in some; `vary(c, seed)` sets the page
/// size, the GQA group and sinks, which the two differ in.
template <class Vary>
std::vector<prefill_case> prefill_dtype_sweep(std::initializer_list<dtype> types,
                                              std::uint64_t seed,
                                              Vary vary) {
  std::vector<prefill_case> out;
  for (dtype t : types)
    for (std::int32_t d : {64, 128, 256}) {
      prefill_case c;
      c.kv_dtype = t;
      c.d        = d;
      vary(c, seed);
      c.ring_pages      = (40 + c.P - 1) / c.P + 1;
      c.layers          = 2;
      c.heads           = 2;
      c.lens            = {70, 3, 21};
      c.chunks          = {20, 33, 5};
      c.q_dtype         = seed % 3 == 0 ? dtype::bf16 : dtype::f32;
      c.o_dtype         = seed % 3 == 1 ? dtype::bf16 : dtype::f32;
      c.max_chunk_slack = static_cast<std::int32_t>(seed % 4) * 7;
      c.seed            = ++seed;
      out.push_back(c);
    }
  return out;
}

/// Every 32- and 16-bit K/V dtype x head dim (GQA 1..8 spread over them), bf16 queries and
/// outputs in some, a slack max_chunk in some (fp8: prefill_cases_fp8).
inline std::vector<prefill_case> prefill_cases_shapes() {
  return prefill_dtype_sweep(
      {dtype::f32, dtype::f16, dtype::bf16}, 300, [](prefill_case& c, std::uint64_t seed) {
        c.P     = c.d == 128 ? 16 : 32;
        c.group = 1 + static_cast<std::int32_t>(seed % 8);
        c.sinks = seed % 2 == 0;
      });
}

/// fp8 K/V (e4m3 and e5m2; pages and chunk K/V both in the KV dtype, as the reference reads
/// them) x every head dim, GQA 1..8 spread over them, bf16 queries and outputs in some.
inline std::vector<prefill_case> prefill_cases_fp8() {
  return prefill_dtype_sweep(
      {dtype::fp8_e4m3, dtype::fp8_e5m2}, 700, [](prefill_case& c, std::uint64_t seed) {
        c.P     = seed % 2 == 0 ? 16 : 1;
        c.group = 1 + static_cast<std::int32_t>((seed * 3) % 8);
        c.sinks = seed % 2 == 1;
      });
}

/// fp8 K/V with scales: e4m3 and e5m2 x per-tensor and per-head scales (pages and chunk K/V both
/// scaled), head dims 64/128/256 and groups 1/2/4/8 among them.
inline std::vector<prefill_case> prefill_cases_fp8_scaled() {
  prefill_case base;
  base.layers = 2;
  base.heads  = 2;
  base.lens   = {70, 3, 21};
  base.chunks = {20, 33, 5};
  return fp8_scaled_cases(base, 750);
}

/// Runs `c` on `backend` and the CPU reference for every layer; compares outputs (f32: 1e-4
/// absolute; f16/bf16 outputs: 1e-2 relative) and LSEs (1e-4 relative). Returns "" when they
/// agree, else the first difference.
template <class Backend>
std::string check_prefill(prefill_case const& c, Backend& backend) {
  prefill_scenario s(c);
  const std::int64_t rows = s.chunk_indptr.back(), Hq = c.heads * c.group;
  const std::size_t out_elems = static_cast<std::size_t>(rows * Hq * c.d);
  const std::size_t out_bytes = std::max<std::size_t>(out_elems, 1) * size_of(c.o_dtype);
  for (std::int32_t layer = 0; layer < c.layers; ++layer) {
    prefill_params p = s.params(c, layer);
    std::vector<unsigned char> o_ref(out_bytes), o_run(out_bytes, 0x7f);
    std::vector<float> lse_ref(static_cast<std::size_t>(std::max<std::int64_t>(rows * Hq, 1))),
        lse_run(lse_ref.size(), 777.f);
    p.o   = o_ref.data();
    p.lse = lse_ref.data();
    reference::prefill_attention(p);
    p.o   = o_run.data();
    p.lse = lse_run.data();
    backend.prefill(s.cache, p);
    std::ostringstream where;
    where << c.describe() << ", layer " << layer << ": ";
    for (std::size_t i = 0; i < out_elems; ++i) {
      const auto at = static_cast<std::int64_t>(i);
      float a       = reference::detail::load_as_float(o_run.data(), c.o_dtype, at);
      float b       = reference::detail::load_as_float(o_ref.data(), c.o_dtype, at);
      float tol     = c.o_dtype == dtype::f32 ? 1e-4f : 1e-2f * std::max(1.f, std::abs(b));
      if (!(std::abs(a - b) <= tol)) {
        where << "output element " << i << " (row " << at / (Hq * c.d) << ", head " << at / c.d % Hq
              << ") is " << a << ", reference " << b;
        return where.str();
      }
    }
    for (std::int64_t i = 0; i < rows * Hq; ++i) {
      float a = lse_run[static_cast<std::size_t>(i)], b = lse_ref[static_cast<std::size_t>(i)];
      if (!(std::abs(a - b) <= 1e-4f * std::max(1.f, std::abs(b)))) {
        where << "lse " << i << " is " << a << ", reference " << b;
        return where.str();
      }
    }
  }
  return {};
}

}  // namespace tangram::test
