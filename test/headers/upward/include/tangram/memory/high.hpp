// SPDX-License-Identifier: Apache-2.0
/**
 * @file memory/high.hpp
 * @brief Fixture of ctest headers:layers_fails: the higher-layer header that core/low.hpp reaches.
 */
#pragma once
