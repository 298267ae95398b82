// SPDX-License-Identifier: Apache-2.0
// What the reliability tests need to know about the runtime they run under.
#pragma once

#include <cstdlib>
#include <cstring>

#include "sanitizers.hpp"  // TANGRAM_TEST_SANITIZED: ASan or TSan (test/support)

namespace tangram::test {

/// True under valgrind (its preload library is in LD_PRELOAD). Valgrind replaces operator new
/// and aborts, instead of throwing std::bad_alloc, when an allocation fails, so tests that make
/// host allocations fail skip themselves there.
inline bool under_valgrind() {
  char const* preload = std::getenv("LD_PRELOAD");
  return preload != nullptr && std::strstr(preload, "vgpreload") != nullptr;
}

}  // namespace tangram::test
