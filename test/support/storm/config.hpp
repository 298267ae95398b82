// SPDX-License-Identifier: Apache-2.0
// The settings of an operation storm (test/support/storm/driver.hpp): a plan, the pool, the
// request sizes and the mix of operations; the named configs of the reliability storm and soak,
// and random tiny configs for the property and mirror storms.
#pragma once

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "../../memory/memory_fixtures.hpp"
#include "tangram/memory/kv_cache_manager.hpp"
#include "tangram/model/presets.hpp"
#include "tangram/plan/footprint.hpp"
#include "tangram/plan/static_plan.hpp"

namespace tangram::test {

/// The operations of a storm's walk (storm::step in driver.hpp).
enum class storm_op : std::uint8_t {
  admit,
  chunk,
  decode,
  end_turn,
  continue_turn,
  fork,
  free,
  abort_chunk,
  misuse,
  full_pool_burst,
  drain,
  speculate,
  extend,
  park,
  mixed_step,  ///< prefill chunks beside decodes on two batches, padded or not
  set_batch,   ///< a random batch of a random kind, padded half of the time
  prefix,      ///< pin an ended sequence as a shared prefix, or admit a request over one
};

/// A mix of operations: (operation, weight) in draw order; a step draws rng() % (sum of weights).
using storm_mix = std::vector<std::pair<storm_op, std::uint32_t>>;

/// The reliability storm's mix (1,000 buckets; the soak driver runs it too).
inline storm_mix reliability_mix() {
  using o = storm_op;
  return {{o::admit, 110},
          {o::chunk, 200},
          {o::decode, 315},
          {o::end_turn, 50},
          {o::continue_turn, 60},
          {o::fork, 35},
          {o::prefix, 20},  // pins, admissions over prefixes, forks of them, misuse
          {o::free, 60},
          {o::abort_chunk, 18},
          {o::misuse, 30},
          {o::full_pool_burst, 3},
          {o::drain, 1},
          {o::speculate, 38},
          {o::extend, 25},
          {o::park, 30},
          {o::decode, 5}};
}

/// The property storm's mix: whole lifecycles with many turns, forks, parks and misuses, and
/// mixed steps on padded batches.
inline storm_mix lifecycle_mix() {
  using o = storm_op;
  return {{o::admit, 40},
          {o::chunk, 170},
          {o::decode, 100},
          {o::mixed_step, 110},
          {o::end_turn, 75},
          {o::continue_turn, 75},
          {o::fork, 40},
          {o::prefix, 15},
          {o::free, 70},
          {o::abort_chunk, 18},
          {o::misuse, 90},
          {o::speculate, 30},
          {o::extend, 20},
          {o::park, 140},
          {o::full_pool_burst, 2}};
}

/// The mirror storms' mix: every call that changes the view, batch changes included.
inline storm_mix mirror_mix() {
  auto m = reliability_mix();
  m.push_back({storm_op::set_batch, 90});
  m.push_back({storm_op::mixed_step, 40});
  return m;
}

/// One storm setting: a plan, the pool, the request sizes and the mix of operations.
struct storm_config {
  std::string name;
  static_plan plan;
  bool host = true;  ///< host pool: K/V tags written and read back; else simulated (counts only)
  manager_options options;
  std::int64_t max_prompt = 40;  ///< N of a first turn in [1, max_prompt]
  std::int64_t max_new    = 24;  ///< T in [0, max_new]
  std::int64_t max_chunk  = 16;  ///< chunk tokens in [1, max_chunk]
  storm_mix mix           = reliability_mix();
  /// Check the view journal with the storm's own mirror; off when a mirror under test consumes
  /// view_changes() itself (mirror_storms.hpp).
  bool journal_check = true;
};

/// What a random tiny config varies beyond the plan (random_tiny_config).
struct tiny_knobs {
  bool elastic         = false;  ///< elastic reservation (margin 0.2), else static budgets
  bool simulated       = false;  ///< simulated pool (counts only), else host (K/V tags)
  bool small_index     = false;  ///< a page-id arena barely above the pool: repacking
  bool small_journal   = false;  ///< a 6-entry view journal: overflows into full resyncs
  bool small_max_batch = false;  ///< max_batch in [1, max_sequences]
};

/**
 * A random tiny hybrid plan (8 heads with random budgets, P 2-5, Hp 1, 2 or 4, window 3-12, any
 * scope) on a pool of 80-400 pages and 4-10 slots; requests of up to 40 prompt and 20 answer
 * tokens, chunks up to the whole prompt (elastic: up to max_chunk_tokens).
 */
inline storm_config random_tiny_config(std::string name, std::mt19937& rng, tiny_knobs k) {
  auto uniform = [&](std::int64_t lo, std::int64_t hi) {
    return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng);
  };
  std::vector<double> budgets(8);
  for (auto& b : budgets) b = std::uniform_real_distribution<double>(0.05, 1.0)(rng);
  auto P      = static_cast<std::int32_t>(uniform(2, 5));
  auto Hp     = std::int32_t{1} << uniform(0, 2);
  auto window = static_cast<std::int32_t>(uniform(3, 12));
  auto scope  = static_cast<grouping_scope>(uniform(0, 2));
  if (Hp == 4 && scope != grouping_scope::global) scope = grouping_scope::layer;
  storm_config c;
  c.plan = tiny_plan(
      budgets, P, Hp, window, scope, k.elastic ? elastic_reservation(0.2) : static_reservation());
  c.name = std::move(name) + " P" + std::to_string(P) + " Hp" + std::to_string(Hp) + " W" +
           std::to_string(window) + " " + std::string(to_string(scope)) +
           std::string(k.elastic ? " elastic" : "") + (k.simulated ? " simulated" : "");
  c.host                  = !k.simulated;
  c.max_prompt            = 40;
  c.max_new               = 20;
  c.max_chunk             = std::min<std::int64_t>(40, c.options.max_chunk_tokens);
  c.options.num_pages     = uniform(80, 400);
  c.options.max_sequences = static_cast<std::int32_t>(uniform(4, 10));
  if (k.small_max_batch)
    c.options.max_batch = static_cast<std::int32_t>(uniform(1, c.options.max_sequences));
  if (k.small_index) c.options.index_capacity = c.options.num_pages + 50;
  if (k.small_journal) c.options.max_view_changes = 6;
  return c;
}

/// The model with tiny heads in f32, so host pools can hold real K/V tags cheaply; budgets,
/// rules, kinds and grouping stay those of the real model.
inline model_spec with_small_heads(model_spec m) {
  m.head_dim = 4;
  m.kv_dtype = dtype::f32;
  return m;
}

/// A config whose pool holds about `requests` of the largest first turns.
inline storm_config make_storm_config(std::string name,
                                      static_plan plan,
                                      bool host,
                                      double requests,
                                      std::int32_t max_sequences,
                                      std::int64_t max_prompt,
                                      std::int64_t max_new,
                                      std::int64_t max_chunk,
                                      bool small_index = false) {
  storm_config c;
  c.name                  = std::move(name);
  c.host                  = host;
  c.max_prompt            = max_prompt;
  c.max_new               = max_new;
  c.max_chunk             = max_chunk;
  auto M                  = footprint_pages(plan, max_prompt, max_new);
  c.options.num_pages     = std::max<std::int64_t>(1, static_cast<std::int64_t>(requests * M));
  c.options.max_sequences = max_sequences;
  // A page-id arena barely above the pool forces repacking (and its journal resyncs).
  if (small_index) c.options.index_capacity = c.options.num_pages + 4 * plan.num_groups();
  c.plan = std::move(plan);
  return c;
}

/// An elastic-reservation config: chunks of at most `max_chunk` tokens (manager_options too), a
/// pool of about `requests` of the largest first turns' admission (footprint + staging).
inline storm_config make_elastic_storm_config(std::string name,
                                              static_plan plan,
                                              bool host,
                                              double requests,
                                              std::int32_t max_sequences,
                                              std::int64_t max_prompt,
                                              std::int64_t max_new,
                                              std::int64_t max_chunk) {
  auto c                     = make_storm_config(std::move(name),
                             std::move(plan),
                             host,
                             requests,
                             max_sequences,
                             max_prompt,
                             max_new,
                             max_chunk);
  c.options.max_chunk_tokens = max_chunk;
  auto M                     = admission_footprint_pages(c.plan, max_prompt, max_new, max_chunk);
  c.options.num_pages        = std::max<std::int64_t>(1, static_cast<std::int64_t>(requests * M));
  return c;
}

/// Pool pages for the resource fault cases of a config (test/reliability/faults.hpp): its pool,
/// at most `cap`. Those cases build managers with default options; under elastic reservation a
/// request then stages min(default max_chunk_tokens, its prompt), so the pool must hold the
/// (1, 1) and (2, 2) admissions they make (sized through admission_footprint_pages).
inline std::int64_t fault_case_pages(storm_config const& c, std::int64_t cap) {
  auto chunk = manager_options{}.max_chunk_tokens;
  return std::max({std::min<std::int64_t>(c.options.num_pages, cap),
                   admission_footprint_pages(c.plan, 1, 1, chunk),
                   admission_footprint_pages(c.plan, 2, 2, chunk)});
}

/**
 * The storm settings: tiny hand-checkable hybrid plans (every scope, several P and Hp) and real
 * plans from the bundled profiles and the derived hybrid samples (Llama-3.1-8B, Qwen3-4B,
 * Gemma-3-12B with 1024-token sliding windows, GPT-OSS-20B with 128-token windows on a
 * tensor-parallel rank, Qwen2.5-7B with 4 KV heads). Host configs use 4-element f32 heads so that
 * every token's K/V is written and read back; simulated configs keep the real geometry.
 */
inline std::vector<storm_config> storm_configs() {
  std::vector<storm_config> out;
  out.push_back(make_storm_config("tiny-global-P4-Hp2",
                                  tiny_plan(tiny_budgets(), 4, 2, 10, grouping_scope::global),
                                  true,
                                  5,
                                  8,
                                  40,
                                  24,
                                  16));
  out.push_back(make_storm_config("tiny-layer-P3-Hp1-small-index",
                                  tiny_plan(tiny_budgets(), 3, 1, 7, grouping_scope::layer),
                                  true,
                                  4,
                                  6,
                                  30,
                                  20,
                                  9,
                                  true));
  out.push_back(make_storm_config(
      "tiny-adjacent-P5-Hp2",
      tiny_plan({0.9, 0.05, 0.3, 1.0, 0.15, 0.6, 0.42, 0.08}, 5, 2, 12, grouping_scope::adjacent),
      true,
      6,
      10,
      60,
      30,
      25));
  // Prompts up to 10,240 tokens: the profile protects 4,128 (sink + window), so shorter prompts
  // would never compress.
  out.push_back(make_storm_config("llama-3.1-8b-snapkv-P16-Hp4-global",
                                  llama_plan("snapkv", 16, 4),
                                  false,
                                  6,
                                  12,
                                  10240,
                                  128,
                                  2048));
  out.push_back(make_storm_config("qwen3-4b-ea-P32-Hp2-layer-data",
                                  real_plan(with_small_heads(model_preset("qwen3-4b")),
                                            "profiles/ea/qwen3-4b-instruct-2507.json",
                                            32,
                                            2,
                                            grouping_scope::layer),
                                  true,
                                  5,
                                  8,
                                  192,
                                  48,
                                  96));
  out.push_back(make_storm_config("gemma-3-12b-derived-P16-Hp4-adjacent",
                                  real_plan(model_preset("gemma-3-12b"),
                                            "derived/gemma-3-12b-it.derived.json",
                                            16,
                                            4,
                                            grouping_scope::adjacent),
                                  false,
                                  5,
                                  10,
                                  1200,
                                  96,
                                  400));
  out.push_back(make_storm_config("gpt-oss-20b-derived-tp2-rank1-P16-Hp4-data",
                                  real_plan(with_small_heads(model_preset("gpt-oss-20b")),
                                            "derived/gpt-oss-20b.derived.json",
                                            16,
                                            4,
                                            grouping_scope::global,
                                            2,
                                            1),
                                  true,
                                  5,
                                  8,
                                  300,
                                  80,
                                  128));
  out.push_back(make_storm_config("qwen2.5-7b-derived-P8-Hp4-layer-small-index",
                                  real_plan(model_preset("qwen2.5-7b"),
                                            "derived/qwen2.5-7b-instruct.derived.json",
                                            8,
                                            4,
                                            grouping_scope::layer),
                                  false,
                                  4,
                                  8,
                                  512,
                                  64,
                                  256,
                                  true));
  out.push_back(make_storm_config("llama-3.1-8b-keydiff-P64-Hp8-global",
                                  llama_plan("keydiff", 64, 8),
                                  false,
                                  6,
                                  16,
                                  2048,
                                  256,
                                  1024));
  // Elastic reservation: the compressed groups share one budget, each chunk's eviction picks the
  // groups' lengths within the turn's limit (engine_sim), chunks stage up to max_chunk tokens.
  out.push_back(make_elastic_storm_config(
      "tiny-elastic-global-P4-Hp2-m0.15-chunk8",
      tiny_plan(tiny_budgets(), 4, 2, 10, grouping_scope::global, elastic_reservation(0.15)),
      true,
      5,
      8,
      40,
      24,
      8));
  out.push_back(make_elastic_storm_config(
      "tiny-elastic-adjacent-P3-Hp2-m0-chunk12",
      tiny_plan(tiny_budgets(), 3, 2, 7, grouping_scope::adjacent, elastic_reservation(0.0)),
      true,
      5,
      8,
      36,
      20,
      12));
  // Prompts past the profile's 4128 protected tokens (32 sink + 4096 window), so that the
  // scorer's share, not the protection, sets the limit and the selection clips.
  out.push_back(make_elastic_storm_config("llama-3.1-8b-snapkv-elastic-P16-Hp4-m0.15",
                                          llama_plan("snapkv", 16, 4, elastic_reservation(0.15)),
                                          false,
                                          5,
                                          8,
                                          10240,
                                          128,
                                          1024));
  return out;
}

}  // namespace tangram::test
