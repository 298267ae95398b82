// SPDX-License-Identifier: Apache-2.0
// Shared pieces of the GPU benchmarks: a tiny runner (no Google Benchmark: the programs build
// on a bare GPU machine), cold-L2 flush, CUDA-event timing, and a synthetic paged KV cache (one
// head per group, shuffled page ids) built directly on the device.
//
// Every program takes [--short] [--iterations N] [--out FILE.json] and writes
// {"benchmarks": [{"name", "real_time" (us per iteration), "time_unit", "iterations", counters...,
// "error_occurred", "error_message"}]}, the field names Google Benchmark uses.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "device_buffer.cuh"
#include "tangram/core/kv_view.hpp"
#include "tangram/device/device.hpp"
#include "tangram/io/detail/file_io.hpp"
#include "tangram/io/detail/json.hpp"

namespace tangram::bench {

/// H200 peak HBM bandwidth, the denominator of every "hbm_fraction" counter.
inline constexpr double h200_peak_bytes_per_s = 4.8e12;

using test::cuda_check;
using test::device_buffer;

/// One benchmark's outcome: time per iteration and named counters (or an error).
struct result {
  std::string name;
  double real_time_us = 0;
  int iterations      = 0;
  std::vector<std::pair<std::string, double>> counters;
  std::string error;
};

/// What a benchmark body gets: the iteration count and where to put its numbers.
struct state {
  int iterations  = 10;
  bool short_mode = false;
  result* out     = nullptr;
  void counter(std::string const& name, double v) { out->counters.emplace_back(name, v); }
};

struct benchmark_def {
  std::string name;
  std::function<void(state&)> run;  ///< sets out->real_time_us and the counters
};

/// Runs `defs` (the first `short_count` of them with --short) and writes the JSON report.
/// Exits 0 unless the arguments are wrong or the report cannot be written; without a device
/// every benchmark reports "no CUDA device".
inline int run_benchmarks(int argc,
                          char** argv,
                          std::vector<benchmark_def> const& defs,
                          std::size_t short_count) {
  bool short_mode = false;
  int iterations  = 20;
  std::string out_path;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--short") == 0) {
      short_mode = true;
      iterations = std::min(iterations, 5);
    } else if (std::strcmp(argv[i], "--iterations") == 0 && i + 1 < argc) {
      iterations = std::atoi(argv[++i]);
    } else if (std::strcmp(argv[i], "--out") == 0 && i + 1 < argc) {
      out_path = argv[++i];
    } else {
      std::fprintf(stderr,
                   "%s: unknown argument %s (--short, --iterations N, --out FILE)\n",
                   argv[0],
                   argv[i]);
      return 2;
    }
  }
  if (iterations < 1) {
    std::fprintf(stderr, "%s: --iterations must be >= 1, got %d\n", argv[0], iterations);
    return 2;
  }
  const bool device = cuda_device_count() > 0;
  std::vector<result> results;
  std::size_t n = short_mode ? std::min(short_count, defs.size()) : defs.size();
  for (std::size_t i = 0; i < n; ++i) {
    result r;
    r.name       = defs[i].name;
    r.iterations = iterations;
    if (!device) {
      r.error = "no CUDA device";
    } else {
      state st{iterations, short_mode, &r};
      try {
        defs[i].run(st);
      } catch (std::exception const& e) {
        r.error = e.what();
      }
    }
    if (r.error.empty()) {
      std::printf("%-40s %12.1f us", r.name.c_str(), r.real_time_us);
      for (auto const& [k, v] : r.counters) std::printf("  %s=%.4g", k.c_str(), v);
      std::printf("\n");
    } else {
      std::printf("%-40s ERROR: %s\n", r.name.c_str(), r.error.c_str());
    }
    std::fflush(stdout);
    results.push_back(std::move(r));
  }
  if (!out_path.empty()) {
    namespace json   = detail::json;
    json::value list = json::value::array();
    for (auto const& r : results) {
      json::value b = json::value::object();
      b.members().emplace_back("name", r.name);
      b.members().emplace_back("real_time", r.real_time_us);
      b.members().emplace_back("time_unit", "us");
      b.members().emplace_back("iterations", r.iterations);
      for (auto const& [k, v] : r.counters) b.members().emplace_back(k, v);
      if (!r.error.empty()) {
        b.members().emplace_back("error_occurred", true);
        b.members().emplace_back("error_message", r.error);
      }
      list.elements().push_back(std::move(b));
    }
    json::value doc = json::value::object();
    doc.members().emplace_back("benchmarks", std::move(list));
    try {
      detail::write_file(out_path, json::dump(doc) + "\n");
    } catch (std::exception const& e) {
      std::fprintf(stderr, "%s: %s\n", argv[0], e.what());
      return 2;
    }
  }
  return 0;
}

/// Evicts the L2 cache by writing a buffer of at least twice its size before each timed launch.
class l2_flusher {
 public:
  l2_flusher() {
    int dev = 0, l2 = 0;
    cuda_check(cudaGetDevice(&dev), "cudaGetDevice");
    cuda_check(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev), "L2 size");
    buf_ = device_buffer(std::max<std::size_t>(2 * static_cast<std::size_t>(l2), 64u << 20));
  }
  void flush(cudaStream_t s) {
    cuda_check(cudaMemsetAsync(buf_.get(), ++value_ & 0xff, buf_.bytes(), s), "flush");
  }

 private:
  device_buffer buf_;
  int value_ = 0;
};

/// Times one enqueue with CUDA events after a cold-L2 flush; returns seconds.
template <class F>
double timed(l2_flusher& flusher, cudaStream_t stream, F&& enqueue) {
  cudaEvent_t a, b;
  cuda_check(cudaEventCreate(&a), "event");
  cuda_check(cudaEventCreate(&b), "event");
  flusher.flush(stream);
  cuda_check(cudaEventRecord(a, stream), "record");
  enqueue();
  cuda_check(cudaEventRecord(b, stream), "record");
  cuda_check(cudaEventSynchronize(b), "sync");
  float ms = 0;
  cuda_check(cudaEventElapsedTime(&ms, a, b), "elapsed");
  (void)cudaEventDestroy(a);
  (void)cudaEventDestroy(b);
  return ms * 1e-3;
}

/// A one-layer paged KV cache on the device: one head per group (Hp = 1), every (request, head)
/// with its own length and `reserve` extra positions, page ids shuffled over the pool.
struct device_kv : test::device_kv_arrays {
  kv_cache_view view;
  std::int64_t held_tokens = 0;

  device_kv(page_geometry g,
            std::int32_t batch,
            std::int32_t heads,
            std::vector<std::int32_t> const& len /* [batch * heads] */,
            std::vector<std::int32_t> const& seen /* [batch] */,
            std::int32_t reserve = 0,
            std::uint64_t seed   = 1) {
    std::vector<head_slot> hs(static_cast<std::size_t>(heads));
    for (std::int32_t h = 0; h < heads; ++h) hs[static_cast<std::size_t>(h)] = {h, 0};
    std::vector<std::int32_t> zeros(static_cast<std::size_t>(heads), 0), offs,
        appended_h(static_cast<std::size_t>(batch), 0), slots(static_cast<std::size_t>(batch));
    std::iota(slots.begin(), slots.end(), 0);
    std::int32_t total = 0;
    for (std::int32_t r = 0; r < batch; ++r)
      for (std::int32_t h = 0; h < heads; ++h) {
        offs.push_back(total);
        std::int32_t n = len[static_cast<std::size_t>(r * heads + h)];
        held_tokens += n;
        total += (n + reserve + g.page_tokens - 1) / g.page_tokens;
      }
    std::vector<std::int32_t> ids(static_cast<std::size_t>(total));
    std::iota(ids.begin(), ids.end(), 0);
    std::mt19937_64 rng(seed);
    // Shuffle in runs of 64 pages: allocators hand out mostly nearby pages, never in order.
    for (std::size_t i = 0; i + 64 <= ids.size(); i += 64)
      std::shuffle(ids.begin() + static_cast<std::ptrdiff_t>(i),
                   ids.begin() + static_cast<std::ptrdiff_t>(i + 64),
                   rng);
    pool = device_buffer(static_cast<std::size_t>(std::max(1, total)) *
                         static_cast<std::size_t>(g.page_bytes()));
    cuda_check(cudaMemset(pool.get(), 0x3c, pool.bytes()), "pool fill");  // small finite values
    head_slots  = device_buffer(hs);
    window      = device_buffer(zeros);
    ring        = device_buffer(zeros);
    page_offset = device_buffer(offs);
    pages       = device_buffer(ids);
    base_len    = device_buffer(len);
    appended    = device_buffer(appended_h);
    seq_tokens  = device_buffer(seen);
    batch_slots = device_buffer(slots);
    attach(view);
    view.geometry     = g;
    view.num_layers   = 1;
    view.num_kv_heads = heads;
    view.num_groups   = heads;
    view.batch_size   = batch;
  }
};

}  // namespace tangram::bench
