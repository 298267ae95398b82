// SPDX-License-Identifier: Apache-2.0
// Decode-attention benchmarks on the GPU (time from CUDA events, L2 flushed before every timed
// launch; runner and options in bench_support.cuh). Shapes follow one Llama-3.1-8B layer: 8 KV
// heads, GQA 4, head dim 128, bf16 K/V, 16-token pages.
//
//  BM_decode_bandwidth/B/ctx: every head holds ctx tokens; counters TB_per_s and hbm_fraction
//    (K+V bytes read / time / 4.8 TB/s). Runs the tensor-core split kernel (the default for bf16
//    at GQA 4); BM_decode_bandwidth_cuda_core/B/ctx the same with decode_params::tensor_cores off.
//  BM_decode_skew/B/ctx: three layers with equal total KV bytes timed side by side each
//    iteration: uniform heads (equal split), non-uniform heads with the AOT split map (shares
//    from the budgets) and non-uniform heads with an equal split. Counters aot_over_uniform (goal
//    <= 1.05) and equal_over_uniform; the reported time is the AOT case.
//  BM_decode_invariant/B/ctx/K: the same batch with the split map's pieces and in batch-invariant
//    mode (decode_params::invariant_pieces = K), timed side by side each iteration; counter
//    invariant_over_split (the modelled token ratio is in docs/kernels.md).
//  BM_decode_skew also times a fourth layer on the map `balance_decode_splits` writes for its
//    lengths (balanced_us, balanced_over_uniform) and that launch itself (balance_launch_us),
//    and a fifth on the layer-stream split (`layer_stream_split`: CTAs cut the layer's tokens
//    across heads, nothing launched before; stream_us, stream_over_uniform).
//  BM_decode_stream/B/ctx: the same non-uniform heads decoded on the balanced map (its launch
//    timed apart) and on the layer-stream split, side by side each iteration, by batch size;
//    counter stream_over_balanced (stream / (balance launch + balanced decode)): what
//    `tangram simulate --decode-split stream` assumes against the default balanced map.
//  BM_balance_splits/B: one balance_decode_splits launch over a batch of B (one layer).
//  BM_decode_pdl/B/ctx: 32 decode launches back to back (one layer's data, one workspace), with
//    and without programmatic dependent launch (decode_params::pdl), timed side by side each
//    iteration; counter pdl_over_plain (the launch gaps PDL hides, per 32 layers).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "bench_support.cuh"
#include "tangram/core/split_view.hpp"
#include "tangram/kernels/balanced_split.hpp"
#include "tangram/kernels/decode_attention.hpp"
#include "tangram/plan/split_planner.hpp"

using namespace tangram;
using namespace tangram::bench;

namespace {

constexpr std::int32_t H = 8, G = 4, D = 128, P = 16;

/// Everything one decode launch needs, allocated once per benchmark.
struct decode_setup {
  std::unique_ptr<device_kv> kv;
  device_buffer q, o, begin, workspace;
  decode_params p;

  decode_setup(std::int32_t batch,
               std::vector<std::int32_t> const& len,
               std::vector<std::int32_t> const& cta_begin,
               std::int32_t n_cta,
               bool tensor_cores             = true,
               std::int32_t invariant_pieces = 0) {
    page_geometry g{P, 1, D, dtype::bf16};
    std::vector<std::int32_t> seen(static_cast<std::size_t>(batch), 1 << 20);
    kv    = std::make_unique<device_kv>(g, batch, H, len, seen);
    q     = device_buffer(static_cast<std::size_t>(batch) * H * G * D * 2);
    o     = device_buffer(q.bytes());
    begin = device_buffer(cta_begin);
    cuda_check(cudaMemset(q.get(), 0x3c, q.bytes()), "q fill");
    p.kv               = kv->view;
    p.splits           = {1, H, n_cta, begin.get<std::int32_t>()};
    p.group            = G;
    p.q                = q.get();
    p.q_dtype          = dtype::bf16;
    p.o                = o.get();
    p.o_dtype          = dtype::bf16;
    p.tensor_cores     = tensor_cores;
    p.invariant_pieces = invariant_pieces;
    workspace          = device_buffer(decode_workspace_bytes(p));
  }
  void enqueue(cudaStream_t s) { decode_attention(p, workspace.get(), workspace.bytes(), s); }
  double kv_bytes() const { return static_cast<double>(kv->held_tokens) * 2 * D * 2; }
};

device_limits limits_or_default() {
  return decode_device_limits(dtype::bf16, D, G).value_or(device_limits{});
}

/// The library's split map of one layer whose H heads have `budgets` (Phi = B, the paper's
/// weighting; all 1.0 gives the equal split): the CTA boundaries of the launch.
std::vector<std::int32_t> cta_begin_for(std::vector<double> const& budgets, std::int32_t n_cta) {
  std::vector<head_rule> rules;
  for (double b : budgets) rules.push_back({layer_kind::compressed, b, 0, 0});
  split_options o;
  o.limits    = {n_cta, 1};
  o.weighting = split_weighting::budget;
  return build_split_map(rules, 1, H, o).cta_begin;
}

void decode_bandwidth(state& st, std::int32_t batch, std::int32_t ctx, bool tensor_cores) {
  auto lim = limits_or_default();
  decode_setup s(batch,
                 std::vector<std::int32_t>(static_cast<std::size_t>(batch * H), ctx),
                 cta_begin_for(std::vector<double>(H, 1.0), lim.max_ctas()),
                 lim.max_ctas(),
                 tensor_cores);
  l2_flusher flusher;
  s.enqueue(nullptr);  // warm-up
  double total = 0;
  for (int i = 0; i < st.iterations; ++i)
    total += timed(flusher, nullptr, [&] { s.enqueue(nullptr); });
  double per           = total / st.iterations;
  st.out->real_time_us = per * 1e6;
  st.counter("TB_per_s", s.kv_bytes() / per / 1e12);
  st.counter("hbm_fraction", s.kv_bytes() / per / h200_peak_bytes_per_s);
  st.counter("n_cta", lim.max_ctas());
}

/// Per-head budgets with a realistic spread (heads of one layer of a calibrated profile range
/// from a few percent to everything); the uniform case keeps their mean.
const std::vector<double> skew_budget = {1.0, 0.55, 0.32, 0.2, 0.12, 0.08, 0.05, 0.04};

/// Every request's heads at `skew_budget` x ctx tokens ([batch * H]).
std::vector<std::int32_t> skewed_lengths(std::int32_t batch, std::int32_t ctx) {
  std::vector<std::int32_t> len;
  for (std::int32_t r = 0; r < batch; ++r)
    for (std::int32_t h = 0; h < H; ++h)
      len.push_back(
          static_cast<std::int32_t>(std::lround(skew_budget[static_cast<std::size_t>(h)] * ctx)));
  return len;
}

/// The balanced map's parameters for `s` (its lengths), starting from the split in `s.begin`.
balanced_split_params balance_params(decode_setup& s, std::int32_t n_cta) {
  balanced_split_params bp;
  bp.kv        = s.kv->view;
  bp.num_ctas  = n_cta;
  bp.cta_begin = s.begin.get<std::int32_t>();
  return bp;
}

void decode_skew(state& st, std::int32_t batch, std::int32_t ctx) {
  auto lim           = limits_or_default();
  auto const& budget = skew_budget;
  double mean        = 0;
  for (double b : budget) mean += b / H;
  std::vector<std::int32_t> uni_len(static_cast<std::size_t>(batch * H),
                                    static_cast<std::int32_t>(std::lround(mean * ctx)));
  auto skew_len = skewed_lengths(batch, ctx);
  auto n_cta    = lim.max_ctas();
  std::vector<double> equal(H, 1.0);
  decode_setup uniform(batch, uni_len, cta_begin_for(equal, n_cta), n_cta);
  decode_setup aot(batch, skew_len, cta_begin_for(budget, n_cta), n_cta);
  decode_setup equal_split(batch, skew_len, cta_begin_for(equal, n_cta), n_cta);
  // The map balanced on the device for these lengths (balance_decode_splits), starting from the
  // equal split; its launch is timed on its own.
  decode_setup balanced(batch, skew_len, cta_begin_for(equal, n_cta), n_cta);
  auto bp = balance_params(balanced, n_cta);
  decode_setup stream(batch, skew_len, cta_begin_for(equal, n_cta), n_cta);
  stream.p.splits = layer_stream_split(1, H, n_cta);
  l2_flusher flusher;
  uniform.enqueue(nullptr);  // warm-up
  balance_decode_splits(bp, nullptr);
  stream.enqueue(nullptr);
  double tu = 0, ta = 0, te = 0, tb = 0, tl = 0, ts = 0;
  for (int i = 0; i < st.iterations; ++i) {
    tu += timed(flusher, nullptr, [&] { uniform.enqueue(nullptr); });
    ta += timed(flusher, nullptr, [&] { aot.enqueue(nullptr); });
    te += timed(flusher, nullptr, [&] { equal_split.enqueue(nullptr); });
    tl += timed(flusher, nullptr, [&] { balance_decode_splits(bp, nullptr); });
    tb += timed(flusher, nullptr, [&] { balanced.enqueue(nullptr); });
    ts += timed(flusher, nullptr, [&] { stream.enqueue(nullptr); });
  }
  auto it              = static_cast<double>(st.iterations);
  st.out->real_time_us = ta / it * 1e6;  // the AOT case
  st.counter("uniform_us", tu / it * 1e6);
  st.counter("aot_us", ta / it * 1e6);
  st.counter("equal_split_us", te / it * 1e6);
  st.counter("aot_over_uniform", ta / tu);
  st.counter("equal_over_uniform", te / tu);
  st.counter("bytes_ratio", aot.kv_bytes() / uniform.kv_bytes());
  st.counter("hbm_fraction_aot", aot.kv_bytes() / (ta / it) / h200_peak_bytes_per_s);
  st.counter("balanced_us", tb / it * 1e6);
  st.counter("balanced_over_uniform", tb / tu);
  st.counter("balance_launch_us", tl / it * 1e6);
  st.counter("stream_us", ts / it * 1e6);
  st.counter("stream_over_uniform", ts / tu);
}

/// Non-uniform heads on the balanced map (launch + decode) against the layer-stream split.
void decode_stream(state& st, std::int32_t batch, std::int32_t ctx) {
  auto lim      = limits_or_default();
  auto n_cta    = lim.max_ctas();
  auto skew_len = skewed_lengths(batch, ctx);
  auto equal    = cta_begin_for(std::vector<double>(H, 1.0), n_cta);
  decode_setup balanced(batch, skew_len, equal, n_cta);
  auto bp = balance_params(balanced, n_cta);
  decode_setup stream(batch, skew_len, equal, n_cta);
  stream.p.splits = layer_stream_split(1, H, n_cta);
  l2_flusher flusher;
  balance_decode_splits(bp, nullptr);  // warm-up
  balanced.enqueue(nullptr);
  stream.enqueue(nullptr);
  double tl = 0, tb = 0, ts = 0;
  for (int i = 0; i < st.iterations; ++i) {
    tl += timed(flusher, nullptr, [&] { balance_decode_splits(bp, nullptr); });
    tb += timed(flusher, nullptr, [&] { balanced.enqueue(nullptr); });
    ts += timed(flusher, nullptr, [&] { stream.enqueue(nullptr); });
  }
  auto it              = static_cast<double>(st.iterations);
  st.out->real_time_us = ts / it * 1e6;  // the layer stream
  st.counter("balance_launch_us", tl / it * 1e6);
  st.counter("balanced_us", tb / it * 1e6);
  st.counter("stream_us", ts / it * 1e6);
  st.counter("stream_over_balanced", ts / (tl + tb));
  st.counter("hbm_fraction_stream", stream.kv_bytes() / (ts / it) / h200_peak_bytes_per_s);
}

/// One launch of balance_decode_splits over a batch of `batch` requests (one layer, 8 heads of
/// log-spread lengths): what `tangram simulate` charges as 5 us a decoding step.
void balance_launch(state& st, std::int32_t batch) {
  auto lim = limits_or_default();
  std::vector<std::int32_t> len;
  for (std::int32_t r = 0; r < batch; ++r)
    for (std::int32_t h = 0; h < H; ++h) len.push_back(16 + (r * 37 + h * 101) % 2000);
  decode_setup s(batch, len, cta_begin_for(std::vector<double>(H, 1.0), lim.max_ctas()),
                 lim.max_ctas());
  balanced_split_params bp;
  bp.kv        = s.kv->view;
  bp.num_ctas  = lim.max_ctas();
  bp.cta_begin = s.begin.get<std::int32_t>();
  l2_flusher flusher;
  balance_decode_splits(bp, nullptr);  // warm-up
  double t = 0;
  for (int i = 0; i < st.iterations; ++i)
    t += timed(flusher, nullptr, [&] { balance_decode_splits(bp, nullptr); });
  st.out->real_time_us = t / st.iterations * 1e6;
}

void decode_invariant(state& st, std::int32_t batch, std::int32_t ctx, std::int32_t K) {
  auto lim  = limits_or_default();
  auto map  = cta_begin_for(std::vector<double>(H, 1.0), lim.max_ctas());
  auto lens = std::vector<std::int32_t>(static_cast<std::size_t>(batch * H), ctx);
  decode_setup split(batch, lens, map, lim.max_ctas());
  decode_setup invariant(batch, lens, map, lim.max_ctas(), true, K);
  l2_flusher flusher;
  split.enqueue(nullptr);  // warm-up
  invariant.enqueue(nullptr);
  double ts = 0, ti = 0;
  for (int i = 0; i < st.iterations; ++i) {
    ts += timed(flusher, nullptr, [&] { split.enqueue(nullptr); });
    ti += timed(flusher, nullptr, [&] { invariant.enqueue(nullptr); });
  }
  auto it              = static_cast<double>(st.iterations);
  st.out->real_time_us = ti / it * 1e6;  // the invariant case
  st.counter("split_us", ts / it * 1e6);
  st.counter("invariant_us", ti / it * 1e6);
  st.counter("invariant_over_split", ti / ts);
  st.counter("hbm_fraction_invariant", invariant.kv_bytes() / (ti / it) / h200_peak_bytes_per_s);
}

void decode_pdl(state& st, std::int32_t batch, std::int32_t ctx) {
  auto lim = limits_or_default();
  decode_setup s(batch,
                 std::vector<std::int32_t>(static_cast<std::size_t>(batch * H), ctx),
                 cta_begin_for(std::vector<double>(H, 1.0), lim.max_ctas()),
                 lim.max_ctas());
  l2_flusher flusher;
  auto layers = [&](bool pdl) {
    s.p.pdl = pdl;
    for (int l = 0; l < 32; ++l) s.enqueue(nullptr);
  };
  layers(false);  // warm-up
  layers(true);
  double tp = 0, tq = 0;
  for (int i = 0; i < st.iterations; ++i) {
    tp += timed(flusher, nullptr, [&] { layers(false); });
    tq += timed(flusher, nullptr, [&] { layers(true); });
  }
  auto it              = static_cast<double>(st.iterations);
  st.out->real_time_us = tq / it * 1e6;  // with PDL
  st.counter("plain_us", tp / it * 1e6);
  st.counter("pdl_us", tq / it * 1e6);
  st.counter("pdl_over_plain", tq / tp);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<benchmark_def> defs;
  auto bandwidth = [&](std::int32_t b, std::int32_t ctx) {
    defs.push_back({"BM_decode_bandwidth/" + std::to_string(b) + "/" + std::to_string(ctx),
                    [=](state& st) { decode_bandwidth(st, b, ctx, true); }});
  };
  auto bandwidth_cuda_core = [&](std::int32_t b, std::int32_t ctx) {
    defs.push_back(
        {"BM_decode_bandwidth_cuda_core/" + std::to_string(b) + "/" + std::to_string(ctx),
         [=](state& st) { decode_bandwidth(st, b, ctx, false); }});
  };
  auto skew = [&](std::int32_t b, std::int32_t ctx) {
    defs.push_back({"BM_decode_skew/" + std::to_string(b) + "/" + std::to_string(ctx),
                    [=](state& st) { decode_skew(st, b, ctx); }});
  };
  auto invariant = [&](std::int32_t b, std::int32_t ctx, std::int32_t K) {
    defs.push_back({"BM_decode_invariant/" + std::to_string(b) + "/" + std::to_string(ctx) + "/" +
                        std::to_string(K),
                    [=](state& st) { decode_invariant(st, b, ctx, K); }});
  };
  auto stream = [&](std::int32_t b, std::int32_t ctx) {
    defs.push_back({"BM_decode_stream/" + std::to_string(b) + "/" + std::to_string(ctx),
                    [=](state& st) { decode_stream(st, b, ctx); }});
  };
  auto balance = [&](std::int32_t b) {
    defs.push_back({"BM_balance_splits/" + std::to_string(b),
                    [=](state& st) { balance_launch(st, b); }});
  };
  auto pdl = [&](std::int32_t b) {
    defs.push_back({"BM_decode_pdl/" + std::to_string(b) + "/4096",
                    [=](state& st) { decode_pdl(st, b, 4096); }});
  };
  // The short set (--short) first: one long-context, one batched, one skew point, one
  // batch-invariant point and one PDL point.
  bandwidth(1, 131072);
  bandwidth(32, 32768);
  skew(16, 65536);
  invariant(16, 32768, 64);
  pdl(32);
  balance(32);
  balance(1024);
  stream(64, 16384);
  const std::size_t short_count = defs.size();
  // The layer stream against the balanced map from batch 1 to 1024 (<= 4M tokens a head row).
  for (std::int32_t batch : {1, 4, 16, 256, 1024})
    stream(batch, std::min<std::int32_t>(65536, (1 << 22) / batch));
  invariant(1, 131072, 64);  // batch-invariant mode beside the split map's pieces
  invariant(4, 32768, 16);
  invariant(64, 8192, 64);
  pdl(1);
  bandwidth_cuda_core(1, 131072);  // the CUDA-core kernel on the short set's bandwidth points
  bandwidth_cuda_core(32, 32768);
  for (std::int32_t batch : {1, 8, 32, 128})
    for (std::int32_t ctx : {4096, 32768, 131072})
      if (static_cast<std::int64_t>(batch) * ctx <= (std::int64_t{1} << 22) &&
          !(batch == 1 && ctx == 131072) && !(batch == 32 && ctx == 32768))
        bandwidth(batch, ctx);  // <= 17 GB of KV
  for (std::int32_t batch : {1, 16, 64})
    for (std::int32_t ctx : {16384, 65536})
      if (!(batch == 16 && ctx == 65536)) skew(batch, ctx);
  return run_benchmarks(argc, argv, defs, short_count);
}
