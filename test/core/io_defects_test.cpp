// SPDX-License-Identifier: Apache-2.0
// Regression tests for issue 11's file and text defects: unsafe output files (3), JSON that is not
// JSON and names that reach the terminal raw (7).
#include <dirent.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cmath>
#include <csignal>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "tangram/core/detail/str.hpp"
#include "tangram/io/detail/file_io.hpp"
#include "tangram/io/detail/json.hpp"
#include "test_support.hpp"

namespace fs = std::filesystem;
using tangram::detail::read_file;
using tangram::detail::write_file;
using tangram::test::dir_entries;
using tangram::test::fresh_tmp_dir;

namespace {

/// Independent UTF-8 check (RFC 3629 table): no overlong forms, no surrogates, <= U+10FFFF.
bool valid_utf8(std::string const& s) {
  std::size_t i = 0;
  while (i < s.size()) {
    auto b     = [&](std::size_t k) { return static_cast<unsigned char>(s[k]); };
    auto cont  = [&](std::size_t k) { return k < s.size() && (b(k) & 0xc0) == 0x80; };
    unsigned c = b(i);
    if (c < 0x80) {
      i += 1;
    } else if (c >= 0xc2 && c <= 0xdf && cont(i + 1)) {
      i += 2;
    } else if (c >= 0xe0 && c <= 0xef && cont(i + 1) && cont(i + 2)) {
      unsigned c1 = b(i + 1);
      if ((c == 0xe0 && c1 < 0xa0) || (c == 0xed && c1 >= 0xa0)) return false;
      i += 3;
    } else if (c >= 0xf0 && c <= 0xf4 && cont(i + 1) && cont(i + 2) && cont(i + 3)) {
      unsigned c1 = b(i + 1);
      if ((c == 0xf0 && c1 < 0x90) || (c == 0xf4 && c1 >= 0x90)) return false;
      i += 4;
    } else {
      return false;
    }
  }
  return true;
}

/// No byte a terminal acts on: C0 controls, DEL, and C1 controls (raw bytes are invalid UTF-8,
/// encoded ones are C2 80..C2 9F).
bool terminal_safe(std::string const& s) {
  for (std::size_t i = 0; i < s.size(); ++i) {
    auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c == 0x7f) return false;
    if (c == 0xc2 && i + 1 < s.size() && static_cast<unsigned char>(s[i + 1]) <= 0x9f) return false;
  }
  return valid_utf8(s);
}

bool is_symlink(std::string const& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode);
}

}  // namespace

TEST_CASE("write_file ignores a symlink planted at the old predictable temporary name",
          "[regression][file_io]") {
  auto dir    = fresh_tmp_dir("io_defects", "planted");
  auto victim = dir + "/victim.txt";
  auto target = dir + "/out.json";
  write_file(victim, "precious");
  REQUIRE(::symlink(victim.c_str(), (target + ".tmp").c_str()) == 0);
  write_file(target, "{\"a\": 1}\n");
  CHECK(read_file(victim) == "precious");
  CHECK(is_symlink(target + ".tmp"));
  CHECK_FALSE(is_symlink(target));
  CHECK(read_file(target) == "{\"a\": 1}\n");
  CHECK(dir_entries(dir) == std::set<std::string>{"victim.txt", "out.json", "out.json.tmp"});
}

TEST_CASE("write_file writes into a FIFO instead of replacing it", "[regression][file_io]") {
  auto dir  = fresh_tmp_dir("io_defects", "fifo");
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
  CHECK(dir_entries(dir) == std::set<std::string>{"pipe"});
}

TEST_CASE("write_file writes into a character device instead of replacing it",
          "[regression][file_io]") {
  // A private null device node (root may create one; otherwise the FIFO case above stands in).
  // Never the real /dev/null: the old code, run as root, replaced it.
  auto dir = fresh_tmp_dir("io_defects", "chardev");
  auto dev = dir + "/null";
  if (::mknod(dev.c_str(), S_IFCHR | 0666, makedev(1, 3)) != 0) {
    WARN("cannot create a device node here; covered by the FIFO case");
    return;
  }
  write_file(dev, "discarded");
  struct stat st {};
  REQUIRE(::lstat(dev.c_str(), &st) == 0);
  CHECK(S_ISCHR(st.st_mode));
  CHECK(dir_entries(dir) == std::set<std::string>{"null"});
}

TEST_CASE("write_file through a symlink replaces the link's target and keeps the link",
          "[file_io]") {
  auto dir  = fresh_tmp_dir("io_defects", "link");
  auto real = dir + "/real.json";
  auto link = dir + "/link.json";
  write_file(real, "old");
  REQUIRE(::symlink("real.json", link.c_str()) == 0);
  write_file(link, "new");
  CHECK(is_symlink(link));
  CHECK(read_file(real) == "new");
  CHECK(dir_entries(dir) == std::set<std::string>{"real.json", "link.json"});
}

TEST_CASE("write_file refuses a folder, a dangling link and a missing folder, leaving nothing",
          "[file_io]") {
  using tangram::invalid_argument;
  auto dir = fresh_tmp_dir("io_defects", "refuse");
  fs::create_directories(dir + "/sub");
  REQUIRE(::symlink("nowhere", (dir + "/dangling").c_str()) == 0);
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      write_file(dir + "/sub", "x"), invalid_argument, "sub\"", "not a regular file");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      write_file(dir + "/dangling", "x"), invalid_argument, "dangling\"", "symbolic link");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      write_file(dir + "/missing/out.json", "x"), invalid_argument, "cannot write", "out.json\"");
  CHECK(dir_entries(dir) == std::set<std::string>{"sub", "dangling"});
  CHECK(fs::is_empty(dir + "/sub"));
}

TEST_CASE("write_file leaves no temporary and the old contents when a write fails midway",
          "[file_io]") {
  auto dir    = fresh_tmp_dir("io_defects", "midway");
  auto target = dir + "/out.json";
  write_file(target, "old contents");
  // A file size limit makes the write itself fail after the temporary exists.
  struct rlimit saved {};
  REQUIRE(::getrlimit(RLIMIT_FSIZE, &saved) == 0);
  auto old_handler    = std::signal(SIGXFSZ, SIG_IGN);
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
  CHECK(dir_entries(dir) == std::set<std::string>{"out.json"});
}

TEST_CASE("write_file creates files with the umask's mode and keeps a replaced file's mode",
          "[file_io]") {
  auto dir     = fresh_tmp_dir("io_defects", "mode");
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

TEST_CASE("write_file appends to an open descriptor's file instead of replacing it", "[file_io]") {
  auto dir  = fresh_tmp_dir("io_defects", "descriptor");
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
  CHECK(dir_entries(dir) == std::set<std::string>{"stdout.txt"});
}

namespace {

/// Runs `f` with standard output redirected to `file` (opened like a shell's `>`), then restores
/// it.
template <class F>
void with_stdout_in(std::string const& file, F&& f) {
  std::fflush(stdout);
  int saved = ::dup(STDOUT_FILENO);
  REQUIRE(saved >= 0);
  int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  REQUIRE(fd >= 0);
  REQUIRE(::dup2(fd, STDOUT_FILENO) == STDOUT_FILENO);
  ::close(fd);
  std::string error;
  try {
    f();
  } catch (std::exception const& e) {
    error = e.what();
  }
  std::fflush(stdout);
  ::dup2(saved, STDOUT_FILENO);
  ::close(saved);
  REQUIRE(error.empty());
}

}  // namespace

TEST_CASE("write_file to a redirected standard output keeps what the process prints around it",
          "[regression][file_io]") {
  // `tangram plan --out /dev/stdout > x.json` used to open a second descriptor at offset 0 and
  // the process's own later output overwrote the plan; other spellings of the same file were
  // replaced by a rename, detaching the redirect.
  auto dir                                 = fresh_tmp_dir("io_defects", "redirect");
  auto file                                = dir + "/out.txt";
  std::vector<std::string> const spellings = {"/dev/stdout",
                                              "//dev/stdout",
                                              "/dev/./stdout",
                                              "/proc/thread-self/fd/1",
                                              "/proc/" + std::to_string(::getpid()) + "/fd/1",
                                              file};
  for (auto const& spelling : spellings) {
    INFO(spelling);
    struct stat before {};
    with_stdout_in(file, [&] {
      REQUIRE(::stat(file.c_str(), &before) == 0);
      REQUIRE(::write(STDOUT_FILENO, "first\n", 6) == 6);
      write_file(spelling, "contents\n");
      REQUIRE(::write(STDOUT_FILENO, "last\n", 5) == 5);
    });
    struct stat after {};
    REQUIRE(::stat(file.c_str(), &after) == 0);
    CHECK(after.st_ino == before.st_ino);  // the redirected file was never replaced
    CHECK(read_file(file) == "first\ncontents\nlast\n");
  }
  CHECK(dir_entries(dir) == std::set<std::string>{"out.txt"});
}

TEST_CASE("write_file writes a file whose name is as long as the system allows",
          "[regression][file_io]") {
  // The temporary's name used to embed the target's, 22 bytes longer: names of 234-255 bytes
  // passed every check and then failed with "File name too long".
  auto dir  = fresh_tmp_dir("io_defects", "long-name");
  auto name = std::string(250, 'b') + ".svg";
  write_file(dir + "/" + name, "x");
  CHECK(read_file(dir + "/" + name) == "x");
  CHECK(dir_entries(dir) == std::set<std::string>{name});
}

TEST_CASE("check_writable refuses up front exactly what write_file would refuse",
          "[regression][file_io]") {
  using tangram::detail::check_writable;
  auto dir = fresh_tmp_dir("io_defects", "check");
  REQUIRE(::symlink((dir + "/missing.svg").c_str(), (dir + "/dangling.svg").c_str()) == 0);
  TANGRAM_REQUIRE_THROWS_WITH_ALL(check_writable(dir + "/dangling.svg"),
                                  tangram::invalid_argument,
                                  "dangling.svg",
                                  "symbolic link");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(check_writable(dir), tangram::invalid_argument, "directory");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      check_writable(dir + "/no-such/out.json"), tangram::invalid_argument, "folder", "no-such");
  write_file(dir + "/file", "x");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      check_writable(dir + "/file/out.json"), tangram::invalid_argument, "Not a directory");
  check_writable(dir + "/new.json");  // a new file in a writable folder
  check_writable(dir + "/file");      // a regular file to replace
  check_writable("/dev/null");        // a device, written directly
  check_writable(std::string(dir + "/") + std::string(250, 'c'));
  CHECK(dir_entries(dir) == std::set<std::string>{"dangling.svg", "file"});  // nothing created
}

// ---- defect 7: JSON numbers, non-finite values, UTF-8 and printed names ----------------------

TEST_CASE("json reads an upper-case negative exponent that underflows as zero, not infinity",
          "[regression][json]") {
  namespace json = tangram::detail::json;
  auto v         = json::parse("[1E-400, -1E-400, 1e-400, 2.5E-999999999999999999999]", "t");
  for (auto const& e : v.elements()) {
    CHECK(e.number() == 0.0);
    CHECK(std::isfinite(e.number()));
  }
  CHECK(std::signbit(v.elements()[1].number()));
  // The exponent's sign alone does not decide: 10^400 x 10^-10 still overflows, and
  // 10^-400 x 10^+10 still underflows.
  auto big   = "1" + std::string(400, '0') + "E-10";
  auto small = "0." + std::string(399, '0') + "1E+10";
  CHECK(json::parse(big, "t").number() == HUGE_VAL);
  CHECK(json::parse("-" + big, "t").number() == -HUGE_VAL);
  CHECK(json::parse(small, "t").number() == 0.0);
  CHECK(json::parse("1E400", "t").number() == HUGE_VAL);
  CHECK(json::parse("0E99999999999999999999", "t").number() == 0.0);
}

TEST_CASE("json writes non-finite numbers as null, so written JSON is always JSON",
          "[regression][json]") {
  namespace json = tangram::detail::json;
  auto doc       = json::value::object();
  doc.set("inf", HUGE_VAL);
  doc.set("ninf", -HUGE_VAL);
  doc.set("nan", std::nan(""));
  doc.set("one", 1.5);
  for (int indent : {-1, 2}) {
    auto text = json::dump(doc, indent);
    CHECK(text.find("Infinity") == std::string::npos);
    CHECK(text.find("NaN") == std::string::npos);
    auto back = json::parse(text, "t");
    CHECK(back.find("inf")->is_null());
    CHECK(back.find("ninf")->is_null());
    CHECK(back.find("nan")->is_null());
    CHECK(back.find("one")->number() == 1.5);
  }
}

TEST_CASE("json writes valid UTF-8 and no terminal controls whatever the strings hold",
          "[regression][json]") {
  namespace json   = tangram::detail::json;
  std::string bad  = "a\xff\xc3(\xed\xa0\x80\xf4\x90\x80\x80\xc0\xafz";  // invalid sequences
  std::string good = "\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80";             // e-acute, euro, emoji
  std::string ctl =
      "\x1b[2J\x7f\xc2\x9b"
      "31m";  // ESC, DEL, U+009B (CSI)
  auto doc = json::value::object();
  doc.set("bad", bad);
  doc.set("good", good);
  doc.set("ctl", ctl);
  doc.set(bad, 1);  // member names too
  auto text = json::dump(doc, -1);
  CHECK(valid_utf8(text));
  CHECK(terminal_safe(text));
  auto back = json::parse(text, "t");
  CHECK(back.find("good")->string() == good);
  CHECK(back.find("ctl")->string() == ctl);  // escaped, not changed
  auto fixed = back.find("bad")->string();
  CHECK(valid_utf8(fixed));
  CHECK(fixed.front() == 'a');
  CHECK(fixed.back() == 'z');
  CHECK(fixed.find("\xef\xbf\xbd") != std::string::npos);  // U+FFFD replaces what was invalid
  CHECK(json::dump(back, -1) == text);                     // and stays put from then on
}

TEST_CASE("quoted and printable escape terminal controls and invalid UTF-8", "[regression][str]") {
  namespace td = tangram::detail;  // qualified: std::quoted would win by ADL
  std::string hostile =
      "evil\x1b]0;title\x07\x9b"
      "2J\xc2\x9b"
      "2J\xff\xc3 \xc3\xa9nd";
  for (auto const& s : {td::quoted(hostile), td::printable(hostile), td::quoted(hostile, 8)}) {
    INFO(s);
    CHECK(terminal_safe(s));
  }
  CHECK(td::printable(hostile) == "evil\\x1b]0;title\\x07\\x9b2J\\xc2\\x9b2J\\xff\\xc3 \xc3\xa9nd");
  CHECK(td::quoted("plain name") == "\"plain name\"");
  CHECK(td::printable("Llama-3.1-8B/\xc3\xa9") == "Llama-3.1-8B/\xc3\xa9");
  // Cutting never splits a UTF-8 sequence.
  CHECK(td::quoted("\xc3\xa9\xc3\xa9\xc3\xa9", 2) == "\"\xc3\xa9\xc3\xa9...\"");
}

TEST_CASE("json errors print the source name with its controls escaped", "[regression][json]") {
  namespace json     = tangram::detail::json;
  std::string source = "f\x1b[2J.json";
  try {
    (void)json::parse("[1,", source);
    FAIL("no error");
  } catch (tangram::parse_error const& e) {
    CHECK(terminal_safe(e.what()));
    CHECK(std::string(e.what()).find("f\\x1b[2J.json:1:4:") == 0);
  }
  auto v = json::parse("{\"a\": \"x\"}", source);
  json::node n(v, source);
  try {
    (void)n["a"].as_int(0, 1);
    FAIL("no error");
  } catch (tangram::parse_error const& e) {
    CHECK(terminal_safe(e.what()));
  }
}
