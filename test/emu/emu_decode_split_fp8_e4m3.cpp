// SPDX-License-Identifier: Apache-2.0
// The emulated decode split kernel for float8_e4m3 K/V, every compiled head dim and query-group
// bucket.
#include "emu_decode_split.inl"

namespace tangram::test {
TANGRAM_EMU_DECODE_INSTANTIATE(float8_e4m3)
}  // namespace tangram::test
