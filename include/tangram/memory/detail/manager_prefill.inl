// SPDX-License-Identifier: Apache-2.0
/**
 * @file memory/detail/manager_prefill.inl
 * @brief Bodies of `basic_kv_cache_manager` (memory/kv_cache_manager.hpp): the chunks of a prompt
 * (prepare_chunk, expected_kept, commit_chunk). Included by the facade only.
 */
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "tangram/core/error.hpp"
#include "tangram/core/retention.hpp"
#include "tangram/memory/detail/chunk_rules.hpp"
#include "tangram/memory/detail/manager_checks.hpp"

namespace tangram {

template <class Layout>
void basic_kv_cache_manager<Layout>::prepare_chunk(sequence_id seq, std::int64_t chunk_tokens) {
  std::int32_t s = sequences_.find(seq, "prepare_chunk");
  auto& st       = sequences_[s];
  detail::check_chunk_size(groups_.elastic(), chunk_tokens, options_.max_chunk_tokens);
  sequences_.expect_phase(s, st.phase == sequence_phase::prefill, "prepare_chunk", ", not prefill");
  sequences_.expect_no_prepared_chunk(s);
  sequences_.expect_chunk_fits(s, chunk_tokens, "prepare_chunk");
  std::int64_t n = lengths_.tokens(s) + chunk_tokens, pooled_need = 0;
  for (std::int32_t g = 0; g < groups_.num_groups(); ++g) {
    auto need = usage_.pages_after_chunk(s, g, n, chunk_tokens);
    if (groups_.pooled(g)) {
      // A pooled group keeps the previous chunk's staged pages (page_flow::settle_after_chunk):
      // it draws what it lacks, and what it holds beyond `need` goes back first.
      auto held = page_table_.count(s, g);
      pooled_need += need >= held ? need - held : -usage_.exclusive_tail(s, g, need);
    } else {
      page_table_.expect_can_grow(s, g, need, "prepare_chunk");
    }
    chunk_need_[static_cast<std::size_t>(g)] = need;
  }
  page_table_.expect_pooled_room(s, pooled_need, "prepare_chunk");
  for (auto g : groups_.pooled_groups())
    flow_.return_to_reservation(s, g, chunk_need_[static_cast<std::size_t>(g)]);
  for (std::int32_t g = 0; g < groups_.num_groups(); ++g) {
    page_table_.count_before_chunk(s, g) = page_table_.count(s, g);
    flow_.grow_to(s, g, chunk_need_[static_cast<std::size_t>(g)]);
  }
  st.chunk_pending = chunk_tokens;
}

template <class Layout>
void basic_kv_cache_manager<Layout>::expected_kept(sequence_id seq,
                                                   std::int64_t chunk_tokens,
                                                   std::int32_t* out) const {
  std::int32_t s = sequences_.find(seq, "expected_kept");
  TANGRAM_EXPECTS(chunk_tokens >= 0,
                  invalid_argument,
                  "expected_kept.chunk_tokens: must be >= 0, got ",
                  chunk_tokens);
  // Bounds n + c by the turn's admitted size (<= 2^31 - 1), so the counts fit in int32.
  sequences_.expect_chunk_fits(s, chunk_tokens, "expected_kept");
  std::int64_t n = lengths_.tokens(s) + chunk_tokens;
  for (std::int32_t h = 0; h < groups_.num_heads(); ++h)
    out[h] = static_cast<std::int32_t>(usage_.expected_kept(s, h, n, chunk_tokens));
}

template <class Layout>
void basic_kv_cache_manager<Layout>::commit_chunk(sequence_id seq,
                                                  std::int32_t const* kept,
                                                  std::size_t count) {
  std::int32_t s       = sequences_.find(seq, "commit_chunk");
  auto& st             = sequences_[s];
  std::int32_t const H = groups_.num_kv_heads(), heads = groups_.num_heads();
  TANGRAM_EXPECTS(count == static_cast<std::size_t>(heads),
                  invalid_argument,
                  "commit_chunk.kept: expected ",
                  heads,
                  " counts (layers x KV heads), got ",
                  count);
  sequences_.expect_prepared_chunk(s);
  std::int64_t c = st.chunk_pending;
  std::int64_t n = lengths_.tokens(s) + c;
  for (std::int32_t h = 0; h < heads; ++h) {
    auto kind = plan_.rules[static_cast<std::size_t>(h)].kind;
    detail::check_kept(kind,
                       kept[h],
                       usage_.expected_kept(s, h, n, c),
                       n,
                       s,
                       h / H,
                       h % H,
                       usage_.pinned_tokens(s, h));
  }
  detail::check_pooled_kept(groups_, kept, page_table_.pooled_limit(s), s);
  lengths_.commit_chunk(s, kept, static_cast<std::int32_t>(n), [&](std::int32_t h) {
    return plan_.rules[static_cast<std::size_t>(h)].kind == layer_kind::sliding_window;
  });
  st.prompt_remaining -= c;
  st.chunk_pending = 0;
  if (st.prompt_remaining == 0) st.phase = sequence_phase::decode;
  flow_.settle_after_chunk(s);
  if (st.phase == sequence_phase::decode) flow_.trim_pooled_budget(s, usage_.pooled_decode_need(s));
  journal_.note_slot(s);
}

}  // namespace tangram
