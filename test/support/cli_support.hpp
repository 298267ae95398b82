// SPDX-License-Identifier: Apache-2.0
// Running the `tangram` command line in-process, for the suites that link tangram_cli_lib.
#pragma once

#include <algorithm>
#include <catch2/catch.hpp>
#include <filesystem>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "commands.hpp"
#include "tangram/io/detail/json.hpp"

namespace tangram::test {

/// What one in-process `tangram` run returned and printed.
struct cli_result {
  int code = 0;
  std::string out, err;
};

/// `argv` followed by `extra`: a test's common options plus one run's own.
inline std::vector<std::string> with_args(std::vector<std::string> argv,
                                          std::vector<std::string> const& extra) {
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}

/// Runs `tangram argv...` (argv without the program name) and captures its streams.
inline cli_result run_cli(std::vector<std::string> const& argv) {
  std::ostringstream out, err;
  int code = cli::run(argv, {out, err});
  return {code, out.str(), err.str()};
}

/// `tangram argv...` in-process: the name every command-line test file calls (`using
/// tangram::test::run;`), one definition so the suites build as unity batches.
inline cli_result run(std::vector<std::string> const& argv) {
  return run_cli(argv);
}

/// A successful run's result and the JSON document it printed on stdout (owned here: take
/// `root()` from a named `cli_json`, the cursor points into `doc`).
struct cli_json {
  cli_result result;
  detail::json::value doc;

  /// A cursor on the whole document, whose errors name the source "stdout".
  [[nodiscard]] detail::json::node root() const { return {doc, "stdout"}; }
};

/// Runs `tangram argv...`, requires exit code 0 (showing stderr when not) and parses stdout as
/// JSON: how the simulate tests read a `--json` report.
inline cli_json run_json(std::vector<std::string> const& argv) {
  auto r = run_cli(argv);
  INFO(r.err);
  REQUIRE(r.code == 0);
  auto doc = detail::json::parse(r.out, "stdout");
  return {std::move(r), std::move(doc)};
}

/// A path `name` in the build tree's scratch folder `test-tmp/<folder>` (created on demand).
inline std::string cli_tmp_path(std::string const& folder, std::string const& name) {
  auto dir = std::filesystem::path(TANGRAM_BINARY_DIR) / "test-tmp" / folder;
  std::filesystem::create_directories(dir);
  return (dir / name).string();
}

/// Checks that `tangram argv...` is refused: exit code `code` and one line on stderr holding each
/// of `pieces`; with `quiet_stdout`, nothing on stdout either.
inline void check_refused(std::vector<std::string> const& argv,
                          std::vector<std::string> const& pieces,
                          int code          = 2,
                          bool quiet_stdout = false) {
  auto r = run_cli(argv);
  INFO("stderr: " << r.err);
  CHECK(r.code == code);
  if (quiet_stdout) CHECK(r.out.empty());
  CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);  // one line
  for (auto const& p : pieces) CHECK(r.err.find(p) != std::string::npos);
}

/// One refused command line: its argv and a piece of its one-line error.
struct refusal {
  std::vector<std::string> argv;
  std::string piece;
};

/// check_refused (exit code 2) on each of `cases`.
inline void check_refusals(std::vector<refusal> const& cases) {
  for (auto const& c : cases) check_refused(c.argv, {c.piece});
}

}  // namespace tangram::test
