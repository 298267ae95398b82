// SPDX-License-Identifier: Apache-2.0
/**
 * @file test/gpu/balanced_split_cases.hpp
 * @brief The scenarios of the per-step balanced split map (kernels/balanced_split.hpp) and their
 * check against the CPU reference. Part of test/gpu/kernel_cases.hpp (read its overview:
 * backends, checks). Host-only C++.
 */
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "../reference/kv_test_cache.hpp"
#include "tangram/kernels/balanced_split.hpp"
#include "tangram/reference/balanced_split.hpp"

namespace tangram::test {

/// One balanced-split scenario: a cache of `layers` layers (the last one sliding, window 24) and
/// `heads` KV heads (Hp 1, d 1: the kernel reads lengths only), a batch of `batch` of its
/// sequences in random order with every `padding_every`-th row padding (0: none), N_CTA `ctas`.
struct balanced_split_case {
  std::int32_t layers        = 2;
  std::int32_t heads         = 8;
  std::int32_t batch         = 5;
  std::int32_t padding_every = 0;
  std::int32_t ctas          = 132;
  std::uint64_t seed         = 1;
};

/// Cases across the kernel's strides: heads below and above one warp's lanes and the block's
/// warps, batches below and above 32 lanes, an empty batch, padding rows, N_CTA from exactly one
/// CTA per head to many per head.
inline std::vector<balanced_split_case> balanced_split_cases() {
  return {{2, 8, 5, 0, 132, 1},
          {3, 8, 37, 4, 264, 2},
          {2, 1, 3, 0, 1, 3},
          {2, 3, 40, 0, 3, 4},
          {2, 40, 9, 3, 528, 5},
          {1, 70, 33, 0, 70, 6},
          {2, 8, 0, 0, 132, 7},
          {2, 8, 6, 1, 132, 8},
          {4, 16, 64, 5, 1000, 9},
          {2, 2, 1, 0, 4096, 10},
          {2, 33, 70, 7, 33, 11}};
}

/// Runs `c` with `backend.balance` and the reference, on the case's N_CTA and on one that layer 0
/// fills exactly: the split maps must be identical, and the reference's must be a valid map
/// (every head at least one CTA, every layer's shares summing to N_CTA).
template <class Backend>
std::string check_balanced_split(balanced_split_case const& c, Backend& backend) {
  std::mt19937_64 rng(c.seed);
  page_geometry geo{16, 1, 1, dtype::f32};
  std::vector<std::int32_t> sliding = {c.layers - 1};
  auto layout = adjacent_layout(geo, c.layers, c.heads, sliding, /*window=*/24, /*ring_pages=*/2);
  std::int32_t sequences = c.batch + 3;
  std::vector<std::int32_t> lens, appended, seen;
  for (std::int32_t s = 0; s < sequences; ++s) {
    // Log-uniform lengths 0..~2K: heads that differ by orders of magnitude, some empty.
    auto len =
        static_cast<std::int32_t>(std::exp2(std::uniform_real_distribution<double>(0, 11)(rng))) -
        1;
    lens.push_back(len);
    appended.push_back(static_cast<std::int32_t>(rng() % 3));
    seen.push_back(len + 5);
  }
  auto seqs = ragged_sequences(lens, appended, seen, c.layers, c.heads, rng);
  test_cache cache(layout, seqs, c.seed);
  std::vector<std::int32_t> batch;
  for (std::int32_t r = 0; r < c.batch; ++r)
    batch.push_back(c.padding_every > 0 && r % c.padding_every == c.padding_every - 1
                        ? kv_cache_view{}.padding_slot
                        : static_cast<std::int32_t>(rng() % static_cast<std::uint64_t>(sequences)));
  auto view = cache.view(batch);
  auto H    = static_cast<std::size_t>(c.heads);
  // The case's N_CTA, then a tight one: layer 0 needs exactly N CTAs at its least bound (every
  // CTA taken by the bisection, none left over), N = sum_h max(1, ceil(W_h / T0)) for T0 a third
  // of its longest head's tokens (no N' < N fits T0, and fewer CTAs never fit a smaller bound).
  std::int64_t most = 1, tight = 0;
  std::vector<std::int64_t> layer0(H, 0);
  for (std::size_t h = 0; h < H; ++h) {
    for (std::int32_t r = 0; r < c.batch; ++r)
      layer0[h] += view.head_len(r, 0, static_cast<std::int32_t>(h));
    most = std::max(most, layer0[h]);
  }
  for (auto w : layer0) tight += balanced_head_ctas(w, std::max<std::int64_t>(1, most / 3));
  for (std::int64_t ctas : {static_cast<std::int64_t>(c.ctas), tight}) {
    auto size = static_cast<std::size_t>(c.layers) * (H + 1);
    std::vector<std::int32_t> want(size, -7), got(size, -7);
    balanced_split_params p;
    p.kv        = view;
    p.num_ctas  = static_cast<std::int32_t>(ctas);
    p.cta_begin = want.data();
    reference::balance_decode_splits(p);
    p.cta_begin = got.data();
    backend.balance(cache, p);
    std::ostringstream where;
    where << "layers " << c.layers << " heads " << c.heads << " batch " << c.batch
          << " padding every " << c.padding_every << " N_CTA " << ctas << " seed " << c.seed;
    for (std::size_t l = 0; l < static_cast<std::size_t>(c.layers); ++l) {
      auto const* b = want.data() + l * (H + 1);
      if (b[0] != 0 || b[H] != ctas)
        return where.str() + ": reference layer " + std::to_string(l) + " spans [" +
               std::to_string(b[0]) + ", " + std::to_string(b[H]) + ")";
      for (std::size_t h = 0; h < H; ++h)
        if (b[h + 1] - b[h] < 1)
          return where.str() + ": reference gives head " + std::to_string(h) + " of layer " +
                 std::to_string(l) + " no CTA";
    }
    for (std::size_t i = 0; i < size; ++i)
      if (got[i] != want[i])
        return where.str() + ": cta_begin[" + std::to_string(i) + "] = " + std::to_string(got[i]) +
               ", reference " + std::to_string(want[i]);
  }
  return {};
}

}  // namespace tangram::test
