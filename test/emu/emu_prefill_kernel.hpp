// SPDX-License-Identifier: Apache-2.0
// The emulated prefill-attention kernel, one explicit instantiation file per K/V dtype
// (emu_prefill_kernel_<dtype>.cpp): all shapes in one file were among the emulation suite's
// longest compiles (the asan stage's critical path on 2 cores).
#pragma once

#include "tangram/kernels/detail/prefill_attention.cuh"

namespace tangram::test {

/// Runs the prefill kernel of shape <T, D> on the emulator (defined in emu_prefill_kernel.inl,
/// instantiated for every compiled shape by the per-dtype files).
template <class T, int D>
void emu_prefill_kernel(detail::prefill_args const& a);

}  // namespace tangram::test
