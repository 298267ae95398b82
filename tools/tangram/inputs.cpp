// SPDX-License-Identifier: Apache-2.0
#include "inputs.hpp"

#include <sys/stat.h>

#include <cerrno>

#include "embedded_profiles.hpp"
#include "tangram/io/detail/file_io.hpp"
#include "tangram/io/detail/json.hpp"

namespace tangram::cli {

bool names_a_file(std::string const& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) return true;
  int err = errno;
  if (err == ENOENT || err == ENOTDIR) return false;
  TANGRAM_FAIL(tangram::invalid_argument,
               "cannot open ",
               tangram::detail::quoted(path),
               ": ",
               tangram::detail::system_reason(err));
}

input_text read_input(std::string const& name_or_path) {
  if (names_a_file(name_or_path)) return {name_or_path, tangram::detail::read_file(name_or_path)};
  std::string key = name_or_path;
  if (key.size() < 5 || key.compare(key.size() - 5, 5, ".json") != 0) key += ".json";
  for (auto const& f : embedded_profiles())
    if (f.name == key) return {"bundled:" + std::string(f.name), std::string(f.text)};
  std::string known;
  for (auto const& f : embedded_profiles())
    known += (known.empty() ? "" : ", ") + std::string(f.name);
  TANGRAM_FAIL(tangram::invalid_argument,
               "no such file or bundled profile: ",
               tangram::detail::quoted(name_or_path),
               " (bundled: ",
               known,
               ")");
}

std::string format_of(input_text const& in) {
  auto doc = tangram::detail::json::parse(in.text, in.source);
  if (doc.type() != tangram::detail::json::kind::object) return "";
  auto const* f = doc.find("format");
  return f != nullptr && f->type() == tangram::detail::json::kind::string ? f->string() : "";
}

}  // namespace tangram::cli
