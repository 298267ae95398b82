// SPDX-License-Identifier: Apache-2.0
/**
 * @file io/detail/file_io.hpp
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
#include <vector>

#include "tangram/core/error.hpp"

namespace tangram::detail {

/// Why a path that exists is not a regular file: "a FIFO", "a directory", ...
inline char const* file_kind_name(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

/// The system's reason for `err` as a user reads it: a symbolic link loop is named as one
/// (ELOOP), not left as "Too many levels of symbolic links" alone.
inline std::string system_reason(int err) {
  if (err == ELOOP) return cat("a symbolic link loop (", std::strerror(err), ")");
  return std::strerror(err);
}

/// Reads a whole regular file. Anything else (a FIFO, a device, a folder, a socket) is refused
/// before a byte is read: opening is non-blocking, so a FIFO without a writer cannot block the
/// program. Reading stops, and the file is refused, as soon as it exceeds `max_bytes`: memory never
/// holds more than the cap (plus one read buffer).
/// @throw invalid_argument naming the path and the reason.
inline std::string read_file(std::string const& path,
                             std::size_t max_bytes = std::size_t{64} << 20) {
  int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    TANGRAM_FAIL(invalid_argument, "cannot open ", detail::quoted(path), ": ", system_reason(err));
  }
  struct closer {
    int fd;
    ~closer() { ::close(fd); }
  } close_at_exit{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    TANGRAM_FAIL(invalid_argument, "cannot read ", detail::quoted(path), ": ", system_reason(err));
  }
  if (!S_ISREG(st.st_mode))
    TANGRAM_FAIL(invalid_argument,
                 "cannot read ",
                 detail::quoted(path),
                 ": it is ",
                 file_kind_name(st.st_mode),
                 ", not a regular file (inputs are read whole from regular files)");
  std::string out;
  char buf[1 << 16];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int err = errno;
      TANGRAM_FAIL(
          invalid_argument, "cannot read ", detail::quoted(path), ": ", system_reason(err));
    }
    if (n == 0) break;
    if (out.size() + static_cast<std::size_t>(n) > max_bytes)
      TANGRAM_FAIL(invalid_argument,
                   detail::quoted(path),
                   ": file is larger than the limit of ",
                   max_bytes,
                   " bytes");
    out.append(buf, static_cast<std::size_t>(n));
  }
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
  std::uint64_t x             = (std::uint64_t{rd()} << 32) ^ rd();
  static constexpr char hex[] = "0123456789abcdef";
  std::string s(16, '0');
  for (auto& c : s) {
    c = hex[x & 15];
    x >>= 4;
  }
  return s;
}

/// The descriptor of this process already open on the file `st` describes, or -1: the N of
/// `/dev/fd/N` and `/proc/self/fd/N`, or standard output or error whenever the path names the
/// same file by any spelling (`/dev/stdout`, `//dev/stdout`, `/proc/<pid>/fd/1`, a link to one,
/// the redirected file itself). Writing through it shares the stream's file offset, so what the
/// process prints before or after is kept; a new descriptor or a rename would overwrite or detach
/// it.
inline int open_descriptor_for(std::string const& path, struct stat const& st) {
  for (char const* prefix : {"/dev/fd/", "/proc/self/fd/"}) {
    std::size_t n = std::strlen(prefix);
    if (path.size() <= n || path.size() > n + 9 || path.compare(0, n, prefix) != 0) continue;
    if (path.find_first_not_of("0123456789", n) != std::string::npos) continue;
    return std::atoi(path.c_str() + n);
  }
  for (int fd : {STDOUT_FILENO, STDERR_FILENO}) {
    struct stat fs {};
    if (::fstat(fd, &fs) == 0 && fs.st_dev == st.st_dev && fs.st_ino == st.st_ino) return fd;
  }
  return -1;
}

/// How `write_file` reaches a path (see its documentation).
struct write_target {
  enum class kind {
    descriptor,  ///< this process's open descriptor `fd`: written through it
    stream,      ///< a character device or FIFO: opened and written, never replaced
    replace,     ///< an existing regular file `file` (links resolved): temporary + rename
    create,      ///< a new file `file`: temporary + rename
  } how  = kind::create;
  int fd = -1;
  std::string file;
  mode_t mode = 0;  ///< replace: the replaced file's permission bits (never set-id bits)
  uid_t owner = 0;  ///< replace: the replaced file's owner and group, kept where the process may
  gid_t group = 0;
};

/// Decides how `write_file` writes `path`, creating nothing.
/// @throw invalid_argument naming the path for paths `write_file` refuses: an empty path, a folder,
/// a dangling link, a symbolic link loop, anything but a regular file, a character device or a
/// FIFO, and an existing file this process may not write (a write-protected file is refused, as
/// `cp` refuses it, though replacing it needs only the folder's permission).
inline write_target classify_write_target(std::string const& path) {
  auto fail = [&](std::string const& why) {
    TANGRAM_FAIL(invalid_argument, "cannot write ", detail::quoted(path), ": ", why);
  };
  TANGRAM_EXPECTS(!path.empty(), invalid_argument, "cannot write \"\": empty path");
  write_target t;
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    int err = errno;
    struct stat lst {};
    if (err == ENOENT && ::lstat(path.c_str(), &lst) == 0 && S_ISLNK(lst.st_mode))
      fail("it is a symbolic link to a missing file");
    if (err != ENOENT) fail(system_reason(err));
    t.how  = write_target::kind::create;
    t.file = path;
    return t;
  }
  if ((t.fd = open_descriptor_for(path, st)) >= 0) {
    t.how = write_target::kind::descriptor;
    return t;
  }
  if (S_ISCHR(st.st_mode) || S_ISFIFO(st.st_mode)) {
    t.how = write_target::kind::stream;
    return t;
  }
  if (!S_ISREG(st.st_mode))
    fail(cat("it is ",
             file_kind_name(st.st_mode),
             ", not a regular file, a character device or a FIFO"));
  if (::faccessat(AT_FDCWD, path.c_str(), W_OK, AT_EACCESS) != 0)
    fail(cat(system_reason(errno), " (the file is write-protected)"));
  // Replace what a link points to, not the link: rename over the resolved path.
  char resolved[PATH_MAX];
  if (::realpath(path.c_str(), resolved) == nullptr) fail(system_reason(errno));
  t.how   = write_target::kind::replace;
  t.file  = resolved;
  t.mode  = st.st_mode & 0777;
  t.owner = st.st_uid;
  t.group = st.st_gid;
  return t;
}

/**
 * @brief Checks, creating nothing, that `write_file(path, ...)` can write `path`, so a command can
 * refuse an output option before its work rather than after: the target is classified as
 * `write_file` does; a descriptor must be open for writing, a device or FIFO writable, and for a
 * new or replaced file its folder must exist and be writable (the temporary is created there).
 * @throw invalid_argument naming the path (or its folder) and the reason.
 */
inline void check_writable(std::string const& path) {
  auto fail = [&](std::string const& why) {
    TANGRAM_FAIL(invalid_argument, "cannot write ", detail::quoted(path), ": ", why);
  };
  write_target t = classify_write_target(path);
  switch (t.how) {
    case write_target::kind::descriptor: {
      int flags = ::fcntl(t.fd, F_GETFL);
      if (flags < 0) fail(std::strerror(errno));
      if ((flags & O_ACCMODE) == O_RDONLY) fail("its descriptor is open for reading only");
      return;
    }
    case write_target::kind::stream:
      if (::access(path.c_str(), W_OK) != 0) fail(std::strerror(errno));
      return;
    case write_target::kind::replace:
    case write_target::kind::create: {
      std::string folder = split_path(t.file).first;
      struct stat st {};
      if (::stat(folder.c_str(), &st) != 0)
        fail(cat("folder ", detail::quoted(folder), ": ", system_reason(errno)));
      if (!S_ISDIR(st.st_mode)) fail(cat(detail::quoted(folder), " is not a folder"));
      if (::access(folder.c_str(), W_OK | X_OK) != 0)
        fail(cat("folder ", detail::quoted(folder), ": ", std::strerror(errno)));
      return;
    }
  }
}

/**
 * @brief Whole files written all or none: `add` prepares each file (a regular file's contents go
 * to an unpredictable temporary beside it, created exclusively, flushed to disk), `commit` then
 * puts every one in place (renames; a descriptor, device or FIFO target is written then), and a
 * batch destroyed before its commit removes its temporaries and leaves every target as it was. So
 * a command that writes several files (one plan per pipeline stage) checks and writes them all
 * before any target changes; a failure while preparing (a full disk, an unwritable target) leaves
 * nothing behind. How each target is reached is `write_file`'s (see there). Not thread-safe; one
 * batch per writer.
 */
class file_batch {
 public:
  file_batch()                             = default;
  file_batch(file_batch const&)            = delete;
  file_batch& operator=(file_batch const&) = delete;
  ~file_batch() {
    for (auto const& e : entries_)
      if (!e.tmp.empty()) ::unlink(e.tmp.c_str());
  }

  /// Prepares `path` to hold `contents` (the whole file). Nothing at `path` changes until commit.
  /// @throw invalid_argument naming the path and the system's reason; the batch keeps what it had.
  void add(std::string const& path, std::string const& contents) {
    entry e;
    e.path   = path;
    e.target = classify_write_target(path);
    auto how = e.target.how;
    if (how == write_target::kind::descriptor || how == write_target::kind::stream) {
      e.contents = contents;  // written at commit: a stream cannot be staged
      entries_.push_back(std::move(e));
      return;
    }
    e.tmp = write_temporary(e, contents);
    entries_.push_back(std::move(e));
  }

  /// Puts every prepared file in place, in the order added. A rename in a folder where the
  /// temporary was just created does not fail in practice; if one does, the files before it are
  /// in place and the error names the file that is not. @throw invalid_argument naming the path.
  void commit() {
    for (auto& e : entries_) {
      commit_one(e);
      e.tmp.clear();
    }
    entries_.clear();
  }

 private:
  struct entry {
    std::string path;
    write_target target;
    std::string tmp;       // regular files: the prepared temporary
    std::string contents;  // descriptors and streams: written at commit
  };

  [[noreturn]] static void fail(std::string const& path, std::string const& why) {
    TANGRAM_FAIL(invalid_argument, "cannot write ", detail::quoted(path), ": ", why);
  }

  static std::string write_temporary(entry const& e, std::string const& contents) {
    std::string folder = split_path(e.target.file).first;
    std::string tmp;
    int fd = -1;
    // The temporary's name does not embed the target's: a target name near NAME_MAX still fits.
    for (int attempt = 0; attempt < 64 && fd < 0; ++attempt) {
      tmp = folder + "/.tangram-" + random_suffix() + ".tmp";
      fd  = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
      if (fd < 0 && errno != EEXIST) fail(e.path, system_reason(errno));
    }
    if (fd < 0) fail(e.path, "no unused temporary name in its folder");
    bool replacing = e.target.how == write_target::kind::replace;
    if (replacing && ::fchown(fd, e.target.owner, e.target.group) != 0)
      (void)::fchown(fd, static_cast<uid_t>(-1), e.target.group);  // the group, if not the owner
    bool ok = write_all(fd, contents) && (!replacing || ::fchmod(fd, e.target.mode) == 0) &&
              ::fsync(fd) == 0;
    int err = ok ? 0 : errno;
    if (::close(fd) != 0 && ok) {
      ok  = false;
      err = errno;
    }
    if (!ok) {
      ::unlink(tmp.c_str());
      fail(e.path, std::strerror(err));
    }
    return tmp;
  }

  static void commit_one(entry const& e) {
    if (e.target.how == write_target::kind::descriptor) {
      if (!write_all(e.target.fd, e.contents)) fail(e.path, std::strerror(errno));
      return;
    }
    if (e.target.how == write_target::kind::stream) {
      int fd = ::open(e.path.c_str(), O_WRONLY | O_APPEND | O_NOCTTY | O_CLOEXEC);
      if (fd < 0) fail(e.path, std::strerror(errno));
      bool ok = write_all(fd, e.contents);
      int err = ok ? 0 : errno;
      if (::close(fd) != 0 && ok) {
        ok  = false;
        err = errno;
      }
      if (!ok) fail(e.path, std::strerror(err));
      return;
    }
    if (::rename(e.tmp.c_str(), e.target.file.c_str()) != 0) {
      int err = errno;
      ::unlink(e.tmp.c_str());
      fail(e.path, std::strerror(err));
    }
    // The rename is durable once the folder is flushed; a folder that cannot be opened or flushed
    // (some file systems) does not make the written file less complete.
    int dfd = ::open(split_path(e.target.file).first.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
      (void)::fsync(dfd);
      ::close(dfd);
    }
  }

  std::vector<entry> entries_;
};

/**
 * @brief Writes a whole file so that readers never see half of it, without ever replacing or
 * following anything but the target the caller named.
 *
 * - A regular file (new, or existing) is written to an unpredictable temporary created
 *   exclusively (O_CREAT | O_EXCL | O_NOFOLLOW) in the same folder, flushed to disk, then renamed
 *   over the target. A new file gets mode 0666 less the umask, like any file a program creates;
 *   a replaced file keeps its permission bits, and its owner and group where the process may set
 *   them (root; otherwise the group, if the process is in it).
 * - An existing file the process may not write (a write-protected file) is refused, as `cp`
 *   refuses it, though the rename would need only the folder's permission.
 * - A symbolic link to a regular file: the link stays, the file it points to is replaced (as an
 *   editor saving through a link does). A dangling link and a link loop are refused, each named.
 * - A file this process already has open as standard output or error (any spelling of
 *   `/dev/stdout`, or the redirected file itself), and `/dev/fd/N`, `/proc/self/fd/N`: written
 *   through that descriptor, at its current offset, so what the process prints is kept.
 * - A character device or a FIFO (`/dev/null`, a pipe) is opened and written, never replaced.
 * - Anything else (a folder, a block device, a socket) is refused.
 * On failure the temporary is removed and the target is left as it was. Several files written
 * all or none: `file_batch`.
 * @throw invalid_argument naming the path and the system's reason.
 */
inline void write_file(std::string const& path, std::string const& contents) {
  file_batch batch;
  batch.add(path, contents);
  batch.commit();
}

}  // namespace tangram::detail
