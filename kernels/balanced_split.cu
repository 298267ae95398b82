// SPDX-License-Identifier: Apache-2.0
// balance_decode_splits: validation and the launch (device code:
// kernels/detail/balanced_split.cuh).
#include <cuda_runtime_api.h>

#include "tangram/kernels/balanced_split.hpp"
#include "tangram/kernels/detail/balanced_split.cuh"

namespace tangram {

void balance_decode_splits(balanced_split_params const& p, cuda_stream_t stream) {
  p.validate();
  detail::launch_balanced_split_with(p, detail::stream_launch{stream});
  detail::check_launch(cudaGetLastError(), "balance_decode_splits: kernel launch");
}

}  // namespace tangram
