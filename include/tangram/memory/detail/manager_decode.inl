// SPDX-License-Identifier: Apache-2.0
/**
 * @file memory/detail/manager_decode.inl
 * @brief Bodies of `basic_kv_cache_manager` (memory/kv_cache_manager.hpp): batches and decode
 * (batch_sequence, decode_step, append_tokens, rollback, try_extend). Included by the facade only.
 */
#pragma once

#include <cstddef>
#include <cstdint>

#include "tangram/core/error.hpp"
#include "tangram/memory/detail/manager_checks.hpp"

namespace tangram {

template <class Layout>
std::size_t basic_kv_cache_manager<Layout>::kind_index(batch_kind kind, char const* op) {
  auto k = static_cast<std::size_t>(kind);
  TANGRAM_EXPECTS(k < batch_kind_count,
                  invalid_argument,
                  op,
                  ".kind: must be batch_kind::decode or batch_kind::prefill, got ",
                  k);
  return k;
}

template <class Layout>
sequence_id basic_kv_cache_manager<Layout>::batch_sequence(batch_kind kind, std::int32_t r) const {
  auto const& b = batch_of(kind, "batch_sequence");
  TANGRAM_EXPECTS(r >= 0 && r < b.size(),
                  invalid_argument,
                  "batch_sequence.r: must be in [0, ",
                  b.size(),
                  ") for the ",
                  to_string(kind),
                  " batch, got ",
                  r);
  TANGRAM_EXPECTS(r < b.members(),
                  invalid_argument,
                  "batch_sequence.r: request ",
                  r,
                  " of the ",
                  to_string(kind),
                  " batch is a padding request (requests ",
                  b.members(),
                  " to ",
                  b.size() - 1,
                  " are padding) and has no sequence");
  return b.member(r);
}

template <class Layout>
void basic_kv_cache_manager<Layout>::decode_step() {
  check_batch_live("decode_step");
  auto const& b = decode_batch();
  for (std::int32_t r = 0; r < b.members(); ++r) sequences_.expect_decode_room(b.slot(r));
  for (std::int32_t r = 0; r < b.members(); ++r) flow_.append_decode_token(b.slot(r));
}

template <class Layout>
void basic_kv_cache_manager<Layout>::decode_step(std::int32_t const* tokens, std::size_t count) {
  check_batch_live("decode_step");
  auto const& b = decode_batch();
  TANGRAM_EXPECTS(count == static_cast<std::size_t>(b.size()),
                  invalid_argument,
                  "decode_step.tokens: expected ",
                  b.size(),
                  " counts (one per request of the decode batch, padding included), got ",
                  count);
  for (std::int32_t r = 0; r < b.size(); ++r) {
    TANGRAM_EXPECTS(tokens[r] >= 0,
                    invalid_argument,
                    "decode_step.tokens[",
                    r,
                    "]: must be >= 0, got ",
                    tokens[r]);
    TANGRAM_EXPECTS(r < b.members() || tokens[r] == 0,
                    invalid_argument,
                    "decode_step.tokens[",
                    r,
                    "]: request ",
                    r,
                    " is a padding request and appends nothing, got ",
                    tokens[r]);
    if (r < b.members()) sequences_.expect_decode_room(b.slot(r), tokens[r]);
  }
  for (std::int32_t r = 0; r < b.members(); ++r) flow_.append_decode_tokens(b.slot(r), tokens[r]);
}

template <class Layout>
void basic_kv_cache_manager<Layout>::append_tokens(sequence_id seq, std::int64_t tokens) {
  std::int32_t s = sequences_.find(seq, "append_tokens");
  detail::check_token_count("append_tokens.tokens", tokens);
  sequences_.expect_decode_room(s, tokens, "append_tokens");
  flow_.append_decode_tokens(s, tokens);
}

template <class Layout>
void basic_kv_cache_manager<Layout>::rollback(sequence_id seq, std::int64_t tokens) {
  std::int32_t s = sequences_.find(seq, "rollback");
  detail::check_token_count("rollback.tokens", tokens);
  sequences_.expect_phase(
      s, sequences_[s].phase == sequence_phase::decode, "rollback", ", not decode");
  auto limit = usage_.max_rollback(s);
  TANGRAM_EXPECTS(tokens <= limit,
                  logic_error,
                  "rollback.tokens: ",
                  tokens,
                  " exceeds max_rollback = ",
                  limit,
                  " for the sequence in slot ",
                  s,
                  " (",
                  sequences_[s].decoded,
                  " decode tokens this turn",
                  limit < sequences_[s].decoded
                      ? "; a page of those positions is shared with a fork or an uncompleted "
                        "page copy, or a sliding-window ring already overwrote tokens its "
                        "window needs again)"
                      : ")");
  flow_.rollback_decode_tokens(s, tokens);
  stats_.rolled_back_tokens += tokens;
}

template <class Layout>
bool basic_kv_cache_manager<Layout>::try_extend(sequence_id seq, std::int64_t more_tokens) {
  std::int32_t s = sequences_.find(seq, "try_extend");
  auto& st       = sequences_[s];
  sequences_.expect_phase(s,
                          st.phase == sequence_phase::decode,
                          "try_extend",
                          ", not decode (reserve prompt-phase tokens at admission)");
  std::int64_t max_new =
      detail::check_extension(lengths_.tokens(s) - st.decoded, st.max_new, more_tokens);
  usage_.size_extension(s, max_new, footprint_);
  bool relocate = footprint_.grows_capacity();
  if (!footprint_fits(relocate)) {
    ++stats_.extend_rejected;
    return false;
  }
  // Checked: nothing below fails.
  if (relocate) {
    page_table_.relocate(s, footprint_);
    journal_.note_full_resync();
  }
  (void)pool_.try_extend(st.reservation, footprint_.reserve_total());
  page_table_.extend_turn(s, footprint_);
  st.max_new = max_new;
  ++stats_.extended;
  return true;
}

}  // namespace tangram
