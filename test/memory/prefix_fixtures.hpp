// SPDX-License-Identifier: Apache-2.0
// The shared prefix of the prefix tests on the tiny hybrid model (prefix_sharing_test.cpp,
// deferred_reuse_test.cpp).
#pragma once

#include "storm/engine_sim.hpp"
#include "test_support.hpp"

namespace tangram::test {

/// A 16-token prefix prefilled in two chunks of 8 and ended (not pinned). Pages per group of the
/// tiny plan (manager_test's chunk 2 at n = 16): {3, 2, 2, 1, 3, 3, 4, 4} = 22.
inline sequence_id prefill_prefix(engine_sim& sim) {
  auto p = sim.admit(16, 0);
  REQUIRE(p);
  sim.chunk(*p, 8);
  sim.chunk(*p, 8);
  sim.end_turn(*p);
  return *p;
}

}  // namespace tangram::test
