// SPDX-License-Identifier: Apache-2.0
// Host emulation shim (test/emu): cub::BlockHistogram. Composite adds the thread's items to the
// caller's (shared) histogram with atomics and no barrier, as CUB's BLOCK_HISTO_ATOMIC does; the
// caller synchronises before reading the histogram or reusing the storage.
#pragma once

#include "../../../simt/simt.hpp"

namespace cub {

enum BlockHistogramAlgorithm { BLOCK_HISTO_SORT, BLOCK_HISTO_ATOMIC };

template <class T,
          int BLOCK_DIM_X,
          int ITEMS_PER_THREAD,
          int BINS,
          BlockHistogramAlgorithm ALGORITHM = BLOCK_HISTO_SORT,
          int BLOCK_DIM_Y                   = 1,
          int BLOCK_DIM_Z                   = 1,
          int LEGACY_PTX_ARCH               = 0>
class BlockHistogram {
  static constexpr int threads = BLOCK_DIM_X * BLOCK_DIM_Y * BLOCK_DIM_Z;

 public:
  struct TempStorage {
    unsigned char unused;
  };

  explicit BlockHistogram(TempStorage&) {}

  template <class Counter>
  void InitHistogram(Counter histogram[BINS]) {
    const int tid =
        static_cast<int>(threadIdx.x + BLOCK_DIM_X * (threadIdx.y + BLOCK_DIM_Y * threadIdx.z));
    for (int b = tid; b < BINS; b += threads) histogram[b] = 0;
  }
  template <class Counter>
  void Composite(T (&items)[ITEMS_PER_THREAD], Counter histogram[BINS]) {
    for (int i = 0; i < ITEMS_PER_THREAD; ++i) atomicAdd(&histogram[items[i]], Counter(1));
  }
  template <class Counter>
  void Histogram(T (&items)[ITEMS_PER_THREAD], Counter histogram[BINS]) {
    InitHistogram(histogram);
    __syncthreads();
    Composite(items, histogram);
  }
};

}  // namespace cub
