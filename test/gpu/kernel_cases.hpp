// SPDX-License-Identifier: Apache-2.0
/**
 * @file test/gpu/kernel_cases.hpp
 * @brief The kernel test scenarios, shared by the GPU tests (test/gpu) and the host emulation
 * tests (test/emu): one way to build each scenario and to compare a kernel run with the CPU
 * reference. Host-only C++; no test framework.
 *
 * A backend runs the kernels on host-side parameters (every pointer host memory, as for the
 * reference) and leaves the results in those host arrays:
 *
 *     void decode(test_cache&, decode_params const&);   // writes p.o and p.lse
 *     void evict(test_cache&, eviction_params const&);  // updates the cache's pool in place,
 *                                                       // writes p.new_len and p.scores_out
 *     void append(test_cache&, append_params const&);   // updates the cache's pool in place
 *     void balance(test_cache&, balanced_split_params const&);  // writes p.cta_begin
 *
 * (the GPU backend uploads, launches and downloads; the emulator runs on the host arrays). Each
 * check returns an empty string when the kernel agrees with the reference, else a description of
 * the first difference.
 *
 * The scenarios of each kernel are in their own header: decode_cases.hpp, eviction_cases.hpp,
 * append_cases.hpp and balanced_split_cases.hpp.
 */
#pragma once

#include "append_cases.hpp"
#include "balanced_split_cases.hpp"
#include "decode_cases.hpp"
#include "eviction_cases.hpp"
