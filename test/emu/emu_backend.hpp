// SPDX-License-Identifier: Apache-2.0
// The emulator as a backend of test/gpu/kernel_cases.hpp: runs the real kernel bodies
// (include/tangram/kernels/detail/*.cuh) through their real launch sequences on host memory.
// Defined in emu_{decode,eviction,elastic_eviction,append,prefill,balanced_split}.cpp, one
// translation unit per kernel family, so the instantiations compile in parallel and the test files
// need no kernel headers.
#pragma once

#include "../reference/kv_test_cache.hpp"
#include "simt/simt.hpp"
#include "tangram/kernels/append.hpp"
#include "tangram/kernels/balanced_split.hpp"
#include "tangram/kernels/decode_attention.hpp"
#include "tangram/kernels/elastic_eviction.hpp"
#include "tangram/kernels/eviction.hpp"
#include "tangram/kernels/prefill_attention.hpp"

namespace tangram::test {

struct emu_backend {
  /// Split + merge kernels for p (host pointers), into p.o and p.lse; the workspace starts
  /// poisoned (0xff), as unwritten device memory would be garbage.
  void decode(test_cache& cache, decode_params const& p);
  /// The eviction kernels for p (host pointers), in place on the cache's pool.
  void evict(test_cache& cache, eviction_params const& p);
  /// The elastic selection kernels for p (host pointers), in place on the cache's pool; the
  /// workspace starts poisoned (0xff).
  void evict_elastic(test_cache& cache, elastic_eviction_params const& p);
  /// The append kernel for p (host pointers), in place on the cache's pool.
  void append(test_cache& cache, append_params const& p);
  /// The prefill-attention kernel for p (host pointers), into p.o and p.lse.
  void prefill(test_cache& cache, prefill_params const& p);
  /// The balanced split-map kernel for p (host pointers), into p.cta_begin.
  void balance(test_cache& cache, balanced_split_params const& p);
};

}  // namespace tangram::test
