// SPDX-License-Identifier: Apache-2.0
// The emulated prefill-attention kernel for float8_e4m3 K/V, every compiled head dim.
#include "emu_prefill_kernel.inl"

namespace tangram::test {
TANGRAM_EMU_PREFILL_INSTANTIATE(float8_e4m3)
}  // namespace tangram::test
