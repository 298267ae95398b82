// SPDX-License-Identifier: Apache-2.0
/**
 * @file eval/sim/shared_prompt.hpp
 * @brief The shared-system-prompt workload of `tangram simulate --shared-prompt S`: R requests
 * whose prompts start with the same S-token system prompt, each followed by U tokens of its own
 * and T answer tokens. Measured on the real manager (simulated memory, exact page accounting)
 * with and without a pinned shared prefix (memory/detail/manager_prefix.inl), and computed for
 * full_kv (vLLM v1 paging) with and without its automatic prefix caching, which shares the
 * prompt's full blocks. The prompt lengths are the caller's (synthetic: no dataset); the
 * compressed groups' kept counts are the static plan's `expected_kept` (its budgets).
 */
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "tangram/core/error.hpp"
#include "tangram/eval/sim/simulated_memory_resource.hpp"
#include "tangram/memory/kv_cache_manager.hpp"
#include "tangram/plan/footprint.hpp"
#include "tangram/plan/static_plan.hpp"

namespace tangram::sim {

/// The workload: R requests of S shared + U own prompt tokens and T answer tokens.
struct shared_prompt_workload {
  std::int64_t prompt_tokens = 2048;  ///< S, the shared system prompt
  std::int64_t requests      = 32;    ///< R
  std::int64_t user_tokens   = 256;   ///< U, each request's own prompt after S
  std::int64_t answer_tokens = 256;   ///< T
  std::int64_t chunk_tokens  = 2048;  ///< prefill chunk (the prompt's chunks end at S)
  std::int32_t full_kv_block = 16;    ///< full_kv's block (vLLM's default block size)
};

/// Bytes one policy holds for the whole workload, with and without sharing the prompt.
struct shared_prompt_bytes {
  double unshared = 0;  ///< every request holds its own copy of the prompt
  double shared   = 0;  ///< the prompt held once (and what each request still copies)
  [[nodiscard]] double saved() const { return unshared - shared; }
};

/// The measurement: committed bytes (held + reserved) once every request is prefilled.
struct shared_prompt_result {
  shared_prompt_bytes tangram;            ///< the manager on this plan, pinned prefix vs none
  shared_prompt_bytes full_kv;            ///< uncompressed, vLLM prefix caching vs none
  std::int64_t tangram_pages_shared = 0;  ///< `prefix_pages_shared` after the R admissions
  std::int64_t tangram_page_copies  = 0;  ///< pages the requests copied from the prefix
};

namespace detail {

/// Prefills `tokens` prompt tokens of `seq` in chunks of at most `chunk`, each head keeping the
/// manager's `expected_kept` (the static budgets' eviction).
inline void prefill_expected(kv_cache_manager& m,
                             sequence_id seq,
                             std::int64_t tokens,
                             std::int64_t chunk,
                             std::vector<std::int32_t>& kept) {
  while (tokens > 0) {
    auto c = std::min(tokens, chunk);
    m.prepare_chunk(seq, c);
    m.expected_kept(seq, c, kept.data());
    m.commit_chunk(seq, kept);
    tokens -= c;
  }
}

/// Pages held plus reserved in the pool.
inline std::int64_t committed_pages(kv_cache_manager const& m) {
  auto s = m.pool().stats();
  return s.used + s.reserved;
}

}  // namespace detail

/**
 * @brief Pages of the pool `measure_shared_prompt` builds: R + 1 sequences (the R requests, and
 * the pinned prompt once) each of S + U prompt and T answer tokens uncompressed
 * (`uncompressed_footprint_pages`), so that the measurement refuses nothing. Its host metadata and
 * the GPU memory it stands for grow with S: a caller bounds it before measuring (`tangram simulate`
 * refuses an S whose pool passes the configured GPU's KV budget).
 * @throw invalid_argument naming the field for S, U or chunk < 1, R outside [1, 4096], T < 0,
 *        S + U + T past 2^31 - 1, or a page count past int64.
 */
inline std::int64_t shared_prompt_pool_pages(static_plan const& plan,
                                             shared_prompt_workload const& w) {
  TANGRAM_EXPECTS(w.requests >= 1 && w.requests <= 4096,
                  invalid_argument,
                  "shared_prompt_workload.requests: ",
                  w.requests,
                  " (1 to 4096)");
  auto at_least = [](std::int64_t value, std::int64_t least, char const* field) {
    TANGRAM_EXPECTS(value >= least,
                    invalid_argument,
                    "shared_prompt_workload.",
                    field,
                    ": ",
                    value,
                    " (at least ",
                    least,
                    ")");
  };
  at_least(w.prompt_tokens, 1, "prompt_tokens");
  at_least(w.user_tokens, 1, "user_tokens");
  at_least(w.answer_tokens, 0, "answer_tokens");
  at_least(w.chunk_tokens, 1, "chunk_tokens");
  at_least(w.full_kv_block, 1, "full_kv_block");
  std::int64_t const S = w.prompt_tokens, U = w.user_tokens, T = w.answer_tokens;
  constexpr std::int64_t max_tokens = std::numeric_limits<std::int32_t>::max();
  TANGRAM_EXPECTS(U <= max_tokens && T <= max_tokens && S <= max_tokens - U - T,
                  invalid_argument,
                  "shared_prompt_workload: prompt_tokens + user_tokens + answer_tokens = ",
                  S,
                  " + ",
                  U,
                  " + ",
                  T,
                  " pass 2^31 - 1");
  // A pool that holds every request uncompressed, plus the prompt once: nothing is refused.
  std::int64_t per_request = uncompressed_footprint_pages(plan, S + U, T);
  TANGRAM_EXPECTS(per_request <= std::numeric_limits<std::int64_t>::max() / (w.requests + 1),
                  invalid_argument,
                  "shared_prompt_workload: ",
                  w.requests,
                  " requests of ",
                  per_request,
                  " pages overflow a page count");
  return (w.requests + 1) * per_request;
}

/**
 * @brief Runs the workload on a manager over `plan` (static budgets) twice: R plain requests of
 * S + U prompt tokens, chunked so that a chunk ends at S; and the prompt prefilled once, pinned,
 * then R requests admitted over it with U prompt tokens. Both prefill every request and report
 * the pool's held + reserved pages times the page bytes. full_kv: R (S + U + T) tokens of
 * `full_token_bytes` (all layers and KV heads) in blocks of `full_kv_block` tokens per request,
 * unshared; shared, the prompt's full blocks once (vLLM shares full blocks only).
 * @throw invalid_argument as `shared_prompt_pool_pages`; the manager's for a pool it cannot
 *        build.
 */
inline shared_prompt_result measure_shared_prompt(static_plan const& plan,
                                                  shared_prompt_workload const& w,
                                                  double full_token_bytes) {
  auto const pool_pages = shared_prompt_pool_pages(plan, w);  // validates the workload first
  std::int64_t const S = w.prompt_tokens, U = w.user_tokens, T = w.answer_tokens;
  manager_options o;
  o.num_pages        = pool_pages;
  o.max_sequences    = static_cast<std::int32_t>(w.requests + 1);
  o.max_chunk_tokens = w.chunk_tokens;
  std::vector<std::int32_t> kept(static_cast<std::size_t>(plan.num_layers * plan.num_kv_heads));
  auto page_bytes = static_cast<double>(plan.page_bytes());
  shared_prompt_result r;
  {
    simulated_memory_resource mr;
    kv_cache_manager m(plan, mr, o);
    for (std::int64_t i = 0; i < w.requests; ++i) {
      auto id = m.try_admit(S + U, T);
      TANGRAM_EXPECTS(id.has_value(), logic_error, "shared prompt: a plain request was refused");
      detail::prefill_expected(m, *id, S, w.chunk_tokens, kept);
      detail::prefill_expected(m, *id, U, w.chunk_tokens, kept);
    }
    r.tangram.unshared = static_cast<double>(detail::committed_pages(m)) * page_bytes;
  }
  {
    simulated_memory_resource mr;
    kv_cache_manager m(plan, mr, o);
    auto p = m.try_admit(S, 0);
    TANGRAM_EXPECTS(p.has_value(), logic_error, "shared prompt: the prefix was refused");
    detail::prefill_expected(m, *p, S, w.chunk_tokens, kept);
    m.end_turn(*p);
    m.pin_prefix(*p);
    for (std::int64_t i = 0; i < w.requests; ++i) {
      auto id = m.try_admit_with_prefix(*p, U, T);
      TANGRAM_EXPECTS(id.has_value(), logic_error, "shared prompt: a request was refused");
      m.complete_page_copies();  // the engine copied them (no content in simulated memory)
      detail::prefill_expected(m, *id, U, w.chunk_tokens, kept);
    }
    r.tangram.shared       = static_cast<double>(detail::committed_pages(m)) * page_bytes;
    r.tangram_pages_shared = m.stats().prefix_pages_shared;
    r.tangram_page_copies  = m.stats().page_copies;
  }
  auto blocks = [&](std::int64_t tokens) {
    return (tokens + w.full_kv_block - 1) / w.full_kv_block;
  };
  double block_bytes         = full_token_bytes * static_cast<double>(w.full_kv_block);
  auto R                     = static_cast<double>(w.requests);
  r.full_kv.unshared         = R * static_cast<double>(blocks(S + U + T)) * block_bytes;
  std::int64_t shared_blocks = S / w.full_kv_block;  // full blocks of the prompt
  r.full_kv.shared           = (static_cast<double>(shared_blocks) +
                      R * static_cast<double>(blocks(S + U + T) - shared_blocks)) *
                     block_bytes;
  return r;
}

}  // namespace tangram::sim
