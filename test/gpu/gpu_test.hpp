// SPDX-License-Identifier: Apache-2.0
// A minimal test runner for the GPU tests, so that they build on a bare GPU machine (CUDA
// toolkit, CMake, a compiler; no Catch2). Tests register with TANGRAM_GPU_TEST; GPU_REQUIRE
// ends the test on failure, GPU_CHECK records it and goes on. Runner: gpu_main.cpp.
#pragma once

#include <cstdio>
#include <exception>
#include <sstream>
#include <string>
#include <vector>

namespace tangram::gpu_test {

struct test_case {
  std::string name, tags;
  void (*run)();
};

inline std::vector<test_case>& registry() {
  static std::vector<test_case> tests;
  return tests;
}

struct registrar {
  registrar(const char* name, const char* tags, void (*run)()) {
    registry().push_back({name, tags, run});
  }
};

/// Failures of the running test (GPU_CHECK appends, GPU_REQUIRE appends and throws).
inline std::vector<std::string>& failures() {
  static std::vector<std::string> f;
  return f;
}

struct required_failed : std::exception {};

inline void record(const char* file, int line, const char* expr, std::string const& detail) {
  std::ostringstream s;
  s << file << ":" << line << ": " << expr;
  if (!detail.empty()) s << " -- " << detail;
  failures().push_back(s.str());
}

/// Runs `t` with failures() cleared first; a GPU_REQUIRE that ends it or an exception (recorded)
/// stops it. True when it passed.
inline bool run_one(test_case const& t) {
  failures().clear();
  try {
    t.run();
  } catch (required_failed const&) {
  } catch (std::exception const& e) {
    failures().push_back(std::string("exception: ") + e.what());
  }
  return failures().empty();
}

/// Prints "PASS: name" or "FAIL: name" and each failure of the test just run (`run_one`).
inline void print_result(test_case const& t, char const* timing = "") {
  std::printf("%s%s: %s\n", failures().empty() ? "PASS" : "FAIL", timing, t.name.c_str());
  for (auto const& f : failures()) std::printf("    %s\n", f.c_str());
}

/// Runs every registered test (the runners on the fake CUDA runtime, test/fake_cuda/gpu): 0 when
/// there is one and all pass, else 1.
inline int run_all() {
  int failed = 0;
  for (auto const& t : registry()) {
    failed += !run_one(t);
    print_result(t);
  }
  return failed == 0 && !registry().empty() ? 0 : 1;
}

}  // namespace tangram::gpu_test

#define TANGRAM_GPU_CAT2(a, b) a##b
#define TANGRAM_GPU_CAT(a, b)  TANGRAM_GPU_CAT2(a, b)
/// Defines and registers a test: TANGRAM_GPU_TEST("name", "[tags]") { body }
#define TANGRAM_GPU_TEST(name, tags)                                                 \
  static void TANGRAM_GPU_CAT(tangram_gpu_test_, __LINE__)();                        \
  static ::tangram::gpu_test::registrar TANGRAM_GPU_CAT(tangram_gpu_reg_, __LINE__)( \
      name, tags, &TANGRAM_GPU_CAT(tangram_gpu_test_, __LINE__));                    \
  static void TANGRAM_GPU_CAT(tangram_gpu_test_, __LINE__)()

/// Records a failure with `detail` (streamable expression) when `cond` is false.
#define GPU_CHECK_MSG(cond, detail)                                                   \
  do {                                                                                \
    if (!(cond)) {                                                                    \
      std::ostringstream tangram_gpu_msg_;                                            \
      tangram_gpu_msg_ << detail;                                                     \
      ::tangram::gpu_test::record(__FILE__, __LINE__, #cond, tangram_gpu_msg_.str()); \
    }                                                                                 \
  } while (0)
#define GPU_REQUIRE_MSG(cond, detail)                                                 \
  do {                                                                                \
    if (!(cond)) {                                                                    \
      std::ostringstream tangram_gpu_msg_;                                            \
      tangram_gpu_msg_ << detail;                                                     \
      ::tangram::gpu_test::record(__FILE__, __LINE__, #cond, tangram_gpu_msg_.str()); \
      throw ::tangram::gpu_test::required_failed{};                                   \
    }                                                                                 \
  } while (0)
#define GPU_CHECK(cond)   GPU_CHECK_MSG(cond, "")
#define GPU_REQUIRE(cond) GPU_REQUIRE_MSG(cond, "")
/// A kernel_cases.hpp check: the empty string means agreement, anything else is the failure.
#define GPU_REQUIRE_AGREES(expr)                                         \
  do {                                                                   \
    std::string tangram_gpu_verdict_ = (expr);                           \
    GPU_REQUIRE_MSG(tangram_gpu_verdict_.empty(), tangram_gpu_verdict_); \
  } while (0)
