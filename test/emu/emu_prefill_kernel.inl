// SPDX-License-Identifier: Apache-2.0
// Definition of emu_prefill_kernel and the macro that instantiates it for one dtype's head dims;
// included only by the emu_prefill_kernel_<dtype>.cpp files.
#pragma once

#include "emu_prefill_kernel.hpp"
#include "simt/simt.hpp"

namespace tangram::test {

template <class T, int D>
void emu_prefill_kernel(detail::prefill_args const& a) {
  detail::launch_prefill_with<T, D>(a, emu::emulated_launch{});
}

// clang-format off
#define TANGRAM_EMU_PREFILL_ONE(unused, T, D) template void emu_prefill_kernel<T, D>(detail::prefill_args const&);
#define TANGRAM_EMU_PREFILL_INSTANTIATE(T) TANGRAM_KV_SHAPE_HEAD_DIMS(TANGRAM_EMU_PREFILL_ONE, unused, T)
// clang-format on

}  // namespace tangram::test
