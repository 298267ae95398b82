// SPDX-License-Identifier: Apache-2.0
/**
 * @file io/detail/json.hpp
 * @brief A small, strict JSON reader and writer used by every file format of the library (the
 * I/O layer, `tangram/io/`). Core headers must not include it: the layering check fails the build.
 *
 * Why our own: engines embed these headers, and a third-party JSON header in a public API invites
 * version clashes; and every error must name the source, the line and column (syntax) or the field
 * path (validation) together with the offending value. The reader enforces limits (input size,
 * nesting depth, element count) so hostile input cannot exhaust memory or the stack.
 *
 * Parts: json/value.hpp (the document tree), json/parse.hpp (text to tree), json/dump.hpp (tree to
 * text), json/node.hpp (validating field access with error paths).
 */
#pragma once

#include "tangram/io/detail/json/dump.hpp"
#include "tangram/io/detail/json/node.hpp"
#include "tangram/io/detail/json/parse.hpp"
#include "tangram/io/detail/json/value.hpp"
