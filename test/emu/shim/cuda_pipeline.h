// SPDX-License-Identifier: Apache-2.0
// Host emulation shim (test/emu): the cp.async primitives are declared by the emulator.
#pragma once

#include "../simt/simt.hpp"
