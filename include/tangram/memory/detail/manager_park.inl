// SPDX-License-Identifier: Apache-2.0
/**
 * @file memory/detail/manager_park.inl
 * @brief Bodies of `basic_kv_cache_manager` (memory/kv_cache_manager.hpp): sessions parked in
 * host memory (park, complete_park, cancel_park, try_unpark, try_resume and their page counts).
 * Included by the facade only.
 */
#pragma once

#include <cstdint>
#include <optional>

#include "tangram/memory/detail/manager_checks.hpp"
#include "tangram/memory/detail/parking.hpp"

namespace tangram {

template <class Layout>
parked_session basic_kv_cache_manager<Layout>::park(sequence_id seq) {
  std::int32_t s = sequences_.find(seq, "park");
  auto& st       = sequences_[s];
  sequences_.expect_phase(s,
                          st.phase == sequence_phase::ended || st.phase == sequence_phase::decode,
                          "park",
                          "; only an ended session or a turn in decode can be parked");
  sequences_.expect_unpinned(s, "park");
  auto p             = usage_.describe(s, fingerprint_, pool_.page_bytes());
  st.parked_mid_turn = st.phase == sequence_phase::decode;
  st.phase           = sequence_phase::parking;
  stats_.pages_parked += p.host_pages();
  return p;
}

template <class Layout>
void basic_kv_cache_manager<Layout>::complete_park(sequence_id seq) {
  std::int32_t s = sequences_.find(seq, "complete_park");
  sequences_.expect_phase(s,
                          sequences_[s].phase == sequence_phase::parking,
                          "complete_park",
                          ", not parking (call park first)");
  stats_.parked_mid_turn += sequences_[s].parked_mid_turn;
  release_sequence(s);
  ++stats_.parked;
}

template <class Layout>
void basic_kv_cache_manager<Layout>::cancel_park(sequence_id seq) {
  std::int32_t s = sequences_.find(seq, "cancel_park");
  auto& st       = sequences_[s];
  sequences_.expect_phase(
      s, st.phase == sequence_phase::parking, "cancel_park", ", not parking (call park first)");
  st.phase           = st.parked_mid_turn ? sequence_phase::decode : sequence_phase::ended;
  st.parked_mid_turn = false;
}

template <class Layout>
std::int64_t basic_kv_cache_manager<Layout>::unpark_pages(parked_session const& session,
                                                          std::int64_t prompt_tokens,
                                                          std::int64_t max_new_tokens) const {
  check_unpark("unpark_pages", session, prompt_tokens, max_new_tokens);
  detail::turn_footprint fp(groups_.num_groups());
  usage_.size_turn(detail::turn_kind::restore,
                   -1,
                   session.seq_tokens + prompt_tokens,
                   prompt_tokens,
                   max_new_tokens,
                   fp,
                   session.group_pages.data());
  return fp.reserve_total() + session.host_pages();
}

template <class Layout>
std::optional<restored_session> basic_kv_cache_manager<Layout>::try_unpark(
    parked_session const& session, std::int64_t prompt_tokens, std::int64_t max_new_tokens) {
  check_unpark("try_unpark", session, prompt_tokens, max_new_tokens);
  usage_.size_turn(detail::turn_kind::restore,
                   -1,
                   session.seq_tokens + prompt_tokens,
                   prompt_tokens,
                   max_new_tokens,
                   footprint_,
                   session.group_pages.data());
  auto out = restore(session, sequence_phase::prefill, stats_.unpark_rejected);
  if (!out) return out;
  sequences_[out->id.slot].prompt_remaining = prompt_tokens;
  sequences_[out->id.slot].max_new          = max_new_tokens;
  ++stats_.unparked;
  return out;
}

template <class Layout>
std::int64_t basic_kv_cache_manager<Layout>::resume_pages(parked_session const& session,
                                                          std::int64_t max_new_tokens) const {
  check_resume("resume_pages", session, max_new_tokens);
  detail::turn_footprint fp(groups_.num_groups());
  usage_.size_resume(session, max_new_tokens, fp);
  return fp.reserve_total() + session.host_pages();
}

template <class Layout>
std::optional<restored_session> basic_kv_cache_manager<Layout>::try_resume(
    parked_session const& session, std::int64_t max_new_tokens) {
  check_resume("try_resume", session, max_new_tokens);
  usage_.size_resume(session, max_new_tokens, footprint_);
  auto out = restore(session, sequence_phase::decode, stats_.resume_rejected);
  if (!out) return out;
  sequences_[out->id.slot].max_new = max_new_tokens;
  sequences_[out->id.slot].decoded = session.decoded;
  ++stats_.resumed;
  return out;
}

template <class Layout>
void basic_kv_cache_manager<Layout>::check_unpark(char const* op,
                                                  parked_session const& session,
                                                  std::int64_t prompt_tokens,
                                                  std::int64_t max_new_tokens) const {
  detail::check_parked_session(op, session, fingerprint_, pool_.page_bytes(), groups_);
  detail::check_ended_session(op, session);
  detail::check_turn_sizes(op, session.seq_tokens, prompt_tokens, max_new_tokens);
}

template <class Layout>
void basic_kv_cache_manager<Layout>::check_resume(char const* op,
                                                  parked_session const& session,
                                                  std::int64_t max_new) const {
  detail::check_parked_session(op, session, fingerprint_, pool_.page_bytes(), groups_);
  detail::check_resume(op, session, max_new);
}

template <class Layout>
std::optional<restored_session> basic_kv_cache_manager<Layout>::restore(parked_session const& p,
                                                                        sequence_phase phase,
                                                                        std::int64_t& rejected) {
  restored_session out;
  auto s = flow_.try_restore(p, footprint_, phase, out.device_pages);
  if (!s) {
    ++rejected;
    return std::nullopt;
  }
  out.id = sequence_id{*s, sequences_[*s].generation};
  return out;
}

}  // namespace tangram
