// SPDX-License-Identifier: Apache-2.0
// Chunk-eviction benchmarks on the GPU (time from CUDA events, L2 flushed before every timed
// launch; runner and options in bench_support.cuh). One Llama-3.1-8B-like layer: 8 KV heads, GQA 4,
// head dim 128, bf16, every head compressed with budget 0.25 (sink 4 + window 60 protected), a
// 4096-token chunk. Throughput: K+V bytes of all candidates (held + chunk) per second, GB_per_s.
//
//  BM_evict/B/n_before/scorer: 0 = supplied scores, 1 = key norm, 2 = SnapKV (w = 32) computing
//  its own normalisers (CUDA cores, logits twice), 3 = SnapKV from the prefill's log-sum-exp on
//  tensor cores (logits once), 4 = the same on CUDA cores; --short runs B 8, n_before 16384.
#include <cuda_runtime_api.h>

#include <memory>
#include <string>
#include <vector>

#include "bench_support.cuh"
#include "tangram/kernels/eviction.hpp"

using namespace tangram;
using namespace tangram::bench;

namespace {

constexpr std::int32_t H = 8, G = 4, D = 128, P = 16, chunk = 4096;

void evict(state& st, std::int32_t batch, std::int32_t n_before, int scorer) {
  const score_source source = scorer >= 2 ? score_source::snapkv : static_cast<score_source>(scorer);
  head_rule rule;
  rule.kind    = layer_kind::compressed;
  rule.budget  = 0.25;
  rule.protect = 64;
  auto held    = static_cast<std::int32_t>(retained_tokens(rule, n_before));
  std::vector<head_rule> rules(H, rule);
  std::vector<std::int32_t> len(static_cast<std::size_t>(batch * H), held),
      seen(static_cast<std::size_t>(batch), n_before), indptr{0};
  for (std::int32_t r = 0; r < batch; ++r) indptr.push_back(indptr.back() + chunk);
  device_kv kv(page_geometry{P, 1, D, dtype::bf16}, batch, H, len, seen, chunk);
  std::int32_t rows = indptr.back(), max_cand = held + chunk;
  device_buffer drules(rules), dindptr(indptr), ck(static_cast<std::size_t>(rows) * H * D * 2),
      cv(ck.bytes()), q(static_cast<std::size_t>(rows) * H * G * D * 2),
      scores(static_cast<std::size_t>(batch) * H * max_cand * 4),
      new_len(static_cast<std::size_t>(batch) * H * 4),
      lse(static_cast<std::size_t>(rows) * H * G * 4);
  cuda_check(cudaMemset(ck.get(), 0x3c, ck.bytes()), "fill");
  cuda_check(cudaMemset(cv.get(), 0x3b, cv.bytes()), "fill");
  cuda_check(cudaMemset(q.get(), 0x3c, q.bytes()), "fill");
  cuda_check(cudaMemset(scores.get(), 0x3e, scores.bytes()), "fill");
  cuda_check(cudaMemset(lse.get(), 0x41, lse.bytes()), "fill");  // 12.1: finite weights
  eviction_params p;
  p.kv             = kv.view;
  p.rules          = drules.get<head_rule>();
  p.sink           = 4;
  p.chunk_indptr   = dindptr.get<std::int32_t>();
  p.chunk_k        = ck.get();
  p.chunk_v        = cv.get();
  p.max_candidates = max_cand;
  p.source         = source;
  p.scores         = scores.get<float>();
  p.q              = q.get();
  p.q_dtype        = dtype::bf16;
  p.group          = G;
  p.obs_window     = 32;
  p.new_len        = new_len.get<std::int32_t>();
  p.q_lse          = scorer >= 3 ? lse.get<float>() : nullptr;
  p.tensor_cores   = scorer != 4;
  device_buffer ws(eviction_workspace_bytes(p));
  l2_flusher flusher;
  evict_chunk(p, ws.get(), ws.bytes(), nullptr);  // warm-up
  double total = 0;
  for (int i = 0; i < st.iterations; ++i)
    total += timed(flusher, nullptr, [&] { evict_chunk(p, ws.get(), ws.bytes(), nullptr); });
  double bytes         = static_cast<double>(batch) * H * max_cand * 2 * D * 2;
  st.out->real_time_us = total / st.iterations * 1e6;
  st.counter("GB_per_s", bytes / (total / st.iterations) / 1e9);
  st.counter("candidates", max_cand);
  st.counter("keep", static_cast<double>(retained_tokens(rule, n_before + chunk)));
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<benchmark_def> defs;
  // The short set (--short) first: batch 8, 16K tokens before the chunk, every score source.
  for (std::int32_t batch : {8, 1})
    for (std::int32_t n_before : {16384, 131072})
      for (int scorer : {0, 1, 2, 3, 4})
        defs.push_back({"BM_evict/" + std::to_string(batch) + "/" + std::to_string(n_before) +
                            "/" + std::to_string(scorer),
                        [=](state& st) { evict(st, batch, n_before, scorer); }});
  return run_benchmarks(argc, argv, defs, 5);
}
