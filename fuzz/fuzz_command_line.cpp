// SPDX-License-Identifier: Apache-2.0
// libFuzzer harness: see properties.hpp (command_line).
#include <cstdint>
#include <string_view>

#include "properties.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  tangram::fuzz::command_line(std::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}
