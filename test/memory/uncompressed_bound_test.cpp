// SPDX-License-Identifier: Apache-2.0
// Never worse than uncompressed (issue 29 item 6): no admission reserves more pages than the same
// request takes uncompressed on the same pages, staging, margin and answer included. Swept over
// every prompt length 1..2048, a random geometric sample up to 64K and several answer lengths, for
// static and elastic plans from every bundled profile and from synthetic profiles of other model
// presets (a sliding-window hybrid with sinks, a 4-KV-head MoE, ...). The uncompressed footprint
// is counted independently, head by head from the model's layers; the manager's own reservation
// is read back from a manager. Elastic admissions at the bound are then run through their whole
// prefill and answer with the evictions keeping as much as the limit allows (the most pages the
// turn can hold), so a reservation cut to the bound is shown to suffice.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "memory_fixtures.hpp"
#include "tangram/eval/sim/simulated_memory_resource.hpp"
#include "tangram/io/retention_samples.hpp"
#include "tangram/plan/elastic_selection.hpp"
#include "tangram/plan/footprint.hpp"

using namespace tangram;
using namespace tangram::test;

namespace {

/// A plan and a label for the sweep's messages.
struct sweep_plan {
  std::string label;
  static_plan plan;
};

/// Pages the request of N prompt and T answer tokens takes uncompressed, counted head by head from
/// the model (not from the plan's groups): a head of a sliding-window layer holds min(N + T, W)
/// tokens, every other head N + T, in whole pages of P tokens; Hp heads share a page. Valid for
/// plans whose groups never mix windows (every plan here: groups hold heads of one rule kind, and
/// each sliding model has one window).
std::int64_t uncompressed_by_heads(static_plan const& plan, std::int64_t N, std::int64_t T) {
  std::int64_t head_pages = 0, P = plan.geometry.page_tokens;
  for (std::int32_t l = 0; l < plan.num_layers; ++l) {
    auto const& layer   = plan.model.layers[static_cast<std::size_t>(plan.first_layer + l)];
    std::int64_t tokens = layer.kind == layer_kind::sliding_window
                              ? std::min<std::int64_t>(N + T, layer.window)
                              : N + T;
    head_pages += plan.num_kv_heads * ((tokens + P - 1) / P);
  }
  return head_pages / plan.grouping.group_size;
}

/// A synthetic profile of `model`: every full-attention layer profiled with random budgets in
/// [0.02, 0.9], sink 4 and window 60 tokens, global keep ratio 0.3.
budget_profile synthetic_profile(model_spec const& model, std::mt19937& rng) {
  budget_profile p;
  p.model             = model.name;
  p.num_model_layers  = model.num_layers;
  p.num_kv_heads      = model.num_kv_heads;
  p.sink_tokens       = 4;
  p.window_tokens     = 60;
  p.target_keep_ratio = 0.3;
  std::uniform_real_distribution<double> budget(0.02, 0.9);
  for (std::int32_t l = 0; l < model.num_layers; ++l) {
    if (model.layers[static_cast<std::size_t>(l)].kind == layer_kind::sliding_window) continue;
    p.layer_ids.push_back(l);
    for (std::int32_t h = 0; h < model.num_kv_heads; ++h) p.budgets.push_back(budget(rng));
  }
  return p;
}

/// Static and elastic (default margin) plans from every bundled profile, and from synthetic
/// profiles of other presets: a sliding-window hybrid with learned sinks (gpt-oss-20b), one with
/// five sliding layers per global one (gemma-3-12b), a 4-KV-head MoE (qwen3-30b-a3b), a 4-KV-head
/// dense model (qwen2.5-7b) and an 80-layer one (llama-3.1-70b).
std::vector<sweep_plan> sweep_plans() {
  std::vector<sweep_plan> out;
  reservation_options elastic;  // the library's default: elastic at the default margin
  REQUIRE(elastic.mode == reservation_mode::elastic);
  for (auto const& rel : bundled_profiles()) {
    auto samples = load_retention_samples(data_path("profiles/" + rel));
    auto model   = model_preset(samples.model);
    auto profile = calibrate(samples);
    for (auto r : {static_reservation(), elastic}) {
      plan_options o;
      o.reservation = r;
      out.push_back({rel + " " + std::string(to_string(r.mode)),
                     build_static_plan(model, profile, o, samples)});
    }
  }
  std::mt19937 rng(29);
  for (char const* name :
       {"gpt-oss-20b", "gemma-3-12b", "qwen3-30b-a3b", "qwen2.5-7b", "llama-3.1-70b"}) {
    auto model   = model_preset(name);
    auto profile = synthetic_profile(model, rng);
    for (auto r : {static_reservation(), elastic}) {
      plan_options o;
      o.reservation = r;
      out.push_back({std::string(name) + " (synthetic) " + std::string(to_string(r.mode)),
                     build_static_plan(model, profile, o)});
    }
  }
  return out;
}

/// Every prompt length 1..2048, then a random geometric sample up to 64K (65,536 included).
std::vector<std::int64_t> prompt_lengths() {
  std::vector<std::int64_t> out;
  for (std::int64_t n = 1; n <= 2048; ++n) out.push_back(n);
  std::mt19937 rng(64);
  std::uniform_real_distribution<double> e(std::log(2049.0), std::log(65536.0));
  for (int i = 0; i < 160; ++i) out.push_back(static_cast<std::int64_t>(std::exp(e(rng))));
  for (std::int64_t n : {4095, 4096, 4097, 4127, 4128, 4129, 8191, 8192, 8193, 16384, 65536})
    out.push_back(n);
  return out;
}

/// One elastic turn walked to its end with evictions that keep as much as the limit allows:
/// every chunk's need is every candidate, the optimal placement fills the limit, each head keeps
/// min(its group's length, its candidates); then the whole answer is decoded. The sequence never
/// draws beyond its admission (held + reserved stays <= what was admitted), and the invariants
/// hold after every call.
void walk_greedy_turn(kv_cache_manager& m, std::int64_t N, std::int64_t T) {
  auto const& plan      = m.plan();
  std::int64_t admitted = m.admission_pages(N, T);
  auto id               = m.try_admit(N, T);
  REQUIRE(id);
  REQUIRE(m.info(*id).reserved_pages == admitted);
  std::vector<std::vector<std::int32_t>> members;
  for (auto const& g : plan.grouping.groups) {
    if (g.rule.kind != layer_kind::compressed) continue;
    members.emplace_back();
    for (auto mb : g.members) members.back().push_back(mb.layer * plan.num_kv_heads + mb.head);
  }
  auto holds = [&] {
    auto i = m.info(*id);
    return i.held_pages + i.reserved_pages;
  };
  std::vector<std::int32_t> kept(plan.rules.size());
  while (m.info(*id).prompt_remaining > 0) {
    std::int64_t c = std::min(m.info(*id).prompt_remaining, m.options().max_chunk_tokens);
    m.prepare_chunk(*id, c);
    REQUIRE(holds() <= admitted);
    m.expected_kept(*id, c, kept.data());  // pooled heads: every candidate
    std::vector<std::int64_t> needs;
    std::vector<std::int32_t> order;
    for (auto const& g : members)
      for (auto h : g) {
        needs.push_back(kept[static_cast<std::size_t>(h)]);
        order.push_back(static_cast<std::int32_t>(order.size()));
      }
    reference::elastic_selection_input sel;
    sel.needs        = &needs;
    sel.members      = &order;
    sel.group_size   = plan.grouping.group_size;
    sel.page_tokens  = plan.geometry.page_tokens;
    sel.candidates   = m.info(*id).seq_tokens + c;
    sel.protect      = plan.profile.protected_tokens();
    sel.budget_pages = m.elastic_page_limit(*id);
    auto r           = reference::select_group_lengths(sel);
    REQUIRE(r.fits);
    for (std::size_t k = 0; k < members.size(); ++k)
      for (auto h : members[k])
        kept[static_cast<std::size_t>(h)] = static_cast<std::int32_t>(std::min<std::int64_t>(
            r.group_pages[k] * plan.geometry.page_tokens, kept[static_cast<std::size_t>(h)]));
    m.commit_chunk(*id, kept);
    REQUIRE(holds() <= admitted);
  }
  m.set_batch({*id});
  for (std::int64_t t = 0; t < T; ++t) m.decode_step();
  REQUIRE(holds() <= admitted);
  CHECK(m.stats().reclaimed_pages == 0);
  m.check_invariants();
  m.free(*id);
}

}  // namespace

TEST_CASE("no admission reserves more than the same request uncompressed",
          "[memory][uncompressed_bound][issue29]") {
  auto const lengths           = prompt_lengths();
  std::int64_t const answers[] = {0, 1, 15, 16, 17, 256, 4096};
  std::int64_t const chunks[]  = {8192, 512, 65536};  // max_chunk_tokens, one per plan in turn
  std::int64_t checked = 0, elastic_below = 0, elastic_checked = 0;
  auto plans = sweep_plans();
  REQUIRE(plans.size() == 2 * (bundled_profiles().size() + 5));
  for (std::size_t k = 0; k < plans.size(); ++k) {
    auto const& sp   = plans[k];
    auto const& plan = sp.plan;
    INFO(sp.label);
    bool elastic       = plan.options.reservation.mode == reservation_mode::elastic;
    auto o             = opts(uncompressed_by_heads(plan, 65536, 4096) + 1, 1);
    o.max_chunk_tokens = chunks[k % 3];
    simulated_memory_resource mr;
    kv_cache_manager m(plan, mr, o);
    for (auto N : lengths)
      for (auto T : answers) {
        INFO("N " << N << " T " << T << " max_chunk_tokens " << o.max_chunk_tokens);
        std::int64_t bound = uncompressed_by_heads(plan, N, T);
        REQUIRE(uncompressed_footprint_pages(plan, N, T) == bound);
        std::int64_t pages = admission_footprint_pages(plan, N, T, o.max_chunk_tokens);
        REQUIRE(pages <= bound);
        REQUIRE(m.admission_pages(N, T) == pages);
        auto id = m.try_admit(N, T);
        REQUIRE(id);
        REQUIRE(m.info(*id).reserved_pages == pages);
        m.free(*id);
        ++checked;
        // Well past the protected tokens and twice a chunk's staging (a 64K-token chunk stages the
        // whole prompt: capped at the bound exactly).
        if (elastic && N >= 16384 && o.max_chunk_tokens <= 8192) {
          ++elastic_checked;
          elastic_below += pages < bound;
        }
      }
  }
  CHECK(checked == static_cast<std::int64_t>(plans.size() * lengths.size() * std::size(answers)));
  // The bound binds short prompts only: from 16K tokens on every elastic admission stays below it.
  CHECK(elastic_checked > 0);
  CHECK(elastic_below == elastic_checked);
}

TEST_CASE("an elastic reservation cut to the uncompressed bound suffices for the whole turn",
          "[memory][uncompressed_bound][issue29]") {
  // The cut binds below the protected tokens (4,128 for the bundled profiles, where every head
  // keeps everything) and around a chunk or two of staging; the walk keeps the most the limit
  // allows at every chunk, the worst case for pages held.
  for (auto const& sp : sweep_plans()) {
    auto const& plan = sp.plan;
    if (plan.options.reservation.mode != reservation_mode::elastic) continue;
    INFO(sp.label);
    for (std::int64_t chunk : {512, 8192}) {
      auto o             = opts(uncompressed_by_heads(plan, 20000, 300) + 1, 1);
      o.max_chunk_tokens = chunk;
      simulated_memory_resource mr;
      kv_cache_manager m(plan, mr, o);
      for (std::int64_t N : {1, 5, 16, 17, 100, 600, 4095, 4128, 4129, 8192, 9000, 20000})
        for (std::int64_t T : {0, 1, 300}) {
          INFO("N " << N << " T " << T << " max_chunk_tokens " << chunk);
          REQUIRE(m.admission_pages(N, T) <= uncompressed_footprint_pages(plan, N, T));
          walk_greedy_turn(m, N, T);
        }
    }
  }
}

TEST_CASE("elastic admission, worked by hand at the uncompressed bound",
          "[memory][uncompressed_bound][issue29]") {
  // Llama-3.1-8B, snapkv, margin 0.15, P 16, Hp 4 (the defaults when issue 29 measured it; set
  // here, so later defaults do not change the hand-worked case): 64 compressed groups, protect
  // 4,128 tokens (every head keeps everything below it), T 256, max_chunk_tokens 8192. Issue 29
  // measured 1.67x / 1.94x / 1.56x the uncompressed footprint at N 512 / 4,096 / 8,192.
  // N 512: R = 64 x 32 = 2,048, decode 64 x 16 = 1,024, staging 64 x 32 = 2,048;
  //   min(2,048 + max(1,024, 2,048), 64 x ceil(768 / 16) = 3,072) = 3,072 = uncompressed (1.00x).
  // N 4,096: R = 64 x 256 = 16,384, staging 16,384: min(32,768, 64 x 272 = 17,408) = 17,408.
  // N 8,192: R + staging 64 x 512 = 32,768 exceeds the uncompressed 64 x 528 = 33,792: capped.
  auto samples = load_retention_samples(data_path("profiles/snapkv/llama-3.1-8b-instruct.json"));
  plan_options po;
  po.group_size         = 4;
  po.reservation.margin = 0.15;
  auto plan = build_static_plan(model_preset("llama-3.1-8b"), calibrate(samples), po, samples);
  REQUIRE(plan.options.reservation.mode == reservation_mode::elastic);
  REQUIRE(compressed_group_count(plan) == 64);
  REQUIRE(plan.profile.protected_tokens() == 4128);
  CHECK(admission_footprint_pages(plan, 512, 256, 8192) == 3072);
  CHECK(uncompressed_footprint_pages(plan, 512, 256) == 3072);
  CHECK(admission_footprint_pages(plan, 4096, 256, 8192) == 17408);
  CHECK(admission_footprint_pages(plan, 8192, 256, 8192) == 33792);
  // Above the bound's reach the staging still counts once, not beside the answer: N 32,768,
  // R + max(1,024, 32,768).
  scorer_total t{0.3, 4128, keep_ratio_basis::all_tokens};
  auto R =
      elastic_compressed_pages(t, 256, 4, 16, plan.options.reservation.margin_or_default(), 32768);
  CHECK(admission_footprint_pages(plan, 32768, 256, 8192) == R + 32768);
  CHECK(elastic_footprint_pages(plan, plan.options.reservation.margin_or_default(), 32768, 256) ==
        R + 1024);
  // The defaults, per-head pages (Hp 1: 256 one-head groups, pages of a quarter the size) at
  // N 512: R 256 x 32 = 8,192, staging 8,192, uncompressed 256 x 48 = 12,288 = the bound (1.00x).
  auto per_head = build_static_plan(model_preset("llama-3.1-8b"), calibrate(samples), {}, samples);
  REQUIRE(compressed_group_count(per_head) == 256);
  CHECK(admission_footprint_pages(per_head, 512, 256, 8192) == 12288);
  CHECK(uncompressed_footprint_pages(per_head, 512, 256) == 12288);
}
