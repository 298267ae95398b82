// SPDX-License-Identifier: Apache-2.0
// Issue 30: the per-head dynamic baseline (per-head pages holding each head's own retention,
// admission by the estimated compressed size, preempted requests keeping their blocks as cache),
// checked by page arithmetic worked by hand from the samples and by a hand-worked replay.
#include <vector>

#include "../memory/memory_fixtures.hpp"
#include "tangram/eval/sim/per_head_policy.hpp"
#include "tangram/eval/sim/policies.hpp"
#include "tangram/eval/sim/replay.hpp"
#include "tangram/model/presets.hpp"
#include "test_support.hpp"

using namespace tangram;
using namespace tangram::sim;

namespace {

retention_samples snapkv_samples() {
  return load_retention_samples(test::data_path("profiles/snapkv/llama-3.1-8b-instruct.json"));
}

/// Bytes of one per-head page (one head's P tokens of K and V).
double head_page_bytes(static_plan const& plan) {
  return static_cast<double>(plan.geometry.page_tokens) * head_token_bytes(plan);
}

/// A policy of `capacity` one-token units, for the replay's preemption rules alone: a prompt needs
/// its tokens free at admission and as it is prefilled, every decoded token one unit.
class unit_policy final : public kv_policy {
 public:
  unit_policy(std::int64_t capacity, bool keep) : capacity_(capacity), keep_(keep), held_(2, 0) {}
  std::string name() const override { return "units"; }
  bool start_turn(
      std::int32_t, std::int64_t, std::int64_t prompt, std::int64_t, std::int64_t) override {
    return prompt <= free();
  }
  bool prefill_chunk(std::int32_t s, std::int64_t n) override {
    if (n > free()) return false;
    held_[static_cast<std::size_t>(s)] += n;
    return true;
  }
  bool decode(std::vector<std::int32_t> const& ss) override {
    if (static_cast<std::int64_t>(ss.size()) > free()) return false;
    for (auto s : ss) held_[static_cast<std::size_t>(s)] += 1;
    return true;
  }
  void end_turn(std::int32_t) override {}
  void release(std::int32_t s) override { held_[static_cast<std::size_t>(s)] = 0; }
  double kv_bytes_read(std::int32_t s) const override {
    return static_cast<double>(held_[static_cast<std::size_t>(s)]);
  }
  double attended_tokens(std::int32_t s) const override { return kv_bytes_read(s); }
  policy_memory memory() const override {
    policy_memory m;
    m.allocated_bytes = static_cast<double>(capacity_ - free());
    m.live_bytes      = m.allocated_bytes;
    return m;
  }
  double capacity_bytes() const override { return static_cast<double>(capacity_); }
  bool preempted_kv_is_cache() const override { return keep_; }

 private:
  std::int64_t free() const { return capacity_ - held_[0] - held_[1]; }
  std::int64_t capacity_;
  bool keep_;
  std::vector<std::int64_t> held_;
};

}  // namespace

TEST_CASE("per-head pages hold each head's own retention, layer-wide pages its layer's longest",
          "[per_head][issue30]") {
  auto plan    = test::llama_plan("snapkv");
  auto samples = snapkv_samples();
  elastic_needs n;
  n.samples      = samples;
  auto own       = std::make_shared<retention_needs const>(plan, n);
  std::int64_t P = plan.geometry.page_tokens, N = 20000;  // above sample 0's 18,055: linear
  double kv = 40e9;
  auto ph =
      make_per_head_dynamic_policy(plan, kv, 2, 2, 1 << 20, own, estimated_scorer(plan, 0.3), 8192);
  unified_policy layer(plan, unified_mode::compressed_reclaim, kv, 2, 2, 1 << 20, own);
  CHECK(ph->name() == "per_head_dynamic");
  CHECK(ph->preempted_kv_is_cache());
  CHECK_FALSE(ph->idle_kv_is_prefix_cache());
  REQUIRE(ph->start_turn(0, 0, N, 1, 0));
  REQUIRE(layer.start_turn(0, 0, N, 1, 0));
  REQUIRE(ph->prefill_chunk(0, N));
  REQUIRE(layer.prefill_chunk(0, N));
  // Session 0 is sample 0 at N > its context tokens: head i keeps max(protect, ceil(kept_i * N /
  // context)) (N > protect = 4,128), every profiled head (the snapkv profile covers every layer of
  // Llama-3.1-8B).
  auto const& smp = samples.samples[0];
  REQUIRE(smp.kept.size() == plan.rules.size());
  std::int64_t head_pages = 0, layer_pages = 0;
  for (std::int32_t l = 0; l < plan.num_layers; ++l) {
    std::int64_t longest = 0;
    for (std::int32_t h = 0; h < plan.num_kv_heads; ++h) {
      auto i = static_cast<std::size_t>(l * plan.num_kv_heads + h);
      REQUIRE(plan.rules[i].protect == 4128);
      auto keep = std::min<std::int64_t>(
          N, std::max(plan.rules[i].protect, ceil_div(smp.kept[i] * N, smp.context_tokens)));
      head_pages += ceil_div(keep, P);
      longest = std::max(longest, keep);
    }
    layer_pages += ceil_div(longest, P);
  }
  CHECK(ph->baseline().pool().used_pages() == head_pages);
  CHECK(ph->baseline().page_bytes() == static_cast<std::int64_t>(head_page_bytes(plan)));
  CHECK(layer.baseline().pool().used_pages() == layer_pages);
  CHECK(ph->memory().allocated_bytes == Approx(head_pages * head_page_bytes(plan)));
  CHECK(ph->memory().allocated_bytes < layer.memory().allocated_bytes);
  // The same live tokens either way: only the padding differs.
  CHECK(ph->memory().live_bytes == Approx(layer.memory().live_bytes));
  // The chunk was allocated whole and its tail freed: reclaimed pages are counted.
  CHECK(ph->reclaimed_pages() ==
        static_cast<std::int64_t>(plan.rules.size()) * ceil_div(N, P) - head_pages);
  ph->release(0);
  CHECK(ph->baseline().pool().used_pages() == 0);
}

TEST_CASE("the per-head baseline admits by the prompt's estimated compressed size plus one chunk",
          "[per_head][issue30]") {
  auto plan = test::llama_plan("snapkv");
  // 16K tokens: beyond the profile's 4,128 protected tokens (sink 32 + window 4096).
  std::int64_t P = plan.geometry.page_tokens, N = 16384, c = 512;
  auto est = estimated_scorer(plan, 0.3);
  // By hand: every head holds at most max(kbar(N), kbar(N - c) + c) tokens while prefilling.
  std::int64_t per_head = ceil_div(std::max(est.per_head(N), est.per_head(N - c) + c), P);
  REQUIRE(per_head < ceil_div(N, P));  // less than the uncompressed prompt
  std::int64_t need = per_head * static_cast<std::int64_t>(plan.rules.size());
  auto make         = [&](std::int64_t pages) {
    return make_per_head_dynamic_policy(
        plan, static_cast<double>(pages) * head_page_bytes(plan), 2, 2, 1 << 20, nullptr, est, c);
  };
  CHECK(make(need)->start_turn(0, 0, N, 1, 0));
  CHECK_FALSE(make(need - 1)->start_turn(0, 0, N, 1, 0));
  // The continuation headroom of new sessions is asked for in every page table, uncompressed.
  CHECK(
      make(need + 2 * static_cast<std::int64_t>(plan.rules.size()))->start_turn(0, 0, N, 1, 2 * P));
  CHECK_FALSE(make(need + 2 * static_cast<std::int64_t>(plan.rules.size()) - 1)
                  ->start_turn(0, 0, N, 1, 2 * P));
  // The layer-wide baseline on the same bytes needs the whole uncompressed prompt.
  unified_policy layer(plan,
                       unified_mode::compressed_reclaim,
                       static_cast<double>(need) * head_page_bytes(plan),
                       2,
                       2,
                       1 << 20);
  CHECK_FALSE(layer.start_turn(0, 0, N, 1, 0));
  CHECK_THROWS_WITH(estimated_scorer(plan, 0).validate(), Catch::Contains("keep_ratio"));
}

TEST_CASE("a preempted request keeps its blocks as cache and resumes without recompute",
          "[replay][issue30]") {
  // Two 2-token prompts answered with 5 tokens each on 11 units. Both decode until step 5, when
  // they need 2 units and 1 is free: the newest (B, holding 5) is preempted. Kept as cache, its
  // units stay and A's decode fits in the one free unit; A finishes and leaves, B resumes where it
  // stopped. Dropped, B's 2 prompt tokens and 4 answer tokens are recomputed.
  workload w;
  w.sessions.push_back({0.0, {{2, 5, 0.0}}});
  w.sessions.push_back({0.0, {{2, 5, 0.0}}});
  auto m = model_preset("llama-3.1-8b");
  cost_model cost(m, gpu_spec{});
  unit_policy keep(11, true), drop(11, false);
  auto kept    = replay(w, keep, cost);
  auto dropped = replay(w, drop, cost);
  CHECK(kept.preemptions == 1);
  CHECK(kept.recomputed_tokens == 0);
  CHECK(kept.prefilled_tokens == 4);
  CHECK(kept.idle_evictions == 0);
  CHECK(dropped.preemptions == 1);
  CHECK(dropped.recomputed_tokens == 6);
  CHECK(dropped.prefilled_tokens == 4 + 6);
  for (auto const* r : {&kept, &dropped}) {
    CHECK(r->generated_tokens == 10);
    CHECK(r->completed_requests == 2);
    CHECK(r->rejected_sessions == 0);
  }
}
