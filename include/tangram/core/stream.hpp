// SPDX-License-Identifier: Apache-2.0
/**
 * @file core/stream.hpp
 * @brief A CUDA stream handle that host-only code can name without the CUDA headers.
 *
 * The CUDA runtime defines `typedef struct CUstream_st* cudaStream_t;`. Declaring the same opaque
 * struct here gives launchers a parameter type that *is* `cudaStream_t`, so engines pass their
 * streams directly while `.hpp` headers still compile with a plain C++ compiler.
 */
#pragma once

struct CUstream_st;  // the CUDA runtime's opaque stream type (never defined in user code)

namespace tangram {

/// @brief Identical to `cudaStream_t`; `nullptr` is the legacy default stream.
using cuda_stream_t = ::CUstream_st*;

}  // namespace tangram
