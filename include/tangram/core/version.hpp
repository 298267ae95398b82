// SPDX-License-Identifier: Apache-2.0
/**
 * @file core/version.hpp
 * @brief Library version. Kept in step with `project(VERSION)` in CMakeLists.txt (a test checks).
 */
#pragma once

#define TANGRAM_VERSION_MAJOR  0
#define TANGRAM_VERSION_MINOR  1
#define TANGRAM_VERSION_PATCH  0
#define TANGRAM_VERSION_STRING "0.1.0"

namespace tangram {
/// @brief The library version as "major.minor.patch".
inline constexpr const char* version_string = TANGRAM_VERSION_STRING;
}  // namespace tangram
