// SPDX-License-Identifier: Apache-2.0
// Host emulation shim (test/emu): cub::BlockScan with the same temp-storage contract as CUB's:
// the data lives in the caller's TempStorage (so unions alias it as on the GPU), the collective
// has one internal barrier and none at the end, so reusing the storage needs a __syncthreads()
// in between; a missing one makes a fast thread overwrite totals others have not read yet.
#pragma once

#include "../../../simt/simt.hpp"

namespace cub {

enum BlockScanAlgorithm { BLOCK_SCAN_RAKING, BLOCK_SCAN_RAKING_MEMOIZE, BLOCK_SCAN_WARP_SCANS };

template <class T,
          int BLOCK_DIM_X,
          BlockScanAlgorithm ALGORITHM = BLOCK_SCAN_RAKING,
          int BLOCK_DIM_Y              = 1,
          int BLOCK_DIM_Z              = 1,
          int LEGACY_PTX_ARCH          = 0>
class BlockScan {
  static constexpr int threads = BLOCK_DIM_X * BLOCK_DIM_Y * BLOCK_DIM_Z;

 public:
  struct TempStorage {
    T totals[threads];
  };

  explicit BlockScan(TempStorage& storage) : storage_(storage) {}

  void InclusiveSum(T input, T& output) {
    T aggregate;
    scan(input, output, aggregate);
    output += input;
  }
  void InclusiveSum(T input, T& output, T& block_aggregate) {
    scan(input, output, block_aggregate);
    output += input;
  }
  void ExclusiveSum(T input, T& output) {
    T aggregate;
    scan(input, output, aggregate);
  }
  void ExclusiveSum(T input, T& output, T& block_aggregate) {
    scan(input, output, block_aggregate);
  }
  template <int N>
  void InclusiveSum(T (&input)[N], T (&output)[N], T& block_aggregate) {
    T run;
    scan(thread_total(input), run, block_aggregate);
    for (int i = 0; i < N; ++i) output[i] = run += input[i];
  }
  template <int N>
  void InclusiveSum(T (&input)[N], T (&output)[N]) {
    T aggregate;
    InclusiveSum(input, output, aggregate);
  }
  template <int N>
  void ExclusiveSum(T (&input)[N], T (&output)[N], T& block_aggregate) {
    T run;
    scan(thread_total(input), run, block_aggregate);
    for (int i = 0; i < N; ++i) {
      T v       = input[i];
      output[i] = run;
      run += v;
    }
  }
  template <int N>
  void ExclusiveSum(T (&input)[N], T (&output)[N]) {
    T aggregate;
    ExclusiveSum(input, output, aggregate);
  }

 private:
  template <int N>
  static T thread_total(T (&input)[N]) {
    T t = T(0);
    for (int i = 0; i < N; ++i) t += input[i];
    return t;
  }
  /// Exclusive prefix of `total` over the threads in linear order, and the block's sum.
  void scan(T total, T& exclusive, T& aggregate) {
    const int tid =
        static_cast<int>(threadIdx.x + BLOCK_DIM_X * (threadIdx.y + BLOCK_DIM_Y * threadIdx.z));
    storage_.totals[tid] = total;
    __syncthreads();
    exclusive = T(0);
    aggregate = T(0);
    for (int i = 0; i < threads; ++i) {
      if (i < tid) exclusive += storage_.totals[i];
      aggregate += storage_.totals[i];
    }
  }

  TempStorage& storage_;
};

}  // namespace cub
