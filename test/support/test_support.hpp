// SPDX-License-Identifier: Apache-2.0
// Helpers shared by the CPU test suites.
#pragma once

#include <catch2/catch.hpp>

#include <filesystem>
#include <set>
#include <string>
#include <vector>

namespace tangram::test {

/// A fresh, empty scratch folder `test-tmp/<file>/<name>` in the build tree for one test.
inline std::string fresh_tmp_dir(std::string const& file, std::string const& name) {
  auto dir = std::filesystem::path(TANGRAM_BINARY_DIR) / "test-tmp" / file / name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

/// The names in folder `dir`.
inline std::set<std::string> dir_entries(std::string const& dir) {
  std::set<std::string> out;
  for (auto const& e : std::filesystem::directory_iterator(dir))
    out.insert(e.path().filename().string());
  return out;
}

/// Path of a file under data/ in the source tree.
inline std::string data_path(std::string const& rel) { return std::string(TANGRAM_TEST_DATA_DIR) + "/" + rel; }

/// The bundled real retention profiles (scorer/model.json), relative to data/profiles.
inline std::vector<std::string> bundled_profiles() {
  std::vector<std::string> out;
  for (char const* scorer : {"ea", "fastkvzip", "keydiff", "snapkv"})
    for (char const* model : {"llama-3.1-8b-instruct", "qwen3-4b-instruct-2507"})
      out.push_back(std::string(scorer) + "/" + model + ".json");
  return out;
}

}  // namespace tangram::test

/// Checks that `expr` throws `Exception` whose message contains every one of the given pieces.
#define TANGRAM_REQUIRE_THROWS_WITH_ALL(expr, Exception, ...)                          \
  do {                                                                                  \
    bool tangram_threw_ = false;                                                        \
    try {                                                                               \
      (void)(expr);                                                                     \
    } catch (Exception const& tangram_e_) {                                             \
      tangram_threw_ = true;                                                            \
      std::string tangram_msg_ = tangram_e_.what();                                     \
      for (std::string tangram_piece_ : {__VA_ARGS__}) {                                \
        INFO("message: " << tangram_msg_);                                              \
        CHECK(tangram_msg_.find(tangram_piece_) != std::string::npos);                  \
      }                                                                                 \
    }                                                                                   \
    INFO("expected " #Exception " from " #expr);                                        \
    CHECK(tangram_threw_);                                                              \
  } while (0)
