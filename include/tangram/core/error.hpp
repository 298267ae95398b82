// SPDX-License-Identifier: Apache-2.0
/**
 * @file core/error.hpp
 * @brief Exception types and precondition macros.
 *
 * Policy (see docs/design.md): exceptions report broken preconditions and bad input, always with a
 * message that names the field and the offending value. Running out of KV pages is *not* an
 * exception: admission answers "does not fit" through its return value. `out_of_memory` is thrown
 * only when an upstream memory resource cannot provide the arena a pool is built on.
 */
#pragma once

#include <new>
#include <stdexcept>
#include <string>

#include "tangram/core/detail/str.hpp"

namespace tangram {

/// @brief A caller broke an object's contract (double free, unknown sequence, write past a
/// reservation, ...). The object is left exactly as it was before the call.
struct logic_error : std::logic_error {
  using std::logic_error::logic_error;
};

/// @brief An argument or input field has a value the library cannot accept.
struct invalid_argument : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

/// @brief Text or a file could not be parsed or failed validation; the message names the source,
/// the field path and the value.
struct parse_error : invalid_argument {
  using invalid_argument::invalid_argument;
};

/// @brief A CUDA runtime call failed.
struct cuda_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// @brief An upstream memory resource could not provide the requested bytes.
class out_of_memory : public std::bad_alloc {
 public:
  explicit out_of_memory(std::string what) : what_(std::move(what)) {}
  [[nodiscard]] const char* what() const noexcept override { return what_.c_str(); }

 private:
  std::string what_;
};

}  // namespace tangram

/// Throws `ExceptionType(message)` unless `condition` holds. The message expression is evaluated
/// only on failure, so it may format values freely.
#define TANGRAM_EXPECTS(condition, ExceptionType, ...)                          \
  do {                                                                          \
    if (!(condition)) throw ExceptionType(::tangram::detail::cat(__VA_ARGS__)); \
  } while (0)

/// Throws `ExceptionType(message)` unconditionally.
#define TANGRAM_FAIL(ExceptionType, ...) throw ExceptionType(::tangram::detail::cat(__VA_ARGS__))
