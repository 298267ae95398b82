// SPDX-License-Identifier: Apache-2.0
// Explicit instantiations of the chunk-eviction kernels for fp8_e5m2 K/V, head dims 64/128/256.
#include "tangram/kernels/detail/eviction.cuh"

namespace tangram::detail {
TANGRAM_EVICTION_INSTANTIATE(, float8_e5m2)
}  // namespace tangram::detail
