// SPDX-License-Identifier: Apache-2.0
// The manager's two batches (batch_kind::decode and batch_kind::prefill) and fixed-capacity
// batches with padding requests, worked by hand on the tiny plan: each kind's view, what
// set_batch of one kind leaves of the other, what decode_step does to padding, every refusal
// (naming the field and the value, nothing changed) and the extents the padding slot adds.
#include <numeric>

#include "memory_fixtures.hpp"
#include "storm/engine_sim.hpp"
#include "tangram/memory/host_memory_resource.hpp"

using namespace tangram;
using namespace tangram::test;

namespace {

std::vector<std::int32_t> slots_of(kv_cache_view const& v) {
  return {v.batch_slots, v.batch_slots + v.batch_size};
}

}  // namespace

TEST_CASE("two batches: each kind has its own view, the views share every page-table array",
          "[memory][manager][batches]") {
  tiny_manager fx(opts(200, 6));
  auto& m = fx.m;
  auto a = decoding(m, 20, 5), b = decoding(m, 9, 3);
  auto c = *m.try_admit(12, 2);  // in prefill
  // Nothing set: both batches empty.
  CHECK(m.batch_size(batch_kind::decode) == 0);
  CHECK(m.batch_size(batch_kind::prefill) == 0);
  CHECK(m.view(batch_kind::prefill).batch_size == 0);

  m.set_batch(batch_kind::decode, {b, a});
  m.set_batch(batch_kind::prefill, {c, a});  // a in both batches: allowed
  auto dv = m.view(batch_kind::decode), pv = m.view(batch_kind::prefill);
  CHECK(slots_of(dv) == std::vector<std::int32_t>{b.slot, a.slot});
  CHECK(slots_of(pv) == std::vector<std::int32_t>{c.slot, a.slot});
  CHECK(m.view().batch_slots == dv.batch_slots);  // view() is the decode view
  CHECK(pv.batch_slots != dv.batch_slots);
  CHECK(pv.pool == dv.pool);
  CHECK(pv.pages == dv.pages);
  CHECK(pv.page_offset == dv.page_offset);
  CHECK(pv.head_base_len == dv.head_base_len);
  CHECK(pv.appended == dv.appended);
  CHECK(pv.seq_tokens == dv.seq_tokens);
  CHECK(pv.head_slots == dv.head_slots);
  CHECK(pv.padding_slot == 6);  // one past the 6 sequence slots
  CHECK(m.batch_sequence(batch_kind::prefill, 0) == c);
  CHECK(m.batch_sequence(1) == a);  // the decode batch
  CHECK(m.batch_padding(batch_kind::decode) == 0);

  // Setting one kind leaves the other as it was, including across a failed set.
  m.set_batch(batch_kind::prefill, {c});
  CHECK(slots_of(m.view()) == std::vector<std::int32_t>{b.slot, a.slot});
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      m.set_batch(batch_kind::decode, {a, b, a}), logic_error, "set_batch", "listed twice");
  CHECK(slots_of(m.view()) == std::vector<std::int32_t>{b.slot, a.slot});
  CHECK(slots_of(m.view(batch_kind::prefill)) == std::vector<std::int32_t>{c.slot});

  // The legacy calls mean the decode batch; decode_step touches only its members.
  m.set_batch({a});
  CHECK(m.batch_size() == 1);
  CHECK(m.batch_size(batch_kind::prefill) == 1);
  auto before_c = m.info(c);
  m.decode_step();
  CHECK(m.info(a).appended == 1);
  CHECK(m.info(b).appended == 0);
  CHECK(m.info(c).seq_tokens == before_c.seq_tokens);

  // The prefill batch's chunk: prepare, commit; the decode view still shows a's new token.
  m.prepare_chunk(c, 12);
  CHECK(m.view(batch_kind::prefill).seq_tokens[c.slot] == 0);  // state before the chunk
  std::vector<std::int32_t> kept(m.plan().rules.size());
  m.expected_kept(c, 12, kept.data());
  m.commit_chunk(c, kept);
  CHECK(m.view(batch_kind::prefill).seq_tokens[c.slot] == 12);
  CHECK(m.view().head_len(0, 2, 0) == 21);  // a, uncompressed layer: 20 + 1

  // A freed member: only the view of its batch refuses; check_batch_live names the kind's op.
  m.free(c);
  CHECK_NOTHROW(m.view());
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      m.view(batch_kind::prefill), logic_error, "view: batch request 0", "freed");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      m.check_batch_live(batch_kind::prefill, "evict"), logic_error, "evict: batch request 0");
  m.set_batch(batch_kind::prefill, {});
  CHECK(m.view(batch_kind::prefill).batch_size == 0);
  m.check_invariants();

  // An unknown kind is bad input, named.
  auto bad = static_cast<batch_kind>(7);
  TANGRAM_REQUIRE_THROWS_WITH_ALL(m.set_batch(bad, {a}),
                                  invalid_argument,
                                  "set_batch.kind: must be batch_kind::decode or "
                                  "batch_kind::prefill, got 7");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(m.view(bad), invalid_argument, "view.kind", "got 7");
  CHECK_THROWS_AS(m.batch_size(bad), invalid_argument);
  CHECK_THROWS_AS(m.batch_sequence(bad, 0), invalid_argument);
  CHECK(to_string(batch_kind::prefill) == "prefill");
}

TEST_CASE("padded batches: requests past the members name the padding slot and hold nothing",
          "[memory][manager][batches]") {
  auto plan = tiny_plan(tiny_budgets());  // L = 4, H = 4, G = 8
  host_memory_resource mr;
  kv_cache_manager m(plan, mr, opts(200, 6));  // max_batch = 6
  auto a = decoding(m, 20, 5), b = decoding(m, 9, 3);
  m.check_invariants();

  // Extents count the padding slot's rows: 6 + 1 slots.
  auto e = m.view_extents();
  CHECK(e.slots == 7);
  CHECK(e.page_offset == 7 * 8);
  CHECK(e.head_base_len == 7 * 16);
  CHECK(e.batch == 6);

  m.set_batch(batch_kind::decode, {b, a}, 5);
  CHECK(m.batch_size() == 5);
  CHECK(m.batch_padding(batch_kind::decode) == 3);
  auto v = m.view();
  CHECK(slots_of(v) == std::vector<std::int32_t>{b.slot, a.slot, 6, 6, 6});
  CHECK_FALSE(v.is_padding(1));
  CHECK(v.is_padding(2));
  CHECK(v.is_padding(4));
  for (std::int32_t r = 2; r < 5; ++r)
    for (std::int32_t l = 0; l < 4; ++l)
      for (std::int32_t h = 0; h < 4; ++h) CHECK(v.head_len(r, l, h) == 0);
  // The padding slot's rows: zero.
  CHECK(v.appended[6] == 0);
  CHECK(v.seq_tokens[6] == 0);
  for (std::int32_t g = 0; g < 8; ++g) CHECK(v.page_offset[6 * 8 + g] == 0);
  for (std::int32_t h = 0; h < 16; ++h) CHECK(v.head_base_len[6 * 16 + h] == 0);
  TANGRAM_REQUIRE_THROWS_WITH_ALL(m.batch_sequence(2),
                                  invalid_argument,
                                  "batch_sequence.r: request 2 of the decode batch is a padding "
                                  "request (requests 2 to 4 are padding) and has no sequence");
  CHECK(m.batch_sequence(1) == a);

  // decode_step skips padding: a and b get one token each, nothing else moves.
  auto pool_before = m.pool().stats();
  m.decode_step();
  CHECK(m.info(a).decoded == 1);
  CHECK(m.info(b).decoded == 1);
  CHECK(m.pool().stats().reserved + m.pool().stats().used ==
        pool_before.reserved + pool_before.used);
  m.check_invariants();

  // Per-request counts: one per request, padding included, padding counts 0.
  std::vector<std::int32_t> counts{1, 2, 0, 0, 0};
  m.decode_step(counts);
  CHECK(m.info(b).decoded == 2);
  CHECK(m.info(a).decoded == 3);
  auto snap = snapshot(m, {a, b});
  TANGRAM_REQUIRE_THROWS_WITH_ALL(m.decode_step(std::vector<std::int32_t>{1, 1}),
                                  invalid_argument,
                                  "decode_step.tokens: expected 5 counts (one per request of the "
                                  "decode batch, padding included), got 2");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(m.decode_step(std::vector<std::int32_t>{0, 0, 0, 1, 0}),
                                  invalid_argument,
                                  "decode_step.tokens[3]: request 3 is a padding request and "
                                  "appends nothing, got 1");
  CHECK(snapshot(m, {a, b}) == snap);

  // Bad padded sizes: named, batch unchanged.
  TANGRAM_REQUIRE_THROWS_WITH_ALL(m.set_batch(batch_kind::decode, {a, b}, 1),
                                  invalid_argument,
                                  "set_batch.padded_size: must be 0 (no padding) or in [count = "
                                  "2, max_batch = 6], got 1");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      m.set_batch(batch_kind::prefill, {a}, 7), invalid_argument, "max_batch = 6], got 7");
  CHECK(snapshot(m, {a, b}) == snap);

  // All padding (an idle graph replay) and exactly full: both fine.
  m.set_batch(batch_kind::prefill, std::vector<sequence_id>{}, 6);
  CHECK(m.batch_size(batch_kind::prefill) == 6);
  CHECK(m.batch_padding(batch_kind::prefill) == 6);
  CHECK(slots_of(m.view(batch_kind::prefill)) == std::vector<std::int32_t>(6, 6));
  m.set_batch(batch_kind::decode, {a, b}, 2);
  CHECK(m.batch_padding(batch_kind::decode) == 0);
  m.check_invariants();

  // A freed member is found; padding requests are never "freed".
  m.set_batch(batch_kind::decode, {a}, 4);
  m.free(b);
  CHECK_NOTHROW(m.view());
  m.free(a);
  TANGRAM_REQUIRE_THROWS_WITH_ALL(m.decode_step(), logic_error, "batch request 0");
  m.set_batch(batch_kind::decode, std::vector<sequence_id>{}, 3);
  m.decode_step();  // only padding: nothing to do
  CHECK(m.pool().stats().used == 0);
  CHECK(m.pool().stats().reserved == 0);
  m.check_invariants();
}

TEST_CASE("engine_sim: mixed steps on padded batches keep every token where the model says",
          "[memory][manager][batches]") {
  tiny_manager fx(opts(300, 6));
  auto& m = fx.m;
  engine_sim sim(m, 7, 0.0);
  auto a = *sim.admit(20, 6), b = *sim.admit(9, 4), c = *sim.admit(30, 3);
  sim.chunk(a, 20);
  sim.chunk(b, 9);
  sim.verify();
  // Step 1: c's first chunk beside decodes of a and b, decode batch padded to 4, prefill to 3.
  sim.mixed_step({c}, {12}, {a, b}, 3, 4);
  sim.verify();
  // Step 2: c's last chunk beside a alone, no padding on the prefill side.
  sim.mixed_step({c}, {18}, {a}, 0, 6);
  sim.verify();
  // Step 3: all three decode, prefill batch empty (padded: an idle eviction graph).
  sim.mixed_step({}, {}, {c, a, b}, 2, 0);
  sim.verify();
  CHECK(m.info(a).decoded == 3);
  CHECK(m.info(b).decoded == 2);
  CHECK(m.info(c).decoded == 1);
  for (auto id : sim.ids()) sim.free(id);
  CHECK(m.pool().stats().used == 0);
  CHECK(m.pool().stats().reserved == 0);
  m.check_invariants();
}
