// SPDX-License-Identifier: Apache-2.0
// `tangram simulate --shared-prompt S` (issue 35 item 4): the shared-system-prompt workload's JSON
// on the default plan (full_kv's blocks worked by hand; Tangram's pages are checked on the tiny
// plan in memory/prefix_sharing_test.cpp), and the options it refuses.
#include <string>

#include "cli_support.hpp"
#include "commands.hpp"
#include "tangram/io/detail/json.hpp"
#include "test_support.hpp"

using namespace tangram;

TEST_CASE("simulate --shared-prompt reports both policies with and without sharing",
          "[sim][cli][prefix]") {
  namespace json = tangram::detail::json;
  auto r         = test::run_cli({"simulate", "--shared-prompt", "64", "--json"});
  INFO(r.err);
  REQUIRE(r.code == 0);
  auto doc = json::parse(r.out, "stdout");
  json::node root(doc, "stdout");
  // full_kv: Llama-3.1-8B bf16 holds 32 layers x 8 heads x 128 x 2 (K, V) x 2 B = 131072 B per
  // token; 32 requests of 64 + 256 + 256 tokens take 36 blocks of 16 each, and with prefix
  // caching the prompt's 4 full blocks are held once: 4 + 32 x 32 blocks.
  double block = 16.0 * 131072.0;
  CHECK(root["full_kv"]["unshared_bytes"].as_double(0, 1e15) == 32 * 36 * block);
  CHECK(root["full_kv"]["shared_bytes"].as_double(0, 1e15) == (4 + 32 * 32) * block);
  // Every layer of the default plan is compressed: no page is shared, each request copies the
  // prompt's pages and the pinned prompt is one more copy (a loss, reported as such).
  CHECK(root["tangram"]["pages_shared"].as_int(0, 1 << 30) == 0);
  CHECK(root["tangram"]["page_copies"].as_int(0, 1 << 30) > 0);
  CHECK(root["tangram"]["saved_bytes"].as_double(-1e15, 1e15) < 0);
  CHECK(root["workload"]["requests"].as_int(0, 1000) == 32);

  auto zero = test::run_cli({"simulate", "--shared-prompt", "0"});
  CHECK(zero.code == 2);
  CHECK(zero.err.find("--shared-prompt: must be in [1,") != std::string::npos);
  auto verdict = test::run_cli({"simulate", "--verdict", "--shared-prompt", "64"});
  CHECK(verdict.code == 2);
  CHECK(verdict.err.find("--shared-prompt: applies to a single simulate run") != std::string::npos);
}
