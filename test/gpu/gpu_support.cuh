// SPDX-License-Identifier: Apache-2.0
// Helpers for the GPU tests: a device mirror of a test_cache view (buffers: device_buffer.cuh),
// and the GPU backend of the shared scenarios (kernel_cases.hpp): upload, launch, download.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "../reference/kv_test_cache.hpp"
#include "device_buffer.cuh"
#include "gpu_test.hpp"
#include "kernel_cases.hpp"
#include "prefill_cases.hpp"
#include "tangram/core/kv_view.hpp"
#include "tangram/kernels/append.hpp"
#include "tangram/kernels/balanced_split.hpp"
#include "tangram/kernels/decode_attention.hpp"
#include "tangram/kernels/elastic_eviction.hpp"
#include "tangram/kernels/eviction.hpp"
#include "tangram/kernels/prefill_attention.hpp"

namespace tangram::test {

#define TANGRAM_TEST_CUDA(call)                                         \
  do {                                                                  \
    cudaError_t tangram_err_ = (call);                                  \
    GPU_REQUIRE_MSG(tangram_err_ == cudaSuccess,                        \
                    #call << ": " << cudaGetErrorString(tangram_err_)); \
  } while (0)

/// The arrays of a test_cache's view, copied to the device, and the device view over them (the
/// batch is `host`'s batch_slots, not necessarily the cache's last view()).
struct device_cache : device_kv_arrays {
  kv_cache_view view;

  explicit device_cache(test_cache& c, kv_cache_view const& host)
      : device_kv_arrays{device_buffer(c.pool()),
                         device_buffer(c.head_slots()),
                         device_buffer(c.layout().group_window),
                         device_buffer(c.layout().group_ring_pages),
                         device_buffer(c.page_offset()),
                         device_buffer(c.pages()),
                         device_buffer(c.base_len()),
                         device_buffer(c.appended()),
                         device_buffer(c.seq_tokens()),
                         // The view's own batch (a test may permute or subset the cache's):
                         device_buffer(std::vector<std::int32_t>(
                             host.batch_slots, host.batch_slots + host.batch_size)),
                         device_buffer(c.pinned())},
        view(host) {
    attach(view);
  }
};

/// A device copy of `n` host elements at `p` (empty for null).
template <class T>
device_buffer upload(const T* p, std::size_t n) {
  device_buffer b(p ? n * sizeof(T) : 0);
  if (p) b.upload(p, n * sizeof(T));
  return b;
}

/// Downloads a device buffer into `n` bytes at `dst`.
inline void download(device_buffer const& b, void* dst, std::size_t n) {
  if (n) cuda_check(cudaMemcpy(dst, b.get(), n, cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
}

/// The GPU as a kernel_cases.hpp backend (synchronous; each call uploads what it needs).
struct gpu_backend {
  /// evict() captures evict_chunk into a CUDA graph and launches the graph (the launch sequence
  /// must be capturable: no host synchronisation, no host reads of device data).
  bool evict_through_graph = false;

  void decode(test_cache& cache, decode_params const& hp) {
    device_cache dev(cache, hp.kv);
    const std::int32_t B = hp.kv.batch_size, Hq = hp.num_q_heads(), d = hp.kv.geometry.head_dim;
    const std::size_t out_bytes = static_cast<std::size_t>(B) * Hq * d * size_of(hp.o_dtype);
    auto dbegin =
        upload(hp.splits.cta_begin,
               static_cast<std::size_t>(hp.splits.num_layers) * (hp.splits.num_kv_heads + 1));
    auto dq     = upload(static_cast<const unsigned char*>(hp.q),
                     static_cast<std::size_t>(B) * static_cast<std::size_t>(hp.q_row_stride()) *
                         size_of(hp.q_dtype));
    auto dsinks = upload(hp.sinks, static_cast<std::size_t>(Hq));
    auto dsk    = upload(hp.scales.k, static_cast<std::size_t>(hp.scales.count));
    auto dsv    = upload(hp.scales.v, static_cast<std::size_t>(hp.scales.count));
    device_buffer dout(out_bytes), dlse(static_cast<std::size_t>(B) * Hq * 4);
    decode_params p    = hp;
    p.scales.k         = hp.scales.count ? dsk.get<float>() : nullptr;
    p.scales.v         = hp.scales.count ? dsv.get<float>() : nullptr;
    p.kv               = dev.view;
    p.splits.cta_begin = dbegin.get<std::int32_t>();
    p.q                = dq.get();
    p.sinks            = hp.sinks ? dsinks.get<float>() : nullptr;
    p.o                = dout.get();
    p.lse              = hp.lse ? dlse.get<float>() : nullptr;
    const std::size_t n_counters = static_cast<std::size_t>(B) * hp.kv.num_kv_heads;
    auto dcounters               = upload(hp.merge_counters, n_counters);
    p.merge_counters             = hp.merge_counters ? dcounters.get<std::int32_t>() : nullptr;
    device_buffer ws(decode_workspace_bytes(p));
    decode_attention(p, ws.get(), ws.bytes(), nullptr);
    cuda_check(cudaDeviceSynchronize(), "decode_attention");
    auto first = dout.download<unsigned char>();
    std::memcpy(hp.o, first.data(), out_bytes);
    if (hp.lse) download(dlse, hp.lse, dlse.bytes());
    // Deterministic: a second launch (reusing the merge counters) gives the same bits.
    decode_attention(p, ws.get(), ws.bytes(), nullptr);
    cuda_check(cudaDeviceSynchronize(), "decode_attention (second launch)");
    if (dout.download<unsigned char>() != first)
      throw std::runtime_error("decode_attention: a second launch gave different bits");
    if (hp.merge_counters) download(dcounters, hp.merge_counters, n_counters * 4);
  }

  void evict(test_cache& cache, eviction_params const& hp) {
    device_cache dev(cache, hp.kv);
    const std::int32_t B = hp.kv.batch_size, H = hp.kv.num_kv_heads, d = hp.kv.geometry.head_dim;
    const std::size_t rows = static_cast<std::size_t>(hp.chunk_indptr[B]);
    const std::size_t es   = static_cast<std::size_t>(hp.kv.geometry.element_bytes());
    const std::size_t cand = static_cast<std::size_t>(B) * H * hp.max_candidates;
    auto drules            = upload(hp.rules, static_cast<std::size_t>(H));
    auto dindptr           = upload(hp.chunk_indptr, static_cast<std::size_t>(B) + 1);
    auto dck     = upload(static_cast<const unsigned char*>(hp.chunk_k), rows * H * d * es);
    auto dcv     = upload(static_cast<const unsigned char*>(hp.chunk_v), rows * H * d * es);
    auto dq      = upload(static_cast<const unsigned char*>(hp.q),
                     hp.q ? rows * H * hp.group * d * size_of(hp.q_dtype) : 0);
    auto dscores = upload(hp.scores, cand);
    // The prefill's log-sum-exp (SnapKV from lse): [rows][H * group].
    auto dlse = upload(hp.q_lse, hp.q_lse ? rows * H * static_cast<std::size_t>(hp.group) : 0);
    device_buffer dnew(static_cast<std::size_t>(B) * H * 4), dscores_out(cand * 4);
    // The stage keys' total, from the host view the test launched with (stage launches come from
    // elastic_harness.hpp, whose rules point into the whole [L * H] array at layer * H).
    std::vector<std::int64_t> base(static_cast<std::size_t>(B) * hp.kv.num_groups);
    const auto words =
        hp.stage_keys
            ? static_cast<std::size_t>(stage_key_layout(
                  hp.kv, hp.rules - hp.layer * hp.kv.num_kv_heads, hp.chunk_indptr, base.data()))
            : 0;
    auto dstage             = upload(hp.stage_keys, words);
    auto dbase              = upload(hp.stage_key_base, hp.stage_keys ? base.size() : 0);
    auto dsk                = upload(hp.scales.k, static_cast<std::size_t>(hp.scales.count));
    auto dsv                = upload(hp.scales.v, static_cast<std::size_t>(hp.scales.count));
    eviction_params p       = hp;
    p.scales.k              = hp.scales.count ? dsk.get<float>() : nullptr;
    p.scales.v              = hp.scales.count ? dsv.get<float>() : nullptr;
    p.stage_keys            = hp.stage_keys ? dstage.get<std::uint32_t>() : nullptr;
    p.stage_key_base        = hp.stage_keys ? dbase.get<std::int64_t>() : nullptr;
    p.kv                    = dev.view;
    p.rules                 = drules.get<head_rule>();
    p.chunk_indptr          = dindptr.get<std::int32_t>();
    p.chunk_k               = dck.get();
    p.chunk_v               = dcv.get();
    p.q                     = hp.q ? dq.get() : nullptr;
    p.scores                = hp.scores ? dscores.get<float>() : nullptr;
    p.q_lse                 = hp.q_lse ? dlse.get<float>() : nullptr;
    p.new_len               = dnew.get<std::int32_t>();
    p.scores_out            = hp.scores_out ? dscores_out.get<float>() : nullptr;
    device_buffer ws(eviction_workspace_bytes(p));
    // Garbage in the workspace, as a caller may hand it: the launch clears what it needs.
    cuda_check(cudaMemset(ws.get(), 0xff, ws.bytes()), "poison eviction workspace");
    if (evict_through_graph)
      evict_in_graph(p, ws);
    else
      evict_chunk(p, ws.get(), ws.bytes(), nullptr);
    cuda_check(cudaDeviceSynchronize(), "evict_chunk");
    download(dev.pool, cache.pool().data(), cache.pool().size());
    download(dnew, hp.new_len, dnew.bytes());
    if (hp.scores_out) download(dscores_out, hp.scores_out, dscores_out.bytes());
    if (hp.stage_keys) download(dstage, hp.stage_keys, dstage.bytes());
  }
  static void evict_in_graph(eviction_params const& p, device_buffer& ws) {
    cudaStream_t stream;
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    cuda_check(cudaStreamCreate(&stream), "cudaStreamCreate");
    cuda_check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), "begin capture");
    evict_chunk(p, ws.get(), ws.bytes(), stream);
    cuda_check(cudaStreamEndCapture(stream, &graph), "end capture");
    cuda_check(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
    cuda_check(cudaGraphLaunch(exec, stream), "cudaGraphLaunch");
    cuda_check(cudaStreamSynchronize(stream), "evict_chunk (graph)");
    (void)cudaGraphExecDestroy(exec);
    (void)cudaGraphDestroy(graph);
    (void)cudaStreamDestroy(stream);
  }

  void evict_elastic(test_cache& cache, elastic_eviction_params const& hp) {
    device_cache dev(cache, hp.kv);
    const auto B  = static_cast<std::size_t>(hp.kv.batch_size);
    const auto HH = static_cast<std::size_t>(hp.heads());
    auto drules   = upload(hp.rules, HH);
    auto dindptr  = upload(hp.chunk_indptr, B + 1);
    std::vector<std::int64_t> base(B * static_cast<std::size_t>(hp.kv.num_groups));
    auto words =
        static_cast<std::size_t>(stage_key_layout(hp.kv, hp.rules, hp.chunk_indptr, base.data()));
    auto dkeys    = upload(hp.stage_keys, words);
    auto dbase    = upload(hp.stage_key_base, base.size());
    auto dwanted  = upload(hp.wanted, B);
    auto dlimit   = upload(hp.page_limit, B);
    device_buffer dnew(B * HH * 4), dpages(B * 8);
    elastic_eviction_params p = hp;
    p.kv                      = dev.view;
    p.rules                   = drules.get<head_rule>();
    p.chunk_indptr            = dindptr.get<std::int32_t>();
    p.stage_keys              = dkeys.get<std::uint32_t>();
    p.stage_key_base          = dbase.get<std::int64_t>();
    p.wanted                  = dwanted.get<std::int64_t>();
    p.page_limit              = dlimit.get<std::int64_t>();
    p.new_len                 = dnew.get<std::int32_t>();
    p.pages_out               = hp.pages_out ? dpages.get<std::int64_t>() : nullptr;
    device_buffer ws(elastic_workspace_bytes(p));
    cuda_check(cudaMemset(ws.get(), 0xff, ws.bytes()), "poison elastic workspace");
    ::tangram::evict_elastic(p, ws.get(), ws.bytes(), nullptr);
    cuda_check(cudaDeviceSynchronize(), "evict_elastic");
    download(dev.pool, cache.pool().data(), cache.pool().size());
    download(dnew, hp.new_len, dnew.bytes());
    if (hp.pages_out) download(dpages, hp.pages_out, dpages.bytes());
  }

  void append(test_cache& cache, append_params const& hp) {
    device_cache dev(cache, hp.kv);
    const std::size_t n = static_cast<std::size_t>(hp.kv.batch_size) *
                          static_cast<std::size_t>(hp.row_stride()) * size_of(hp.src_dtype);
    auto dk         = upload(static_cast<const unsigned char*>(hp.k), n);
    auto dv         = upload(static_cast<const unsigned char*>(hp.v), n);
    auto dsk        = upload(hp.scales.k, static_cast<std::size_t>(hp.scales.count));
    auto dsv        = upload(hp.scales.v, static_cast<std::size_t>(hp.scales.count));
    append_params p = hp;
    p.scales.k      = hp.scales.count ? dsk.get<float>() : nullptr;
    p.scales.v      = hp.scales.count ? dsv.get<float>() : nullptr;
    p.kv            = dev.view;
    p.k             = dk.get();
    p.v             = dv.get();
    append_decode_kv(p, nullptr);
    cuda_check(cudaDeviceSynchronize(), "append_decode_kv");
    download(dev.pool, cache.pool().data(), cache.pool().size());
  }

  void balance(test_cache& cache, balanced_split_params const& hp) {
    device_cache dev(cache, hp.kv);
    const std::size_t n = static_cast<std::size_t>(hp.kv.num_layers) *
                          static_cast<std::size_t>(hp.kv.num_kv_heads + 1) * sizeof(std::int32_t);
    device_buffer out(n);
    balanced_split_params p = hp;
    p.kv                    = dev.view;
    p.cta_begin             = out.get<std::int32_t>();
    balance_decode_splits(p, nullptr);
    cuda_check(cudaDeviceSynchronize(), "balance_decode_splits");
    download(out, hp.cta_begin, n);
  }

  void prefill(test_cache& cache, prefill_params const& hp) {
    device_cache dev(cache, hp.kv);
    const auto B      = static_cast<std::size_t>(hp.kv.batch_size);
    const auto rows   = static_cast<std::size_t>(B ? hp.chunk_indptr[B] : 0);
    const auto H      = static_cast<std::size_t>(hp.kv.num_kv_heads);
    const auto Hq     = static_cast<std::size_t>(hp.num_q_heads());
    const auto d      = static_cast<std::size_t>(hp.kv.geometry.head_dim);
    const auto es     = static_cast<std::size_t>(hp.kv.geometry.element_bytes());
    const std::size_t out_bytes = rows * Hq * d * size_of(hp.o_dtype);
    auto dindptr      = upload(hp.chunk_indptr, B + 1);
    auto dq           = upload(static_cast<const unsigned char*>(hp.q),
                     rows * static_cast<std::size_t>(hp.q_row_stride()) * size_of(hp.q_dtype));
    auto dck          = upload(static_cast<const unsigned char*>(hp.chunk_k), rows * H * d * es);
    auto dcv          = upload(static_cast<const unsigned char*>(hp.chunk_v), rows * H * d * es);
    auto dsinks       = upload(hp.sinks, Hq);
    auto dsk          = upload(hp.scales.k, static_cast<std::size_t>(hp.scales.count));
    auto dsv          = upload(hp.scales.v, static_cast<std::size_t>(hp.scales.count));
    device_buffer dout(out_bytes), dlse(rows * Hq * 4);
    prefill_params p  = hp;
    p.scales.k        = hp.scales.count ? dsk.get<float>() : nullptr;
    p.scales.v        = hp.scales.count ? dsv.get<float>() : nullptr;
    p.kv              = dev.view;
    p.chunk_indptr    = dindptr.get<std::int32_t>();
    p.q               = dq.get();
    p.chunk_k         = dck.get();
    p.chunk_v         = dcv.get();
    p.sinks           = hp.sinks ? dsinks.get<float>() : nullptr;
    p.o               = dout.get();
    p.lse             = hp.lse ? dlse.get<float>() : nullptr;
    prefill_attention(p, nullptr, 0, nullptr);
    cuda_check(cudaDeviceSynchronize(), "prefill_attention");
    download(dout, hp.o, out_bytes);
    if (hp.lse) download(dlse, hp.lse, dlse.bytes());
  }
};

}  // namespace tangram::test
