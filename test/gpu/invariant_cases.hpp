// SPDX-License-Identifier: Apache-2.0
/**
 * @file test/gpu/invariant_cases.hpp
 * @brief Batch-invariant decode (decode_params::invariant_pieces): its scenarios and the check
 * that a request's output bits do not depend on the batch around it, shared by the GPU tests and
 * the host emulation tests like kernel_cases.hpp. Host-only C++; no test framework.
 */
#pragma once

#include <cstdint>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "kernel_cases.hpp"

namespace tangram::test {

/// Batch-invariant cases for both split kernels (CUDA-core: f32 GQA 1, fp8 e4m3 GQA 2 with
/// per-head scales; tensor-core: bf16 GQA 4) with lengths around the smallest piece (255..257)
/// and requests of 1, 3 and up to 16 pieces (5001 tokens: 16 pieces of 320 at K 16); K = 1, 3 and
/// 16; one growing layer and one sliding-window layer.
inline std::vector<decode_case> decode_cases_invariant() {
  std::vector<decode_case> out;
  std::uint64_t seed = 70;
  for (std::int32_t pieces : {1, 3, 16}) {
    for (dtype t : {dtype::f32, dtype::bf16, dtype::fp8_e4m3}) {
      decode_case c;
      c.kv_dtype         = t;
      c.d                = t == dtype::f32 ? 64 : 128;
      c.group            = t == dtype::f32 ? 1 : t == dtype::bf16 ? 4 : 2;
      c.scales           = t == dtype::fp8_e4m3 ? scale_mode::per_head : scale_mode::none;
      c.lens             = {1, 255, 256, 257, 700, 3000, 5001};
      c.sinks            = pieces != 3;
      c.invariant_pieces = pieces;
      c.seed             = seed++;
      out.push_back(c);
    }
  }
  return out;
}

/**
 * Runs `c` (its `invariant_pieces` replaced by `pieces`) on `backend` for every layer over the
 * whole batch, the batch in reverse order, each request alone and each pair of neighbours
 * swapped, each under split maps of `c.ctas` CTAs (default: the KV heads, 264 and 535, random
 * shares) and, with `with_fold`, both with the merge kernel and with the folded merge
 * (merge_counters, which must be zero again after every launch). Requires every request's output
 * and LSE bits to equal those of its first run. Returns an empty string, or the first difference.
 * (With `pieces` = 0 the split map's pieces depend on the batch, so long requests are expected
 * to differ: the tests use that to show the check can fail.)
 */
template <class Backend>
std::string check_decode_batch_invariance(decode_case c,
                                          std::int32_t pieces,
                                          Backend& backend,
                                          bool with_fold = false) {
  c.invariant_pieces = pieces;
  decode_scenario s(c);
  const std::int32_t B = s.view.batch_size, Hq = c.heads * c.group;
  const std::size_t q_row = static_cast<std::size_t>(Hq) * c.d;
  const std::size_t o_row = q_row * size_of(c.o_dtype);
  std::vector<std::vector<std::int32_t>> batches;
  std::vector<std::int32_t> all(static_cast<std::size_t>(B));
  for (std::int32_t r = 0; r < B; ++r) all[static_cast<std::size_t>(r)] = r;
  batches.push_back(all);
  batches.emplace_back(all.rbegin(), all.rend());
  for (std::int32_t r = 0; r < B; ++r) batches.push_back({r});
  for (std::int32_t r = 0; r + 1 < B; ++r) batches.push_back({r + 1, r});
  std::vector<std::int32_t> ctas = c.ctas;
  if (ctas.empty()) ctas = {c.heads, 2 * 132, 4 * 132 + 7};

  for (std::int32_t layer = 0; layer < c.layers; ++layer) {
    // first[r]: request r's output row and LSEs from the first run that held it.
    std::vector<std::vector<unsigned char>> first_o(static_cast<std::size_t>(B));
    std::vector<std::vector<float>> first_lse(static_cast<std::size_t>(B));
    for (std::int32_t n_cta : ctas) {
      auto begin = random_cta_begin(c.layers, c.heads, n_cta, s.rng);
      for (int fold = 0; fold <= (with_fold ? 1 : 0); ++fold)
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
          p.invariant_pieces = pieces;
          std::vector<unsigned char> o(static_cast<std::size_t>(n) * o_row);
          std::vector<float> lse(static_cast<std::size_t>(n) * Hq);
          p.o   = o.data();
          p.lse = lse.data();
          std::vector<std::int32_t> counters(static_cast<std::size_t>(n) * c.heads, 0);
          if (fold) p.merge_counters = counters.data();
          backend.decode(s.cache, p);
          for (auto x : counters)
            if (x != 0) return c.describe() + ": a merge counter is not zero after the launch";
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
              where << c.describe() << ", invariant_pieces " << pieces << ", layer " << layer
                    << ": request " << r << " ("
                    << s.view.head_len(static_cast<std::int32_t>(r), layer, 0)
                    << " tokens on head 0) differs in a batch of " << n << " with N_CTA " << n_cta;
              return where.str();
            }
          }
        }
    }
  }
  return {};
}

}  // namespace tangram::test
