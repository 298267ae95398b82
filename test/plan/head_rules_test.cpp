// SPDX-License-Identifier: Apache-2.0
// The planning steps that now have their own headers, checked against hand-computed values:
// head_rules_for (plan/head_rules.hpp) and the split options (plan/split_options.hpp).
#include "tangram/plan/head_rules.hpp"

#include <cstdint>
#include <vector>

#include "tangram/plan/split_options.hpp"
#include "test_support.hpp"

using namespace tangram;

namespace {

/// Four layers of four KV heads: compressed, sliding window (W = 128), compressed, uncompressed.
model_spec hybrid_model() {
  model_spec m;
  m.name            = "hybrid";
  m.num_layers      = 4;
  m.num_query_heads = 8;
  m.num_kv_heads    = 4;
  m.head_dim        = 64;
  m.layers          = {{layer_kind::compressed, 0},
                       {layer_kind::sliding_window, 128},
                       {layer_kind::compressed, 0},
                       {layer_kind::uncompressed, 0}};
  return m;
}

/// Budgets for model layer 0 only (layer 2 is full attention without budgets).
budget_profile layer0_profile() {
  budget_profile p;
  p.model            = "hybrid";
  p.num_model_layers = 4;
  p.num_kv_heads     = 4;
  p.layer_ids        = {0};
  p.sink_tokens      = 4;
  p.window_tokens    = 60;
  p.budgets          = {0.125, 0.25, 0.5, 1.0};
  return p;
}

head_rule compressed(double budget, std::int64_t protect) {
  head_rule r;
  r.kind    = layer_kind::compressed;
  r.budget  = budget;
  r.protect = protect;
  return r;
}

head_rule sliding(std::int32_t window) {
  head_rule r;
  r.kind   = layer_kind::sliding_window;
  r.window = window;
  return r;
}

head_rule uncompressed() {
  head_rule r;
  r.kind = layer_kind::uncompressed;
  return r;
}

}  // namespace

TEST_CASE("head_rules_for: each layer's kind and budgets, rank by rank", "[plan][head_rules]") {
  auto model   = hybrid_model();
  auto profile = layer0_profile();

  // One rank: layer-major, one rule per (layer, KV head); protect = sink + window = 64.
  std::vector<head_rule> one_rank = {compressed(0.125, 64),
                                     compressed(0.25, 64),
                                     compressed(0.5, 64),
                                     compressed(1.0, 64),
                                     sliding(128),
                                     sliding(128),
                                     sliding(128),
                                     sliding(128),
                                     uncompressed(),
                                     uncompressed(),
                                     uncompressed(),
                                     uncompressed(),
                                     uncompressed(),
                                     uncompressed(),
                                     uncompressed(),
                                     uncompressed()};
  CHECK(head_rules_for(model, profile) == one_rank);

  // Two ranks: rank 1 holds model KV heads 2 and 3, so it takes their budgets.
  std::vector<head_rule> rank1 = {compressed(0.5, 64),
                                  compressed(1.0, 64),
                                  sliding(128),
                                  sliding(128),
                                  uncompressed(),
                                  uncompressed(),
                                  uncompressed(),
                                  uncompressed()};
  CHECK(head_rules_for(model, profile, 2, 1) == rank1);
}

TEST_CASE("head_rules_for: a profile that does not fit the model is refused",
          "[plan][head_rules]") {
  auto model        = hybrid_model();
  auto profile      = layer0_profile();
  profile.layer_ids = {1};  // the sliding-window layer cannot carry budgets
  TANGRAM_REQUIRE_THROWS_WITH_ALL(head_rules_for(model, profile),
                                  invalid_argument,
                                  "profile.layer_ids: layer 1",
                                  "sliding-window");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      head_rules_for(model, layer0_profile(), 3), invalid_argument, "tp_size: 3");
  // Issue 31 (found by the plan-consistency property under ASan): a rank outside [0, tp_size)
  // read past the profile's budgets.
  for (std::int32_t rank : {2, 3, -1})
    TANGRAM_REQUIRE_THROWS_WITH_ALL(head_rules_for(model, layer0_profile(), 2, rank),
                                    invalid_argument,
                                    std::string("tp_rank: must be in [0, 1] for tp_size 2"),
                                    detail::cat("got ", rank));
}

TEST_CASE("split options: default traffic and bounds", "[plan][split]") {
  // round(1024 x 128^(i / 63)): 1K first, 128K last, strictly increasing.
  auto refs = default_reference_contexts();
  REQUIRE(refs.size() == 64);
  CHECK(refs.front() == 1024);
  CHECK(refs.back() == 131072);
  for (std::size_t i = 1; i < refs.size(); ++i) CHECK(refs[i] > refs[i - 1]);

  split_options o;
  CHECK(o.weighting == split_weighting::batch_share);
  CHECK(o.reference_contexts == refs);
  CHECK_NOTHROW(o.validate());

  CHECK(split_weighting_named("budget") == split_weighting::budget);
  CHECK(split_weighting_named("batch_share") == split_weighting::batch_share);
  CHECK_FALSE(split_weighting_named("tokens").has_value());
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      parse_split_weighting("tokens"), invalid_argument, "weighting", "\"tokens\"");

  auto bad               = o;
  bad.reference_contexts = {split_limits::max_reference_context + 1};
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      bad.validate(), invalid_argument, "split_options.reference_contexts", "16777217");
  bad                      = o;
  bad.reference_batches    = 65536;
  bad.reference_batch_size = 16;  // 2^20 requests, over the 2^18 cap
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      bad.validate(), invalid_argument, "reference_batches x reference_batch_size", "262144");
  bad                = o;
  bad.share_quantile = 1.5;
  TANGRAM_REQUIRE_THROWS_WITH_ALL(bad.validate(), invalid_argument, "share_quantile", "1.5");
}
