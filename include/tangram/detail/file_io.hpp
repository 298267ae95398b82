// SPDX-License-Identifier: Apache-2.0
/**
 * @file detail/file_io.hpp
 * @brief Whole-file reads with a size cap and safe, atomic whole-file writes (host only, POSIX).
 * Part of the I/O layer (`tangram/io/`); core headers must not include it.
 */
#pragma once

#include <fcntl.h>
#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <utility>

#include "tangram/error.hpp"

// Marks the I/O layer: the layering check (test/CMakeLists.txt, "Layers") fails the build when a
// core header reaches this one.
#define TANGRAM_LAYER_FILE_IO 1

namespace tangram::detail {

/// Reads a whole file. Reading stops, and the file is refused, as soon as it exceeds `max_bytes`:
/// memory never holds more than the cap (plus one read buffer).
/// @throw invalid_argument naming the path and the system's reason.
inline std::string read_file(std::string const& path, std::size_t max_bytes = std::size_t{64} << 20) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) TANGRAM_FAIL(invalid_argument, "cannot open ", detail::quoted(path), ": ", std::strerror(errno));
  std::string out;
  char buf[1 << 16];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) {
    if (out.size() + n > max_bytes) {
      std::fclose(f);
      TANGRAM_FAIL(invalid_argument, detail::quoted(path), ": file is larger than the limit of ", max_bytes, " bytes");
    }
    out.append(buf, n);
  }
  bool failed = std::ferror(f) != 0;
  std::fclose(f);
  if (failed) TANGRAM_FAIL(invalid_argument, "cannot read ", detail::quoted(path));
  return out;
}

/// Writes `contents` to an open descriptor, retrying short writes; false with errno set on error.
inline bool write_all(int fd, std::string const& contents) {
  std::size_t done = 0;
  while (done < contents.size()) {
    ssize_t n = ::write(fd, contents.data() + done, contents.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<std::size_t>(n);
  }
  return true;
}

/// The folder part of a path ("." when it has none) and the last component.
inline std::pair<std::string, std::string> split_path(std::string const& path) {
  auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return {".", path};
  return {slash == 0 ? "/" : path.substr(0, slash), path.substr(slash + 1)};
}

/// A name no one can guess: 16 hex digits from the system's random source.
inline std::string random_suffix() {
  std::random_device rd;
  std::uint64_t x = (std::uint64_t{rd()} << 32) ^ rd();
  static constexpr char hex[] = "0123456789abcdef";
  std::string s(16, '0');
  for (auto& c : s) {
    c = hex[x & 15];
    x >>= 4;
  }
  return s;
}

/// True for the paths of this process's open descriptors (/dev/stdout, /dev/fd/N,
/// /proc/self/fd/N): they name a file that is already open, which a rename would detach.
inline bool names_open_descriptor(std::string const& path) {
  for (char const* prefix : {"/dev/stdout", "/dev/stderr", "/dev/fd/", "/proc/self/fd/"})
    if (path.rfind(prefix, 0) == 0) return true;
  return false;
}

/**
 * @brief Writes a whole file so that readers never see half of it, without ever replacing or
 * following anything but the target the caller named.
 *
 * - A regular file (new, or existing) is written to an unpredictable temporary created
 *   exclusively (O_CREAT | O_EXCL | O_NOFOLLOW) in the same folder, flushed to disk, then renamed
 *   over the target. A new file gets mode 0666 less the umask, like any file a program creates;
 *   a replaced file keeps its permission bits.
 * - A symbolic link to a regular file: the link stays, the file it points to is replaced (as an
 *   editor saving through a link does). A dangling link is refused.
 * - A character device, a FIFO or a descriptor of this process (`/dev/null`, `/dev/stdout`,
 *   `/dev/fd/N`) is written directly (appending), never replaced.
 * - Anything else (a folder, a block device, a socket) is refused.
 * On failure the temporary is removed and the target is left as it was.
 * @throw invalid_argument naming the path and the system's reason.
 */
inline void write_file(std::string const& path, std::string const& contents) {
  auto fail = [&](char const* why) {
    TANGRAM_FAIL(invalid_argument, "cannot write ", detail::quoted(path), ": ", why);
  };
  TANGRAM_EXPECTS(!path.empty(), invalid_argument, "cannot write \"\": empty path");
  std::string target = path;
  struct stat st {};
  bool exists = ::stat(path.c_str(), &st) == 0;
  if (!exists) {
    int err = errno;
    struct stat lst {};
    if (::lstat(path.c_str(), &lst) == 0 && S_ISLNK(lst.st_mode))
      fail("it is a symbolic link to a missing file");
    if (err != ENOENT) fail(std::strerror(err));
  } else if (S_ISCHR(st.st_mode) || S_ISFIFO(st.st_mode) || names_open_descriptor(path)) {
    // Appending keeps what the process already wrote to a redirected stdout.
    int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_NOCTTY | O_CLOEXEC);
    if (fd < 0) fail(std::strerror(errno));
    bool ok = write_all(fd, contents);
    int err = ok ? 0 : errno;
    if (::close(fd) != 0 && ok) {
      ok  = false;
      err = errno;
    }
    if (!ok) fail(std::strerror(err));
    return;
  } else if (!S_ISREG(st.st_mode)) {
    fail(S_ISDIR(st.st_mode) ? "it is a folder, not a regular file"
                             : "it exists and is not a regular file, a character device or a FIFO");
  } else {
    // Replace what a link points to, not the link: rename over the resolved path.
    char resolved[PATH_MAX];
    if (::realpath(path.c_str(), resolved) == nullptr) fail(std::strerror(errno));
    target = resolved;
  }

  auto [folder, name] = split_path(target);
  mode_t mode         = st.st_mode & 0777;  // a replaced file's bits; never set-id bits
  std::string tmp;
  int fd = -1;
  for (int attempt = 0; attempt < 64 && fd < 0; ++attempt) {
    tmp = folder + "/." + name + "." + random_suffix() + ".tmp";
    fd  = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
    if (fd < 0 && errno != EEXIST) fail(std::strerror(errno));
  }
  if (fd < 0) fail("no unused temporary name in its folder");
  bool ok = write_all(fd, contents) && (!exists || ::fchmod(fd, mode) == 0) && ::fsync(fd) == 0;
  int err = ok ? 0 : errno;
  if (::close(fd) != 0 && ok) {
    ok  = false;
    err = errno;
  }
  if (ok && ::rename(tmp.c_str(), target.c_str()) != 0) {
    ok  = false;
    err = errno;
  }
  if (!ok) {
    ::unlink(tmp.c_str());
    fail(std::strerror(err));
  }
  // The rename is durable once the folder is flushed; a folder that cannot be opened or flushed
  // (some file systems) does not make the written file less complete.
  int dfd = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    (void)::fsync(dfd);
    ::close(dfd);
  }
}

}  // namespace tangram::detail
