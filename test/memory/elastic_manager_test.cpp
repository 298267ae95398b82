// SPDX-License-Identifier: Apache-2.0
// The manager under elastic reservation: admission reserves the scorer's total (plus staging
// for one chunk), each chunk's eviction places it per group within the turn's limit, staged
// pages return to the request's own reservation, decode never runs out, and the invariants hold
// under random operations. Worked by hand on the tiny model, then on every bundled profile.
#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "memory_fixtures.hpp"
#include "tangram/eval/sim/simulated_memory_resource.hpp"
#include "tangram/io/retention_samples.hpp"
#include "tangram/plan/elastic.hpp"
#include "tangram/plan/elastic_selection.hpp"
#include "tangram/plan/footprint.hpp"

using namespace tangram;
using namespace tangram::test;

namespace {

/// The compressed (pooled) groups of a plan, in group order, with their members' flat heads.
std::vector<std::vector<std::int32_t>> pooled_members(static_plan const& plan) {
  std::vector<std::vector<std::int32_t>> out;
  for (auto const& g : plan.grouping.groups) {
    if (g.rule.kind != layer_kind::compressed) continue;
    out.emplace_back();
    for (auto m : g.members) out.back().push_back(m.layer * plan.num_kv_heads + m.head);
  }
  return out;
}
std::vector<std::int32_t> pooled_group_ids(static_plan const& plan) {
  std::vector<std::int32_t> out;
  for (std::size_t g = 0; g < plan.grouping.groups.size(); ++g)
    if (plan.grouping.groups[g].rule.kind == layer_kind::compressed)
      out.push_back(static_cast<std::int32_t>(g));
  return out;
}

/// Kept counts after a chunk: every head keeps what expected_kept allows (its candidates), except
/// that pooled group k keeps min(length[k], candidates) in every member.
std::vector<std::int32_t> kept_with_lengths(kv_cache_manager const& m,
                                            sequence_id id,
                                            std::int64_t chunk,
                                            std::vector<std::int64_t> const& length) {
  std::vector<std::int32_t> kept(m.plan().rules.size());
  m.expected_kept(id, chunk, kept.data());
  auto groups = pooled_members(m.plan());
  for (std::size_t k = 0; k < groups.size(); ++k)
    for (auto h : groups[k])
      kept[static_cast<std::size_t>(h)] = static_cast<std::int32_t>(
          std::min<std::int64_t>(length[k], kept[static_cast<std::size_t>(h)]));
  return kept;
}

/// The tiny model under elastic reservation at margin 0.25 (binary: exact products), chunks of
/// at most 8 tokens, `pages` pages and 4 slots.
struct tiny_elastic {
  static_plan plan =
      tiny_plan(tiny_budgets(), 4, 2, 10, grouping_scope::global, elastic_reservation(0.25));
  simulated_memory_resource mr;
  kv_cache_manager m;
  explicit tiny_elastic(std::int64_t pages) : m(plan, mr, options(pages)) {}
  static manager_options options(std::int64_t pages) {
    auto o             = opts(pages, 4);
    o.max_chunk_tokens = 8;
    return o;
  }
};

}  // namespace

TEST_CASE("elastic: admission reserves the scorer's total, worked by hand", "[memory][elastic]") {
  // Tiny model: 8 compressed heads in G_c = 4 groups of Hp 2, P 4, protect 3, keep 0.5, m 0.25.
  // N 20, T 6: kbar = max(3, 10) = 10, K = 80, (1 + m) K = 100 head-tokens, R = ceil(100 / 8) =
  // 13 pages; decode 4 * ceil(6 / 4) = 8; staging (max chunk 8): 4 * 2 = 8; the compressed
  // groups share min(13 + max(8, 8), 4 * ceil(26 / 4) = 28) = 21 (a turn stages before it
  // decodes, never both). Sliding (2 groups, W 10): 3 each; uncompressed (2 groups): ceil(26 / 4)
  // = 7 each. Total 41, below the 8 groups' 7 + 7 + 3 + 3 + 7 + 7 + 7 + 7 = 48 uncompressed.
  tiny_elastic fx(200);
  auto const& plan = fx.plan;
  auto& m          = fx.m;
  CHECK(elastic_footprint_pages(plan, 0.25, 20, 6) == 13 + 8 + 6 + 14);
  CHECK(m.admission_pages(20, 6) == 41);
  CHECK(uncompressed_footprint_pages(plan, 20, 6) == 48);
  auto id = m.try_admit(20, 6);
  REQUIRE(id);
  CHECK(m.pool().reserved_pages() == 41);
  CHECK(m.elastic_page_limit(*id) == 13);
  for (auto g : pooled_group_ids(plan)) CHECK(m.group_reserved(*id, g) == 0);
  m.check_invariants();

  // A prompt shorter than the chunk bound stages only itself: N 4, T 0: R = 4 (every group's
  // protected page), staging 4 * ceil(4 / 4) = 4 (not 4 * ceil(8 / 4) = 8: no chunk of a 4-token
  // prompt is longer than 4); R + staging = 8 is capped at the groups' uncompressed 4 * 1 = 4
  // pages (no group ever holds more than the 4 tokens seen). Sliding and uncompressed groups 1
  // page each (4). Total 8: the uncompressed footprint exactly.
  CHECK(elastic_footprint_pages(plan, 0.25, 4, 0) == 8);
  CHECK(m.admission_pages(4, 0) == 8);
  CHECK(admission_footprint_pages(plan, 4, 0, 8) == 8);
  CHECK(uncompressed_footprint_pages(plan, 4, 0) == 8);
  auto small = m.try_admit(4, 0);
  REQUIRE(small);
  CHECK(m.pool().reserved_pages() == 41 + 8);
  m.prepare_chunk(*small, 4);
  std::vector<std::int32_t> small_kept(
      static_cast<std::size_t>(plan.num_layers * plan.num_kv_heads));
  m.expected_kept(*small, 4, small_kept.data());
  m.commit_chunk(*small, small_kept);
  m.check_invariants();
  m.free(*small);
  CHECK(m.pool().reserved_pages() == 41);

  // A static plan has no elastic limit; its admission is M(r).
  kv_cache_manager s(tiny_plan(tiny_budgets()), fx.mr, opts(200, 4));
  auto sid = s.try_admit(20, 6);
  REQUIRE(sid);
  CHECK(s.elastic_page_limit(*sid) == 0);
  CHECK(s.pool().reserved_pages() == footprint_pages(s.plan(), 20, 6));

  // The eviction's `wanted`: the scorer's total over the 8 compressed heads once the prepared
  // chunk is in. Nothing seen yet: 0. A chunk of 8: kbar = max(min(8, 3), ceil(0.5 x 8)) = 4 per
  // head, 32 in all; then 8 more tokens (n = 16): max(3, 8) = 8 per head, 64.
  CHECK(m.elastic_wanted_tokens(*id) == 0);
  m.prepare_chunk(*id, 8);
  CHECK(m.elastic_wanted_tokens(*id) == 32);
  std::vector<std::int32_t> kept(static_cast<std::size_t>(plan.num_layers * plan.num_kv_heads));
  m.expected_kept(*id, 8, kept.data());
  m.commit_chunk(*id, kept);
  m.prepare_chunk(*id, 8);
  CHECK(m.elastic_wanted_tokens(*id) == 64);
  CHECK(s.elastic_wanted_tokens(*sid) == 0);  // static budgets
  CHECK_THROWS_AS(m.elastic_wanted_tokens(sequence_id{3, 9}), tangram::logic_error);
}

TEST_CASE("elastic: chunks stage, evict into the limit, return staging, decode never runs out",
          "[memory][elastic]") {
  tiny_elastic fx(200);
  auto const& plan = fx.plan;
  auto& m          = fx.m;
  auto id          = *m.try_admit(20, 6);
  auto pooled      = pooled_group_ids(plan);

  // Chunk 1 (8 tokens): every compressed group stages ceil(8 / 4) = 2 pages from the shared
  // reservation; the eviction keeps lengths 8, 4, 3, 8 -> 2 + 1 + 1 + 2 = 6 pages (limit 13).
  // The prompt is not in: the groups keep their staged pages for the next chunk.
  m.prepare_chunk(id, 8);
  for (auto g : pooled) CHECK(m.group_page_count(id, g) == 2);
  auto reserved_staged = m.info(id).reserved_pages;
  m.commit_chunk(id, kept_with_lengths(m, id, 8, {8, 4, 3, 8}));
  for (auto g : pooled) CHECK(m.group_page_count(id, g) == 2);
  CHECK(compressed_pages_used(m, id) == 6);
  CHECK(m.stats().staging_pages_returned == 0);
  CHECK(m.info(id).reserved_pages == reserved_staged);
  CHECK(m.stats().reclaimed_pages == 0);
  m.check_invariants();

  // Chunk 2 stages 16, 12, 11, 16 tokens: 4 + 3 + 3 + 4 pages, of which it holds 2 each, so it
  // draws 6 (it drew 8 when chunk 1's unkept staging went back first). Keeping every candidate
  // would take 14 pages > 13: refused, nothing changes.
  m.prepare_chunk(id, 8);
  CHECK(compressed_pages_held(m, id) == 14);
  CHECK(m.stats().staging_pages_returned == 0);
  auto before = m.info(id);
  std::vector<std::int64_t> counts;
  for (std::int32_t g = 0; g < m.num_groups(); ++g) counts.push_back(m.group_page_count(id, g));
  TANGRAM_REQUIRE_THROWS_WITH_ALL(m.commit_chunk(id, kept_with_lengths(m, id, 8, {16, 16, 16, 16})),
                                  logic_error,
                                  "would hold 14 pages",
                                  "allows 13");
  CHECK(m.info(id).reserved_pages == before.reserved_pages);
  CHECK(m.info(id).chunk_pending == 8);
  for (std::int32_t g = 0; g < m.num_groups(); ++g)
    CHECK(m.group_page_count(id, g) == counts[static_cast<std::size_t>(g)]);
  m.check_invariants();
  // Exactly at the limit is fine: 16, 12, 11, 12 tokens = 4 + 3 + 3 + 3 = 13 pages.
  m.commit_chunk(id, kept_with_lengths(m, id, 8, {16, 12, 12, 12}));
  CHECK(compressed_pages_used(m, id) == 13);
  CHECK(compressed_pages_held(m, id) == 14);
  m.check_invariants();

  // Final chunk (4) stages 5 + 4 + 4 + 4 pages, drawing 3 more. Its commit keeps 16, 12, 8, 8
  // tokens: the prompt is in, so the groups' staging beyond 4 + 3 + 2 + 2 pages goes back into
  // the reservation (6 pages); the budget shrinks to what decode needs and the rest of the
  // reservation (staging, unused placement) returns to the pool.
  m.prepare_chunk(id, 4);
  CHECK(compressed_pages_held(m, id) == 17);
  m.commit_chunk(id, kept_with_lengths(m, id, 4, {16, 12, 8, 8}));
  CHECK(m.info(id).phase == sequence_phase::decode);
  CHECK(compressed_pages_held(m, id) == 11);
  CHECK(m.stats().staging_pages_returned == 6);
  // Decode 6 tokens: groups of 16 / 12 / 8 / 8 tokens grow to 22 / 18 / 14 / 14: 6 + 5 + 4 + 4
  // pages, from 4 + 3 + 2 + 2 held: 8 pooled pages; static groups need what they reserved.
  std::int64_t pooled_decode = 8;
  std::int64_t static_left   = 0;
  for (std::int32_t g = 0; g < m.num_groups(); ++g) static_left += m.group_reserved(id, g);
  CHECK(m.info(id).reserved_pages == pooled_decode + static_left);
  m.set_batch({id});
  for (int t = 0; t < 6; ++t) m.decode_step();
  CHECK(m.group_page_count(id, pooled[0]) == 6);
  CHECK(m.group_page_count(id, pooled[3]) == 4);
  CHECK(m.info(id).reserved_pages == 0);  // exact: nothing left over, nothing missing
  m.check_invariants();
  m.end_turn(id);
  m.free(id);
  CHECK(m.pool().used_pages() == 0);
  CHECK(m.pool().reserved_pages() == 0);
  CHECK(m.stats().reclaimed_pages == 0);
}

TEST_CASE(
    "elastic: a chunk keeps the previous chunk's staging and gives back what it does not need",
    "[memory][elastic]") {
  tiny_elastic fx(200);
  auto const& plan = fx.plan;
  auto& m          = fx.m;
  auto id          = *m.try_admit(20, 6);
  auto pooled      = pooled_group_ids(plan);
  auto counts      = [&] {
    std::vector<std::int64_t> c;
    for (auto g : pooled) c.push_back(m.group_page_count(id, g));
    return c;
  };
  using v = std::vector<std::int64_t>;
  // Chunk 1 (8): 2 pages a group, every candidate kept (8 pages of the limit 13).
  m.prepare_chunk(id, 8);
  m.commit_chunk(id, kept_with_lengths(m, id, 8, {8, 8, 8, 8}));
  CHECK(counts() == v{2, 2, 2, 2});
  // Chunk 2 (8): 16 candidates a group, 4 pages each (the 2 held + 2 drawn); group 0 keeps 16,
  // the others 4: 4 + 1 + 1 + 1 pages used, 16 held.
  m.prepare_chunk(id, 8);
  CHECK(counts() == v{4, 4, 4, 4});
  m.commit_chunk(id, kept_with_lengths(m, id, 8, {16, 4, 4, 4}));
  CHECK(counts() == v{4, 4, 4, 4});
  CHECK(compressed_pages_used(m, id) == 7);
  auto reserved    = m.info(id).reserved_pages;
  auto others_held = [&] {  // pages of the static groups (they draw for the chunk too)
    std::int64_t n = 0;
    for (std::int32_t g = 0; g < m.num_groups(); ++g)
      if (std::find(pooled.begin(), pooled.end(), g) == pooled.end())
        n += m.group_page_count(id, g);
    return n;
  };
  auto others_before = others_held();
  CHECK(m.stats().staging_pages_returned == 0);
  m.clear_view_changes();
  // Chunk 3 (1 token) stages ceil(17 / 4) = 5 and ceil(5 / 4) = 2 pages: group 0 draws one, the
  // others give 2 each back into the reservation before anything is drawn. The page lists a
  // device mirror must upload change by that one entry (and the static groups' growth), where
  // giving the staging back at each commit made every group draw again.
  m.prepare_chunk(id, 1);
  CHECK(counts() == v{5, 2, 2, 2});
  CHECK(!m.changes().full_resync);
  CHECK(static_cast<std::int64_t>(m.changes().num_page_entries) ==
        1 + others_held() - others_before);
  CHECK(m.stats().staging_pages_returned == 6);
  CHECK(m.info(id).reserved_pages == reserved + 6 - 1 - (others_held() - others_before));
  m.check_invariants();
  m.commit_chunk(id, kept_with_lengths(m, id, 1, {17, 5, 5, 5}));
  CHECK(counts() == v{5, 2, 2, 2});
  // Chunk 4 (the last 3 tokens) stages 5 and 2 pages again: nothing moves; its commit keeps
  // 20, 8, 8, 8 tokens, exactly what the groups hold, so nothing goes back either.
  auto drawn = m.stats().pages_drawn, others = others_held();
  m.prepare_chunk(id, 3);
  CHECK(counts() == v{5, 2, 2, 2});
  CHECK(m.stats().pages_drawn - drawn == others_held() - others);  // no compressed page drawn
  m.commit_chunk(id, kept_with_lengths(m, id, 3, {20, 8, 8, 8}));
  CHECK(m.info(id).phase == sequence_phase::decode);
  CHECK(counts() == v{5, 2, 2, 2});
  CHECK(m.stats().staging_pages_returned == 6);
  m.check_invariants();
  m.free(id);
  CHECK(m.pool().used_pages() == 0);
  CHECK(m.pool().reserved_pages() == 0);
  CHECK(m.stats().reclaimed_pages == 0);
}

TEST_CASE("elastic: bad chunk sizes and misuse change nothing", "[memory][elastic]") {
  tiny_elastic fx(200);
  auto const& plan = fx.plan;
  auto& m          = fx.m;
  auto id          = *m.try_admit(20, 6);
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      m.prepare_chunk(id, 9), invalid_argument, "chunk_tokens", "9", "max_chunk_tokens = 8");
  CHECK(m.info(id).chunk_pending == 0);
  m.check_invariants();
  // A head may not keep more than its candidates under elastic either.
  m.prepare_chunk(id, 8);
  std::vector<std::int32_t> kept(plan.rules.size());
  m.expected_kept(id, 8, kept.data());
  kept[0] = 9;
  REQUIRE_THROWS_AS(m.commit_chunk(id, kept), logic_error);
  m.check_invariants();
  // Options and plan: a margin out of range, a plan without a keep ratio.
  auto o               = tiny_elastic::options(200);
  auto bad             = o;
  bad.max_chunk_tokens = 0;
  auto& mr             = fx.mr;
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      kv_cache_manager(plan, mr, bad), invalid_argument, "max_chunk_tokens", "0");
  auto no_ratio                      = plan;
  no_ratio.profile.target_keep_ratio = 0;
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      kv_cache_manager(no_ratio, mr, o), invalid_argument, "target_keep_ratio");
  auto big_margin                       = plan;
  big_margin.options.reservation.margin = 11;
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      kv_cache_manager(big_margin, mr, o), invalid_argument, "reservation.margin", "11");
}

TEST_CASE("elastic: random turns, forks and frees keep every invariant", "[memory][elastic]") {
  auto plan =
      tiny_plan(tiny_budgets(), 4, 2, 10, grouping_scope::global, elastic_reservation(0.15));
  auto members = pooled_members(plan);
  for (std::uint64_t seed : {1u, 2u, 3u, 4u}) {
    std::mt19937_64 rng(seed);
    auto o             = opts(400, 6);
    o.max_chunk_tokens = 12;
    simulated_memory_resource mr;
    kv_cache_manager m(plan, mr, o);
    std::vector<sequence_id> live;
    std::int64_t clipped = 0, wanted = 0;
    auto pick = [&](std::int64_t lo, std::int64_t hi) {
      return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng);
    };
    for (int step = 0; step < 600; ++step) {
      auto op = pick(0, 9);
      if (op <= 1 || live.empty()) {
        if (auto id = m.try_admit(pick(1, 60), pick(0, 12))) live.push_back(*id);
      } else {
        auto k  = static_cast<std::size_t>(pick(0, static_cast<std::int64_t>(live.size()) - 1));
        auto id = live[k];
        auto in = m.info(id);
        if (in.phase == sequence_phase::prefill) {
          auto c = std::min<std::int64_t>(pick(1, 12), in.prompt_remaining);
          m.prepare_chunk(id, c);
          auto staged = compressed_pages_held(m, id);
          // The eviction's own batch, padded to a random capacity (CUDA-graph style): the
          // decode batch is left as it is.
          m.set_batch(batch_kind::prefill, {id}, static_cast<std::size_t>(pick(0, 6)));
          REQUIRE(m.view(batch_kind::prefill).batch_slots[0] == id.slot);
          // The scorer wants a random share of each head's candidates; the optimal placement
          // within the limit picks the groups' lengths; padding heads keep their next-best.
          std::vector<std::int32_t> cand(plan.rules.size());
          m.expected_kept(id, c, cand.data());
          std::vector<std::int64_t> needs;
          std::vector<std::int32_t> order;
          std::int64_t n = m.info(id).seq_tokens + c;
          for (auto const& g : members)
            for (auto h : g) {
              needs.push_back(pick(std::min<std::int64_t>(3, cand[static_cast<std::size_t>(h)]),
                                   cand[static_cast<std::size_t>(h)]));
              order.push_back(static_cast<std::int32_t>(order.size()));
            }
          reference::elastic_selection_input sel;
          sel.needs        = &needs;
          sel.members      = &order;
          sel.group_size   = 2;
          sel.page_tokens  = 4;
          sel.candidates   = n;
          sel.protect      = 0;
          sel.budget_pages = m.elastic_page_limit(id);
          auto r           = reference::select_group_lengths(sel);
          REQUIRE(r.fits);
          std::vector<std::int64_t> lengths;
          for (auto p : r.group_pages) lengths.push_back(p * 4);
          m.commit_chunk(id, kept_with_lengths(m, id, c, lengths));
          clipped += r.wanted_clipped();
          wanted += r.wanted_total;
          CHECK(compressed_pages_used(m, id) <= m.elastic_page_limit(id));
          // Until the prompt is in, the groups keep exactly the chunk's staged pages.
          if (m.info(id).phase == sequence_phase::prefill)
            CHECK(compressed_pages_held(m, id) == staged);
          else
            CHECK(compressed_pages_held(m, id) == compressed_pages_used(m, id));
        } else if (in.phase == sequence_phase::decode && op <= 5) {
          if (in.decoded < in.max_new) {
            m.set_batch(batch_kind::decode, {id}, static_cast<std::size_t>(pick(0, 6)));
            m.decode_step();
            REQUIRE(m.info(id).decoded == in.decoded + 1);
          } else {
            m.end_turn(id);
          }
        } else if (in.phase == sequence_phase::ended && op <= 5) {
          (void)m.continue_turn(id, pick(1, 30), pick(0, 8));
        } else if (op <= 7 && in.phase != sequence_phase::prefill) {
          if (auto c = m.fork(id)) live.push_back(*c);
          m.complete_page_copies();
        } else {
          m.free(id);
          live.erase(live.begin() + static_cast<std::ptrdiff_t>(k));
        }
      }
      m.check_invariants();
    }
    CHECK(m.stats().reclaimed_pages == 0);
    // The walk reached every path: continued turns, forks with copies, staging returned.
    CHECK(m.stats().turns_continued > 0);
    CHECK(m.stats().forks > 0);
    CHECK(m.stats().page_copies > 0);
    CHECK(m.stats().staging_pages_returned > 0);
    CHECK(wanted > 0);
    CHECK(clipped <= wanted);
    for (auto id : live) m.free(id);
    m.complete_page_copies();
    CHECK(m.pool().used_pages() == 0);
    CHECK(m.pool().reserved_pages() == 0);
  }
}

TEST_CASE("elastic on every bundled profile: the manager holds what calibrate predicts",
          "[memory][elastic][profiles]") {
  // Each bundled sample is one request (N = its context, T = 256, one chunk): admission reserves
  // exactly admission_footprint_pages; the optimal placement of the sample's own per-head
  // needs fits the limit; pages held never exceed it; nothing is reclaimed; after prefill only
  // the decode pages stay reserved. Elastic reserves less than the static plan at mu + 2 sigma.
  // In calibrate's ratio units the manager's compressed reservation equals calibrate's
  // in-sample reserved_over_ideal at the same margin (the acceptance asks for 2%).
  struct profile_case {
    char const* model;
    char const* file;
    char const* scorer;
  };
  std::vector<profile_case> cases;
  for (char const* scorer : {"snapkv", "keydiff", "ea", "fastkvzip"}) {
    cases.push_back({"llama-3.1-8b", "llama-3.1-8b-instruct.json", scorer});
    cases.push_back({"qwen3-4b", "qwen3-4b-instruct-2507.json", scorer});
  }
  // Groups of 4 at margin 0.15, and the defaults: per-head pages (Hp 1) at default_elastic_margin.
  for (std::int32_t hp : {4, 1})
    for (auto const& pc : cases) {
      auto const* scorer  = pc.scorer;
      std::string rel     = std::string("profiles/") + scorer + "/" + pc.file;
      double const margin = hp == 1 ? default_elastic_margin : 0.15;
      INFO(rel << " Hp " << hp << " margin " << margin);
      auto samples = load_retention_samples(data_path(rel));
      auto model   = model_preset(pc.model);
      REQUIRE(samples.layer_ids.size() ==
              static_cast<std::size_t>(model.num_layers));  // kept is by flat head
      auto plan =
          real_plan(model, rel, 16, hp, grouping_scope::global, 1, 0, elastic_reservation(margin));
      auto stat          = real_plan(model, rel, 16, hp, grouping_scope::global);
      auto members       = pooled_members(plan);
      std::int64_t max_n = 0;
      for (auto const& s : samples.samples) max_n = std::max(max_n, s.context_tokens);
      auto o             = opts(1 << 22, 4);
      o.max_chunk_tokens = max_n;
      simulated_memory_resource mr;
      kv_cache_manager m(plan, mr, o);
      std::int64_t elastic_reserved = 0, static_reserved = 0, wanted = 0, clipped = 0;
      double compressed_ratio = 0, kept_ratio = 0;  // calibrate's ratio units
      double const cell = hp * 16.0;
      for (std::size_t k = 0; k < samples.samples.size(); ++k) {
        auto n  = samples.samples[k].context_tokens;
        auto id = m.try_admit(n, 256);
        REQUIRE(id);
        // Staging: one chunk of at most min(max_chunk_tokens, n) = n tokens per compressed group,
        // instead of the 256 answer tokens (a turn stages before it decodes), capped at the
        // groups' uncompressed ceil((n + 256) / 16) pages each (every head here is compressed).
        auto Gc      = static_cast<std::int64_t>(members.size());
        auto staging = Gc * ((n + 15) / 16);
        CHECK(m.info(*id).reserved_pages ==
              std::min(m.elastic_page_limit(*id) + std::max(staging, Gc * 16),
                       Gc * ((n + 256 + 15) / 16)));
        CHECK(m.info(*id).reserved_pages == admission_footprint_pages(plan, n, 256, max_n));
        elastic_reserved += elastic_footprint_pages(plan, margin, n, 256);
        // The compressed groups' share of the reservation: the footprint without decode pages and
        // without the groups the plan does not compress (none in these profiles: every head of the
        // bundled models is compressed).
        compressed_ratio +=
            static_cast<double>(m.elastic_page_limit(*id)) * cell / static_cast<double>(n);
        auto const& kk = samples.samples[k].kept;
        kept_ratio += static_cast<double>(std::accumulate(kk.begin(), kk.end(), std::int64_t{0})) /
                      static_cast<double>(n);
        static_reserved += footprint_pages(stat, n, 256);
        m.prepare_chunk(*id, n);
        // The sample's needs, flat head index -> the pooled heads in group order.
        auto const& kept = samples.samples[k].kept;
        std::vector<std::int64_t> needs;
        std::vector<std::int32_t> order;
        for (auto const& g : members)
          for (auto h : g) {
            needs.push_back(std::min<std::int64_t>(kept[static_cast<std::size_t>(h)], n));
            order.push_back(static_cast<std::int32_t>(order.size()));
          }
        reference::elastic_selection_input sel;
        sel.needs        = &needs;
        sel.members      = &order;
        sel.group_size   = hp;
        sel.page_tokens  = 16;
        sel.candidates   = n;
        sel.protect      = plan.profile.protected_tokens();
        sel.budget_pages = m.elastic_page_limit(*id);
        auto r           = reference::select_group_lengths(sel);
        REQUIRE(r.fits);
        std::vector<std::int64_t> lengths;
        for (auto p : r.group_pages) lengths.push_back(p * 16);
        m.commit_chunk(*id, kept_with_lengths(m, *id, n, lengths));
        CHECK(compressed_pages_held(m, *id) == r.pages_used);
        CHECK(r.pages_used <= m.elastic_page_limit(*id));
        wanted += r.wanted_total;
        clipped += r.wanted_clipped();
        m.check_invariants();
        m.free(*id);
      }
      CHECK(m.stats().reclaimed_pages == 0);
      // In-sample clipping with the plan's groups: well under 1% (none with per-head pages).
      CHECK(static_cast<double>(clipped) < 0.01 * static_cast<double>(wanted));
      if (hp == 1) CHECK(clipped == 0);
      CHECK(elastic_reserved < static_reserved);
      elastic_options eo;
      eo.group_size = hp;
      eo.margin     = margin;
      auto rep      = evaluate_elastic(samples, eo, evaluation_options{0});
      double mgr    = compressed_ratio / kept_ratio;
      // Same R(n) formula on both sides, so equal up to rounding (Hp 4: 1.144-1.146 on these
      // profiles; Hp 1: 1.015-1.017); the acceptance only asks for 2%.
      CHECK(mgr == Approx(rep.reserved_over_ideal).epsilon(1e-9));
    }
}

TEST_CASE("elastic: an eviction may drop pages whose copy is still pending (found by review)",
          "[memory][elastic][regression]") {
  // A forked session continues; its shared compressed pages are copied (pending). The engine
  // runs chunks before completing the copies and its eviction drops copied pages: the sequence
  // must not lose reservation, so later chunks and decode never run short.
  tiny_elastic fx(400);
  auto const& plan = fx.plan;
  auto& m          = fx.m;
  auto keep        = [&](sequence_id id, std::int64_t c, std::int64_t len) {
    return kept_with_lengths(
        m, id, c, std::vector<std::int64_t>(pooled_group_ids(plan).size(), len));
  };
  auto p = *m.try_admit(16, 8);
  m.prepare_chunk(p, 8);
  m.commit_chunk(p, keep(p, 8, 8));
  m.prepare_chunk(p, 8);
  m.commit_chunk(p, keep(p, 8, 8));
  m.end_turn(p);
  auto c = *m.fork(p);
  m.complete_page_copies();
  REQUIRE(m.continue_turn(p, 56, 8));
  REQUIRE(!m.pending_copies().empty());
  m.prepare_chunk(p, 8);
  m.commit_chunk(p, keep(p, 8, 0));  // legal: the eviction keeps nothing, copies still pending
  m.check_invariants();
  while (m.info(p).prompt_remaining > 0) {
    auto L = m.elastic_page_limit(p);
    auto n = std::min<std::int64_t>(8, m.info(p).prompt_remaining);
    m.prepare_chunk(p, n);  // threw "need 8 more pages but 5 are reserved" before the fix
    m.commit_chunk(p, keep(p, n, (L / 4) * 4));
    m.check_invariants();
  }
  m.set_batch({p});
  for (int t = 0; t < 8; ++t) m.decode_step();
  m.check_invariants();
  m.complete_page_copies();
  m.free(p);
  m.free(c);
  CHECK(m.pool().used_pages() == 0);
  CHECK(m.pool().reserved_pages() == 0);
}
