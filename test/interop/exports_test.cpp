// SPDX-License-Identifier: Apache-2.0
// The FlashInfer block-sparse and FlashAttention varlen exports: CPU references of those
// libraries' decode semantics (interop_references.hpp), fed the exported tables over the raw pool
// through the documented strided tensors, equal Tangram's decode reference on the same pool, for
// every K/V dtype, GQA 1-8, sinks, sliding windows and padded (CUDA-graph) batches; plus the
// exports over a real manager and their errors.
#include <numeric>
#include <random>
#include <vector>

#include "../memory/memory_fixtures.hpp"
#include "../reference/interop_references.hpp"
#include "../reference/kv_test_cache.hpp"
#include "storm/engine_sim.hpp"
#include "tangram/interop/flash_attn_varlen.hpp"
#include "tangram/interop/flashinfer.hpp"
#include "tangram/interop/flashinfer_block_sparse.hpp"
#include "tangram/memory/host_memory_resource.hpp"
#include "tangram/reference/decode_attention.hpp"
#include "test_support.hpp"

using namespace tangram;
using tangram::test::strided_cache;

namespace {

struct export_case {
  dtype kv_dtype      = dtype::f32;
  std::int32_t group  = 1;
  std::int32_t window = 32, ring_pages = 2;  ///< layer 1 slides
  bool sinks          = false;
  bool per_head_scale = false;  ///< fp8: one scale per KV head (else one per tensor)
  std::uint64_t seed  = 1;
};

constexpr std::int32_t P = 16, Hp = 2, d = 32, L = 2, H = 4;

/// A ragged cache (layer 1 sliding), its batch shuffled, with a padding request at the end.
struct export_fixture {
  test::test_cache cache;
  std::vector<std::int32_t> batch;
  kv_cache_view view;

  export_fixture(export_case const& c, std::mt19937_64& rng) : cache(make_cache(c, rng)) {
    batch.resize(5);
    std::iota(batch.begin(), batch.end(), 0);
    std::shuffle(batch.begin(), batch.end() - 1, rng);  // slot 4 (empty) pads the batch
    view              = cache.view(batch);
    view.padding_slot = 4;
  }

  static test::test_cache make_cache(export_case const& c, std::mt19937_64& rng) {
    page_geometry geo{P, Hp, d, c.kv_dtype};
    auto layout = test::adjacent_layout(geo, L, H, {1}, c.window, c.ring_pages);
    // Rings: unwrapped, wrapped at a page boundary, wrapped mid-page, far past the window.
    std::vector<std::int32_t> lens{37, 5, 60, 16}, appended{3, 0, 9, 16}, seen{37, 64, 70, 211};
    auto seqs = test::ragged_sequences(lens, appended, seen, L, H, rng);
    test::sequence_spec pad;
    pad.base_len.assign(static_cast<std::size_t>(L * H), 0);
    seqs.push_back(pad);
    return test::test_cache(layout, seqs, rng());
  }
};

/// Tangram's decode reference (unsplit) for one layer: o [B][H * G][d].
std::vector<float> tangram_decode(kv_cache_view const& v,
                                  std::int32_t layer,
                                  export_case const& c,
                                  std::vector<float> const& q,
                                  std::vector<float> const& sinks,
                                  kv_scales scales) {
  decode_params p;
  p.kv      = v;
  p.layer   = layer;
  p.group   = c.group;
  p.q       = q.data();
  p.q_dtype = dtype::f32;
  p.o_dtype = dtype::f32;
  p.sinks   = c.sinks ? sinks.data() : nullptr;
  p.scales  = scales;
  std::vector<float> o(q.size());
  p.o = o.data();
  reference::decode_attention(p, reference::split_mode::unsplit);
  return o;
}

bool is_fp8(dtype t) {
  return t == dtype::fp8_e4m3 || t == dtype::fp8_e5m2;
}

void run_case(export_case const& c) {
  INFO("dtype " << to_string(c.kv_dtype) << " group " << c.group << " sinks " << c.sinks
                << " window " << c.window << " ring pages " << c.ring_pages << " seed " << c.seed);
  std::mt19937_64 rng(c.seed);
  export_fixture fx(c, rng);
  auto const& v  = fx.view;
  std::int32_t B = v.batch_size, G = c.group, Hq = H * G;
  std::vector<float> q(static_cast<std::size_t>(B * Hq * d)), sinks(static_cast<std::size_t>(Hq));
  for (auto& x : q) x = std::uniform_real_distribution<float>(-2.f, 2.f)(rng);
  for (auto& x : sinks) x = std::uniform_real_distribution<float>(-1.f, 3.f)(rng);
  std::vector<float> k_scale(c.per_head_scale ? H : 1), v_scale(k_scale.size());
  for (auto& x : k_scale) x = std::uniform_real_distribution<float>(0.5f, 2.f)(rng);
  for (auto& x : v_scale) x = std::uniform_real_distribution<float>(0.5f, 2.f)(rng);
  kv_scales scales{};
  if (is_fp8(c.kv_dtype))
    scales = {k_scale.data(), v_scale.data(), static_cast<std::int32_t>(k_scale.size())};
  double sm_scale = 1.0 / std::sqrt(static_cast<double>(d));
  double tol      = 2e-4;

  auto* pool         = fx.cache.pool().data();
  std::int64_t bytes = v.geometry.element_bytes();
  for (std::int32_t layer = 0; layer < L; ++layer) {
    INFO("layer " << layer);
    auto want = tangram_decode(v, layer, c, q, sinks, scales);

    // FlashAttention varlen: sequences j = b * H + h; q [B, H * G, d] is [B * H, G, d].
    flash_attn_varlen_paged fa;
    export_flash_attn_varlen(v, layer, fa);
    REQUIRE(fa.num_sequences == B * H);
    CHECK(fa.window_left == (layer == 1 ? c.window - 1 : -1));
    strided_cache k{pool, c.kv_dtype, fa.layout.page_stride_elements, 0, d};
    strided_cache vv = k;
    vv.base          = pool + fa.layout.v_offset_elements * bytes;
    auto got_fa      = test::flash_attn_paged_decode(
        q,
        fa.num_sequences,
        G,
        d,
        P,
        fa.block_table,
        fa.max_pages,
        fa.seqused_k,
        fa.window_left,
        k,
        vv,
        sm_scale,
        [&](std::int32_t j) { return c.sinks ? sinks.data() + (j % H) * G : nullptr; },
        [&](std::int32_t j) {
          return std::pair<float, float>{scales.k_of(j % H), scales.v_of(j % H)};
        });
    for (std::size_t i = 0; i < want.size(); ++i)
      REQUIRE(std::abs(got_fa[i] - want[i]) <= tol * (1 + std::abs(want[i])));
    for (std::int32_t j = 0; j < fa.num_sequences; ++j)
      CHECK(fa.cu_seqlens_k[static_cast<std::size_t>(j) + 1] -
                fa.cu_seqlens_k[static_cast<std::size_t>(j)] ==
            fa.seqused_k[static_cast<std::size_t>(j)]);

    // FlashInfer block-sparse: K as [virtual pages, H, P, d] with a zero head stride.
    if (c.per_head_scale) continue;  // its bmm1/bmm2 scales are per tensor
    flashinfer_block_sparse fi;
    bool exact = c.window % P == 0 || layer != 1;
    if (!exact) {
      TANGRAM_REQUIRE_THROWS_WITH_ALL(export_flashinfer_block_sparse(v, layer, fi),
                                      invalid_argument,
                                      "ring wrapped mid-page",
                                      "layer 1");
      continue;
    }
    export_flashinfer_block_sparse(v, layer, fi);
    REQUIRE(fi.num_kv_heads == H);
    REQUIRE(fi.batch_size == B);
    k.head_stride  = 0;
    vv.head_stride = 0;
    k.scale        = scales.k_of(0);
    vv.scale       = scales.v_of(0);
    auto got_fi    = test::flashinfer_block_sparse_decode(q,
                                                       B,
                                                       H,
                                                       G,
                                                       d,
                                                       P,
                                                       fi.block_tables,
                                                       fi.max_pages,
                                                       fi.seq_lens,
                                                       k,
                                                       vv,
                                                       sm_scale,
                                                       c.sinks ? sinks.data() : nullptr);
    for (std::size_t i = 0; i < want.size(); ++i)
      REQUIRE(std::abs(got_fi[i] - want[i]) <= tol * (1 + std::abs(want[i])));
    for (std::int32_t h = 0; h < H; ++h) {
      CHECK(fi.seq_len(h, B - 1) == 0);  // the padding request
      for (std::int32_t b = 0; b < B; ++b) CHECK(fi.seq_len(h, b) == v.head_len(b, layer, h));
    }
  }
}

}  // namespace

TEST_CASE("block-sparse and varlen exports equal Tangram's decode for every dtype and GQA 1-8",
          "[interop]") {
  std::uint64_t seed = 1;
  for (dtype t : {dtype::f32, dtype::f16, dtype::bf16, dtype::fp8_e4m3, dtype::fp8_e5m2})
    for (std::int32_t group : {1, 2, 3, 4, 8}) {
      export_case c;
      c.kv_dtype = t;
      c.group    = group;
      c.sinks    = group % 2 == 0;
      c.seed     = seed++;
      run_case(c);
    }
}

TEST_CASE("exports with sinks, per-head fp8 scales and rings with stale slots", "[interop]") {
  export_case c;
  c.sinks = true;
  c.group = 5;
  SECTION("window not a multiple of P: varlen masks the ring, block-sparse refuses it") {
    c.window     = 40;
    c.ring_pages = 4;
    c.seed       = 11;
    run_case(c);
  }
  SECTION("per-KV-head fp8 scales: varlen's per-sequence descale") {
    c.kv_dtype       = dtype::fp8_e4m3;
    c.per_head_scale = true;
    c.seed           = 12;
    run_case(c);
  }
  SECTION("window shorter than a page: its ring page holds stale slots") {
    c.window     = 10;
    c.ring_pages = 1;
    c.seed       = 14;
    run_case(c);
  }
  SECTION("window of one page") {
    c.window     = 16;
    c.ring_pages = 1;
    c.kv_dtype   = dtype::bf16;
    c.seed       = 13;
    run_case(c);
  }
}

TEST_CASE("block-sparse rows list each held token once, in a table of fixed width", "[interop]") {
  std::mt19937_64 rng(5);
  export_case c;
  export_fixture fx(c, rng);
  auto const& v = fx.view;
  flashinfer_block_sparse fi;
  export_flashinfer_block_sparse(v, 0, fi, 9, 1000);
  CHECK(fi.max_pages == 9);
  CHECK(fi.layout.num_virtual_pages == 2 * Hp * 1000 - Hp);
  CHECK(fi.layout.v_offset_elements == Hp * P * d);
  std::int32_t longest = 0;
  for (std::int32_t b = 0; b < v.batch_size; ++b)
    for (std::int32_t h = 0; h < H; ++h) {
      std::int32_t n = fi.seq_len(h, b);
      longest        = std::max(longest, n);
      auto col       = v.slot_of(0, h).column;
      for (std::int32_t i = 0; i < n; ++i) {  // growing heads: token i at row position i
        auto loc = v.locate(b, 0, h, i);
        CHECK(fi.entry(h, b, i / P) == virtual_page(loc.page, Hp, col));
        CHECK(i % P == loc.token);
      }
      for (std::int32_t k = (n + P - 1) / P; k < fi.max_pages; ++k) CHECK(fi.entry(h, b, k) == 0);
    }
  CHECK(fi.max_seq_len == longest);
  auto before = fi.block_tables;
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      export_flashinfer_block_sparse(v, 0, fi, 1), invalid_argument, "max_pages: 1", "longest row");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      export_flashinfer_block_sparse(v, 2, fi), invalid_argument, "layer", "got 2");
  flash_attn_varlen_paged fa;
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      export_flash_attn_varlen(v, 0, fa, -1), invalid_argument, "max_pages", "got -1");
  CHECK(fi.block_tables == before);  // unchanged by the refused calls
}

TEST_CASE("exports over a manager's padded batches of both kinds", "[interop][memory]") {
  auto plan = test::tiny_plan(test::tiny_budgets(), 4, 2, 6);
  host_memory_resource mr;
  kv_cache_manager m(plan, mr, test::opts(400, 8));
  test::engine_sim sim(m, 5, 0.3);
  auto a = *sim.admit(23, 20);
  auto b = *sim.admit(9, 20);
  sim.chunk(a, 10);
  sim.chunk(a, 13);
  sim.chunk(b, 9);
  for (int i = 0; i < 7; ++i) sim.decode({a, b});
  std::vector<sequence_id> ids{b, a};
  m.set_batch(batch_kind::decode, ids, 4);  // padded to 4 for a captured graph
  auto v                = m.view(batch_kind::decode);
  std::int32_t const Pm = plan.geometry.page_tokens;
  REQUIRE(v.batch_size == 4);
  for (std::int32_t l = 0; l < plan.num_layers; ++l) {
    INFO("layer " << l);
    flash_attn_varlen_paged fa;
    export_flash_attn_varlen(m, batch_kind::decode, l, fa);
    for (std::int32_t r = 0; r < 4; ++r)
      for (std::int32_t h = 0; h < plan.num_kv_heads; ++h) {
        auto j = r * plan.num_kv_heads + h;
        if (r >= 2) CHECK(fa.seqused_k[static_cast<std::size_t>(j)] == 0);
        // Every held token at its FlashAttention position (after the masked skip).
        std::int32_t len  = v.head_len(r, l, h);
        std::int32_t skip = len > 0 ? fa.seqused_k[static_cast<std::size_t>(j)] - len : 0;
        for (std::int32_t i = 0; i < len; ++i) {
          auto loc = v.locate(r, l, h, i);
          CHECK(fa.entry(j, (skip + i) / Pm) == virtual_page(loc.page, 2, v.slot_of(l, h).column));
        }
      }
    flashinfer_block_sparse fi;
    if (flashinfer_block_sparse_exact(plan, l)) {
      export_flashinfer_block_sparse(m, batch_kind::decode, l, fi);
      for (std::int32_t h = 0; h < plan.num_kv_heads; ++h)
        for (std::int32_t r = 0; r < 4; ++r) CHECK(fi.seq_len(h, r) == v.head_len(r, l, h));
    }
  }
  // A freed member: the batch must be set again.
  m.free(a);
  flash_attn_varlen_paged fa;
  TANGRAM_REQUIRE_THROWS_WITH_ALL(export_flash_attn_varlen(m, batch_kind::decode, 0, fa),
                                  logic_error,
                                  "export_flash_attn_varlen");
}
