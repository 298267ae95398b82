// SPDX-License-Identifier: Apache-2.0
// The real retention profiles of data/profiles, compiled into the command-line program.
#pragma once

#include <string_view>
#include <vector>

namespace tangram::cli {

struct embedded_file {
  std::string_view name;  ///< path relative to data/profiles, e.g. "snapkv/llama-3.1-8b-instruct.json"
  std::string_view text;
};

/// All bundled profile files, sorted by name.
std::vector<embedded_file> const& embedded_profiles();

}  // namespace tangram::cli
