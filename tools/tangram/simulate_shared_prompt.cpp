// SPDX-License-Identifier: Apache-2.0
#include "simulate_shared_prompt.hpp"

#include <ostream>
#include <string>

#include "plan_support.hpp"
#include "tangram/core/detail/str.hpp"
#include "tangram/eval/sim/shared_prompt.hpp"
#include "usage_error.hpp"

namespace tangram::cli {

namespace {
using tangram::detail::cat;

std::string mb(double bytes) {
  return fixed(bytes / 1e6, 1);
}
/// Bytes as an exact integer (page and block counts times their bytes: whole numbers).
long long whole_bytes(double bytes) {
  return static_cast<long long>(bytes);
}
std::string pct(double part, double whole) {
  return whole > 0 ? fixed(100.0 * part / whole, 1) : std::string("0.0");
}

/// Refuses an S whose measurement pool passes the KV budget (its pages are simulated, but their
/// host metadata is real and grows with S), naming the largest S that fits: the pool grows with
/// S, so a binary search over [1, S) finds it.
void check_pool_fits(static_plan const& plan,
                     sim::shared_prompt_workload w,
                     kv_budget const& budget) {
  auto page_bytes = static_cast<double>(plan.page_bytes());
  auto pool_bytes = [&](std::int64_t S) {
    w.prompt_tokens = S;
    return static_cast<double>(sim::shared_prompt_pool_pages(plan, w)) * page_bytes;
  };
  std::int64_t const S = w.prompt_tokens;
  double const bytes   = pool_bytes(S);
  if (bytes <= budget.bytes) return;
  std::int64_t fits = 0, too_big = S;  // pool_bytes(fits) fits (0: none), pool_bytes(too_big) not
  while (too_big - fits > 1) {
    auto mid = fits + (too_big - fits) / 2;
    if (pool_bytes(mid) <= budget.bytes)
      fits = mid;
    else
      too_big = mid;
  }
  throw usage_error(cat("--shared-prompt ",
                        S,
                        ": the measurement holds ",
                        w.requests + 1,
                        " sequences of ",
                        S,
                        " + ",
                        w.user_tokens,
                        " prompt and ",
                        w.answer_tokens,
                        " answer tokens uncompressed, ",
                        fixed(bytes / 1e9, 2),
                        " GB, more than the ",
                        fixed(budget.bytes / 1e9, 2),
                        " GB KV budget (--gpu-mem x --usable: ",
                        budget.text,
                        "); ",
                        fits > 0 ? cat("at most ", fits, " fits") : std::string("no prompt fits"),
                        ", or raise --gpu-mem"));
}
}  // namespace

int run_shared_prompt(model_spec const& model,
                      static_plan const& plan,
                      std::int64_t prompt_tokens,
                      std::int64_t chunk_tokens,
                      kv_budget const& budget,
                      bool as_json,
                      streams io) {
  sim::shared_prompt_workload w;
  w.prompt_tokens = prompt_tokens;
  w.chunk_tokens  = chunk_tokens;
  check_pool_fits(plan, w, budget);
  auto r    = sim::measure_shared_prompt(plan, w, static_cast<double>(model.kv_bytes_per_token()));
  auto& out = io.out;
  if (as_json) {
    out << "{\"workload\": {\"shared_prompt_tokens\": " << w.prompt_tokens
        << ", \"requests\": " << w.requests << ", \"user_tokens\": " << w.user_tokens
        << ", \"answer_tokens\": " << w.answer_tokens << ", \"chunk_tokens\": " << w.chunk_tokens
        << "},\n \"tangram\": {\"unshared_bytes\": " << whole_bytes(r.tangram.unshared)
        << ", \"shared_bytes\": " << whole_bytes(r.tangram.shared)
        << ", \"saved_bytes\": " << whole_bytes(r.tangram.saved())
        << ", \"pages_shared\": " << r.tangram_pages_shared
        << ", \"page_copies\": " << r.tangram_page_copies
        << "},\n \"full_kv\": {\"unshared_bytes\": " << whole_bytes(r.full_kv.unshared)
        << ", \"shared_bytes\": " << whole_bytes(r.full_kv.shared)
        << ", \"saved_bytes\": " << whole_bytes(r.full_kv.saved()) << "}}\n";
    return 0;
  }
  out << "Shared system prompt on " << model.name << ": " << w.requests << " requests, each "
      << w.prompt_tokens << " shared + " << w.user_tokens << " own prompt tokens, "
      << w.answer_tokens << " answer tokens (synthetic lengths), chunks of " << w.chunk_tokens
      << ".\nCommitted KV memory (held + reserved) once every request is prefilled:\n";
  out << "  policy   no sharing (MB)   shared prompt (MB)   saved (MB)   saved (%)\n";
  out << "  tangram  " << mb(r.tangram.unshared) << "  " << mb(r.tangram.shared) << "  "
      << mb(r.tangram.saved()) << "  " << pct(r.tangram.saved(), r.tangram.unshared) << "\n";
  out << "  full_kv  " << mb(r.full_kv.unshared) << "  " << mb(r.full_kv.shared) << "  "
      << mb(r.full_kv.saved()) << "  " << pct(r.full_kv.saved(), r.full_kv.unshared) << "\n";
  out << "tangram: measured on the manager (pinned prefix, try_admit_with_prefix): "
      << r.tangram_pages_shared << " pages mapped by reference, " << r.tangram_page_copies
      << " copied (every group shares the prefix pages all its heads filled, a compressed group's"
         " pinned in place by its eviction; sliding rings copy theirs; measured on the static plan:"
         " docs/memory.md#shared-prefixes).\n"
         "full_kv: vLLM v1 with automatic prefix caching, the prompt's full 16-token blocks held"
         " once (modelled). Compressed unified baselines (the reference, SGLang with compression)"
         " disable prefix caching and share nothing.\n";
  return 0;
}

}  // namespace tangram::cli
