// SPDX-License-Identifier: Apache-2.0
// Stand-in for test/support/test_support.hpp when the test models
// (test/support/storm/engine_sim.hpp, test/support/storm/driver.hpp) run inside the soak driver
// instead of Catch: REQUIRE and CHECK throw a check_failure naming the expression and its place;
// INFO is dropped (the driver reports the config, seed and op index instead).
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

namespace tangram::test {

/// A violated check of the test model.
struct check_failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

[[noreturn]] inline void fail_check(char const* expr, char const* file, int line) {
  throw check_failure(std::string(file) + ":" + std::to_string(line) + ": check failed: " + expr);
}

/// Path of a file under data/ in the source tree.
inline std::string data_path(std::string const& rel) {
  return std::string(TANGRAM_TEST_DATA_DIR) + "/" + rel;
}

}  // namespace tangram::test

#define REQUIRE(...)                                                                   \
  do {                                                                                 \
    if (!(__VA_ARGS__)) ::tangram::test::fail_check(#__VA_ARGS__, __FILE__, __LINE__); \
  } while (0)
#define CHECK(...) REQUIRE(__VA_ARGS__)
#define INFO(...) \
  do {            \
  } while (0)
