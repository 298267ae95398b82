// SPDX-License-Identifier: Apache-2.0
// Replays every input the fuzzers ever found (fuzz/regressions/<harness>/) and the seed corpora
// through the same properties the harnesses check.
#include <dirent.h>

#include <string>
#include <vector>

#include "../../fuzz/properties.hpp"
#include "tangram/io/detail/file_io.hpp"
#include "test_support.hpp"

namespace {

std::vector<std::string> files_in(std::string const& dir) {
  std::vector<std::string> out;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (auto* e = ::readdir(d))
      if (e->d_name[0] != '.') out.push_back(dir + "/" + e->d_name);
    ::closedir(d);
  }
  return out;
}

template <class Property>
std::size_t replay(std::string const& name, Property property) {
  std::size_t n = 0;
  for (char const* kind : {"regressions", "corpus"}) {
    for (auto const& path : files_in(std::string(TANGRAM_SOURCE_DIR) + "/fuzz/" + kind + "/" + name)) {
      INFO(path);
      CHECK_NOTHROW(property(tangram::detail::read_file(path)));
      ++n;
    }
  }
  return n;
}

}  // namespace

TEST_CASE("fuzz findings and seeds replay cleanly", "[fuzz]") {
  CHECK(replay("json", tangram::fuzz::json_roundtrip) >= 2);
  CHECK(replay("retention_samples", tangram::fuzz::retention_samples_invariants) >= 1);
  CHECK(replay("budget_profile", tangram::fuzz::budget_profile_roundtrip) >= 1);
  replay("model_spec", tangram::fuzz::model_spec_roundtrip);
  CHECK(replay("static_plan", tangram::fuzz::static_plan_roundtrip) >= 1);
  CHECK(replay("workload", tangram::fuzz::workload_roundtrip) >= 1);
  CHECK(replay("command_line", tangram::fuzz::command_line) >= 4);
  // The first finding: "-5e-325" underflows to -0.0, which used to be written as "-0" and read
  // back as the integer 0.
  CHECK_NOTHROW(tangram::fuzz::json_roundtrip("[-5e-325, 3.0, -0.0]"));
  namespace json = tangram::detail::json;
  CHECK(json::dump(json::parse("[-0.0, 3.0, 2]", "t"), -1) == "[-0.0,3.0,2]");
}
