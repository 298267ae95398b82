// SPDX-License-Identifier: Apache-2.0
// Explicit instantiations of the decode split kernel for fp8_e5m2 K/V: head dims 64/128/256 x GQA
// group buckets 1/2/4/8 (a runtime group g runs in the smallest bucket >= g). One file per dtype
// keeps the instantiations compiling in parallel.
#include "tangram/kernels/detail/decode_attention.cuh"

namespace tangram::detail {
TANGRAM_DECODE_INSTANTIATE(, float8_e5m2)
}  // namespace tangram::detail
