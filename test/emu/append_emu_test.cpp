// SPDX-License-Identifier: Apache-2.0
// The decode-step append kernel in the host emulator against the CPU reference (the scenario of
// test/gpu/append_test.cu): identical page pools for every cache x source dtype.
#include <catch2/catch.hpp>

#include "../gpu/kernel_cases.hpp"
#include "emu_backend.hpp"
#include "emu_support.hpp"

using namespace tangram;

TEST_CASE("emulated append_decode_kv matches the reference for every cache and source dtype",
          "[emu][append]") {
  std::uint64_t seed = 1;
  for (dtype cache : test::append_cache_dtypes())
    for (dtype src : test::append_source_dtypes()) {
      auto o = test::emu_schedules(++seed, 1).front();
      INFO("cache " << to_string(cache) << " src " << to_string(src) << ", schedule seed "
                    << o.seed);
      emu::scoped_options scope(o);
      test::emu_backend backend;
      CHECK(test::check_append(cache, src, backend) == "");
    }
}

TEST_CASE("emulated append_decode_kv matches the reference for fp8 caches with scales",
          "[emu][append][fp8][scales]") {
  std::uint64_t seed = 40;
  for (dtype cache : {dtype::fp8_e4m3, dtype::fp8_e5m2})
    for (auto m : {test::scale_mode::per_tensor, test::scale_mode::per_head})
      for (dtype src : test::append_source_dtypes()) {
        auto o = test::emu_schedules(++seed, 1).front();
        INFO("cache " << to_string(cache) << " src " << to_string(src) << ", " << to_string(m)
                      << ", schedule seed " << o.seed);
        emu::scoped_options scope(o);
        test::emu_backend backend;
        CHECK(test::check_append(cache, src, backend, m) == "");
      }
}

TEST_CASE("emulated append_decode_kv matches the reference on per-head pages (Hp 1)",
          "[emu][append][per_head]") {
  std::uint64_t seed = 60;
  for (dtype cache : test::append_cache_dtypes()) {
    auto o = test::emu_schedules(++seed, 1).front();
    INFO("cache " << to_string(cache) << ", schedule seed " << o.seed);
    emu::scoped_options scope(o);
    test::emu_backend backend;
    auto scales = cache == dtype::fp8_e4m3 ? test::scale_mode::per_head : test::scale_mode::none;
    CHECK(test::check_append(cache, dtype::bf16, backend, scales, 1) == "");
  }
}
