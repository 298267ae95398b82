// SPDX-License-Identifier: Apache-2.0
// Review (adversarial) coverage, passing at eb66c19 (kept as extra coverage, ~1 min) of
// batch-invariant decode: a request's output and LSE bits across batch compositions (with empty
// requests between the others), split maps, and with and without the folded merge
// (decode_params::merge_counters), on both split kernels including fp8 on the tensor-core kernel.
// Every run is compared bit for bit with the request's first run.
#include <catch2/catch.hpp>

#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "../gpu/invariant_cases.hpp"
#include "emu_backend.hpp"
#include "emu_support.hpp"

using namespace tangram;
using tangram::test::emu_backend;

namespace {

std::string check_invariance_fold(test::decode_case c, emu_backend& backend) {
  test::decode_scenario s(c);
  const std::int32_t B = s.view.batch_size, Hq = c.heads * c.group;
  const std::size_t q_row = static_cast<std::size_t>(Hq) * c.d;
  const std::size_t o_row = q_row * size_of(c.o_dtype);
  std::vector<std::vector<std::int32_t>> batches;
  std::vector<std::int32_t> all(static_cast<std::size_t>(B));
  for (std::int32_t r = 0; r < B; ++r) all[static_cast<std::size_t>(r)] = r;
  batches.push_back(all);
  batches.emplace_back(all.rbegin(), all.rend());
  for (std::int32_t r = 0; r < B; ++r) batches.push_back({r});
  // pairs: each request beside the next one (mixed positions)
  for (std::int32_t r = 0; r + 1 < B; ++r) batches.push_back({r + 1, r});
  std::vector<std::int32_t> ctas = {c.heads, 2 * 132 + 1, 2000};
  for (std::int32_t layer = 0; layer < c.layers; ++layer) {
    std::vector<std::vector<unsigned char>> first_o(static_cast<std::size_t>(B));
    std::vector<std::vector<float>> first_lse(static_cast<std::size_t>(B));
    for (std::int32_t n_cta : ctas) {
      auto begin = test::random_cta_begin(c.layers, c.heads, n_cta, s.rng);
      for (bool fold : {false, true})
        for (auto const& batch : batches) {
          const auto n = static_cast<std::int32_t>(batch.size());
          std::vector<std::int32_t> slots;
          std::vector<float> q;
          for (std::int32_t r : batch) {
            slots.push_back(s.view.batch_slots[r]);
            q.insert(q.end(),
                     s.q.begin() + static_cast<std::ptrdiff_t>(r * q_row),
                     s.q.begin() + static_cast<std::ptrdiff_t>((r + 1) * q_row));
          }
          decode_params p;
          p.kv               = s.view;
          p.kv.batch_slots   = slots.data();
          p.kv.batch_size    = n;
          p.layer            = layer;
          p.group            = c.group;
          p.q_dtype          = dtype::f32;
          p.o_dtype          = c.o_dtype;
          p.splits           = {c.layers, c.heads, n_cta, begin.data()};
          p.q                = q.data();
          p.sinks            = c.sinks ? s.sinks.data() : nullptr;
          p.tensor_cores     = c.tensor_cores;
          p.scales           = s.scales.view();
          p.invariant_pieces = c.invariant_pieces;
          std::vector<std::int32_t> counters(static_cast<std::size_t>(n) * c.heads, 0);
          if (fold) p.merge_counters = counters.data();
          std::vector<unsigned char> o(static_cast<std::size_t>(n) * o_row, 0x7f);
          std::vector<float> lse(static_cast<std::size_t>(n) * Hq, 777.f);
          p.o   = o.data();
          p.lse = lse.data();
          backend.decode(s.cache, p);
          for (auto x : counters)
            if (x != 0) return "counter left nonzero";
          for (std::int32_t k = 0; k < n; ++k) {
            const auto r = static_cast<std::size_t>(batch[static_cast<std::size_t>(k)]);
            std::vector<unsigned char> row(
                o.begin() + static_cast<std::ptrdiff_t>(k * o_row),
                o.begin() + static_cast<std::ptrdiff_t>((k + 1) * o_row));
            std::vector<float> lrow(lse.begin() + static_cast<std::ptrdiff_t>(k * Hq),
                                    lse.begin() + static_cast<std::ptrdiff_t>((k + 1) * Hq));
            if (first_o[r].empty()) {
              first_o[r]   = std::move(row);
              first_lse[r] = std::move(lrow);
              continue;
            }
            if (row != first_o[r] ||
                std::memcmp(lrow.data(), first_lse[r].data(), lrow.size() * sizeof(float)) != 0) {
              std::ostringstream where;
              where << c.describe() << ", layer " << layer << ": request " << r
                    << " differs in a batch of " << n << " with N_CTA " << n_cta << " fold "
                    << fold;
              return where.str();
            }
          }
        }
    }
  }
  return {};
}

}  // namespace

TEST_CASE("review: batch invariance with empty requests, fold on/off, fp8 tensor cores",
          "[emu][decode][invariant][review]") {
  emu_backend backend;
  std::uint64_t seed = 9100;
  for (dtype t : {dtype::fp8_e5m2, dtype::f32}) {
    test::decode_case c;
    c.kv_dtype         = t;
    c.d                = t == dtype::f32 ? 64 : 128;
    c.group            = t == dtype::f32 ? 1 : 8;
    c.scales           = t == dtype::fp8_e5m2 ? test::scale_mode::per_head : test::scale_mode::none;
    c.lens             = {0, 700, 0, 3000, 257, 0, 1500};
    c.sinks            = true;
    c.invariant_pieces = 5;
    c.layers           = 1;
    c.sliding.clear();
    c.seed = seed++;
    INFO(c.describe());
    CHECK(check_invariance_fold(c, backend) == "");
  }
}
