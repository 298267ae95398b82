// SPDX-License-Identifier: Apache-2.0
// Issue 31, defects 5 to 7 (file side): a write-protected target silently replaced (the rename
// needs only the folder's permission), a FIFO input that blocked forever, a symbolic link loop
// reported as a missing file, and several files written one by one (a failure left some behind).
#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <set>
#include <string>

#include "tangram/io/detail/file_io.hpp"
#include "test_support.hpp"

namespace fs = std::filesystem;
using tangram::invalid_argument;
using tangram::detail::check_writable;
using tangram::detail::file_batch;
using tangram::detail::read_file;
using tangram::detail::write_file;
using tangram::test::dir_entries;

namespace {

/// A fresh folder under /tmp that any user may enter (the write-protection cases run as nobody).
std::string fresh_shared_dir(std::string const& name) {
  auto dir =
      fs::temp_directory_path() / ("tangram-file-io-" + name + "-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  ::chmod(dir.c_str(), 0777);
  return dir.string();
}

/// Runs `body` in a child process (as user `uid` when >= 0, which needs root) with a watchdog of
/// `watchdog_s` seconds, so a call that would block forever fails the test instead of hanging
/// it. Returns the child's exit code, or 128 + signal (SIGALRM: the watchdog fired).
int in_child(std::function<int()> const& body, int uid = -1, unsigned watchdog_s = 20) {
  std::fflush(nullptr);
  pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::alarm(watchdog_s);
    if (uid >= 0 && (::setgroups(0, nullptr) != 0 || ::setgid(static_cast<gid_t>(uid)) != 0 ||
                     ::setuid(static_cast<uid_t>(uid)) != 0))
      ::_exit(90);
    int rc = 91;
    try {
      rc = body();
    } catch (...) {
      rc = 92;
    }
    ::_exit(rc);
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/// 0 when `f` throws invalid_argument whose message holds every piece, else 1.
int refuses(std::function<void()> const& f, std::initializer_list<char const*> pieces) {
  try {
    f();
  } catch (invalid_argument const& e) {
    std::string m = e.what();
    for (auto const* p : pieces)
      if (m.find(p) == std::string::npos) return 1;
    return 0;
  }
  return 1;
}

constexpr int nobody = 65534;

}  // namespace

TEST_CASE("read_file refuses a FIFO up front instead of blocking", "[regression][file_io]") {
  auto dir  = fresh_shared_dir("fifo-in");
  auto fifo = dir + "/samples.json";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  // No writer ever opens it: the old fopen blocked here forever (the watchdog fires instead).
  int rc = in_child([&] {
    return refuses([&] { (void)read_file(fifo); },
                   {"cannot read \"", "samples.json\"", "a FIFO", "not a regular file"});
  });
  CHECK(rc == 0);
  // Other things that are not regular files: a folder and a character device.
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      read_file(dir), invalid_argument, "a directory", "not a regular file");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      read_file("/dev/null"), invalid_argument, "a character device", "not a regular file");
  fs::remove_all(dir);
}

TEST_CASE("a symbolic link loop is named as one, for reading and for writing",
          "[regression][file_io]") {
  auto dir = fresh_shared_dir("loop");
  REQUIRE(::symlink("b", (dir + "/a").c_str()) == 0);
  REQUIRE(::symlink("a", (dir + "/b").c_str()) == 0);
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      read_file(dir + "/a"), invalid_argument, "cannot open", "symbolic link loop");
  for (auto const& f : std::vector<std::function<void()>>{[&] { write_file(dir + "/a", "x"); },
                                                          [&] { check_writable(dir + "/a"); }}) {
    bool threw = false;
    try {
      f();
    } catch (invalid_argument const& e) {
      threw         = true;
      std::string m = e.what();
      INFO(m);
      CHECK(m.find("symbolic link loop") != std::string::npos);
      CHECK(m.find("missing file") == std::string::npos);
    }
    CHECK(threw);
  }
  // A dangling link is still one: "a symbolic link to a missing file".
  REQUIRE(::symlink("nowhere", (dir + "/dangling").c_str()) == 0);
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      check_writable(dir + "/dangling"), invalid_argument, "symbolic link to a missing file");
  CHECK(dir_entries(dir) == std::set<std::string>{"a", "b", "dangling"});
  fs::remove_all(dir);
}

TEST_CASE("a write-protected target is refused, as cp refuses it", "[regression][file_io]") {
  // The temporary-and-rename needs only the folder's permission: a 0444 file in a folder the user
  // may write was silently replaced. Run as an unprivileged user (root may write anything).
  auto dir            = fresh_shared_dir("protected");
  auto protected_file = dir + "/plan.json";
  auto writable       = dir + "/other.json";
  write_file(protected_file, "old");
  write_file(writable, "old");
  ::chmod(protected_file.c_str(), 0444);
  ::chmod(writable.c_str(), 0644);
  bool root = ::geteuid() == 0;
  if (root) {
    REQUIRE(::chown(dir.c_str(), nobody, nobody) == 0);
    REQUIRE(::chown(protected_file.c_str(), nobody, nobody) == 0);
    REQUIRE(::chown(writable.c_str(), nobody, nobody) == 0);
  }
  int rc = in_child(
      [&] {
        int bad = 0;
        bad += refuses([&] { write_file(protected_file, "new"); },
                       {"cannot write \"", "plan.json\"", "Permission denied", "write-protected"});
        bad +=
            refuses([&] { check_writable(protected_file); }, {"plan.json\"", "Permission denied"});
        write_file(writable, "new");  // a file the user may write is replaced as before
        return bad;
      },
      root ? nobody : -1);
  CHECK(rc == 0);
  CHECK(read_file(protected_file) == "old");
  CHECK(read_file(writable) == "new");
  CHECK(dir_entries(dir) == std::set<std::string>{"plan.json", "other.json"});
  fs::remove_all(dir);
}

TEST_CASE("a replaced file keeps its owner and group where the process may set them",
          "[regression][file_io]") {
  if (::geteuid() != 0) {
    WARN("not root: cannot make a file another user owns; the mode case stands in");
    return;
  }
  auto dir  = fresh_shared_dir("owner");
  auto file = dir + "/plan.json";
  write_file(file, "old");
  REQUIRE(::chown(file.c_str(), nobody, nobody) == 0);
  REQUIRE(::chmod(file.c_str(), 0640) == 0);
  write_file(file, "new");
  struct stat st {};
  REQUIRE(::stat(file.c_str(), &st) == 0);
  CHECK(st.st_uid == static_cast<uid_t>(nobody));
  CHECK(st.st_gid == static_cast<gid_t>(nobody));
  CHECK((st.st_mode & 0777) == 0640);
  CHECK(read_file(file) == "new");
  fs::remove_all(dir);
}

TEST_CASE("file_batch writes all its files or none", "[regression][file_io]") {
  auto dir = fresh_shared_dir("batch");
  write_file(dir + "/b.json", "old b");
  {
    // A target that cannot be written (a folder) fails its add: nothing is in place, and the
    // batch, destroyed, removes the temporary of the file added before it.
    fs::create_directories(dir + "/c.json");
    file_batch batch;
    batch.add(dir + "/a.json", "new a");
    batch.add(dir + "/b.json", "new b");
    TANGRAM_REQUIRE_THROWS_WITH_ALL(
        batch.add(dir + "/c.json", "new c"), invalid_argument, "c.json\"", "a directory");
  }
  CHECK(dir_entries(dir) == std::set<std::string>{"b.json", "c.json"});
  CHECK(read_file(dir + "/b.json") == "old b");
  fs::remove(dir + "/c.json");
  {
    // A write that fails midway (a file size limit, as a full disk) leaves nothing either.
    struct rlimit saved {};
    REQUIRE(::getrlimit(RLIMIT_FSIZE, &saved) == 0);
    auto old_handler    = std::signal(SIGXFSZ, SIG_IGN);
    struct rlimit small = saved;
    small.rlim_cur      = 64;
    REQUIRE(::setrlimit(RLIMIT_FSIZE, &small) == 0);
    bool threw = false;
    {
      file_batch batch;
      try {
        batch.add(dir + "/a.json", "small");
        batch.add(dir + "/b.json", std::string(4096, 'x'));
      } catch (invalid_argument const& e) {
        threw = std::string(e.what()).find("b.json") != std::string::npos;
      }
    }
    ::setrlimit(RLIMIT_FSIZE, &saved);
    std::signal(SIGXFSZ, old_handler);
    CHECK(threw);
  }
  CHECK(dir_entries(dir) == std::set<std::string>{"b.json"});
  CHECK(read_file(dir + "/b.json") == "old b");
  {
    file_batch batch;
    batch.add(dir + "/a.json", "new a");
    batch.add(dir + "/b.json", "new b");
    CHECK(dir_entries(dir).size() == 3);  // b.json and the two temporaries, nothing in place yet
    CHECK(read_file(dir + "/b.json") == "old b");
    batch.commit();
  }
  CHECK(dir_entries(dir) == std::set<std::string>{"a.json", "b.json"});
  CHECK(read_file(dir + "/a.json") == "new a");
  CHECK(read_file(dir + "/b.json") == "new b");
  fs::remove_all(dir);
}
