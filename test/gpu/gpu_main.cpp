// SPDX-License-Identifier: Apache-2.0
// Runner for the GPU tests (no test framework needed):
//   tangram_gpu_tests [--list] [--short] [NAME_SUBSTRING...]
// runs every registered test whose name contains one of the substrings (all without any),
// skipping those tagged [long] with --short. Exits 0 when all pass, 1 when one fails, 77
// (ctest: skipped) when no usable CUDA device exists, except with --list.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "gpu_test.hpp"
#include "tangram/device/device.hpp"

int main(int argc, char** argv) {
  using namespace tangram::gpu_test;
  bool list = false, short_mode = false;
  std::vector<std::string> filters;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--list") == 0)
      list = true;
    else if (std::strcmp(argv[i], "--short") == 0)
      short_mode = true;
    else if (argv[i][0] == '-') {
      std::fprintf(
          stderr, "tangram_gpu_tests: unknown option %s (--list, --short, NAME...)\n", argv[i]);
      return 2;
    } else
      filters.push_back(argv[i]);
  }
  std::vector<test_case const*> selected;
  for (auto const& t : registry()) {
    bool match = filters.empty();
    for (auto const& f : filters) match |= t.name.find(f) != std::string::npos;
    if (match && !(short_mode && t.tags.find("[long]") != std::string::npos))
      selected.push_back(&t);
  }
  if (list) {
    for (auto const* t : selected) std::printf("%s %s\n", t->name.c_str(), t->tags.c_str());
    return 0;
  }
  if (tangram::cuda_device_count() == 0) {
    std::puts("SKIPPED: no usable CUDA device");
    return 77;
  }
  int failed = 0;
  for (auto const* t : selected) {
    auto t0 = std::chrono::steady_clock::now();
    failed += !run_one(*t);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    char timing[32];
    std::snprintf(timing, sizeof timing, " %.3f s", s);
    print_result(*t, timing);
    std::fflush(stdout);
  }
  std::printf("%zu test cases, %d failed\n", selected.size(), failed);
  return failed ? 1 : 0;
}
