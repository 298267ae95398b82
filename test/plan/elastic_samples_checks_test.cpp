// SPDX-License-Identifier: Apache-2.0
// Elastic placements of retention samples under hostile or unusual inputs (found by an adversarial
// review): the right heads under tensor parallelism, determinism, samples of another model and a
// negative context refused with an error.
#include <cstdint>
#include <vector>

#include "tangram/io/retention_samples.hpp"
#include "tangram/model/presets.hpp"
#include "tangram/plan/build_static_plan.hpp"
#include "tangram/plan/calibration.hpp"
#include "tangram/plan/elastic_placement.hpp"
#include "tangram/plan/elastic_split_map.hpp"
#include "test_support.hpp"

using namespace tangram;
using tangram::test::data_path;

namespace {

retention_samples llama_samples() {
  return load_retention_samples(data_path("profiles/snapkv/llama-3.1-8b-instruct.json"));
}

static_plan elastic_plan(retention_samples const& s, std::int32_t tp, std::int32_t rank) {
  plan_options o;
  o.tp_size          = tp;
  o.tp_rank          = rank;
  o.split.weighting  = split_weighting::batch_share;
  o.reservation.mode = reservation_mode::elastic;
  return build_static_plan(model_preset(s.model), calibrate(s), o, s);
}

}  // namespace

TEST_CASE("review: sample_needs_at reads the rank's own heads under tensor parallelism",
          "[review]") {
  auto s = llama_samples();
  // Global head 5 keeps everything, every other head 100 tokens.
  for (auto& smp : s.samples)
    for (std::size_t i = 0; i < smp.kept.size(); ++i)
      smp.kept[i] = i % 8 == 5 ? smp.context_tokens : 100;
  auto p1 = elastic_plan(s, 2, 1);  // rank 1: heads 4..7, head 5 is local head 1
  auto n  = sample_needs_at(p1, s, 0, 8000);
  for (std::int32_t l = 0; l < p1.num_layers; ++l)
    for (std::int32_t h = 0; h < 4; ++h) {
      auto expect = h == 1 ? std::int64_t{8000} : (100 * 8000 + s.samples[0].context_tokens - 1) /
                                                      s.samples[0].context_tokens;
      CHECK(n[static_cast<std::size_t>(l * 4 + h)] == expect);
    }
  // Deterministic: the same plan twice.
  auto again = elastic_plan(s, 2, 1);
  CHECK(again.splits.cta_begin == p1.splits.cta_begin);
}

TEST_CASE("review: samples of another model (more layers) are rejected", "[review]") {
  auto s          = llama_samples();
  auto plan       = elastic_plan(s, 1, 0);
  auto other      = s;
  other.num_model_layers = 48;
  for (auto& id : other.layer_ids) id += 16;  // layers 16..47 of a 48-layer model
  // Before the check, layers >= 32 were skipped silently and 16..31 took the other model's counts.
  CHECK_THROWS_AS(sample_needs_at(plan, other, 0, 8000), invalid_argument);
  CHECK_THROWS_AS(elastic_placement_split_map(plan, other), invalid_argument);
}

TEST_CASE("review: a negative context is rejected by sample_needs_at itself", "[review]") {
  auto s    = llama_samples();
  auto plan = elastic_plan(s, 1, 0);
  // std::clamp(n, 0, context) with context < 0 violates clamp's precondition (UB).
  CHECK_THROWS_AS(sample_needs_at(plan, s, 0, -5), invalid_argument);
}
