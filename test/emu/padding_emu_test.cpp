// SPDX-License-Identifier: Apache-2.0
// Padding requests (fixed-capacity batches for CUDA graphs, kv_cache_view::padding_slot) through
// the real kernel bodies in the host emulator: the decode split + merge kernels, the eviction
// kernels and the append kernel each run over a batch with padding requests scattered among the
// real ones, and must give the real requests exactly what the unpadded run gives them, write
// zeros (no NaN) for a padding request's attention output, and leave every page byte-identical to
// the unpadded run. The padding slot's rows are zero (what the manager guarantees) or, to show
// that the kernels skip padding by `is_padding` and not by luck, copies of a real sequence's rows
// (its pages and lengths: a kernel that touched them for a padding request would show).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "../gpu/kernel_cases.hpp"
#include "emu_backend.hpp"
#include "emu_support.hpp"

using namespace tangram;
using tangram::test::emu_backend;

namespace {

/// A copy of view `v`'s per-slot arrays (S sequence slots) plus a padding slot S, and a batch in
/// which entry k is real request order[k] of `v` or, for order[k] < 0, a padding request.
struct padded_batch {
  std::vector<std::int32_t> page_offset, base_len, appended, seq_tokens, slots;
  kv_cache_view view;

  /// @param hostile_from -1: the padding slot's rows are zero; else a copy of that slot's rows.
  padded_batch(kv_cache_view const& v,
               std::int32_t S,
               std::vector<std::int32_t> const& order,
               std::int32_t hostile_from) {
    const std::int64_t G  = v.num_groups,
                       LH = static_cast<std::int64_t>(v.num_layers) * v.num_kv_heads;
    page_offset.assign(v.page_offset, v.page_offset + S * G);
    base_len.assign(v.head_base_len, v.head_base_len + S * LH);
    appended.assign(v.appended, v.appended + S);
    seq_tokens.assign(v.seq_tokens, v.seq_tokens + S);
    auto src = hostile_from;
    for (std::int64_t g = 0; g < G; ++g)
      page_offset.push_back(src < 0 ? 0 : page_offset[static_cast<std::size_t>(src * G + g)]);
    for (std::int64_t h = 0; h < LH; ++h)
      base_len.push_back(src < 0 ? 0 : base_len[static_cast<std::size_t>(src * LH + h)]);
    appended.push_back(src < 0 ? 0 : appended[static_cast<std::size_t>(src)]);
    seq_tokens.push_back(src < 0 ? 0 : seq_tokens[static_cast<std::size_t>(src)]);
    for (auto r : order) slots.push_back(r < 0 ? S : v.batch_slots[r]);
    view               = v;
    view.page_offset   = page_offset.data();
    view.head_base_len = base_len.data();
    view.appended      = appended.data();
    view.seq_tokens    = seq_tokens.data();
    view.batch_slots   = slots.data();
    view.batch_size    = static_cast<std::int32_t>(slots.size());
    view.padding_slot  = S;
  }
};

/// Rows of `row_elems` elements of `elem` bytes, regrouped for the padded batch: request order[k]'s
/// rows (its `rows_of(r)` rows at `first_row(r)`), or `pad_rows` random rows for padding.
template <class FirstRow, class RowsOf>
std::vector<unsigned char> regroup_rows(std::vector<unsigned char> const& src,
                                        std::size_t row_bytes,
                                        std::vector<std::int32_t> const& order,
                                        FirstRow first_row,
                                        RowsOf rows_of,
                                        std::int32_t pad_rows,
                                        std::mt19937_64& rng,
                                        std::vector<std::int32_t>* indptr = nullptr) {
  std::vector<unsigned char> out;
  if (indptr) indptr->assign(1, 0);
  for (auto r : order) {
    std::int32_t n = r < 0 ? pad_rows : rows_of(r);
    if (r < 0) {
      // Finite random values (a byte soup could hold NaNs, which the kernels would never see in
      // a real chunk); any pattern works: no kernel may read them.
      for (std::int32_t k = 0; k < n; ++k)
        for (std::size_t b = 0; b < row_bytes; b += 4) {
          float x = std::uniform_real_distribution<float>(-1.f, 1.f)(rng);
          unsigned char bytes[4];
          std::memcpy(bytes, &x, 4);
          out.insert(out.end(), bytes, bytes + 4);
        }
    } else {
      auto at = src.begin() + static_cast<std::ptrdiff_t>(first_row(r) * row_bytes);
      out.insert(out.end(), at, at + static_cast<std::ptrdiff_t>(n * row_bytes));
    }
    if (indptr) indptr->push_back(indptr->back() + n);
  }
  return out;
}

}  // namespace

TEST_CASE("emulated decode over a padded batch: real requests as unpadded, padding gives zeros",
          "[emu][decode][padding]") {
  struct kernel_kind {
    dtype t;
    std::int32_t d, group;
  };
  // The CUDA-core kernel, then the tensor-core one (16-bit K/V, group buckets 4 and 8).
  for (auto kind : {kernel_kind{dtype::f32, 64, 2},
                    kernel_kind{dtype::bf16, 128, 4},
                    kernel_kind{dtype::f16, 64, 7}})
    for (bool sinks : {false, true})
      for (std::int32_t hostile : {-1, 3}) {
        test::decode_case c;
        c.kv_dtype = kind.t;
        c.d        = kind.d;
        c.group    = kind.group;
        c.lens     = {1, 15, 54, 97, 300};
        c.sinks    = sinks;
        c.seed     = 21 + static_cast<std::uint64_t>(sinks);
        test::decode_scenario s(c);
        const auto S         = static_cast<std::int32_t>(c.lens.size());
        const std::int32_t B = s.view.batch_size, Hq = c.heads * c.group;
        const std::vector<std::int32_t> order = {-1, 0, 1, -1, 2, 3, 4, -1, -1};
        padded_batch pb(s.view, S, order, hostile);
        const auto row = static_cast<std::size_t>(Hq * c.d);
        std::vector<float> qp;
        for (auto r : order)
          for (std::size_t x = 0; x < row; ++x)
            qp.push_back(r < 0 ? 100.f : s.q[static_cast<std::size_t>(r) * row + x]);
        auto o = test::emu_schedules(c.seed, 1).front();
        emu::scoped_options scope(o);
        emu_backend backend;
        for (std::int32_t n_cta : {c.heads, 264}) {
          auto begin = test::random_cta_begin(c.layers, c.heads, n_cta, s.rng);
          for (std::int32_t layer = 0; layer < c.layers; ++layer) {
            INFO(to_string(kind.t)
                 << " d " << kind.d << " group " << kind.group << " sinks " << sinks << " hostile "
                 << hostile << " N_CTA " << n_cta << " layer " << layer);
            decode_params p;
            p.layer   = layer;
            p.group   = c.group;
            p.q_dtype = p.o_dtype = dtype::f32;
            p.splits              = {c.layers, c.heads, n_cta, begin.data()};
            p.sinks               = sinks ? s.sinks.data() : nullptr;
            std::vector<float> o_u(static_cast<std::size_t>(B) * row, 7.f);
            std::vector<float> lse_u(static_cast<std::size_t>(B * Hq), 7.f);
            p.kv  = s.view;
            p.q   = s.q.data();
            p.o   = o_u.data();
            p.lse = lse_u.data();
            backend.decode(s.cache, p);
            std::vector<float> o_p(order.size() * row),
                lse_p(order.size() * static_cast<std::size_t>(Hq));
            std::memset(o_p.data(), 0x7f, o_p.size() * 4);  // poison: every row must be written
            std::memset(lse_p.data(), 0x7f, lse_p.size() * 4);
            p.kv  = pb.view;
            p.q   = qp.data();
            p.o   = o_p.data();
            p.lse = lse_p.data();
            backend.decode(s.cache, p);
            for (std::size_t k = 0; k < order.size(); ++k) {
              auto r = order[k];
              for (std::size_t x = 0; x < row; ++x) {
                float got = o_p[k * row + x];
                if (r < 0)
                  REQUIRE(got == 0.f);
                else
                  REQUIRE(got == o_u[static_cast<std::size_t>(r) * row + x]);
              }
              for (std::int32_t h = 0; h < Hq; ++h) {
                float got = lse_p[k * static_cast<std::size_t>(Hq) + static_cast<std::size_t>(h)];
                REQUIRE_FALSE(std::isnan(got));
                if (r < 0 && !sinks)
                  REQUIRE(got == -INFINITY);
                else if (r < 0)  // ln(e^sink): the sink, up to the kernel's exp/log rounding
                  REQUIRE(std::abs(got - s.sinks[static_cast<std::size_t>(h)]) <=
                          1e-5f * std::max(1.f, std::abs(s.sinks[static_cast<std::size_t>(h)])));
                else
                  REQUIRE(got == lse_u[static_cast<std::size_t>(r * Hq + h)]);
              }
            }
            // The CPU reference agrees on the padded batch (it shares the view's head_len).
            std::vector<float> o_ref(o_p.size()), lse_ref(lse_p.size());
            p.o   = o_ref.data();
            p.lse = lse_ref.data();
            reference::decode_attention(p, reference::split_mode::split);
            for (std::size_t i = 0; i < o_ref.size(); ++i)
              REQUIRE(std::abs(o_ref[i] - o_p[i]) <= 5e-5f);
          }
        }
      }
}

TEST_CASE("emulated eviction over a padded batch: pages and lengths as unpadded, padding ignored",
          "[emu][eviction][padding]") {
  constexpr std::int32_t L = test::eviction_scenario::num_layers,
                         H = test::eviction_scenario::num_kv_heads;
  for (auto source : {score_source::key_norm, score_source::snapkv})
    for (std::int32_t hostile : {-1, 0}) {
      INFO("source " << to_string(source) << " hostile " << hostile);
      page_geometry geo{16, 2, 64, dtype::f32};
      const std::int32_t d = geo.head_dim, group = 2, sink = 4;
      auto sc = test::make_eviction_scenario(geo, 24, sink + 8, 300, 90);
      std::mt19937_64 rng(77 + static_cast<std::uint64_t>(hostile + 1));
      const std::int32_t rows = sc.chunk_indptr.back();
      const auto S            = static_cast<std::int32_t>(sc.seqs.size());
      test::test_cache run(sc.layout, sc.seqs, 5), pad(sc.layout, sc.seqs, 5);
      REQUIRE(run.pool() == pad.pool());
      auto v               = run.view(sc.batch);
      const std::int32_t B = v.batch_size;
      std::vector<unsigned char> ck(static_cast<std::size_t>(rows * H * d) * 4), cv(ck.size()),
          q(static_cast<std::size_t>(rows * H * group * d) * 4);
      for (auto* a : {&ck, &cv, &q})
        for (std::size_t i = 0; i < a->size() / 4; ++i) {
          float x = std::uniform_real_distribution<float>(-2.f, 2.f)(rng);
          std::memcpy(a->data() + 4 * i, &x, 4);
        }
      std::int32_t max_cand = 0;
      for (std::int32_t r = 0; r < B; ++r)
        for (std::int32_t l = 0; l < L; ++l)
          for (std::int32_t h = 0; h < H; ++h)
            max_cand =
                std::max(max_cand,
                         v.head_len(r, l, h) + sc.chunk_indptr[static_cast<std::size_t>(r) + 1] -
                             sc.chunk_indptr[static_cast<std::size_t>(r)]);
      // Padding requests get rows of their own (a padding request must ignore them).
      const std::vector<std::int32_t> order = {-1, 0, 1, 2, -1, 3, 4, 5, -1};
      padded_batch pb(pad.view(sc.batch), S, order, hostile);
      auto first = [&](std::int32_t r) { return sc.chunk_indptr[static_cast<std::size_t>(r)]; };
      auto count = [&](std::int32_t r) {
        return sc.chunk_indptr[static_cast<std::size_t>(r) + 1] -
               sc.chunk_indptr[static_cast<std::size_t>(r)];
      };
      std::vector<std::int32_t> indptr;
      auto kv_row = static_cast<std::size_t>(H * d) * 4, q_row = kv_row * group;
      auto ck_p = regroup_rows(ck, kv_row, order, first, count, 7, rng, &indptr);
      auto cv_p = regroup_rows(cv, kv_row, order, first, count, 7, rng);
      auto q_p  = regroup_rows(q, q_row, order, first, count, 7, rng);
      auto o    = test::emu_schedules(31 + static_cast<std::uint64_t>(source), 1).front();
      emu::scoped_options scope(o);
      emu_backend backend;
      for (std::int32_t layer = 0; layer < L; ++layer) {
        INFO("layer " << layer);
        eviction_params p;
        p.layer          = layer;
        p.rules          = sc.rules.data() + layer * H;
        p.sink           = sink;
        p.max_candidates = max_cand;
        p.source         = source;
        p.q_dtype        = dtype::f32;
        p.group          = group;
        p.obs_window     = 16;
        std::vector<std::int32_t> len_u(static_cast<std::size_t>(B * H), -9);
        p.kv           = v;
        p.chunk_indptr = sc.chunk_indptr.data();
        p.chunk_k      = ck.data();
        p.chunk_v      = cv.data();
        p.q            = q.data();
        p.new_len      = len_u.data();
        backend.evict(run, p);
        std::vector<std::int32_t> len_p(order.size() * H, -9);
        p.kv           = pb.view;
        p.chunk_indptr = indptr.data();
        p.chunk_k      = ck_p.data();
        p.chunk_v      = cv_p.data();
        p.q            = q_p.data();
        p.new_len      = len_p.data();
        backend.evict(pad, p);
        for (std::size_t k = 0; k < order.size(); ++k)
          for (std::int32_t h = 0; h < H; ++h) {
            auto got = len_p[k * H + static_cast<std::size_t>(h)];
            if (order[k] < 0)
              REQUIRE(got == 0);
            else
              REQUIRE(got == len_u[static_cast<std::size_t>(order[k] * H + h)]);
          }
        REQUIRE(pad.pool() == run.pool());
      }
    }
}

TEST_CASE("emulated append over a padded batch writes exactly the unpadded run's bytes",
          "[emu][append][padding]") {
  for (std::int32_t hostile : {-1, 2}) {
    INFO("hostile " << hostile);
    page_geometry geo{16, 2, 128, dtype::bf16};
    auto layout = test::adjacent_layout(geo, 2, 4, /*sliding=*/{1}, /*window=*/40, 3);
    std::vector<test::sequence_spec> seqs;
    for (std::int32_t r = 0; r < 5; ++r) {
      test::sequence_spec s;
      s.seq_tokens = 30 + 17 * r;
      s.appended   = 1 + r;
      s.base_len.assign(8, 10 + 7 * r);
      seqs.push_back(s);
    }
    test::test_cache run(layout, seqs, 42), pad(layout, seqs, 42);
    std::vector<std::int32_t> batch = {3, 0, 4, 1};
    auto v                          = run.view(batch);
    std::mt19937_64 rng(9);
    auto row = static_cast<std::size_t>(4 * 128) * 4;  // f32 source rows
    std::vector<unsigned char> k(batch.size() * row), vv(k.size());
    for (auto* a : {&k, &vv})
      for (std::size_t i = 0; i < a->size() / 4; ++i) {
        float x = std::uniform_real_distribution<float>(-2.f, 2.f)(rng);
        std::memcpy(a->data() + 4 * i, &x, 4);
      }
    const std::vector<std::int32_t> order = {0, -1, 1, 2, -1, 3, -1};
    padded_batch pb(pad.view(batch), 5, order, hostile);
    auto first = [](std::int32_t r) { return r; };
    auto one   = [](std::int32_t) { return 1; };
    auto k_p   = regroup_rows(k, row, order, first, one, 1, rng);
    auto v_p   = regroup_rows(vv, row, order, first, one, 1, rng);
    auto o     = test::emu_schedules(5, 1).front();
    emu::scoped_options scope(o);
    emu_backend backend;
    for (std::int32_t layer = 0; layer < 2; ++layer) {
      append_params p;
      p.layer     = layer;
      p.src_dtype = dtype::f32;
      p.kv        = v;
      p.k         = k.data();
      p.v         = vv.data();
      backend.append(run, p);
      p.kv = pb.view;
      p.k  = k_p.data();
      p.v  = v_p.data();
      backend.append(pad, p);
      REQUIRE(pad.pool() == run.pool());
    }
  }
}
