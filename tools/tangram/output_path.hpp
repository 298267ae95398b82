// SPDX-License-Identifier: Apache-2.0
// Output options (--out, --svg, --plot) are checked before any work, so a long run never ends
// in "cannot write".
#pragma once

#include <string>
#include <string_view>

namespace tangram::cli {

/// Refuses, before any work is done, an output path that detail::write_file could not write
/// (detail::check_writable: empty, a folder, a dangling link, a missing or unwritable folder for a
/// new or replaced file, a read-only descriptor). Creates nothing: the file is written only once
/// the command has succeeded.
/// @throw usage_error naming `option`, the path and the reason.
void check_output_path(std::string_view option, std::string const& path);

}  // namespace tangram::cli
