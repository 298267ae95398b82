// SPDX-License-Identifier: Apache-2.0
#include "output_path.hpp"

#include "tangram/io/detail/file_io.hpp"
#include "usage_error.hpp"

namespace tangram::cli {

void check_output_path(std::string_view option, std::string const& path) {
  // The same classification write_file uses, so a path accepted here is one it can write.
  try {
    tangram::detail::check_writable(path);
  } catch (tangram::invalid_argument const& e) {
    throw usage_error(tangram::detail::cat(option, ": ", e.what()));
  }
}

}  // namespace tangram::cli
