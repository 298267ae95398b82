// SPDX-License-Identifier: Apache-2.0
/**
 * @file test/gpu/elastic_cases.hpp
 * @brief The elastic eviction scenarios shared by the GPU tests (test/gpu) and the host emulation
 * (test/emu), for any backend with `evict` and `evict_elastic` (reference/elastic_harness.hpp).
 *
 * The cache is test::make_eviction_scenario: 3 layers x 4 KV heads, layer 1 sliding window,
 * compressed groups spanning layers 0 and 2 (heads 0-2), head 3 uncompressed; six requests with
 * ragged held lengths and chunks of 64, 50, long, 3, 0 and 120 tokens. Each request gets its own
 * page limit: generous, exactly the protected floors (tight), halfway, one page below the floors
 * (does not fit), floors + 1. Stage every layer, then select; the backend's pool, keys, lengths
 * and pages must equal the CPU reference's byte for byte. Built-in scores: the reference replays
 * the backend's own raw scores as supplied scores (scoring is checked by kernel_cases.hpp).
 */
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "../reference/elastic_harness.hpp"
#include "../reference/kv_test_cache.hpp"
#include "eviction_cases.hpp"
#include "scale_cases.hpp"

namespace tangram::test {

struct elastic_case {
  dtype kv_dtype = dtype::bf16;
  std::int32_t d = 128, P = 16, sink = 4, recent = 8, window = 24;
  std::int32_t Hp         = 2;  ///< heads per page: 2 or 1 (per-head pages)
  score_source source     = score_source::supplied;
  std::int32_t group      = 4;
  std::int32_t long_len   = 600;  ///< tokens seen by the longest request before its chunk
  std::int32_t long_chunk = 200;
  double keep_ratio       = 0.3;    ///< K = ceil(keep_ratio n_seen) per compressed head
  bool short_max          = false;  ///< max_candidates one below the longest head: invalid heads
  std::uint64_t seed      = 1;
  scale_mode scales       = scale_mode::none;  ///< fp8 only (scale_arrays)
  /// Leading pages of every growing group pinned as a shared prefix's (kv_cache_view::pinned, at
  /// most what the group's shortest head fills); their supplied scores are the lowest.
  std::int32_t pin_pages = 0;

  [[nodiscard]] std::string describe() const {
    std::ostringstream s;
    s << "elastic " << to_string(kv_dtype) << " d " << d << " P " << P << " Hp " << Hp << " source "
      << to_string(source) << " seed " << seed;
    if (scales != scale_mode::none) s << ", " << to_string(scales);
    if (pin_pages > 0) s << ", " << pin_pages << " pinned pages";
    return s.str();
  }
};

/// Supplied scores (many ties): every dtype at d 128 / P 16, then bf16 d 64 / P 1, f16 d 256,
/// then bf16 d 128 with one request's heads over max_candidates.
inline std::vector<elastic_case> elastic_cases_supplied() {
  std::vector<elastic_case> out;
  std::uint64_t seed = 100;
  for (dtype t : {dtype::f32, dtype::f16, dtype::bf16}) {
    elastic_case c;
    c.kv_dtype = t;
    c.seed     = ++seed;
    out.push_back(c);
  }
  elastic_case c;
  c.d    = 64;
  c.P    = 1;
  c.seed = ++seed;
  out.push_back(c);
  c.kv_dtype = dtype::f16;
  c.d        = 256;
  c.P        = 16;
  c.sink     = 0;
  c.recent   = 0;  // no protection: floors of 0 pages
  c.seed     = ++seed;
  out.push_back(c);
  c.kv_dtype  = dtype::bf16;
  c.d         = 128;
  c.sink      = 4;
  c.recent    = 8;
  c.short_max = true;  // the longest request's heads are invalid, the others unaffected
  c.seed      = ++seed;
  out.push_back(c);
  return out;
}

/// Built-in scores: SnapKV with GQA 4 (bf16, d 128), key norm (f32, d 64, P 1).
inline std::vector<elastic_case> elastic_cases_builtin() {
  elastic_case c;
  c.source = score_source::snapkv;
  c.seed   = 140;
  elastic_case k;
  k.source   = score_source::key_norm;
  k.kv_dtype = dtype::f32;
  k.d        = 64;
  k.P        = 1;
  k.seed     = 141;
  return {c, k};
}

/// fp8 caches: e4m3 and e5m2 x every score source x no scales and per-head scales, head dims
/// 64/128/256 among them (the compaction copies one-byte elements; the stage launches score
/// dequantised K).
inline std::vector<elastic_case> elastic_cases_fp8() {
  std::vector<elastic_case> out;
  std::uint64_t seed = 160;
  int i              = 0;
  for (dtype t : {dtype::fp8_e4m3, dtype::fp8_e5m2})
    for (score_source src : {score_source::supplied, score_source::snapkv, score_source::key_norm})
      for (scale_mode m : {scale_mode::none, scale_mode::per_head}) {
        elastic_case c;
        c.kv_dtype = t;
        c.source   = src;
        c.scales   = m;
        c.d        = std::array<std::int32_t, 3>{64, 128, 256}[(i + i / 6) % 3];
        c.P        = c.d == 64 ? 1 : 16;
        c.seed     = ++seed;
        out.push_back(c);
        ++i;
      }
  return out;
}

/// Per-head pages (Hp 1: every compressed head its own group, so the selection places each
/// head's pages alone): supplied scores (bf16 d 128, f32 d 64 on one-token pages, a tight
/// max_candidates), SnapKV (bf16 GQA 4) and key norm on fp8 e5m2 with per-head scales.
inline std::vector<elastic_case> elastic_cases_per_head() {
  std::vector<elastic_case> out;
  elastic_case c;
  c.Hp   = 1;
  c.seed = 170;
  out.push_back(c);
  c.kv_dtype = dtype::f32;
  c.d        = 64;
  c.P        = 1;
  c.seed     = 171;
  out.push_back(c);
  c.kv_dtype  = dtype::bf16;
  c.d         = 128;
  c.P         = 16;
  c.short_max = true;
  c.seed      = 172;
  out.push_back(c);
  c.short_max = false;
  c.source    = score_source::snapkv;
  c.seed      = 173;
  out.push_back(c);
  c.kv_dtype = dtype::fp8_e5m2;
  c.source   = score_source::key_norm;
  c.scales   = scale_mode::per_head;
  c.seed     = 174;
  out.push_back(c);
  return out;
}

/// Long candidate lists: several compaction tiles (1024) per head and ~17K keys per request.
inline elastic_case elastic_case_long() {
  elastic_case c;
  c.long_len   = 3000;
  c.long_chunk = 300;
  c.seed       = 150;
  return c;
}

/// Heads of more than two top-k slices (select_slice = 4096 candidates per histogram CTA).
inline elastic_case elastic_case_many_slices() {
  elastic_case c;
  c.long_len   = 9000;
  c.long_chunk = 300;
  c.seed       = 152;
  return c;
}

/// Pinned shared-prefix pages (kv_cache_view::pinned): supplied scores with the pinned
/// candidates scored lowest (layer-shared groups, then per-head pages on f32 d 64), key norm;
/// one page and up to every page the shortest head fills.
inline std::vector<elastic_case> elastic_cases_pinned() {
  std::vector<elastic_case> out;
  elastic_case c;
  c.pin_pages = 1;
  c.seed      = 95;
  out.push_back(c);
  c.pin_pages = 40;
  c.seed      = 96;
  out.push_back(c);
  c.Hp       = 1;
  c.kv_dtype = dtype::f32;
  c.d        = 64;
  c.seed     = 97;
  out.push_back(c);
  c.Hp        = 2;
  c.kv_dtype  = dtype::f16;
  c.d         = 128;
  c.source    = score_source::key_norm;
  c.pin_pages = 3;
  c.seed      = 98;
  out.push_back(c);
  return out;
}

/// Builds the setup of `c` over `cache` (constructed from the returned setup's layout and seqs).
inline elastic_setup make_elastic_setup(elastic_case const& c) {
  constexpr std::int32_t L = eviction_scenario::num_layers, H = eviction_scenario::num_kv_heads;
  page_geometry geo{c.P, c.Hp, c.d, c.kv_dtype};
  auto sc = make_eviction_scenario(geo, c.window, c.sink + c.recent, c.long_len, c.long_chunk);
  elastic_setup s;
  s.layout = sc.layout;
  s.rules  = sc.rules;
  s.seqs   = sc.seqs;
  s.batch  = sc.batch;
  s.indptr = sc.chunk_indptr;
  s.sink   = c.sink;
  s.source = c.source;
  s.group  = c.group;
  const scale_arrays scales(c.scales, H, c.seed);
  s.k_scale             = scales.k;
  s.v_scale             = scales.v;
  std::int32_t max_cand = 1;
  for (std::int32_t r = 0; r < s.B(); ++r) {
    auto const& q = s.seqs[static_cast<std::size_t>(s.batch[static_cast<std::size_t>(r)])];
    for (std::int32_t i = 0; i < L * H; ++i)
      max_cand =
          std::max(max_cand, q.base_len[static_cast<std::size_t>(i)] + q.appended + s.chunk(r));
  }
  s.max_candidates = c.short_max ? max_cand - 1 : max_cand;
  return s;
}

/// Fills scores, queries, K and the page limits of `s` for the cache it runs on.
inline void fill_elastic_setup(elastic_case const& c, elastic_setup& s, test_cache& cache) {
  constexpr std::int32_t L = eviction_scenario::num_layers, H = eviction_scenario::num_kv_heads;
  std::mt19937_64 rng(c.seed);
  s.fill_chunk(cache);
  for (auto& x : s.scores) x = static_cast<float>(rng() % 7);  // many ties
  {  // pinned candidates score lowest: only the pin keeps them
    auto v = cache.view(s.batch);
    for (std::int32_t l = 0; l < L; ++l)
      for (std::int32_t r = 0; r < s.B(); ++r)
        for (std::int32_t h = 0; h < H; ++h)
          for (std::int32_t i = 0; i < v.pinned(r, v.slot_of(l, h).group); ++i)
            s.score(l, r, h, i) = -5.f;
  }
  s.q.assign(static_cast<std::size_t>(s.indptr.back()) * H * static_cast<std::size_t>(c.group) *
                 static_cast<std::size_t>(c.d),
             0.f);
  for (auto& x : s.q) x = std::uniform_real_distribution<float>(-2.f, 2.f)(rng);
  auto v = cache.view(s.batch);
  s.wanted.clear();
  s.limit.clear();
  for (std::int32_t r = 0; r < s.B(); ++r) {
    // The compressed groups' floors and full lengths, from the rules and the view.
    std::vector<std::int64_t> longest(static_cast<std::size_t>(v.num_groups), -1);
    std::int64_t heads = 0, n_seen = v.seq_tokens[v.batch_slots[r]] + s.chunk(r);
    std::int64_t protect = 0;
    std::vector<std::int64_t> pinned(static_cast<std::size_t>(v.num_groups), 0);
    for (std::int32_t i = 0; i < L * H; ++i) {
      if (s.rules[static_cast<std::size_t>(i)].kind != layer_kind::compressed) continue;
      ++heads;
      std::int64_t cand = v.head_len(r, i / H, i % H) + s.chunk(r);
      auto g            = static_cast<std::size_t>(v.slot_of(i / H, i % H).group);
      longest[g]        = std::max(longest[g], cand);
      protect = std::max<std::int64_t>(protect, std::min<std::int64_t>(cand, c.sink + c.recent));
      // A head leading with pinned tokens protects them and its recent window.
      auto pin = std::min<std::int64_t>(v.pinned(r, static_cast<std::int32_t>(g)), cand);
      if (pin > c.sink)
        pinned[g] = std::max(pinned[g], std::min<std::int64_t>(cand, pin + c.recent));
    }
    std::int64_t floors = 0, full = 0;
    for (std::size_t g = 0; g < longest.size(); ++g)
      if (longest[g] >= 0) {
        floors += (std::max(protect, pinned[g]) + c.P - 1) / c.P;
        full += (longest[g] + c.P - 1) / c.P;
      }
    s.wanted.push_back(heads * ceil_budget_tokens(c.keep_ratio, n_seen));
    switch (r % 6) {
      case 0:
        s.limit.push_back(full);
        break;
      case 1:
        s.limit.push_back(floors);
        break;
      case 2:
        s.limit.push_back((floors + full) / 2);
        break;
      case 3:
        s.limit.push_back(floors - 1);
        break;
      case 4:
        s.limit.push_back(0);
        break;
      default:
        s.limit.push_back(floors + 1);
        break;
    }
  }
}

/// Runs `c` on `backend` and on the CPU reference: "" when everything is byte-identical.
template <class Backend>
std::string check_elastic(elastic_case const& c, Backend& backend) {
  auto s = make_elastic_setup(c);
  test_cache run_cache(s.layout, s.seqs, c.seed), ref_cache(s.layout, s.seqs, c.seed);
  test_cache before(s.layout, s.seqs, c.seed);  // pristine: the pinned tokens must stay
  if (c.pin_pages > 0)
    for (auto* t : {&run_cache, &ref_cache, &before}) t->pin_leading_pages(c.pin_pages);
  fill_elastic_setup(c, s, run_cache);
  auto run = run_elastic(s, run_cache, backend);
  auto rs  = s;
  if (c.source != score_source::supplied) {  // replay the backend's raw scores
    rs.pool_kernel = c.source == score_source::snapkv ? 7 : 1;
    rs.source      = score_source::supplied;
    rs.scores      = run.scores_out;
  }
  reference_backend ref;
  auto want = run_elastic(rs, ref_cache, ref);
  std::ostringstream where;
  where << c.describe() << ": ";
  if (run.stage_len != want.stage_len) return where.str() + "stage new_len differs";
  if (run.keys != want.keys) return where.str() + "stage keys differ";
  if (run.pages_out != want.pages_out) return where.str() + "pages_out differs";
  if (run.new_len != want.new_len) return where.str() + "new_len differs";
  if (run_cache.pool() != ref_cache.pool()) {
    auto mm =
        std::mismatch(run_cache.pool().begin(), run_cache.pool().end(), ref_cache.pool().begin());
    where << "page pool differs at byte " << (mm.first - run_cache.pool().begin());
    return where.str();
  }
  // The scenario must exercise what it claims: a refusal, a tight fit and a compaction.
  bool refused = false, compacted = false;
  for (auto x : want.pages_out) refused = refused || x == elastic_does_not_fit;
  for (std::size_t i = 0; i < want.new_len.size(); ++i) {
    auto r = static_cast<std::int32_t>(i) / (s.L() * s.H());
    auto h = static_cast<std::int32_t>(i) % (s.L() * s.H());
    if (s.rules[static_cast<std::size_t>(h)].kind == layer_kind::compressed && s.chunk(r) > 0 &&
        want.new_len[i] >= 0 &&
        want.new_len[i] <
            run_cache.len(s.batch[static_cast<std::size_t>(r)], h / s.H(), h % s.H()) + s.chunk(r))
      compacted = true;
  }
  if (!compacted) return where.str() + "no head was compacted (scenario too weak)";
  // Every pinned token of a request that fitted is kept in place, its bytes unchanged (a refused
  // request changed nothing at all: the pools compared equal above and the reference writes
  // nothing for it).
  for (std::int32_t l = 0; l < s.L(); ++l) {
    std::vector<std::int32_t> len(static_cast<std::size_t>(s.B() * s.H()));
    for (std::int32_t r = 0; r < s.B(); ++r)
      for (std::int32_t h = 0; h < s.H(); ++h)
        len[static_cast<std::size_t>(r * s.H() + h)] =
            want.pages_out[static_cast<std::size_t>(r)] < 0
                ? std::numeric_limits<std::int32_t>::max()
                : want.new_len[static_cast<std::size_t>((r * s.L() + l) * s.H() + h)];
    if (auto bad = check_pinned_kept(before, run_cache, s.batch, l, len); !bad.empty())
      return where.str() + "layer " + std::to_string(l) + ", " + bad;
  }
  if (!refused && c.sink + c.recent > 0) return where.str() + "no request was refused";
  bool invalid = std::find(want.pages_out.begin(), want.pages_out.end(), elastic_invalid_head) !=
                 want.pages_out.end();
  if (invalid != c.short_max) return where.str() + "invalid heads not as the scenario intends";
  return {};
}

}  // namespace tangram::test
