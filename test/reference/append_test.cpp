// SPDX-License-Identifier: Apache-2.0
// The decode-step append, driven by the real manager: after each decode_step the reference writes
// the new token's K/V, and every held token of every head must still read back what was written
// for it (tags), including sliding-window rings that wrap.
#include "tangram/reference/append.hpp"
#include "tangram/memory/host_memory_resource.hpp"

#include <map>
#include <tuple>

#include "../memory/memory_fixtures.hpp"
#include "tangram/memory/kv_cache_manager.hpp"
#include "test_support.hpp"

using namespace tangram;

namespace {

// Tag of logical token t of head (layer, head), element x, K (kv 0) or V (kv 1).
float tag(std::int64_t t, std::int32_t l, std::int32_t h, std::int32_t x, std::int32_t kv) {
  return static_cast<float>(t * 1000 + l * 100 + h * 10 + x) * (kv == 0 ? 1.0f : -1.0f);
}

}  // namespace

TEST_CASE("append_decode_kv writes each head's newest token where the view reads it", "[append]") {
  auto plan = test::tiny_plan(test::tiny_budgets(), /*page_tokens=*/4, /*group_size=*/2, /*window=*/6);
  host_memory_resource host;
  manager_options o;
  o.num_pages     = 256;
  o.max_sequences = 4;
  kv_cache_manager kv(plan, host, o);
  std::int32_t const L = plan.num_layers, H = plan.num_kv_heads, d = plan.geometry.head_dim;

  // Two sequences: prompts of 5 and 9 tokens (prefill: the tests only track decode tokens).
  std::vector<sequence_id> ids;
  for (std::int64_t n : {5, 9}) {
    auto id = kv.try_admit(n, 12);
    REQUIRE(id);
    std::vector<std::int32_t> kept(static_cast<std::size_t>(L * H));
    kv.prepare_chunk(*id, n);
    kv.expected_kept(*id, n, kept.data());
    kv.commit_chunk(*id, kept);
    ids.push_back(*id);
  }
  kv.set_batch(ids);
  // Expected contents: (request, layer, head, held index) -> logical token it came from.
  std::vector<std::int64_t> seen = {5, 9};
  std::map<std::tuple<int, int, int, int>, std::int64_t> written;
  std::vector<float> k(static_cast<std::size_t>(2 * H * d)), v(k.size());
  for (int step = 0; step < 10; ++step) {
    kv.decode_step();
    auto view = kv.view();
    for (std::int32_t l = 0; l < L; ++l) {
      for (std::int32_t r = 0; r < 2; ++r)
        for (std::int32_t h = 0; h < H; ++h)
          for (std::int32_t x = 0; x < d; ++x) {
            k[static_cast<std::size_t>((r * H + h) * d + x)] = tag(seen[static_cast<std::size_t>(r)], l, h, x, 0);
            v[static_cast<std::size_t>((r * H + h) * d + x)] = tag(seen[static_cast<std::size_t>(r)], l, h, x, 1);
          }
      append_params p;
      p.kv        = view;
      p.layer     = l;
      p.k         = k.data();
      p.v         = v.data();
      p.src_dtype = dtype::f32;
      reference::append_decode_kv(p);
    }
    for (std::int32_t r = 0; r < 2; ++r) {
      for (std::int32_t l = 0; l < L; ++l) {
        for (std::int32_t h = 0; h < H; ++h) {
          std::int32_t len = view.head_len(r, l, h);
          // The newest held token is this step's token; remember which held index it is.
          written[{r, l, h, len - 1}] = seen[static_cast<std::size_t>(r)];
          bool ring = plan.rule(l, h).kind == layer_kind::sliding_window;
          for (std::int32_t i = 0; i < len; ++i) {
            // In a ring the held index of a token shifts as the window slides: token t is held
            // index t - (seq_tokens - len).
            std::int64_t t = ring ? (seen[static_cast<std::size_t>(r)] + 1 - len + i) : -1;
            if (!ring) {
              auto it = written.find({r, l, h, i});
              if (it == written.end()) continue;  // a prefill token (not written by this test)
              t = it->second;
            } else if (t < (r == 0 ? 5 : 9)) {
              continue;  // still a prefill token
            }
            auto loc = view.locate(r, l, h, i);
            auto col = plan.grouping.slot(l, h).column;
            for (std::int32_t x = 0; x < d; ++x) {
              INFO("r " << r << " l " << l << " h " << h << " i " << i << " step " << step);
              REQUIRE(view.element_ptr<float>(loc, col, 0)[x] == tag(t, l, h, x, 0));
              REQUIRE(view.element_ptr<float>(loc, col, 1)[x] == tag(t, l, h, x, 1));
            }
          }
        }
      }
    }
    seen[0] += 1;
    seen[1] += 1;
  }
  // The sliding layer (window 6) wrapped its ring of ceil(6/4) = 2 pages several times.
  CHECK(kv.view().head_len(1, 1, 0) == 6);
}

TEST_CASE("append_decode_kv converts to the cache dtype and validates its parameters", "[append][errors]") {
  auto plan = test::tiny_plan(test::tiny_budgets());
  host_memory_resource host;
  manager_options o;
  o.num_pages     = 64;
  o.max_sequences = 2;
  kv_cache_manager kv(plan, host, o);
  append_params p;
  p.kv    = kv.view();
  p.layer = 7;
  p.k = p.v = &o;
  TANGRAM_REQUIRE_THROWS_WITH_ALL(reference::append_decode_kv(p), invalid_argument,
                                  "append_params.layer: must be in [0, 3], got 7");
  p.layer = 0;
  p.k     = nullptr;
  TANGRAM_REQUIRE_THROWS_WITH_ALL(reference::append_decode_kv(p), invalid_argument, "append_params.k/v: null");
  p.k          = &o;
  p.src_stride = 3;
  TANGRAM_REQUIRE_THROWS_WITH_ALL(reference::append_decode_kv(p), invalid_argument,
                                  "append_params.src_stride", "H * d = 16", "got 3");
  // bf16 source into an f32 cache: exact for values representable in bf16.
  bfloat16 one(1.5f);
  CHECK(reference::detail::load_as_float(&one, dtype::bf16, 0) == 1.5f);
}
