// SPDX-License-Identifier: Apache-2.0
// Regression tests for issue 11's file and text defects: unsafe output files (3), JSON that is not
// JSON and names that reach the terminal raw (7).
#include <dirent.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <set>
#include <string>

#include "tangram/detail/file_io.hpp"
#include "test_support.hpp"

namespace fs = std::filesystem;
using tangram::detail::read_file;
using tangram::detail::write_file;

namespace {

/// A fresh, empty folder for one test.
std::string fresh_dir(std::string const& name) {
  auto dir = fs::path(TANGRAM_BINARY_DIR) / "test-tmp" / "io_defects" / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

std::set<std::string> entries(std::string const& dir) {
  std::set<std::string> out;
  for (auto const& e : fs::directory_iterator(dir)) out.insert(e.path().filename().string());
  return out;
}

bool is_symlink(std::string const& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode);
}

}  // namespace

TEST_CASE("write_file ignores a symlink planted at the old predictable temporary name",
          "[regression][file_io]") {
  auto dir    = fresh_dir("planted");
  auto victim = dir + "/victim.txt";
  auto target = dir + "/out.json";
  write_file(victim, "precious");
  REQUIRE(::symlink(victim.c_str(), (target + ".tmp").c_str()) == 0);
  write_file(target, "{\"a\": 1}\n");
  CHECK(read_file(victim) == "precious");
  CHECK(is_symlink(target + ".tmp"));
  CHECK_FALSE(is_symlink(target));
  CHECK(read_file(target) == "{\"a\": 1}\n");
  CHECK(entries(dir) == std::set<std::string>{"victim.txt", "out.json", "out.json.tmp"});
}

TEST_CASE("write_file writes into a FIFO instead of replacing it", "[regression][file_io]") {
  auto dir  = fresh_dir("fifo");
  auto fifo = dir + "/pipe";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  // A non-blocking reader is open first, so the writer's open does not wait and the small
  // contents fit the pipe's buffer: no thread, no timing.
  int rd = ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK);
  REQUIRE(rd >= 0);
  write_file(fifo, "through the pipe\n");
  char buf[64] = {};
  auto n       = ::read(rd, buf, sizeof(buf));
  ::close(rd);
  struct stat st {};
  REQUIRE(::lstat(fifo.c_str(), &st) == 0);
  CHECK(S_ISFIFO(st.st_mode));
  CHECK(std::string(buf, n > 0 ? static_cast<std::size_t>(n) : 0) == "through the pipe\n");
  CHECK(entries(dir) == std::set<std::string>{"pipe"});
}

TEST_CASE("write_file writes into a character device instead of replacing it",
          "[regression][file_io]") {
  // A private null device node (root may create one; otherwise the FIFO case above stands in).
  // Never the real /dev/null: the old code, run as root, replaced it.
  auto dir = fresh_dir("chardev");
  auto dev = dir + "/null";
  if (::mknod(dev.c_str(), S_IFCHR | 0666, makedev(1, 3)) != 0) {
    WARN("cannot create a device node here; covered by the FIFO case");
    return;
  }
  write_file(dev, "discarded");
  struct stat st {};
  REQUIRE(::lstat(dev.c_str(), &st) == 0);
  CHECK(S_ISCHR(st.st_mode));
  CHECK(entries(dir) == std::set<std::string>{"null"});
}

TEST_CASE("write_file through a symlink replaces the link's target and keeps the link",
          "[file_io]") {
  auto dir  = fresh_dir("link");
  auto real = dir + "/real.json";
  auto link = dir + "/link.json";
  write_file(real, "old");
  REQUIRE(::symlink("real.json", link.c_str()) == 0);
  write_file(link, "new");
  CHECK(is_symlink(link));
  CHECK(read_file(real) == "new");
  CHECK(entries(dir) == std::set<std::string>{"real.json", "link.json"});
}

TEST_CASE("write_file refuses a folder, a dangling link and a missing folder, leaving nothing",
          "[file_io]") {
  using tangram::invalid_argument;
  auto dir = fresh_dir("refuse");
  fs::create_directories(dir + "/sub");
  REQUIRE(::symlink("nowhere", (dir + "/dangling").c_str()) == 0);
  TANGRAM_REQUIRE_THROWS_WITH_ALL(write_file(dir + "/sub", "x"), invalid_argument, "sub\"",
                                  "not a regular file");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(write_file(dir + "/dangling", "x"), invalid_argument,
                                  "dangling\"", "symbolic link");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(write_file(dir + "/missing/out.json", "x"), invalid_argument,
                                  "cannot write", "out.json\"");
  CHECK(entries(dir) == std::set<std::string>{"sub", "dangling"});
  CHECK(fs::is_empty(dir + "/sub"));
}

TEST_CASE("write_file leaves no temporary and the old contents when a write fails midway",
          "[file_io]") {
  auto dir    = fresh_dir("midway");
  auto target = dir + "/out.json";
  write_file(target, "old contents");
  // A file size limit makes the write itself fail after the temporary exists.
  struct rlimit saved {};
  REQUIRE(::getrlimit(RLIMIT_FSIZE, &saved) == 0);
  auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = saved;
  small.rlim_cur      = 16;
  REQUIRE(::setrlimit(RLIMIT_FSIZE, &small) == 0);
  bool threw = false;
  try {
    write_file(target, std::string(4096, 'x'));
  } catch (tangram::invalid_argument const& e) {
    threw = std::string(e.what()).find("out.json") != std::string::npos;
  }
  ::setrlimit(RLIMIT_FSIZE, &saved);
  std::signal(SIGXFSZ, old_handler);
  CHECK(threw);
  CHECK(read_file(target) == "old contents");
  CHECK(entries(dir) == std::set<std::string>{"out.json"});
}

TEST_CASE("write_file creates files with the umask's mode and keeps a replaced file's mode",
          "[file_io]") {
  auto dir     = fresh_dir("mode");
  mode_t umask = ::umask(022);
  write_file(dir + "/new.json", "x");
  struct stat st {};
  REQUIRE(::stat((dir + "/new.json").c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0644);
  REQUIRE(::chmod((dir + "/new.json").c_str(), 0640) == 0);
  write_file(dir + "/new.json", "y");
  REQUIRE(::stat((dir + "/new.json").c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0640);
  ::umask(umask);
  CHECK(read_file(dir + "/new.json") == "y");
}

TEST_CASE("write_file appends to an open descriptor's file instead of replacing it",
          "[file_io]") {
  auto dir  = fresh_dir("descriptor");
  auto file = dir + "/stdout.txt";
  int fd    = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  REQUIRE(fd >= 0);
  REQUIRE(::write(fd, "summary\n", 8) == 8);
  struct stat before {};
  REQUIRE(::fstat(fd, &before) == 0);
  write_file("/proc/self/fd/" + std::to_string(fd), "plan\n");
  ::close(fd);
  struct stat after {};
  REQUIRE(::stat(file.c_str(), &after) == 0);
  CHECK(after.st_ino == before.st_ino);
  CHECK(read_file(file) == "summary\nplan\n");
  CHECK(entries(dir) == std::set<std::string>{"stdout.txt"});
}
