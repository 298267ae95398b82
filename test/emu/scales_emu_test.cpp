// SPDX-License-Identifier: Apache-2.0
// fp8 K/V scales end to end in the host emulator: values outside fp8's comfortable range,
// quantised by the append kernel and attended over by the decode kernel, come out within a
// bound computed from the quantisation errors with per-head scales and outside it without; and
// the scaled-case comparison with the reference catches a scale read for the wrong head or K and
// V swapped.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "../gpu/kernel_cases.hpp"
#include "../gpu/prefill_cases.hpp"
#include "emu_backend.hpp"
#include "emu_support.hpp"

using namespace tangram;
using tangram::test::emu_backend;

namespace {

/// Per-head magnitudes of one fp8 format's out-of-range inputs.
struct range_case {
  dtype t;
  float fmax;   ///< largest finite value of the format
  float k_amp;  ///< K ~ U(-k_amp, k_amp) * (1 + h)
  float v_lo;   ///< V ~ U(v_lo, v_hi) * (1 + h)
  float v_hi;
};

constexpr std::int32_t H = 2, d = 64, N = 24;

template <class T>
float quantise(float x, float s) {
  return to_float(from_float<T>(x / s)) * s;
}

/// Appends N tokens of K/V per head through the append kernel (one decode step each) with
/// `scales`, then decodes one query with the decode kernel; returns the output [H][d].
std::vector<float> append_then_decode(range_case const& rc,
                                      std::vector<float> const& k,  // [N][H][d]
                                      std::vector<float> const& v,
                                      std::vector<float> const& q,  // [H][d]
                                      float sm_scale,
                                      kv_scales scales) {
  test::sequence_spec seq;
  seq.seq_tokens = N;
  seq.appended   = N;
  seq.base_len.assign(H, 0);
  test::test_cache cache(test::adjacent_layout(page_geometry{16, 2, d, rc.t}, 1, H), {seq}, 9);
  kv_cache_view view                 = cache.view({0});
  std::vector<std::int32_t> appended = {0};
  view.appended                      = appended.data();
  emu_backend backend;
  for (std::int32_t t = 0; t < N; ++t) {
    appended[0] = t + 1;  // the view after decode_step: token t is each head's newest
    append_params a;
    a.kv        = view;
    a.k         = k.data() + static_cast<std::size_t>(t) * H * d;
    a.v         = v.data() + static_cast<std::size_t>(t) * H * d;
    a.src_dtype = dtype::f32;
    a.scales    = scales;
    backend.append(cache, a);
  }
  std::vector<std::int32_t> begin = {0, 1, 2};
  std::vector<float> o(static_cast<std::size_t>(H) * d);
  decode_params p;
  p.kv       = view;
  p.splits   = {1, H, H, begin.data()};
  p.q        = q.data();
  p.q_dtype  = dtype::f32;
  p.o        = o.data();
  p.o_dtype  = dtype::f32;
  p.sm_scale = sm_scale;
  p.scales   = scales;
  backend.decode(cache, p);
  return o;
}

template <class T>
void check_range(range_case const& rc) {
  std::mt19937_64 rng(77);
  std::vector<float> k(static_cast<std::size_t>(N) * H * d), v(k.size()), q(H * d);
  for (std::int32_t t = 0; t < N; ++t)
    for (std::int32_t h = 0; h < H; ++h)
      for (std::int32_t x = 0; x < d; ++x) {
        auto at = (static_cast<std::size_t>(t) * H + h) * d + x;
        k[at]   = std::uniform_real_distribution<float>(-rc.k_amp, rc.k_amp)(rng) * (1 + h);
        v[at]   = std::uniform_real_distribution<float>(rc.v_lo, rc.v_hi)(rng) * (1 + h);
      }
  for (auto& x : q) x = std::uniform_real_distribution<float>(-3.f, 3.f)(rng);
  // Logits of order 1 for the tiny keys (a fixed logit scale, as an engine's would be).
  const float sm_scale = 1.f / (std::sqrt(static_cast<float>(d)) * rc.k_amp);

  // Per-head scales from each head's largest magnitude (what a calibration would pick).
  std::vector<float> sk(H, 0.f), sv(H, 0.f);
  for (std::size_t i = 0; i < k.size(); ++i) {
    auto h = static_cast<std::size_t>(i / d % H);
    sk[h]  = std::max(sk[h], std::abs(k[i]) / rc.fmax);
    sv[h]  = std::max(sv[h], std::abs(v[i]) / rc.fmax);
  }
  kv_scales scaled{sk.data(), sv.data(), H};

  const auto o_scaled   = append_then_decode(rc, k, v, q, sm_scale, scaled);
  const auto o_unscaled = append_then_decode(rc, k, v, q, sm_scale, kv_scales{});

  double worst_scaled = 0, worst_unscaled = 0, err_scaled = 0, err_unscaled = 0;
  for (std::int32_t h = 0; h < H; ++h) {
    // Exact attention over the original values (double), and the bound for the scaled run:
    // with dequantised keys the logits move by at most D = max_i sm_scale |q . dk_i|, which
    // moves every softmax weight by a factor within [e^-2D, e^2D], so the output moves by at most
    // (e^2D - 1) * (max_i v_i - min_i v_i) / 2 (weights sum to 1 either way); the dequantised
    // values add at most max |dv|. Plus f32 arithmetic: 1e-5 of the largest |v|.
    std::vector<double> logit(N), w(N);
    double m = -INFINITY, D = 0, dv_max = 0, v_abs = 0;
    for (std::int32_t t = 0; t < N; ++t) {
      double dot = 0, ddot = 0;
      for (std::int32_t x = 0; x < d; ++x) {
        auto at   = (static_cast<std::size_t>(t) * H + h) * d + x;
        double qx = q[static_cast<std::size_t>(h * d + x)];
        dot += qx * k[at];
        ddot += qx * (quantise<T>(k[at], sk[h]) - k[at]);
        dv_max = std::max(dv_max, std::abs(static_cast<double>(quantise<T>(v[at], sv[h]) - v[at])));
        v_abs  = std::max(v_abs, std::abs(static_cast<double>(v[at])));
      }
      logit[t] = dot * sm_scale;
      D        = std::max(D, std::abs(ddot) * sm_scale);
      m        = std::max(m, logit[t]);
    }
    double den = 0;
    for (std::int32_t t = 0; t < N; ++t) den += (w[t] = std::exp(logit[t] - m));
    for (std::int32_t x = 0; x < d; ++x) {
      double exact = 0, lo = INFINITY, hi = -INFINITY;
      for (std::int32_t t = 0; t < N; ++t) {
        double vx = v[(static_cast<std::size_t>(t) * H + h) * d + x];
        exact += w[t] / den * vx;
        lo = std::min(lo, vx);
        hi = std::max(hi, vx);
      }
      const double bound = dv_max + std::expm1(2 * D) * (hi - lo) / 2 + 1e-5 * v_abs;
      const auto at      = static_cast<std::size_t>(h * d + x);
      const double es = std::abs(o_scaled[at] - exact), eu = std::abs(o_unscaled[at] - exact);
      INFO(to_string(rc.t) << " head " << h << " dim " << x << ": exact " << exact << ", scaled "
                           << o_scaled[at] << ", unscaled " << o_unscaled[at] << ", bound " << bound
                           << " (max |dv| " << dv_max << ", D " << D << ")");
      REQUIRE(es <= bound);
      worst_scaled   = std::max(worst_scaled, es / bound);
      worst_unscaled = std::max(worst_unscaled, eu / bound);
      err_scaled     = std::max(err_scaled, es);
      err_unscaled   = std::max(err_unscaled, eu);
    }
  }
  INFO(to_string(rc.t) << ": worst error / bound, scaled " << worst_scaled << ", unscaled "
                       << worst_unscaled << "; largest error, scaled " << err_scaled
                       << ", unscaled " << err_unscaled);
  // Without scales the same inputs (subnormal or saturated fp8) break the bound, which is a
  // worst case (the scaled run reaches 0.1-0.2 of it), and the largest error is over 8 times the
  // scaled run's (17 and 20 times for e5m2 and e4m3 when written).
  CHECK(worst_scaled <= 1.0);
  CHECK(worst_unscaled > 1.0);
  CHECK(err_unscaled > 8 * err_scaled);
}

}  // namespace

TEST_CASE("fp8 append then decode with per-head scales stays within the quantisation bound",
          "[emu][decode][append][fp8][scales]") {
  // e4m3 at ~1e-3 (below its smallest normal 2^-6: subnormal steps of 2^-9 without scales),
  // values V of 1e-3 magnitude too.
  check_range<float8_e4m3>({dtype::fp8_e4m3, 448.f, 1e-3f, -1e-3f, 1e-3f});
  // e5m2 keys at ~2e-5 (around its smallest subnormal 2^-16) and values at 1e5..3e5 (past its
  // largest finite 57344: saturated without scales).
  check_range<float8_e5m2>({dtype::fp8_e5m2, 57344.f, 2e-5f, 1e5f, 3e5f});
}

TEST_CASE("the scaled decode comparison catches a scale of the wrong head or K and V swapped",
          "[emu][decode][fp8][scales]") {
  for (dtype t : {dtype::fp8_e4m3, dtype::fp8_e5m2}) {
    test::decode_case c;
    c.kv_dtype = t;
    c.d        = 64;
    c.lens     = {40, 7};
    c.layers   = 1;
    c.scales   = test::scale_mode::per_head;
    c.sliding.clear();
    test::decode_scenario s(c);
    std::vector<std::int32_t> begin = {0, 1, 2, 3, 4};
    std::vector<float> o_ref(s.q.size()), o_run(s.q.size());
    decode_params p;
    p.kv      = s.view;
    p.group   = c.group;
    p.q       = s.q.data();
    p.q_dtype = p.o_dtype = dtype::f32;
    p.splits              = {1, c.heads, c.heads, begin.data()};
    p.scales              = s.scales.view();
    p.o                   = o_ref.data();
    reference::decode_attention(p);
    p.o = o_run.data();
    emu_backend backend;
    backend.decode(s.cache, p);
    INFO(to_string(t) << ": control, largest difference " << test::worst_difference(o_run, o_ref));
    CHECK(test::worst_difference(o_run, o_ref) <= 5e-5f);  // check_decode's f32 tolerance
    // Each head reads the next head's scales (what an indexing slip would do).
    std::vector<float> k_rot(s.scales.k), v_rot(s.scales.v);
    std::rotate(k_rot.begin(), k_rot.begin() + 1, k_rot.end());
    std::rotate(v_rot.begin(), v_rot.begin() + 1, v_rot.end());
    p.scales = kv_scales{k_rot.data(), v_rot.data(), c.heads};
    backend.decode(s.cache, p);
    INFO("scales of the next head: largest difference " << test::worst_difference(o_run, o_ref));
    CHECK(test::worst_difference(o_run, o_ref) > 1e-2f);
    // K and V scales swapped.
    p.scales = kv_scales{s.scales.v.data(), s.scales.k.data(), c.heads};
    backend.decode(s.cache, p);
    INFO("K and V scales swapped: largest difference " << test::worst_difference(o_run, o_ref));
    CHECK(test::worst_difference(o_run, o_ref) > 1e-2f);
  }
}

TEST_CASE("the scaled prefill comparison catches a scale of the wrong head or K and V swapped",
          "[emu][prefill][fp8][scales]") {
  for (dtype t : {dtype::fp8_e4m3, dtype::fp8_e5m2}) {
    test::prefill_case c;
    c.kv_dtype = t;
    c.heads    = 2;
    c.layers   = 1;
    c.lens     = {30, 5};
    c.chunks   = {9, 4};
    c.scales   = test::scale_mode::per_head;
    c.sliding.clear();
    test::prefill_scenario s(c);
    const std::size_t n = static_cast<std::size_t>(s.chunk_indptr.back()) * c.heads * c.group * c.d;
    std::vector<float> o_ref(n), o_run(n);
    prefill_params p = s.params(c, 0);
    p.o_dtype        = dtype::f32;
    p.o              = o_ref.data();
    reference::prefill_attention(p);
    p.o = o_run.data();
    emu_backend backend;
    backend.prefill(s.cache, p);
    INFO(to_string(t) << ": control, largest difference " << test::worst_difference(o_run, o_ref));
    CHECK(test::worst_difference(o_run, o_ref) <= 1e-4f);  // check_prefill's f32 tolerance
    std::vector<float> k_rot(s.scales.k), v_rot(s.scales.v);
    std::rotate(k_rot.begin(), k_rot.begin() + 1, k_rot.end());
    std::rotate(v_rot.begin(), v_rot.begin() + 1, v_rot.end());
    p.scales = kv_scales{k_rot.data(), v_rot.data(), c.heads};
    backend.prefill(s.cache, p);
    INFO("scales of the next head: largest difference " << test::worst_difference(o_run, o_ref));
    CHECK(test::worst_difference(o_run, o_ref) > 1e-2f);
    p.scales = kv_scales{s.scales.v.data(), s.scales.k.data(), c.heads};
    backend.prefill(s.cache, p);
    INFO("K and V scales swapped: largest difference " << test::worst_difference(o_run, o_ref));
    CHECK(test::worst_difference(o_run, o_ref) > 1e-2f);
  }
}
