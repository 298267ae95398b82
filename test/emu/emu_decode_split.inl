// SPDX-License-Identifier: Apache-2.0
// Definition of emu_decode_split and the macro that instantiates it for one dtype's shapes; included
// only by the emu_decode_split_<dtype>.cpp files.
#pragma once

#include "emu_decode_split.hpp"
#include "simt/simt.hpp"

namespace tangram::test {

template <class T, int D, int GB>
void emu_decode_split(detail::decode_args const& a) {
  detail::launch_decode_split_with<T, D, GB>(a, emu::emulated_launch{});
}

// clang-format off
#define TANGRAM_EMU_DECODE_ONE(unused, T, D, GB) template void emu_decode_split<T, D, GB>(detail::decode_args const&);
#define TANGRAM_EMU_DECODE_DIM(unused, T, D) TANGRAM_KV_SHAPE_QUERY_GROUPS(TANGRAM_EMU_DECODE_ONE, unused, T, D)
#define TANGRAM_EMU_DECODE_INSTANTIATE(T) TANGRAM_KV_SHAPE_HEAD_DIMS(TANGRAM_EMU_DECODE_DIM, unused, T)
// clang-format on

}  // namespace tangram::test
