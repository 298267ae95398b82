// SPDX-License-Identifier: Apache-2.0
// Parse and validation cost of the real profile files (what a server pays once at start-up).
#include <benchmark/benchmark.h>

#include "tangram/io/budget_profile.hpp"
#include "tangram/io/detail/file_io.hpp"
#include "tangram/io/retention_samples.hpp"
#include "tangram/profile/budget_profile.hpp"
#include "tangram/profile/retention_samples.hpp"

namespace {

std::string const& samples_text() {
  static std::string const text =
      tangram::detail::read_file(std::string(TANGRAM_DATA_DIR) + "/profiles/snapkv/llama-3.1-8b-instruct.json");
  return text;
}

void parse_retention_samples_llama(benchmark::State& state) {
  auto const& text = samples_text();
  for (auto _ : state) {
    auto s = tangram::parse_retention_samples(text, "bench");
    benchmark::DoNotOptimize(s.samples.data());
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * text.size()));
}
BENCHMARK(parse_retention_samples_llama);

void budget_profile_roundtrip(benchmark::State& state) {
  tangram::budget_profile p;
  p.num_model_layers = 32;
  p.num_kv_heads     = 8;
  for (int l = 0; l < 32; ++l) p.layer_ids.push_back(l);
  for (int i = 0; i < 256; ++i) p.budgets.push_back(0.05 + i * 0.003);
  for (auto _ : state) {
    auto back = tangram::parse_budget_profile(tangram::to_json(p), "bench");
    benchmark::DoNotOptimize(back.budgets.data());
  }
}
BENCHMARK(budget_profile_roundtrip);

}  // namespace
