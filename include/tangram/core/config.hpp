// SPDX-License-Identifier: Apache-2.0
/**
 * @file core/config.hpp
 * @brief Compiler portability macros shared by host-only and device code.
 *
 * Headers ending in `.hpp` compile with a plain C++17 compiler; under nvcc the same functions also
 * become callable from device code. This is what lets one view type drive both the CUDA kernels
 * and the CPU reference.
 */
#pragma once

#if defined(__CUDACC__) || defined(__HIPCC__)
#define TANGRAM_HOST_DEVICE __host__ __device__ inline
#define TANGRAM_DEVICE      __device__ inline
#define TANGRAM_HOST        __host__ inline
/// Kernels get hidden visibility so two shared objects embedding Tangram never collide.
#define TANGRAM_KERNEL __global__ __attribute__((visibility("hidden")))
#else
#define TANGRAM_HOST_DEVICE inline
#define TANGRAM_DEVICE      inline
#define TANGRAM_HOST        inline
#endif

#if defined(__CUDA_ARCH__)
#define TANGRAM_ON_DEVICE 1
#else
#define TANGRAM_ON_DEVICE 0
#endif
