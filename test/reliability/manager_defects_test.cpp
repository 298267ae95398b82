// SPDX-License-Identifier: Apache-2.0
// Regression tests for the memory-manager defects of issue 11: signed overflow in the size checks
// of admission and next turns (defect 1), a slot leaked by a rejected admission (defect 2), and
// the FlashInfer export / view reading freed or reused slots (defect 5). Every rejected call must
// leave the whole observable state unchanged (engine_sim's snapshot).
#include <cstdint>
#include <limits>
#include <vector>

#include "../memory/memory_fixtures.hpp"
#include "storm/engine_sim.hpp"
#include "tangram/eval/sim/simulated_memory_resource.hpp"
#include "tangram/interop/flashinfer.hpp"
#include "tangram/memory/host_memory_resource.hpp"
#include "tangram/memory/kv_cache_manager.hpp"
#include "tangram/memory/memory_resource.hpp"
#include "tangram/plan/build_static_plan.hpp"
#include "tangram/plan/footprint.hpp"

// The manager befriends this type so that a test can corrupt its slot bookkeeping on purpose and
// show that check_invariants notices (no correct call sequence can produce such a state).
namespace tangram::detail {
struct kv_cache_manager_test_access {
  template <class Manager>
  static std::vector<std::int32_t>& free_slots(Manager& m) {
    return m.sequences_.free_;
  }
  template <class Manager>
  static head_lengths& lengths(Manager& m) {
    return m.lengths_;
  }
};
}  // namespace tangram::detail

using namespace tangram;
using namespace tangram::test;

namespace {

constexpr std::int64_t i64_max = std::numeric_limits<std::int64_t>::max();
constexpr std::int64_t i32_max = std::numeric_limits<std::int32_t>::max();

/// Every id the manager could report on (live or not): slots 0..S-1 at generations 1..4.
std::vector<sequence_id> all_ids(kv_cache_manager const& m) {
  std::vector<sequence_id> ids;
  for (std::int32_t s = 0; s < m.max_sequences(); ++s)
    for (std::uint32_t g = 1; g <= 4; ++g) ids.push_back({s, g});
  return ids;
}

}  // namespace

TEST_CASE("try_admit: N + T past int64 is invalid_argument and changes nothing",
          "[regression][reliability][manager]") {
  auto plan = tiny_plan(tiny_budgets());
  host_memory_resource mr;
  kv_cache_manager m(plan, mr, opts(200, 3));
  auto live   = decoding(m, 6, 4);
  auto ids    = all_ids(m);
  auto before = snapshot(m, ids);
  struct size_pair {
    std::int64_t n, t;
  };
  // (1, INT64_MAX) used to wrap negative, pass `N + T <= 2^31 - 1` and be admitted with a tiny
  // reservation; its 16th decode step then failed after changing the state.
  for (auto [n, t] : {size_pair{1, i64_max},
                      size_pair{i64_max, 1},
                      size_pair{i64_max, i64_max},
                      size_pair{std::int64_t{1} << 62, std::int64_t{1} << 62},
                      size_pair{i64_max - 5, 6}}) {
    INFO("N " << n << " T " << t);
    TANGRAM_REQUIRE_THROWS_WITH_ALL(
        m.try_admit(n, t), invalid_argument, "prompt_tokens + max_new_tokens", "overflows");
    CHECK(snapshot(m, ids) == before);
    m.check_invariants();
  }
  // Sums that fit in int64 but exceed the per-sequence cap keep their own message.
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      m.try_admit(i32_max, 1), invalid_argument, "exceeds", "2147483647");
  CHECK(snapshot(m, ids) == before);
  // The largest valid size is answered by value ("does not fit" on this small pool).
  CHECK_FALSE(m.try_admit(i32_max - 1, 1).has_value());
  // The live sequence still decodes normally.
  m.set_batch({live});
  for (int k = 0; k < 4; ++k) m.decode_step();
  m.check_invariants();
}

TEST_CASE("continue_turn: n + N + T past int64 is invalid_argument and changes nothing",
          "[regression][reliability][manager]") {
  auto plan = tiny_plan(tiny_budgets());
  host_memory_resource mr;
  kv_cache_manager m(plan, mr, opts(200, 3));
  auto id = decoding(m, 7, 2);
  m.set_batch({id});
  m.decode_step();
  m.end_turn(id);
  auto n      = m.info(id).seq_tokens;
  auto ids    = all_ids(m);
  auto before = snapshot(m, ids);
  struct size_pair {
    std::int64_t n, t;
  };
  // (1, INT64_MAX) used to return true with a tiny reservation.
  for (auto [N, T] : {size_pair{1, i64_max},
                      size_pair{i64_max, 1},
                      size_pair{i64_max, i64_max},
                      size_pair{i64_max - n + 1, 0},
                      size_pair{i64_max - n - 1, 2}}) {
    INFO("N " << N << " T " << T);
    TANGRAM_REQUIRE_THROWS_WITH_ALL(
        (void)m.continue_turn(id, N, T), invalid_argument, "continue_turn", "overflows");
    CHECK(snapshot(m, ids) == before);
    m.check_invariants();
  }
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      (void)m.continue_turn(id, i32_max - n, 1), invalid_argument, "exceeds", "2147483647");
  CHECK(snapshot(m, ids) == before);
  REQUIRE(m.continue_turn(id, 3, 2));
  prefill(m, id, 3);
  m.check_invariants();
}

TEST_CASE("a rejected try_admit never leaks its slot", "[regression][reliability][manager]") {
  auto plan = tiny_plan(tiny_budgets());
  host_memory_resource mr;
  kv_cache_manager m(plan, mr, opts(200, 3));
  auto ids    = all_ids(m);
  auto before = snapshot(m, ids);
  // Each of these used to pop a free slot before the pool refused the (negative) page count.
  for (int k = 0; k < 2 * m.max_sequences(); ++k) {
    CHECK_THROWS_AS(m.try_admit(i64_max, 1), invalid_argument);
    CHECK(m.live_sequences() == 0);
    CHECK(snapshot(m, ids) == before);
    m.check_invariants();
  }
  // Every slot is still usable.
  std::vector<sequence_id> admitted;
  for (std::int32_t k = 0; k < m.max_sequences(); ++k) {
    auto id = m.try_admit(4, 1);
    REQUIRE(id);
    admitted.push_back(*id);
  }
  CHECK_FALSE(m.try_admit(1, 0).has_value());  // no slot left: "does not fit"
  for (auto id : admitted) m.free(id);
  m.check_invariants();
}

TEST_CASE("check_invariants catches leaked, duplicated and live slots on the free list",
          "[regression][reliability][manager]") {
  auto plan = tiny_plan(tiny_budgets());
  host_memory_resource mr;
  kv_cache_manager m(plan, mr, opts(200, 4));
  auto a = m.try_admit(5, 1);
  REQUIRE(a);
  m.check_invariants();
  auto& free_list = detail::kv_cache_manager_test_access::free_slots(m);
  auto saved      = free_list;
  REQUIRE(saved.size() == 3);

  // A leaked slot: free but on no list (what a rejected try_admit used to leave behind).
  free_list.pop_back();
  TANGRAM_REQUIRE_THROWS_WITH_ALL(m.check_invariants(), logic_error, "slot", "free list");
  free_list = saved;
  m.check_invariants();

  // A slot listed twice (it would be handed to two sequences).
  free_list.back() = free_list.front();
  TANGRAM_REQUIRE_THROWS_WITH_ALL(m.check_invariants(), logic_error, "twice");
  free_list = saved;

  // A live slot on the free list (the next admission would overwrite it).
  free_list.back() = a->slot;
  auto live_str    = "slot " + std::to_string(a->slot);
  TANGRAM_REQUIRE_THROWS_WITH_ALL(m.check_invariants(), logic_error, live_str.c_str());
  free_list = saved;
  m.check_invariants();
}

TEST_CASE("check_invariants catches a padding slot that holds tokens",
          "[regression][reliability][manager]") {
  auto plan = tiny_plan(tiny_budgets());
  host_memory_resource mr;
  kv_cache_manager m(plan, mr, opts(200, 4));
  auto a = m.try_admit(5, 1);
  REQUIRE(a);
  m.set_batch(batch_kind::decode, {*a}, 3);
  m.check_invariants();
  // Padding requests read the padding slot's rows: a token there would be read by every kernel.
  auto& lengths       = detail::kv_cache_manager_test_access::lengths(m);
  lengths.appended(4) = 2;
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      m.check_invariants(), logic_error, "padding slot 4: appended 2 and seq_tokens 0");
  lengths.appended(4) = 0;
  lengths.base(4)[5]  = 1;
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      m.check_invariants(), logic_error, "padding slot 4: head_base_len of head 5 is 1");
  lengths.base(4)[5] = 0;
  m.check_invariants();
}

TEST_CASE("view and the FlashInfer export reject a batch with a freed or reused member",
          "[regression][reliability][manager]") {
  auto plan = tiny_plan(tiny_budgets());
  host_memory_resource mr;
  kv_cache_manager m(plan, mr, opts(200, 3));
  auto a = decoding(m, 9, 3);
  auto b = decoding(m, 6, 3);
  m.set_batch({a, b});
  m.decode_step();
  flashinfer_paged_kv fi;
  export_flashinfer_layer(m, 0, fi);
  (void)m.view();

  // A freed member: its pages are back in the pool.
  m.free(a);
  auto sentinel = fi;
  auto ids      = all_ids(m);
  auto before   = snapshot(m, ids);
  auto slot_str = "slot " + std::to_string(a.slot);
  auto gen_str  = "generation " + std::to_string(a.generation);
  auto slot_a   = slot_str.c_str();
  auto gen_a    = gen_str.c_str();
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      export_flashinfer_layer(m, 0, fi), logic_error, "export_flashinfer_layer", slot_a, gen_a);
  CHECK(fi.indptr == sentinel.indptr);  // the caller's output is untouched
  CHECK(fi.indices == sentinel.indices);
  TANGRAM_REQUIRE_THROWS_WITH_ALL((void)m.view(), logic_error, "view", slot_a, gen_a);
  CHECK(snapshot(m, ids) == before);

  // The slot reused by another sequence: exporting would list that sequence's pages.
  auto c = m.try_admit(5, 1);
  REQUIRE(c);
  REQUIRE(c->slot == a.slot);
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      export_flashinfer_layer(m, 1, fi), logic_error, "export_flashinfer_layer", slot_a, gen_a);
  TANGRAM_REQUIRE_THROWS_WITH_ALL((void)m.view(), logic_error, "view", slot_a);
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      m.decode_step(), logic_error, "no longer a live sequence", slot_a);

  // A fresh batch is accepted again.
  m.set_batch({b});
  export_flashinfer_layer(m, 0, fi);
  CHECK(fi.indptr.size() == static_cast<std::size_t>(plan.num_kv_heads) + 1);
  CHECK(m.view().batch_size == 1);
  m.check_invariants();
}

TEST_CASE("FlashInfer's 32-bit virtual page ids are checked when the manager is built",
          "[regression][reliability][manager]") {
  // Hp = 1024: virtual page ids run up to num_pages * 2 * Hp, so 2^20 pages overflow int32.
  // One compressed layer of 1024 KV heads: one group of 1024 heads.
  model_spec model      = tiny_model();
  model.num_layers      = 1;
  model.num_kv_heads    = 1024;
  model.num_query_heads = 1024;
  model.layers          = uniform_layers(1);
  budget_profile profile;
  profile.model            = model.name;
  profile.num_model_layers = 1;
  profile.num_kv_heads     = 1024;
  profile.layer_ids        = {0};
  profile.sink_tokens      = 1;
  profile.window_tokens    = 2;
  profile.budgets.assign(1024, 0.5);
  plan_options po;
  po.reservation.mode      = reservation_mode::static_budgets;  // the profile has no keep ratio
  po.page_tokens           = 4;
  po.group_size            = 1024;
  po.split.limits.sm_count = 512;  // N_CTA >= 1024 heads of a layer
  auto plan                = build_static_plan(model, profile, po);
  REQUIRE(plan.geometry.group_size == 1024);
  simulated_memory_resource mr;
  auto limit     = (i32_max + 1) / (2 * 1024);  // 2^20
  auto limit_str = std::to_string(limit);
  TANGRAM_REQUIRE_THROWS_WITH_ALL(kv_cache_manager(plan, mr, opts(limit, 2)),
                                  invalid_argument,
                                  "num_pages",
                                  limit_str.c_str(),
                                  "group_size");
  manager_options by_bytes;
  by_bytes.pool_bytes    = limit * plan.geometry.page_bytes();
  by_bytes.max_sequences = 2;
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      kv_cache_manager(plan, mr, by_bytes), invalid_argument, "pool_bytes", "group_size");
  CHECK(mr.allocated_bytes() == 0);
  // One page less fits: the largest virtual id is (limit - 1) * 2 * Hp + Hp - 1 < 2^31.
  kv_cache_manager ok(plan, mr, opts(limit - 1, 2));
  CHECK(ok.pool().capacity() == limit - 1);
}

TEST_CASE("manager options whose derived sizes overflow name the field",
          "[regression][reliability][manager]") {
  auto plan = tiny_plan(tiny_budgets());
  simulated_memory_resource mr;
  auto max_str = std::to_string(i64_max);
  // 2 * num_pages used to overflow computing the default page-id arena.
  TANGRAM_REQUIRE_THROWS_WITH_ALL(kv_cache_manager(plan, mr, opts(i64_max, 2)),
                                  invalid_argument,
                                  "manager_options.num_pages",
                                  max_str.c_str());
  manager_options o = opts(0, 2);
  o.pool_bytes      = i64_max;
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      kv_cache_manager(plan, mr, o), invalid_argument, "manager_options.pool_bytes");
  o                  = opts(64, 2);
  o.max_view_changes = i64_max;  // used to reach vector::reserve
  TANGRAM_REQUIRE_THROWS_WITH_ALL(kv_cache_manager(plan, mr, o),
                                  invalid_argument,
                                  "manager_options.max_view_changes",
                                  max_str.c_str());
  CHECK(mr.allocated_bytes() == 0);
}

TEST_CASE("footprints reject sizes whose arithmetic would overflow",
          "[regression][reliability][manager]") {
  auto plan = tiny_plan(tiny_budgets());
  host_memory_resource mr;
  kv_cache_manager m(plan, mr, opts(64, 2));
  for (auto [n, t] : {std::pair<std::int64_t, std::int64_t>{i64_max, 1},
                      {1, i64_max},
                      {i64_max, 0},
                      {-1, 0},
                      {0, -1}}) {
    INFO("context " << n << " decode " << t);
    CHECK_THROWS_AS(footprint_pages(plan, n, t), invalid_argument);
    CHECK_THROWS_AS(footprint_bytes(plan, n, t), invalid_argument);
    CHECK_THROWS_AS(m.admission_pages(n, t), invalid_argument);
    std::vector<std::int64_t> per_group;
    CHECK_THROWS_AS(footprint_pages(plan, n, t, per_group), invalid_argument);
  }
  // Pages fit in int64 but bytes do not (64 KiB pages).
  auto wide              = plan;
  wide.geometry.head_dim = 1024;
  auto big               = std::int64_t{1} << 52;
  CHECK(footprint_pages(wide, big, 0) > 0);
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      footprint_bytes(wide, big, 0), invalid_argument, "footprint_bytes", "overflows");
  // Past 2^53 tokens the double arithmetic of the retention rule is refused.
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      footprint_pages(plan, max_footprint_tokens, 1), invalid_argument, "exceeds");
  // Ordinary sizes are unchanged: hand-checked sliding group (W 10, P 4) and the byte product.
  head_rule sliding{layer_kind::sliding_window, 1.0, 0, 10};
  CHECK(group_pages(sliding, 7, 2, 4) == 3);
  CHECK(group_pages(sliding, 7, 100, 4) == 3);
  CHECK(footprint_bytes(plan, 100, 20) == footprint_pages(plan, 100, 20) * plan.page_bytes());
}

TEST_CASE("expected_kept rejects chunk sizes outside the prompt tokens left",
          "[regression][reliability][manager]") {
  auto plan = tiny_plan(tiny_budgets());
  host_memory_resource mr;
  kv_cache_manager m(plan, mr, opts(64, 2));
  auto id = m.try_admit(8, 1);
  REQUIRE(id);
  std::vector<std::int32_t> kept(plan.rules.size(), -7);
  // Used to compute seq_tokens + chunk_tokens unchecked and cast the counts to int32.
  TANGRAM_REQUIRE_THROWS_WITH_ALL(m.expected_kept(*id, -1, kept.data()),
                                  invalid_argument,
                                  "expected_kept.chunk_tokens",
                                  "got -1");
  for (std::int64_t c : {i64_max, i32_max, std::int64_t{9}}) {
    INFO("chunk " << c);
    TANGRAM_REQUIRE_THROWS_WITH_ALL(
        m.expected_kept(*id, c, kept.data()), logic_error, "expected_kept", "8 prompt tokens left");
  }
  CHECK(kept == std::vector<std::int32_t>(plan.rules.size(), -7));
  m.expected_kept(*id, 8, kept.data());
  CHECK(kept[static_cast<std::size_t>(2 * plan.num_kv_heads)] == 8);  // layer 2: uncompressed
}
