// SPDX-License-Identifier: Apache-2.0
// Runner for the GPU tests: exits 77 (ctest: skipped) when no usable CUDA device exists, except
// when Catch is only asked to list tests.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdio>
#include <cstring>

#include "tangram/device/device.hpp"

int main(int argc, char** argv) {
  bool listing = false;
  for (int i = 1; i < argc; ++i) listing |= std::strncmp(argv[i], "--list", 6) == 0;
  if (!listing && tangram::cuda_device_count() == 0) {
    std::puts("SKIPPED: no usable CUDA device");
    return 77;
  }
  return Catch::Session().run(argc, argv);
}
