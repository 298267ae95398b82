// SPDX-License-Identifier: Apache-2.0
// The emulated prefill-attention kernel for float16 K/V, every compiled head dim.
#include "emu_prefill_kernel.inl"

namespace tangram::test {
TANGRAM_EMU_PREFILL_INSTANTIATE(float16)
}  // namespace tangram::test
