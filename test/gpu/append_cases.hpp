// SPDX-License-Identifier: Apache-2.0
/**
 * @file test/gpu/append_cases.hpp
 * @brief The decode-append scenarios and their check against the CPU reference.
 * Part of test/gpu/kernel_cases.hpp (read its overview: backends, checks). Host-only C++.
 */
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "../reference/kv_test_cache.hpp"
#include "scale_cases.hpp"
#include "tangram/kernels/append.hpp"
#include "tangram/reference/append.hpp"

namespace tangram::test {

// ---------------------------------------------------------------------------------------------
// Append.
// ---------------------------------------------------------------------------------------------

/// Cache dtypes the append kernel is instantiated for, and its source dtypes.
inline std::vector<dtype> append_cache_dtypes() {
  return {dtype::f32, dtype::f16, dtype::bf16, dtype::fp8_e4m3, dtype::fp8_e5m2};
}
inline std::vector<dtype> append_source_dtypes() {
  return {dtype::f32, dtype::f16, dtype::bf16};
}

/// Appends one token to every head of both layers of a 5-sequence cache (a sliding layer
/// included; `Hp` heads per page, 2 or 1) with `backend` and with the reference: the page pools
/// must end byte-identical. `scales` (fp8 caches only) are drawn per layer (scale_arrays: in
/// [0.5, 2], K and V apart): the kernel's `x / s_h` must store the reference's bytes for every
/// head.
template <class Backend>
std::string check_append(dtype cache_dtype,
                         dtype src,
                         Backend& backend,
                         scale_mode scales = scale_mode::none,
                         std::int32_t Hp   = 2) {
  page_geometry geo{16, Hp, 128, cache_dtype};
  auto layout = adjacent_layout(geo, 2, 4, /*sliding=*/{1}, /*window=*/40, /*ring_pages=*/3);
  std::vector<sequence_spec> seqs;
  for (std::int32_t r = 0; r < 5; ++r) {
    sequence_spec s;
    s.seq_tokens = 30 + 17 * r;
    s.appended   = 1 + r;
    s.base_len.assign(8, 10 + 7 * r);
    seqs.push_back(s);
  }
  test_cache run_cache(layout, seqs, 42), ref_cache(layout, seqs, 42);
  std::vector<std::int32_t> batch = {3, 0, 4, 1};
  auto run_view = run_cache.view(batch), ref_view = ref_cache.view(batch);
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-2, 2);
  std::size_t n = batch.size() * 4 * 128;
  std::vector<std::uint8_t> k_src(n * size_of(src)), v_src(n * size_of(src));
  for (std::size_t i = 0; i < n; ++i) {
    reference::detail::store_from_float(k_src.data(), src, static_cast<std::int64_t>(i), u(rng));
    reference::detail::store_from_float(v_src.data(), src, static_cast<std::int64_t>(i), u(rng));
  }
  for (std::int32_t layer = 0; layer < 2; ++layer) {
    append_params p;
    p.kv        = ref_view;
    p.layer     = layer;
    p.k         = k_src.data();
    p.v         = v_src.data();
    p.src_dtype = src;
    const scale_arrays sc(scales, 4, static_cast<std::uint64_t>(layer) + 11);
    p.scales = sc.view();
    reference::append_decode_kv(p);
    p.kv = run_view;
    backend.append(run_cache, p);
  }
  if (run_cache.pool() != ref_cache.pool())
    return "append cache " + std::string(to_string(cache_dtype)) + " src " +
           std::string(to_string(src)) + " " + to_string(scales) + " Hp " + std::to_string(Hp) +
           ": page pool differs";
  return {};
}

}  // namespace tangram::test
