// SPDX-License-Identifier: Apache-2.0
/**
 * @file detail/file_io.hpp
 * @brief Whole-file reads with a size cap and atomic whole-file writes (host only).
 */
#pragma once

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include "tangram/error.hpp"

namespace tangram::detail {

/// Reads a whole file. Files larger than `max_bytes` are refused before anything is read.
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

/// Writes a whole file through a temporary and a rename, so readers never see half a file.
/// @throw invalid_argument naming the path and the system's reason.
inline void write_file(std::string const& path, std::string const& contents) {
  std::string tmp = path + ".tmp";
  std::FILE* f    = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) TANGRAM_FAIL(invalid_argument, "cannot write ", detail::quoted(path), ": ", std::strerror(errno));
  bool ok = std::fwrite(contents.data(), 1, contents.size(), f) == contents.size();
  ok      = (std::fclose(f) == 0) && ok;
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    TANGRAM_FAIL(invalid_argument, "cannot write ", detail::quoted(path), ": ", std::strerror(errno));
  }
}

}  // namespace tangram::detail
