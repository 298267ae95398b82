// SPDX-License-Identifier: Apache-2.0
// libFuzzer harness: see properties.hpp (workload_roundtrip).
#include <cstdint>
#include <string_view>

#include "properties.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  tangram::fuzz::workload_roundtrip(std::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}
