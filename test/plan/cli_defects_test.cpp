// SPDX-License-Identifier: Apache-2.0
// Issue 31, command-line defects: late failures (after the main work) and errors naming internal
// fields (4, 5), partial multi-stage `plan --out` (5), inputs that block or are misnamed (7).
// Driven in-process; a child process with a watchdog where the old code blocked forever.
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "cli_support.hpp"
#include "commands.hpp"
#include "tangram/io/detail/file_io.hpp"
#include "test_support.hpp"

namespace fs = std::filesystem;
using tangram::test::cli_result;
using tangram::test::dir_entries;
using tangram::test::fresh_tmp_dir;
using tangram::test::run_cli;

namespace {

/// Exit 2 with one line of stderr holding every piece.
void expect_usage_error(cli_result const& r, std::vector<std::string> const& pieces) {
  INFO("stdout: " << r.out << "\nstderr: " << r.err);
  CHECK(r.code == 2);
  CHECK(r.out.empty());
  for (auto const& p : pieces) CHECK(r.err.find(p) != std::string::npos);
}

/// Runs `argv` in a child process with a watchdog; 0 when it exits 2 with every piece on stderr,
/// 128 + 14 when the watchdog fired (the command blocked).
int child_usage_error(std::vector<std::string> const& argv,
                      std::vector<std::string> const& pieces) {
  std::fflush(nullptr);
  pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::alarm(20);
    auto r  = run_cli(argv);
    bool ok = r.code == 2;
    for (auto const& p : pieces) ok = ok && r.err.find(p) != std::string::npos;
    ::_exit(ok ? 0 : 1);
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

char const* const profile = "snapkv/llama-3.1-8b-instruct";

}  // namespace

TEST_CASE("plan with stages: a --stage-context that overflows is refused before any work",
          "[regression][cli][pipeline]") {
  // It used to write x.stage0-of-4.json, then fail on stage 0's footprint with a message that
  // named no option ("stage footprint bytes overflows").
  auto dir = fresh_tmp_dir("cli_defects", "overflow");
  for (auto const& stages :
       std::vector<std::vector<std::string>>{{"--pipeline-stages", "4"},
                                             {"--layers", "0:8,8:16,16:24,24:32"},
                                             {"--layers", "0:1,1:32"}}) {
    std::vector<std::string> argv = {
        "plan", profile, "--stage-context", "9007199254740992", "--out", dir + "/x.json"};
    argv.insert(argv.end(), stages.begin(), stages.end());
    expect_usage_error(run_cli(argv), {"--stage-context: 9007199254740992 tokens", "overflows"});
    CHECK(dir_entries(dir).empty());
  }
  // The largest context the check lets through plans every stage.
  auto ok = run_cli({"plan",
                     profile,
                     "--pipeline-stages",
                     "2",
                     "--stage-context",
                     "2147483647",
                     "--out",
                     dir + "/y.json"});
  INFO(ok.err);
  CHECK(ok.code == 0);
  CHECK(dir_entries(dir) == std::set<std::string>{"y.stage0-of-2.json", "y.stage1-of-2.json"});
}

TEST_CASE("plan with stages writes every stage file or none", "[regression][cli][pipeline]") {
  // A write that fails on a later stage (a file size limit, as a full disk) used to leave the
  // earlier stages' files behind; a stage file that existed keeps its contents.
  auto dir = fresh_tmp_dir("cli_defects", "partial");
  auto out = dir + "/x.json";
  // Stage 0 holds one layer, stage 1 the other 31: a limit between their sizes fails stage 1.
  auto sized = run_cli({"plan", profile, "--layers", "0:1,1:32", "--out", out});
  REQUIRE(sized.code == 0);
  auto small = fs::file_size(dir + "/x.stage0-of-2.json");
  auto large = fs::file_size(dir + "/x.stage1-of-2.json");
  REQUIRE(small * 2 < large);
  fs::remove(dir + "/x.stage1-of-2.json");
  tangram::detail::write_file(dir + "/x.stage0-of-2.json", "old stage 0");

  struct rlimit saved {};
  REQUIRE(::getrlimit(RLIMIT_FSIZE, &saved) == 0);
  auto old_handler    = std::signal(SIGXFSZ, SIG_IGN);
  struct rlimit limit = saved;
  limit.rlim_cur      = (small + large) / 2;
  REQUIRE(::setrlimit(RLIMIT_FSIZE, &limit) == 0);
  auto r = run_cli({"plan", profile, "--layers", "0:1,1:32", "--out", out});
  ::setrlimit(RLIMIT_FSIZE, &saved);
  std::signal(SIGXFSZ, old_handler);
  INFO(r.err);
  CHECK(r.code != 0);
  CHECK(r.err.find("x.stage1-of-2.json") != std::string::npos);
  CHECK(dir_entries(dir) == std::set<std::string>{"x.stage0-of-2.json"});
  CHECK(tangram::detail::read_file(dir + "/x.stage0-of-2.json") == "old stage 0");
}

TEST_CASE("simulate --sensitivity refuses a --max-context its sweep cannot replay, first",
          "[regression][cli][simulate]") {
  // The sweep replays at max_tokens = the context; it used to run the whole simulation and sweep,
  // then exit with "replay.max_tokens: must be in [1, 1073741824]". Checked before the inputs
  // are even read: the missing profile is not what is reported.
  auto r = run_cli({"simulate",
                    "--profile",
                    "/nonexistent/profile.json",
                    "--quiet",
                    "--sensitivity",
                    "--max-context",
                    "1073741825"});
  expect_usage_error(r, {"--sensitivity --max-context 1073741825", "1073741824"});
  CHECK(r.err.find("nonexistent") == std::string::npos);
  // Without --sensitivity the same context is the options' to take: the missing file is next.
  auto plain = run_cli({"simulate",
                        "--profile",
                        "/nonexistent/profile.json",
                        "--quiet",
                        "--max-context",
                        "1073741825"});
  CHECK(plain.code == 2);
  CHECK(plain.err.find("nonexistent") != std::string::npos);
}

TEST_CASE("inputs that are not regular files are refused up front, each named",
          "[regression][cli][file_io]") {
  auto dir  = fresh_tmp_dir("cli_defects", "inputs");
  auto fifo = dir + "/samples.json";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  // No writer ever comes: the old read blocked forever (the watchdog fires instead).
  CHECK(child_usage_error({"plan", fifo}, {"samples.json\"", "a FIFO", "not a regular file"}) == 0);
  CHECK(child_usage_error({"calibrate", fifo}, {"a FIFO"}) == 0);
  CHECK(child_usage_error({"plan", profile, "--model", fifo}, {"a FIFO"}) == 0);
  CHECK(child_usage_error({"inspect", fifo}, {"a FIFO"}) == 0);
  // A symbolic link loop is named as one, not as "no such file or bundled profile".
  REQUIRE(::symlink("loop-b", (dir + "/loop-a").c_str()) == 0);
  REQUIRE(::symlink("loop-a", (dir + "/loop-b").c_str()) == 0);
  for (auto const& argv :
       std::vector<std::vector<std::string>>{{"plan", dir + "/loop-a"},
                                             {"plan", profile, "--model", dir + "/loop-a"},
                                             {"plan", profile, "--out", dir + "/loop-a"}}) {
    auto r = run_cli(argv);
    INFO(argv.back() << ": " << r.err);
    CHECK(r.code == 2);
    CHECK(r.err.find("symbolic link loop") != std::string::npos);
    CHECK(r.err.find("no such file") == std::string::npos);
    CHECK(r.err.find("missing file") == std::string::npos);
  }
}
