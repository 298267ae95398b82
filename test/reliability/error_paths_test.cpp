// SPDX-License-Identifier: Apache-2.0
// Documented error paths of the public API that no other suite exercised (audit in
// docs/reliability.md): each call must throw the documented exception with a message naming the
// field and the offending value. Also the caps on sizes read from files: oversized documents are
// refused before anything proportional to the claimed size is allocated.
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>

#include "../memory/memory_fixtures.hpp"
#include "runtime.hpp"
#include "tangram/core/kv_view.hpp"
#include "tangram/eval/baselines/unified_paging.hpp"
#include "tangram/eval/io/workload_io.hpp"
#include "tangram/eval/sim/simulated_memory_resource.hpp"
#include "tangram/eval/split_imbalance.hpp"
#include "tangram/interop/flashinfer.hpp"
#include "tangram/io/budget_profile.hpp"
#include "tangram/io/detail/file_io.hpp"
#include "tangram/io/model_spec.hpp"
#include "tangram/io/retention_samples.hpp"
#include "tangram/io/static_plan.hpp"
#include "tangram/memory/host_memory_resource.hpp"
#include "tangram/memory/segment_arena.hpp"
#include "tangram/model/model_spec.hpp"
#include "tangram/plan/clustering.hpp"
#include "tangram/plan/head_rules.hpp"
#include "tangram/plan/split_planner.hpp"
#include "tangram/profile/budget_profile.hpp"
#include "tangram/profile/retention_samples.hpp"

using namespace tangram;
using namespace tangram::test;

namespace {

/// `n` comma-separated copies of `item` in a JSON array.
std::string json_array(std::size_t n, std::string const& item) {
  std::string s = "[";
  for (std::size_t i = 0; i < n; ++i) {
    if (i) s += ',';
    s += item;
  }
  return s + "]";
}

std::string layer_ids_json(std::int32_t n) {
  std::string s = "[";
  for (std::int32_t i = 0; i < n; ++i) s += (i ? "," : "") + std::to_string(i);
  return s + "]";
}

}  // namespace

TEST_CASE("manager options, plan checks and calls name the field and the value",
          "[reliability][errors][memory]") {
  auto plan = tiny_plan(tiny_budgets());
  simulated_memory_resource mr;
  auto with = [&](auto edit) {
    auto o = opts(10, 4);
    edit(o);
    return o;
  };
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      kv_cache_manager(plan, mr, with([](auto& o) { o.num_pages = -3; })),
      invalid_argument,
      "manager_options.num_pages",
      "got -3");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      kv_cache_manager(plan, mr, with([](auto& o) { o.pool_bytes = -1; })),
      invalid_argument,
      "manager_options.pool_bytes",
      "got -1");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      kv_cache_manager(plan, mr, with([](auto& o) { o.max_sequences = 0; })),
      invalid_argument,
      "manager_options.max_sequences",
      "got 0");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      kv_cache_manager(plan, mr, with([](auto& o) { o.max_sequences = (1 << 20) + 1; })),
      invalid_argument,
      "manager_options.max_sequences",
      "got 1048577");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      kv_cache_manager(plan, mr, with([](auto& o) { o.max_batch = 5; })),
      invalid_argument,
      "manager_options.max_batch",
      "max_sequences = 4",
      "got 5");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      kv_cache_manager(plan, mr, with([](auto& o) { o.index_capacity = std::int64_t{1} << 31; })),
      invalid_argument,
      "manager_options.index_capacity",
      "got 2147483648");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      kv_cache_manager(plan, mr, with([](auto& o) { o.max_view_changes = -7; })),
      invalid_argument,
      "manager_options.max_view_changes",
      "got -7");
  CHECK(mr.allocated_bytes() == 0);

  auto bad = plan;
  bad.rules.pop_back();
  TANGRAM_REQUIRE_THROWS_WITH_ALL(kv_cache_manager(bad, mr, opts(10, 4)),
                                  invalid_argument,
                                  "static_plan.rules",
                                  "expected 16",
                                  "got 15");
  bad                     = plan;
  bad.geometry.group_size = 4;
  TANGRAM_REQUIRE_THROWS_WITH_ALL(kv_cache_manager(bad, mr, opts(10, 4)),
                                  invalid_argument,
                                  "static_plan.geometry.group_size",
                                  "4",
                                  "grouping's 2");
  bad                      = plan;
  bad.geometry.page_tokens = 0;
  TANGRAM_REQUIRE_THROWS_WITH_ALL(kv_cache_manager(bad, mr, opts(10, 4)),
                                  invalid_argument,
                                  "page_geometry.page_tokens",
                                  "got 0");

  kv_cache_manager m(plan, mr, opts(200, 4));
  auto a = *m.try_admit(8, 2);
  prefill(m, a, 8);
  m.end_turn(a);
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      (void)m.continue_turn(a, 0, 1), invalid_argument, "continue_turn.prompt_tokens", "got 0");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      (void)m.continue_turn(a, 1, -4), invalid_argument, "continue_turn.max_new_tokens", "got -4");
  TANGRAM_REQUIRE_THROWS_WITH_ALL((void)m.continue_turn(a, std::int64_t{1} << 31, 0),
                                  invalid_argument,
                                  "seq_tokens + prompt_tokens + max_new_tokens",
                                  "2147483656",
                                  "exceeds 2147483647");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(m.set_batch(std::vector<sequence_id>(5, a)),
                                  invalid_argument,
                                  "set_batch: 5 sequences",
                                  "max_batch 4");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      m.execute_page_copies_host(), logic_error, "execute_page_copies_host", "simulated memory");
  flashinfer_paged_kv fi;
  TANGRAM_REQUIRE_THROWS_WITH_ALL(export_flashinfer_layer(m, 4, fi),
                                  invalid_argument,
                                  "export_flashinfer_layer.layer",
                                  "[0, 3]",
                                  "got 4");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(export_flashinfer_layer(m, -1, fi),
                                  invalid_argument,
                                  "export_flashinfer_layer.layer",
                                  "got -1");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      m.head_len(a, 4, 0), invalid_argument, "head_len", "(layer 4, head 0)", "4 x 4");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      m.group_page_count(a, 8), invalid_argument, "group_page_count", "group 8", "[0, 8)");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      m.group_target(a, -1), invalid_argument, "group_target", "group -1");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      m.info(sequence_id{9, 1}), logic_error, "info", "slot 9 is out of range [0, 4)");
  std::vector<std::int32_t> out(16);
  TANGRAM_REQUIRE_THROWS_WITH_ALL(m.expected_kept(sequence_id{1, 1}, 1, out.data()),
                                  logic_error,
                                  "expected_kept",
                                  "slot 1",
                                  "the slot is free");
  m.check_invariants();
}

TEST_CASE("resources, geometry, segment arena and baseline name the field and the value",
          "[reliability][errors][memory]") {
  host_memory_resource host;
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      (void)host.allocate(0), invalid_argument, "memory_resource::allocate: bytes", "got 0");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      (void)host.allocate(64, 3), invalid_argument, "alignment", "power of two", "got 3");
#if !defined(TANGRAM_TEST_SANITIZED)
  // Sanitizer allocators (g++ or clang builds) and valgrind abort on absurd sizes instead of
  // failing them.
  if (!under_valgrind())
    TANGRAM_REQUIRE_THROWS_WITH_ALL((void)host.allocate(std::size_t{1} << 62),
                                    out_of_memory,
                                    "host_memory_resource",
                                    "4611686018427387904 bytes");
#endif
  simulated_memory_resource sim(1000);
  auto* p = sim.allocate(600);
  TANGRAM_REQUIRE_THROWS_WITH_ALL((void)sim.allocate(500),
                                  out_of_memory,
                                  "simulated_memory_resource",
                                  "500 bytes",
                                  "600 of 1000");
  sim.deallocate(p, 600);

  page_geometry g{16, 4, 128, dtype::bf16};
  auto geo = [&](auto edit) {
    auto x = g;
    edit(x);
    return x;
  };
  TANGRAM_REQUIRE_THROWS_WITH_ALL(geo([](auto& x) { x.page_tokens = 4097; }).validate(),
                                  invalid_argument,
                                  "page_geometry.page_tokens",
                                  "got 4097");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(geo([](auto& x) { x.group_size = 0; }).validate(),
                                  invalid_argument,
                                  "page_geometry.group_size",
                                  "got 0");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(geo([](auto& x) { x.head_dim = 1025; }).validate(),
                                  invalid_argument,
                                  "page_geometry.head_dim",
                                  "got 1025");

  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      segment_arena(-5, 1), invalid_argument, "segment_arena.capacity", "got -5");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      segment_arena(10, 0), invalid_argument, "segment_arena.max_segments", "got 0");

  auto plan = tiny_plan(tiny_budgets());
  simulated_memory_resource mr;
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      unified_paging_baseline(plan, unified_mode::full_kv, mr, 16, 0, 64),
      invalid_argument,
      "unified_paging_baseline.max_sequences",
      "got 0");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      unified_paging_baseline(plan, unified_mode::full_kv, mr, 16, 2, -1),
      invalid_argument,
      "unified_paging_baseline.max_tokens",
      "got -1");
  unified_paging_baseline b(plan, unified_mode::full_kv, mr, 64, 2, 16);
  auto s = *b.try_admit();
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      (void)b.prefill_chunk(s, 17), logic_error, "chunk of 17 tokens", "max 16");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      (void)b.prefill_chunk(5, 1), logic_error, "unknown sequence slot 5");

  // validate_view: every structural field of a view a kernel would read.
  kv_cache_manager m(plan, mr, opts(64, 4));
  auto v = m.view();
  CHECK_NOTHROW(validate_view(v, "decode_params", 0));
  auto view = [&](auto edit) {
    auto x = v;
    edit(x);
    return x;
  };
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      validate_view(view([](auto& x) { x.pool = nullptr; }), "decode_params", 0),
      invalid_argument,
      "decode_params.kv.pool: null");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      validate_view(view([](auto& x) { x.pages = nullptr; }), "evict_params", 0),
      invalid_argument,
      "evict_params.kv: a page-table array is null");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      validate_view(view([](auto& x) { x.batch_size = 9; }), "decode_params", 0, 8),
      invalid_argument,
      "decode_params.kv.batch_size",
      "[0, 8]",
      "got 9");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(validate_view(view([](auto& x) {
                                                  x.batch_size  = 2;
                                                  x.batch_slots = nullptr;
                                                }),
                                                "decode_params",
                                                0),
                                  invalid_argument,
                                  "kv.batch_slots: null with batch_size 2");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      validate_view(view([](auto& x) { x.num_groups = 0; }), "decode_params", 0),
      invalid_argument,
      "num_groups must be >= 1",
      "got 4, 4, 0");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(validate_view(v, "decode_params", 4),
                                  invalid_argument,
                                  "decode_params.layer",
                                  "[0, 3]",
                                  "got 4");
}

TEST_CASE("plan options, grouping, split maps and split analysis name the field and the value",
          "[reliability][errors][plan]") {
  plan_options po;
  auto popt = [&](auto edit) {
    auto x = po;
    edit(x);
    return x;
  };
  TANGRAM_REQUIRE_THROWS_WITH_ALL(popt([](auto& x) { x.group_size = 0; }).validate(),
                                  invalid_argument,
                                  "plan_options.group_size",
                                  "got 0");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(popt([](auto& x) { x.page_tokens = 5000; }).validate(),
                                  invalid_argument,
                                  "plan_options.page_tokens",
                                  "got 5000");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(popt([](auto& x) { x.tp_size = 0; }).validate(),
                                  invalid_argument,
                                  "plan_options.tp_size",
                                  "got 0");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(popt([](auto& x) {
                                    x.tp_size = 2;
                                    x.tp_rank = 2;
                                  }).validate(),
                                  invalid_argument,
                                  "plan_options.tp_rank",
                                  "[0, 1]",
                                  "got 2");

  auto plan = tiny_plan(tiny_budgets());
  auto grp  = [&](auto edit) {
    auto x = plan.grouping;
    edit(x);
    return x;
  };
  TANGRAM_REQUIRE_THROWS_WITH_ALL(grp([](auto& x) { x.group_size = 0; }).validate(),
                                  invalid_argument,
                                  "head_grouping.group_size",
                                  "got 0");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(grp([](auto& x) { x.slots.pop_back(); }).validate(),
                                  invalid_argument,
                                  "head_grouping.slots",
                                  "expected 16",
                                  "got 15");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(grp([](auto& x) { x.groups.pop_back(); }).validate(),
                                  invalid_argument,
                                  "head_grouping.groups",
                                  "7 groups of 2",
                                  "16 heads");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(grp([](auto& x) {
                                    x.groups[3].members[1] = {7, 0};
                                  }).validate(),
                                  invalid_argument,
                                  "head_grouping.groups[3].members[1]",
                                  "(7, 0) out of range");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      grp([](auto& x) { x.groups[3].members[1] = x.groups[0].members[0]; }).validate(),
      invalid_argument,
      "is in more than one group");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      grp([](auto& x) { std::swap(x.slots[0], x.slots[1]); }).validate(),
      invalid_argument,
      "head_grouping.slots: head (0, ",
      "but is member");

  TANGRAM_REQUIRE_THROWS_WITH_ALL(cluster_heads(plan.rules, 0, 4, 2, grouping_scope::global),
                                  invalid_argument,
                                  "cluster_heads",
                                  "got 0 x 4");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(cluster_heads(plan.rules, 4, 3, 2, grouping_scope::global),
                                  invalid_argument,
                                  "cluster_heads: expected 12 rules",
                                  "got 16");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(cluster_heads(plan.rules, 4, 4, 0, grouping_scope::global),
                                  invalid_argument,
                                  "group_size",
                                  "got 0");

  auto sm  = plan.splits;
  auto spl = [&](auto edit) {
    auto x = sm;
    edit(x);
    return x;
  };
  TANGRAM_REQUIRE_THROWS_WITH_ALL(spl([](auto& x) { x.cta_begin.pop_back(); }).validate(),
                                  invalid_argument,
                                  "split_map.cta_begin",
                                  "expected 20");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(spl([](auto& x) { x.cta_begin[4] -= 1; }).validate(),
                                  invalid_argument,
                                  "split_map: layer 0 shares sum to");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(spl([](auto& x) { x.cta_begin[2] = x.cta_begin[1]; }).validate(),
                                  invalid_argument,
                                  "split_map: layer 0 head 1",
                                  "has 0 CTAs");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(spl([](auto& x) { x.limits.sm_count = 0; }).validate(),
                                  invalid_argument,
                                  "sm_count",
                                  "got 0");

  split_options so;
  TANGRAM_REQUIRE_THROWS_WITH_ALL(build_split_map(plan.rules, 4, 3, so),
                                  invalid_argument,
                                  "build_split_map: expected 12 rules",
                                  "got 16");
  so.reference_contexts.clear();
  TANGRAM_REQUIRE_THROWS_WITH_ALL(build_split_map(plan.rules, 4, 4, so),
                                  invalid_argument,
                                  "split_options.reference_contexts: empty");
  so.reference_contexts = {1024, 0};
  TANGRAM_REQUIRE_THROWS_WITH_ALL(build_split_map(plan.rules, 4, 4, so),
                                  invalid_argument,
                                  "split_options.reference_contexts",
                                  "got 0");
  so.reference_contexts   = {1024};
  so.reference_batch_size = 0;
  TANGRAM_REQUIRE_THROWS_WITH_ALL(build_split_map(plan.rules, 4, 4, so),
                                  invalid_argument,
                                  "split_options.reference_batch_size",
                                  "got 0");
  so.reference_batch_size = 4096;
  so.reference_batches    = 4096;
  TANGRAM_REQUIRE_THROWS_WITH_ALL(build_split_map(plan.rules, 4, 4, so),
                                  invalid_argument,
                                  "reference_batches x reference_batch_size",
                                  "4096 x 4096");
  so.reference_batches = 70000;
  TANGRAM_REQUIRE_THROWS_WITH_ALL(build_split_map(plan.rules, 4, 4, so),
                                  invalid_argument,
                                  "split_options.reference_batches",
                                  "got 70000");
  so                = split_options{};
  so.share_quantile = 1.5;
  TANGRAM_REQUIRE_THROWS_WITH_ALL(build_split_map(plan.rules, 4, 4, so),
                                  invalid_argument,
                                  "split_options.share_quantile",
                                  "got 1.5");
  so.share_quantile = std::nan("");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(build_split_map(plan.rules, 4, 4, so),
                                  invalid_argument,
                                  "split_options.share_quantile",
                                  "got nan");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(parse_split_weighting("tokens", "--weighting"),
                                  invalid_argument,
                                  "--weighting",
                                  "\"tokens\"");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(apportion({}, 4), invalid_argument, "apportion: no weights");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      apportion({1.0, -2.0}, 4), invalid_argument, "apportion: weight 1 is -2");

  std::vector<std::int64_t> lens{10, 20};
  std::vector<std::int64_t> loads(4);
  TANGRAM_REQUIRE_THROWS_WITH_ALL(plan_equal_split(lens.data(), 1, 2, 0),
                                  invalid_argument,
                                  "plan_equal_split",
                                  "got 1, 2, 0, 128");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      greedy_split_planner(0), invalid_argument, "greedy_split_planner: min_chunk", "got 0");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      greedy_split_planner(128, 0), invalid_argument, "chunks_per_slot", "got 0");
  greedy_split_planner gp;
  TANGRAM_REQUIRE_THROWS_WITH_ALL(gp.plan(lens.data(), 0, 2, 4, loads.data()),
                                  invalid_argument,
                                  "greedy_split_planner: batch",
                                  "got 0, 2, 4");
  auto rules = plan.rules;
  rules.pop_back();
  TANGRAM_REQUIRE_THROWS_WITH_ALL(split_evaluator(rules, plan.splits),
                                  invalid_argument,
                                  "split_evaluator: expected 16 rules",
                                  "got 15");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      layer_imbalance(plan.rules, plan.splits, {}), invalid_argument, "contexts: empty batch");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      log_uniform_contexts(-1, 1, 10, 1), invalid_argument, "count", "got -1");

  // Rules from a model and a profile that do not fit each other.
  budget_profile prof   = plan.profile;
  auto model            = tiny_model();
  prof.num_model_layers = 5;
  TANGRAM_REQUIRE_THROWS_WITH_ALL(head_rules_for(model, prof),
                                  invalid_argument,
                                  "profile.num_model_layers: 5",
                                  "\"tiny\"",
                                  "4 layers");
  prof              = plan.profile;
  prof.num_kv_heads = 2;
  prof.budgets.resize(4);
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      head_rules_for(model, prof), invalid_argument, "profile.num_kv_heads: 2", "4 KV heads");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      head_rules_for(model, plan.profile, 3), invalid_argument, "tp_size: 3", "4 KV heads");

  // Serialising an inconsistent plan names the field.
  auto bad = plan;
  bad.rules.pop_back();
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      to_json(bad), invalid_argument, "static_plan.rules", "expected 16", "got 15");
  bad = plan;
  bad.grouping.slots.pop_back();
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      to_json(bad), invalid_argument, "static_plan.grouping.slots", "got 15");
  bad = plan;
  bad.splits.phi.pop_back();
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      to_json(bad), invalid_argument, "static_plan.splits", "expected 20");
}

TEST_CASE("profiles, models, calibration inputs and workloads name the field and the value",
          "[reliability][errors][profile]") {
  TANGRAM_REQUIRE_THROWS_WITH_ALL(parse_budget_estimator("median", "--estimator"),
                                  invalid_argument,
                                  "--estimator",
                                  "unknown estimator \"median\"");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(parse_layer_kind("linear", "layers[2].kind"),
                                  invalid_argument,
                                  "layers[2].kind",
                                  "\"linear\"");

  auto base = tiny_plan(tiny_budgets()).profile;
  auto prof = [&](auto edit) {
    auto x = base;
    edit(x);
    return x;
  };
  TANGRAM_REQUIRE_THROWS_WITH_ALL(prof([](auto& x) { x.num_model_layers = 0; }).validate(),
                                  invalid_argument,
                                  "budget_profile.num_model_layers",
                                  "got 0");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(prof([](auto& x) { x.num_kv_heads = 1025; }).validate(),
                                  invalid_argument,
                                  "budget_profile.num_kv_heads",
                                  "got 1025");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(prof([](auto& x) { x.layer_ids.clear(); }).validate(),
                                  invalid_argument,
                                  "budget_profile.layer_ids: empty");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(prof([](auto& x) {
                                    x.layer_ids = {0, 4};
                                  }).validate(),
                                  invalid_argument,
                                  "budget_profile.layer_ids[1]",
                                  "[0, 3]",
                                  "got 4");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(prof([](auto& x) {
                                    x.layer_ids = {3, 0};
                                  }).validate(),
                                  invalid_argument,
                                  "budget_profile.layer_ids[1]",
                                  "strictly increasing",
                                  "got 0 after 3");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(prof([](auto& x) { x.sink_tokens = -1; }).validate(),
                                  invalid_argument,
                                  "budget_profile.sink_tokens",
                                  "got -1");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(prof([](auto& x) { x.window_tokens = -2; }).validate(),
                                  invalid_argument,
                                  "budget_profile.window_tokens",
                                  "got -2");
  auto text = to_json(base);
  auto pos  = text.find("0.25");
  REQUIRE(pos != std::string::npos);
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      parse_budget_profile(text.substr(0, pos) + "1.5" + text.substr(pos + 4), "p.json"),
      parse_error,
      "p.json",
      "budgets[0][1]",
      "budget must be in (0, 1]",
      "1.5");

  auto model = tiny_model();
  auto mod   = [&](auto edit) {
    auto x = model;
    edit(x);
    return x;
  };
  TANGRAM_REQUIRE_THROWS_WITH_ALL(mod([](auto& x) { x.num_layers = 0; }).validate(),
                                  invalid_argument,
                                  "model_spec.num_layers",
                                  "got 0");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(mod([](auto& x) { x.head_dim = 2048; }).validate(),
                                  invalid_argument,
                                  "model_spec.head_dim",
                                  "got 2048");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(mod([](auto& x) { x.num_query_heads = 0; }).validate(),
                                  invalid_argument,
                                  "model_spec.num_query_heads",
                                  "got 0");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(mod([](auto& x) { x.weight_bytes = -1; }).validate(),
                                  invalid_argument,
                                  "model_spec.weight_bytes",
                                  "got -1");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(mod([](auto& x) {
                                    x.weight_bytes        = 10;
                                    x.active_weight_bytes = 11;
                                  }).validate(),
                                  invalid_argument,
                                  "model_spec.active_weight_bytes",
                                  "got 11");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(mod([](auto& x) { x.active_parameters = 1e15; }).validate(),
                                  invalid_argument,
                                  "model_spec.active_parameters",
                                  "got 1e+15");

  // Retention samples built in code, checked by calibration.
  retention_samples s;
  s.num_kv_heads = 2;
  s.layer_ids    = {0};
  s.samples      = {{100, {10, 20}}, {50, {5}}};
  TANGRAM_REQUIRE_THROWS_WITH_ALL(calibrate(s),
                                  invalid_argument,
                                  "retention_samples.samples[1].kept",
                                  "expected 2 entries",
                                  "got 1");
  s.samples = {{0, {0, 0}}};
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      calibrate(s), invalid_argument, "retention_samples.samples[0].context_tokens", "got 0");
  s.samples.clear();
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      calibrate(s), invalid_argument, "retention_samples.samples: empty");
  s.samples = {{100, {10, 20}}};
  s.layer_ids.clear();
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      calibrate(s), invalid_argument, "retention_samples.layer_ids: empty");
  s.layer_ids    = {0};
  s.num_kv_heads = 0;
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      calibrate(s), invalid_argument, "retention_samples.num_kv_heads", "got 0");

  sim::workload_options w;
  auto wopt = [&](auto edit) {
    auto x = w;
    edit(x);
    return x;
  };
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      wopt([](auto& x) { x.turns = 0; }).validate(), invalid_argument, "workload.turns", "got 0");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(wopt([](auto& x) { x.arrival_rate = -1; }).validate(),
                                  invalid_argument,
                                  "workload.arrival_rate",
                                  "got -1");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      wopt([](auto& x) { x.arrival_rate = std::numeric_limits<double>::infinity(); }).validate(),
      invalid_argument,
      "workload.arrival_rate",
      "inf");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(wopt([](auto& x) { x.think_mean_s = -0.5; }).validate(),
                                  invalid_argument,
                                  "workload.think_mean_s",
                                  "got -0.5");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(wopt([](auto& x) { x.max_context = 100; }).validate(),
                                  invalid_argument,
                                  "workload.max_context",
                                  "got 100");
}

TEST_CASE("sizes read from files are capped before anything proportional is allocated",
          "[reliability][errors][limits]") {
  // retention-samples/v1: layers, heads, samples and samples x layers x heads.
  auto samples = [](std::string const& layers,
                    std::string const& ids,
                    std::string const& heads,
                    std::string const& list) {
    return "{\"format\":\"retention-samples/v1\",\"model\":\"m\",\"scorer\":\"s\","
           "\"target_keep_ratio\":0.5,\"sink_tokens\":4,\"window_tokens\":8,\"num_model_layers\":" +
           layers + ",\"layer_ids\":" + ids + ",\"num_kv_heads\":" + heads +
           ",\"samples\":" + list + "}";
  };
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      parse_retention_samples(samples("1025", "[0]", "8", "[0]"), "s.json"),
      parse_error,
      "s.json",
      "num_model_layers",
      "[1, 1024]",
      "got 1025");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      parse_retention_samples(samples("4", "[0]", "100000", "[0]"), "s.json"),
      parse_error,
      "num_kv_heads",
      "got 100000");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      parse_retention_samples(samples("4", "[0]", "8", json_array(100001, "0")), "s.json"),
      parse_error,
      "samples",
      "expected 1 to 100000 elements",
      "got 100001");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      parse_retention_samples(samples("1024", layer_ids_json(1024), "1024", json_array(100, "0")),
                              "s.json"),
      parse_error,
      "100 samples x 1024 layers x 1024 heads",
      "limit of 67108864 entries");

  // Budget profiles, model specs, static plans and workload traces.
  auto prof = to_json(tiny_plan(tiny_budgets()).profile);
  auto edit = [](std::string text, std::string const& from, std::string const& to) {
    auto at = text.find(from);
    REQUIRE(at != std::string::npos);
    return text.replace(at, from.size(), to);
  };
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      parse_budget_profile(edit(prof, "\"num_kv_heads\": 4", "\"num_kv_heads\": 4096"), "p.json"),
      parse_error,
      "num_kv_heads",
      "got 4096");
  auto model = to_json(model_preset("llama-3.1-8b"));
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      parse_model_spec(edit(model, "\"num_layers\": 32", "\"num_layers\": 100000"), "m.json"),
      parse_error,
      "num_layers",
      "got 100000");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      parse_model_spec(edit(model, "\"head_dim\": 128", "\"head_dim\": 65536"), "m.json"),
      parse_error,
      "head_dim",
      "got 65536");
  auto plan = to_json(tiny_plan(tiny_budgets()));
  auto refs = plan.find("\"reference_contexts\": [");
  REQUIRE(refs != std::string::npos);
  auto refs_end = plan.find(']', refs);
  auto big_refs = plan.substr(0, refs) + "\"reference_contexts\":" + json_array(1025, "1024") +
                  plan.substr(refs_end + 1);
  TANGRAM_REQUIRE_THROWS_WITH_ALL(parse_static_plan(big_refs, "plan.json"),
                                  parse_error,
                                  "reference_contexts",
                                  "expected 1 to 1024 elements",
                                  "got 1025");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      parse_static_plan(edit(plan, "\"share_quantile\": 0.95", "\"share_quantile\": 2"),
                        "plan.json"),
      parse_error,
      "share_quantile",
      "2");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      parse_static_plan(edit(plan, "\"reference_batches\": 256", "\"reference_batches\": 65536"),
                        "plan.json"),
      parse_error,
      "reference_batches",
      "65536 x 16");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      parse_static_plan(edit(plan,
                             "\"split_weighting\": \"batch_share\"",
                             "\"split_weighting\": \"expected_tokens\""),
                        "plan.json"),
      parse_error,
      "split_weighting",
      "expected_tokens");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      parse_static_plan(edit(plan, "\"tp_size\": 1", "\"tp_size\": 4096"), "plan.json"),
      parse_error,
      "tp_size",
      "got 4096");
  std::string turn = "{\"prompt_tokens\":10,\"output_tokens\":10}";
  auto trace       = [&](std::string const& sessions) {
    return "{\"format\":\"tangram-workload/v1\",\"sessions\":" + sessions + "}";
  };
  TANGRAM_REQUIRE_THROWS_WITH_ALL(sim::parse_workload(trace(json_array(1000001, "0")), "w.json"),
                                  parse_error,
                                  "sessions",
                                  "expected 1 to 1000000",
                                  "got 1000001");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      sim::parse_workload(trace("[{\"arrival_s\":0,\"turns\":" + json_array(10001, turn) + "}]"),
                          "w.json"),
      parse_error,
      "turns",
      "expected 1 to 10000",
      "got 10001");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      sim::parse_workload(
          trace(
              "[{\"arrival_s\":0,\"turns\":[{\"prompt_tokens\":2000000000,\"output_tokens\":1}]}]"),
          "w.json"),
      parse_error,
      "prompt_tokens",
      "got 2000000000");

  // Whole files: refused by size before they are read into memory.
  std::string path = std::string(TANGRAM_BINARY_DIR) + "/reliability_limit_test.json";
  detail::write_file(path, std::string(100, ' '));
  TANGRAM_REQUIRE_THROWS_WITH_ALL(detail::read_file(path, 64),
                                  invalid_argument,
                                  "reliability_limit_test.json",
                                  "limit of 64 bytes");
  CHECK(detail::read_file(path, 100).size() == 100);
  std::remove(path.c_str());
}
