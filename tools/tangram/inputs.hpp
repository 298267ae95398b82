// SPDX-License-Identifier: Apache-2.0
// Input files for the `tangram` program: a path on disk, or the name of a bundled profile
// ("snapkv/llama-3.1-8b-instruct", with or without ".json").
#pragma once

#include <string>

namespace tangram::cli {

struct input_text {
  std::string source;  ///< the path, or "bundled:<name>"
  std::string text;
};

/// Whether `path` names something on disk (false when nothing is there: a bundled name, a preset).
/// @throw tangram::invalid_argument naming the path and the reason when it cannot be looked at
/// (a symbolic link loop, no permission, a name too long).
bool names_a_file(std::string const& path);

/// Reads a file, falling back to the bundled profiles when no such file exists. A file must be a
/// regular file (a FIFO or a device is refused, naming what it is).
/// @throw tangram::invalid_argument naming the argument when neither exists.
input_text read_input(std::string const& name_or_path);

/// The "format" field of a JSON document, or "" when there is none (used to tell samples,
/// profiles and plans apart).
std::string format_of(input_text const& in);

}  // namespace tangram::cli
