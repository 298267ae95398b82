// SPDX-License-Identifier: Apache-2.0
// `tangram simulate --shared-prompt S` (issue 35 item 4): the shared-system-prompt workload's JSON
// on the default plan (full_kv's blocks worked by hand; Tangram's pages are checked on the tiny
// plan in memory/prefix_sharing_test.cpp), and the options it refuses.
#include <string>
#include <vector>

#include "cli_support.hpp"
#include "commands.hpp"
#include "tangram/io/detail/json.hpp"
#include "test_support.hpp"

using namespace tangram;

TEST_CASE("simulate --shared-prompt reports both policies with and without sharing",
          "[sim][cli][prefix]") {
  auto r    = test::run_json({"simulate", "--shared-prompt", "64", "--json"});
  auto root = r.root();
  // full_kv: Llama-3.1-8B bf16 holds 32 layers x 8 heads x 128 x 2 (K, V) x 2 B = 131072 B per
  // token; 32 requests of 64 + 256 + 256 tokens take 36 blocks of 16 each, and with prefix
  // caching the prompt's 4 full blocks are held once: 4 + 32 x 32 blocks.
  double block = 16.0 * 131072.0;
  CHECK(root["full_kv"]["unshared_bytes"].as_double(0, 1e15) == 32 * 36 * block);
  CHECK(root["full_kv"]["shared_bytes"].as_double(0, 1e15) == (4 + 32 * 32) * block);
  // Every layer of the default plan is compressed, with static budgets and per-head pages (32
  // layers x 8 KV heads = 256 groups of one head). A 64-token prompt keeps every token: each
  // request shares the prompt's 4 full pages of every group, pinned (nothing copied: 64 is a
  // whole number of pages), and holds what full_kv with prefix caching holds, byte for byte.
  CHECK(root["tangram"]["pages_shared"].as_int(0, 1 << 30) == 32 * 256 * 4);
  CHECK(root["tangram"]["page_copies"].as_int(0, 1 << 30) == 0);
  CHECK(root["tangram"]["shared_bytes"].as_double(0, 1e15) == (4 + 32 * 32) * block);
  CHECK(root["tangram"]["unshared_bytes"].as_double(0, 1e15) == 32 * 36 * block);
  CHECK(root["workload"]["requests"].as_int(0, 1000) == 32);

  auto zero = test::run_cli({"simulate", "--shared-prompt", "0"});
  CHECK(zero.code == 2);
  CHECK(zero.err.find("--shared-prompt: must be in [1,") != std::string::npos);
  auto verdict = test::run_cli({"simulate", "--verdict", "--shared-prompt", "64"});
  CHECK(verdict.code == 2);
  CHECK(verdict.err.find("--shared-prompt: applies to a single simulate run") != std::string::npos);
}

TEST_CASE("simulate --shared-prompt refuses a prompt whose measurement does not fit the GPU",
          "[sim][cli][prefix]") {
  // The measurement's pool holds 33 sequences (32 requests and the pinned prompt) of S + 256 + 256
  // tokens uncompressed: on Llama-3.1-8B (131072 B per token, pages of 16 tokens) that is
  // 33 x ceil((S + 512) / 16) x 16 x 131072 B = ceil((S + 512) / 16) x 69,206,016 B.
  // --gpu-mem 20 --usable 1 leaves 20 - 16.06 GB of weights = 3.94 GB: 56 x 69,206,016 =
  // 3,875,536,896 B fits, 57 x = 3,944,742,912 B does not, so S + 512 <= 56 x 16: S <= 384.
  std::vector<std::string> small = {"--gpu-mem", "20", "--usable", "1"};
  auto with                      = test::with_args;
  test::check_refused(with({"simulate", "--shared-prompt", "385"}, small),
                      {"--shared-prompt 385:", "3.94 GB KV budget", "at most 384 fits"});
  auto edge = test::run_cli(with({"simulate", "--shared-prompt", "384", "--json"}, small));
  INFO(edge.err);
  REQUIRE(edge.code == 0);
  CHECK(edge.out.find("\"shared_prompt_tokens\": 384") != std::string::npos);
  // The default H200 (141 GB x 0.9 - 16.06 GB = 110.84 GB): 1601 x 69,206,016 B fits, 1602 x
  // does not, S + 512 <= 1601 x 16: S <= 25104. The largest S the option takes (2^30, a pool of
  // 4.6 PB) is refused before any work instead of exhausting host memory.
  test::check_refused({"simulate", "--shared-prompt", "1073741824"},
                      {"--shared-prompt 1073741824:", "at most 25104 fits", "--gpu-mem"});
  test::check_refused({"simulate", "--shared-prompt", "25105"}, {"at most 25104 fits"});
  // 17 GB leaves 0.94 GB: not even S = 1 (33 x 69,206,016 B) fits.
  test::check_refused({"simulate", "--shared-prompt", "1", "--gpu-mem", "17", "--usable", "1"},
                      {"--shared-prompt 1:", "no prompt fits"});
}
