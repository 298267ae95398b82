// SPDX-License-Identifier: Apache-2.0
// Output options (--out, --svg, --plot) are checked before any work, so a long run never ends
// in "cannot write".
#pragma once

#include <string>
#include <string_view>

namespace tangram::cli {

/// Refuses an output path before any work is done: empty, a folder, a missing or unwritable
/// parent folder, an existing file that may not be written. Creates nothing: the file is written
/// (by detail::write_file) only once the command has succeeded.
/// @throw usage_error naming `option`, the path and the reason.
void check_output_path(std::string_view option, std::string const& path);

}  // namespace tangram::cli
