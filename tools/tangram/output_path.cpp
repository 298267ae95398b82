// SPDX-License-Identifier: Apache-2.0
#include "output_path.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "args.hpp"
#include "tangram/detail/str.hpp"

namespace tangram::cli {

using tangram::detail::cat;

void check_output_path(std::string_view option, std::string const& path) {
  auto fail = [&](std::string const& why) {
    throw usage_error(cat(option, ": cannot write ", tangram::detail::quoted(path), ": ", why));
  };
  if (path.empty()) fail("empty path");
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) fail("it is a directory");
    if (::access(path.c_str(), W_OK) != 0) fail(std::strerror(errno));
    return;
  }
  if (errno != ENOENT) fail(std::strerror(errno));
  auto slash      = path.find_last_of('/');
  std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  if (::stat(dir.c_str(), &st) != 0)
    fail(cat("folder ", tangram::detail::quoted(dir), ": ", std::strerror(errno)));
  if (!S_ISDIR(st.st_mode)) fail(cat(tangram::detail::quoted(dir), " is not a folder"));
  if (::access(dir.c_str(), W_OK | X_OK) != 0)
    fail(cat("folder ", tangram::detail::quoted(dir), ": ", std::strerror(errno)));
}

}  // namespace tangram::cli
