// SPDX-License-Identifier: Apache-2.0
// Host emulation shim (test/emu): the part of the CUDA runtime API the kernel headers name.
// Launch errors do not exist here (a failing emulated launch throws emu::kernel_fault).
#pragma once

#include "../simt/simt.hpp"

struct CUstream_st;
typedef CUstream_st* cudaStream_t;
enum cudaError_t { cudaSuccess = 0, cudaErrorLaunchFailure = 719 };
inline cudaError_t cudaGetLastError() {
  return cudaSuccess;
}
inline const char* cudaGetErrorName(cudaError_t e) {
  return e == cudaSuccess ? "cudaSuccess" : "cudaErrorLaunchFailure";
}
inline const char* cudaGetErrorString(cudaError_t e) {
  return e == cudaSuccess ? "no error" : "emulated launch failure";
}
