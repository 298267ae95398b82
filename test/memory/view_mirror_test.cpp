// SPDX-License-Identifier: Apache-2.0
// The CUDA-free half of kv_view_mirror (device/detail/mirror_layout.hpp): the packed layout, and
// the ranges one sync refreshes in its shadow and uploads. A "device" byte vector receives ONLY
// the uploaded ranges, from two alternating shadows exactly as the CUDA class does; after every
// step of random operation storms (engine_sim: admit, chunks with fused eviction, decode steps,
// speculative appends and rollbacks, extensions, turns, forks, frees, aborts, batch changes) it
// must equal every array of the manager's host view byte for byte, padding zero.
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "memory_fixtures.hpp"
#include "storm/mirror_storms.hpp"
#include "tangram/device/detail/mirror_layout.hpp"
#include "tangram/eval/sim/simulated_memory_resource.hpp"

using namespace tangram;
using namespace tangram::test;
using detail::mirror_array;
using detail::mirror_range;

namespace Catch {
template <>
struct StringMaker<mirror_range> {
  static std::string convert(mirror_range r) {
    return "[" + std::to_string(r.begin) + ", " + std::to_string(r.end) + ")";
  }
};
}  // namespace Catch

namespace {

char const* name_of(std::size_t a) {
  static char const* const names[] = {"head_slots",
                                      "group_window",
                                      "group_ring_pages",
                                      "page_offset",
                                      "pinned_tokens",
                                      "head_base_len",
                                      "pages",
                                      "appended",
                                      "seq_tokens",
                                      "batch_slots",
                                      "prefill_batch_slots"};
  return names[a];
}

/// kv_view_mirror without CUDA: the stager, two shadows, and the device block as bytes.
struct host_mirror {
  detail::mirror_stager stager;
  std::vector<std::byte> shadow[2], device;
  int next           = 0;
  std::int64_t syncs = 0, full_syncs = 0, bytes = 0, copies = 0;

  explicit host_mirror(kv_cache_manager const& m,
                       std::int64_t merge_gap = detail::mirror_stager::default_merge_gap)
      : stager(m.view_extents(), m.options().max_view_changes, merge_gap) {
    auto n    = static_cast<std::size_t>(stager.layout().total);
    shadow[0] = shadow[1] = std::vector<std::byte>(n, std::byte{0});
    // Garbage, not zeros: the first sync must upload every byte.
    device.assign(n, std::byte{0xA5});
  }

  void sync(kv_cache_manager& m) {
    int b = next;
    stager.stage(m.changes(),
                 m.view(batch_kind::decode),
                 m.view(batch_kind::prefill),
                 shadow[b].data(),
                 shadow[1 - b].data());
    for (auto r : stager.uploads()) {
      REQUIRE(r.begin >= 0);
      REQUIRE(r.begin < r.end);
      REQUIRE(r.end <= stager.layout().total);
      std::memcpy(device.data() + r.begin,
                  shadow[b].data() + r.begin,
                  static_cast<std::size_t>(r.end - r.begin));
    }
    ++syncs;
    full_syncs += stager.staged_full();
    bytes += stager.upload_bytes();
    copies += static_cast<std::int64_t>(stager.uploads().size());
    stager.commit();
    m.clear_view_changes();
    next = 1 - b;
  }
};

/// Every array of the host view (at its full extent) equals the device copy; padding is zero.
void require_mirrored(host_mirror const& hm, kv_cache_manager const& m) {
  auto const& l = hm.stager.layout();
  auto v = m.view(batch_kind::decode), pv = m.view(batch_kind::prefill);
  std::int64_t covered = 0;
  for (std::size_t a = 0; a < detail::mirror_array_count; ++a) {
    auto const* host = detail::mirror_layout::host_array(v, pv, static_cast<mirror_array>(a));
    auto const* dev  = hm.device.data() + l.offset[a];
    auto n           = static_cast<std::size_t>(l.bytes[a]);
    if (n > 0 && std::memcmp(host, dev, n) != 0) {
      std::size_t i = 0;
      while (host[i] == dev[i]) ++i;
      INFO("array " << name_of(a) << " differs at element " << i / 4 << " of " << n / 4);
      REQUIRE(false);
    }
    // Padding up to the next array (or the end) is zero.
    auto end = a + 1 < detail::mirror_array_count ? l.offset[a + 1] : l.total;
    for (auto k = l.offset[a] + l.bytes[a]; k < end; ++k)
      REQUIRE(hm.device[static_cast<std::size_t>(k)] == std::byte{0});
    covered += l.bytes[a];
  }
  REQUIRE(covered <= l.total);
}

}  // namespace

TEST_CASE("mirror layout: arrays packed in order at 128-byte boundaries, worked by hand",
          "[memory][mirror]") {
  auto plan = tiny_plan(tiny_budgets());  // L * H = 16 heads, G = 8 groups
  simulated_memory_resource sim;
  kv_cache_manager m(plan, sim, opts(200, 8));
  auto e = m.view_extents();
  REQUIRE(e.head_slots == 16);
  REQUIRE(e.groups == 8);
  REQUIRE(e.slots == 9);  // 8 sequence slots + the padding slot
  REQUIRE(e.batch == 8);
  auto l = detail::mirror_layout::of(e);
  // head_slots: 16 x 8 bytes = 128 at 0; window, ring: 32 bytes each, padded to 128;
  // page_offset: 9 slots x 8 groups x 4 = 288 (padded to 384); pinned_tokens the same rows;
  // head_base_len: 9 x 16 x 4 = 576 (padded to 640); then pages.
  CHECK(l.offset_of(mirror_array::head_slots) == 0);
  CHECK(l.bytes_of(mirror_array::head_slots) == 128);
  CHECK(l.offset_of(mirror_array::group_window) == 128);
  CHECK(l.bytes_of(mirror_array::group_window) == 32);
  CHECK(l.offset_of(mirror_array::group_ring_pages) == 256);
  CHECK(l.offset_of(mirror_array::page_offset) == 384);
  CHECK(l.bytes_of(mirror_array::page_offset) == 288);
  CHECK(l.offset_of(mirror_array::pinned_tokens) == 768);
  CHECK(l.bytes_of(mirror_array::pinned_tokens) == 288);
  CHECK(l.offset_of(mirror_array::head_base_len) == 1152);
  CHECK(l.bytes_of(mirror_array::head_base_len) == 576);
  CHECK(l.offset_of(mirror_array::pages) == 1792);
  CHECK(l.bytes_of(mirror_array::pages) == 4 * e.pages);
  std::int64_t A = 1792 + (4 * e.pages + 127) / 128 * 128;
  CHECK(l.offset_of(mirror_array::appended) == A);
  CHECK(l.bytes_of(mirror_array::appended) == 36);  // 9 slots
  CHECK(l.offset_of(mirror_array::seq_tokens) == A + 128);
  CHECK(l.offset_of(mirror_array::batch_slots) == A + 256);
  CHECK(l.bytes_of(mirror_array::batch_slots) == 32);  // max_batch entries
  CHECK(l.offset_of(mirror_array::prefill_batch_slots) == A + 384);
  CHECK(l.bytes_of(mirror_array::prefill_batch_slots) == 32);
  CHECK(l.total == A + 512);

  SECTION("one decode step uploads two page entries and the slot's two counters") {
    auto a = *m.try_admit(20, 5);
    prefill(m, a, 20);
    m.set_batch({a});
    host_mirror exact(m, 0);  // no coalescing across gaps
    exact.sync(m);            // first sync: everything, one copy
    CHECK(exact.full_syncs == 1);
    CHECK(exact.copies == 1);
    CHECK(exact.bytes == l.total);
    require_mirrored(exact, m);

    m.decode_step();  // a = 1: two uncompressed groups (6 and 7) start their 6th page
    auto v  = m.view();
    auto s  = a.slot;
    auto e6 = v.page_offset[s * 8 + 6] + 5, e7 = v.page_offset[s * 8 + 7] + 5;
    REQUIRE(e6 + 1 < e7);  // separate lists: not adjacent
    exact.sync(m);
    std::vector<mirror_range> want = {{1792 + 4 * e6, 1792 + 4 * e6 + 4},
                                      {1792 + 4 * e7, 1792 + 4 * e7 + 4},
                                      {A + 4 * s, A + 4 * s + 4},
                                      {A + 128 + 4 * s, A + 128 + 4 * s + 4}};
    CHECK(exact.stager.changed() == want);
    CHECK(exact.stager.uploads() == want);
    CHECK_FALSE(exact.stager.staged_full());
    require_mirrored(exact, m);

    // Default coalescing: the same changes go up as one span from the first to the last.
    host_mirror merged(m);
    merged.sync(m);
    m.decode_step();  // a = 2: groups 0 and 2 cross (the journal test in manager_test.cpp)
    v = m.view();
    // The last entry of each list: group 0's 5th page, group 2's 3rd.
    auto lo = v.page_offset[s * 8 + 0] + m.group_page_count(a, 0) - 1;
    auto hi = v.page_offset[s * 8 + 2] + m.group_page_count(a, 2) - 1;
    REQUIRE(lo < hi);
    merged.sync(m);
    CHECK(merged.stager.changed() ==
          std::vector<mirror_range>{{1792 + 4 * lo, 1792 + 4 * lo + 4},
                                    {1792 + 4 * hi, 1792 + 4 * hi + 4},
                                    {A + 4 * s, A + 4 * s + 4},
                                    {A + 128 + 4 * s, A + 128 + 4 * s + 4}});
    REQUIRE(merged.stager.uploads().size() == 1);
    CHECK(merged.stager.uploads()[0] == mirror_range{1792 + 4 * lo, A + 128 + 4 * s + 4});
    require_mirrored(merged, m);

    // A batch change alone uploads the batch array (max_batch entries), nothing else.
    auto b = *m.try_admit(4, 2);
    prefill(m, b, 4);
    merged.sync(m);
    m.set_batch({b, a});
    merged.sync(m);
    CHECK(merged.stager.uploads() == std::vector<mirror_range>{{A + 256, A + 256 + 32}});
    require_mirrored(merged, m);
    // Nothing changed: nothing to upload.
    merged.sync(m);
    CHECK(merged.stager.uploads().empty());
    CHECK(merged.stager.upload_bytes() == 0);
    // The same members in the same order again: still nothing.
    m.set_batch({b, a});
    merged.sync(m);
    CHECK(merged.stager.uploads().empty());
    require_mirrored(merged, m);
    // A prefill batch change alone uploads the prefill batch's array only; a padded decode batch
    // (a, then padding to 4) only the decode batch's: [a, padding slot 8, 8, 8].
    m.set_batch(batch_kind::prefill, {b});
    merged.sync(m);
    CHECK(merged.stager.uploads() == std::vector<mirror_range>{{A + 384, A + 384 + 32}});
    require_mirrored(merged, m);
    m.set_batch(batch_kind::decode, {a}, 4);
    merged.sync(m);
    CHECK(merged.stager.uploads() == std::vector<mirror_range>{{A + 256, A + 256 + 32}});
    std::int32_t slots[4];
    std::memcpy(slots, merged.device.data() + A + 256, sizeof slots);
    CHECK(slots[0] == a.slot);
    CHECK(slots[1] == 8);
    CHECK(slots[3] == 8);
    require_mirrored(merged, m);
  }
}

TEST_CASE("mirror layout: bad extents are refused naming the field", "[memory][mirror]") {
  kv_view_extents e;
  e.head_slots = e.groups = e.page_offset = e.pages = e.head_base_len = e.slots = e.batch = 1;
  e.pages                                                                                 = -3;
  auto msg = [](kv_view_extents const& x) {
    try {
      (void)detail::mirror_layout::of(x);
    } catch (invalid_argument const& err) {
      return std::string(err.what());
    }
    return std::string("no error");
  };
  CHECK(msg(e) == "kv_view_mirror: kv_view_extents.pages must be >= 0, got -3");
  e.pages = std::int64_t{1} << 62;  // 2^64 bytes
  CHECK(msg(e).find("kv_view_extents.pages = 4611686018427387904 elements overflow") !=
        std::string::npos);
  e.pages         = 1;
  e.head_base_len = (std::int64_t{1} << 61) - 1;  // fits alone, overflows with what follows
  CHECK(msg(e).find("overflow") != std::string::npos);
  e.head_base_len = 1;
  CHECK_THROWS_AS(detail::mirror_stager(e, -1), invalid_argument);
  CHECK_THROWS_AS(detail::mirror_stager(e, 0, -1), invalid_argument);
}

TEST_CASE("mirror: a journal entry outside the extents is refused before anything is written",
          "[memory][mirror]") {
  tiny_manager_on<simulated_memory_resource> fx(opts(200, 8));
  auto& m = fx.m;
  host_mirror hm(m);
  hm.sync(m);
  std::int32_t bad_slot = 9;  // 8 sequence slots and the padding slot: 9 is outside
  view_changes c;
  c.counter_slots     = &bad_slot;
  c.num_counter_slots = 1;
  auto before         = hm.shadow[1];
  try {
    hm.stager.stage(
        c, m.view(), m.view(batch_kind::prefill), hm.shadow[1].data(), hm.shadow[0].data());
    FAIL("no error");
  } catch (logic_error const& err) {
    CHECK(std::string(err.what()) ==
          "kv_view_mirror: view_changes.counter_slots[0] = 9 is outside [0, 9)");
  }
  CHECK(hm.shadow[1] == before);
}

TEST_CASE("mirror: random storms keep the uploaded copy equal to the host view byte for byte",
          "[memory][mirror][property]") {
  const int trials      = 8;
  std::int64_t uploaded = 0, whole = 0;
  auto t = mirror_storms(trials, 700, 7000, [&](kv_cache_manager& m, std::mt19937& rng) {
    // Exact ranges, small gaps, and the default coalescing.
    std::int64_t gaps[] = {0, 16, 256, detail::mirror_stager::default_merge_gap};
    struct checked {
      host_mirror hm;
      std::int64_t *uploaded, *whole;
      mirror_sync_kind sync(kv_cache_manager& kv) {
        hm.sync(kv);
        require_mirrored(hm, kv);
        *uploaded += hm.stager.upload_bytes();
        *whole += hm.stager.layout().total;
        auto const& c = hm.stager.changed();
        auto const& l = hm.stager.layout();
        return {hm.stager.staged_full(),
                !hm.stager.staged_full() && c.size() == 1 &&
                    (c[0].begin == l.offset_of(mirror_array::batch_slots) ||
                     c[0].begin == l.offset_of(mirror_array::prefill_batch_slots))};
      }
    };
    return checked{host_mirror(m, gaps[rng() % 4]), &uploaded, &whole};
  });
  INFO("syncs " << t.syncs << " full " << t.full << " incremental " << t.incremental
                << " batch only " << t.batch_only << " resyncs " << t.resyncs);
  // The walk exercised both kinds of sync, journal resyncs and batch-only uploads; incremental
  // syncs upload less than the whole block.
  CHECK(t.full > trials);
  CHECK(t.incremental > 1000);
  CHECK(t.resyncs > 0);
  CHECK(t.batch_only > 0);
  CHECK(uploaded < whole / 2);
}
