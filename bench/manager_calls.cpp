// SPDX-License-Identifier: Apache-2.0
// The manager calls that bench/python/bench_bindings.py times through the Python bindings, here
// from C++ on the same plan and sizes (Llama-3.1-8B, snapkv profile, static budgets, host pool):
// the difference is what the bindings add per call (docs/python.md).
//   build/bench/bench_manager_calls --benchmark_format=json
#include <benchmark/benchmark.h>

#include <string>

#include "tangram/io/retention_samples.hpp"
#include "tangram/memory/host_memory_resource.hpp"
#include "tangram/memory/kv_cache_manager.hpp"
#include "tangram/model/presets.hpp"
#include "tangram/plan/build_static_plan.hpp"
#include "tangram/plan/calibration.hpp"

namespace {

using namespace tangram;

static_plan const& llama_plan() {
  static static_plan p = [] {
    auto s = load_retention_samples(std::string(TANGRAM_DATA_DIR) +
                                    "/profiles/snapkv/llama-3.1-8b-instruct.json");
    plan_options o;
    o.reservation.mode = reservation_mode::static_budgets;  // as documented in docs/python.md
    return build_static_plan(model_preset(s.model), calibrate(s), o);
  }();
  return p;
}

/// A manager with one sequence in decode (prompt 64, 2048 decode tokens reserved), as the Python
/// benchmark builds it.
struct fixture {
  host_memory_resource memory;
  kv_cache_manager kv;
  sequence_id seq;
  fixture() : kv(llama_plan(), memory, options()) { start(); }
  static manager_options options() {
    manager_options o;
    o.num_pages     = 20000;
    o.max_sequences = 8;
    return o;
  }
  std::vector<std::int32_t> expected(std::int64_t c) {
    std::vector<std::int32_t> k(static_cast<std::size_t>(llama_plan().rules.size()));
    kv.expected_kept(seq, c, k.data());
    return k;
  }
  /// A fresh sequence in decode (prompt 64, 2048 decode tokens reserved).
  void start() {
    seq = *kv.try_admit(64, 2048);
    kv.prepare_chunk(seq, 64);
    kv.commit_chunk(seq, expected(64));
    kv.set_batch(&seq, 1);
  }
  /// One decode step; when the reservation is used up the sequence is replaced by a fresh one
  /// (same cycle as the Python benchmark, amortised over 2048 steps).
  void step() {
    if (kv.info(seq).decoded == 2048) {
      kv.free(seq);
      start();
    }
    kv.decode_step();
  }
};

void try_admit_and_free(benchmark::State& state) {
  fixture f;
  for (auto _ : state) {
    auto s = f.kv.try_admit(1000, 64);
    f.kv.free(*s);
  }
}
BENCHMARK(try_admit_and_free);

void info(benchmark::State& state) {
  fixture f;
  for (auto _ : state) benchmark::DoNotOptimize(f.kv.info(f.seq));
}
BENCHMARK(info);

void set_batch(benchmark::State& state) {
  fixture f;
  for (auto _ : state) f.kv.set_batch(&f.seq, 1);
}
BENCHMARK(set_batch);

void decode_step(benchmark::State& state) {
  fixture f;
  for (auto _ : state) f.step();
}
BENCHMARK(decode_step);

void view(benchmark::State& state) {
  fixture f;
  for (auto _ : state) benchmark::DoNotOptimize(f.kv.view());
}
BENCHMARK(view);

}  // namespace
