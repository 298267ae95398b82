// SPDX-License-Identifier: Apache-2.0
/**
 * @file core/low.hpp
 * @brief Fixture of ctest headers:layers_fails: a bottom-layer header that includes a header of a
 * layer above it, which cmake/check_headers.cmake must report.
 */
#pragma once

#include "tangram/memory/high.hpp"
