// SPDX-License-Identifier: Apache-2.0
// What the reliability tests need to know about the runtime they run under.
#pragma once

#include <cstdlib>
#include <cstring>

// TANGRAM_TEST_SANITIZED: built with AddressSanitizer or ThreadSanitizer, by g++ (which defines
// __SANITIZE_*__) or clang (which says so through __has_feature). Their allocators abort on absurd
// sizes instead of failing them.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define TANGRAM_TEST_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define TANGRAM_TEST_SANITIZED 1
#endif
#endif

namespace tangram::test {

/// True under valgrind (its preload library is in LD_PRELOAD). Valgrind replaces operator new
/// and aborts, instead of throwing std::bad_alloc, when an allocation fails, so tests that make
/// host allocations fail skip themselves there.
inline bool under_valgrind() {
  char const* preload = std::getenv("LD_PRELOAD");
  return preload != nullptr && std::strstr(preload, "vgpreload") != nullptr;
}

}  // namespace tangram::test
