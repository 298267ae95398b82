// SPDX-License-Identifier: Apache-2.0
#include "simulate_shared_prompt.hpp"

#include <ostream>

#include "plan_support.hpp"
#include "tangram/eval/sim/shared_prompt.hpp"

namespace tangram::cli {

namespace {
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
}  // namespace

int run_shared_prompt(model_spec const& model,
                      static_plan const& plan,
                      std::int64_t prompt_tokens,
                      std::int64_t chunk_tokens,
                      bool as_json,
                      streams io) {
  sim::shared_prompt_workload w;
  w.prompt_tokens = prompt_tokens;
  w.chunk_tokens  = chunk_tokens;
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
      << " copied (compressed and sliding groups copy the prefix: only uncompressed groups share"
         " it; docs/memory.md#shared-prefixes-built-uncompressed-groups).\n"
         "full_kv: vLLM v1 with automatic prefix caching, the prompt's full 16-token blocks held"
         " once (modelled). Compressed unified baselines (the reference, SGLang with compression)"
         " disable prefix caching and share nothing.\n";
  return 0;
}

}  // namespace tangram::cli
