// SPDX-License-Identifier: Apache-2.0
// The emulated decode split kernel, one explicit instantiation file per K/V dtype
// (emu_decode_split_<dtype>.cpp, like kernels/decode_attention_<dtype>.cu): the 60 shapes in one
// file were the emulation suite's longest compile (the asan stage's critical path on 2 cores).
#pragma once

#include "tangram/kernels/detail/decode_attention.cuh"

namespace tangram::test {

/// Runs the split kernel of shape <T, D, GB> on the emulator (defined in emu_decode_split.inl,
/// instantiated for every compiled shape by the per-dtype files).
template <class T, int D, int GB>
void emu_decode_split(detail::decode_args const& a);

}  // namespace tangram::test
