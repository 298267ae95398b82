// SPDX-License-Identifier: Apache-2.0
// Which sanitizer a test binary is built with, as g++ (__SANITIZE_*__) or clang (__has_feature)
// says: TANGRAM_TEST_ASAN (AddressSanitizer), TANGRAM_TEST_TSAN (ThreadSanitizer), and
// TANGRAM_TEST_SANITIZED for either (their allocators abort on absurd sizes instead of failing
// them).
#pragma once

#if defined(__has_feature)
#define TANGRAM_TEST_HAS_FEATURE(x) __has_feature(x)
#else
#define TANGRAM_TEST_HAS_FEATURE(x) 0
#endif

#if defined(__SANITIZE_ADDRESS__) || TANGRAM_TEST_HAS_FEATURE(address_sanitizer)
#define TANGRAM_TEST_ASAN 1
#endif
#if defined(__SANITIZE_THREAD__) || TANGRAM_TEST_HAS_FEATURE(thread_sanitizer)
#define TANGRAM_TEST_TSAN 1
#endif
#if defined(TANGRAM_TEST_ASAN) || defined(TANGRAM_TEST_TSAN)
#define TANGRAM_TEST_SANITIZED 1
#endif
