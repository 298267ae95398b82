// SPDX-License-Identifier: Apache-2.0
// Everything observable about a manager, as one vector of numbers: the "nothing changed" check
// of every refused call and misuse in the storms (test/support/storm/) and the targeted tests.
#pragma once

#include <cstdint>
#include <vector>

#include "tangram/memory/kv_cache_manager.hpp"

namespace tangram::test {

/// Everything observable about a manager, for "nothing changed" checks.
struct manager_snapshot {
  std::vector<std::int64_t> numbers;
  friend bool operator==(manager_snapshot const& a, manager_snapshot const& b) {
    return a.numbers == b.numbers;
  }
};

template <class Manager>
manager_snapshot snapshot(Manager const& m, std::vector<sequence_id> const& ids) {
  manager_snapshot s;
  auto& v = s.numbers;
  auto st = m.stats();
  for (auto x : {st.admitted,
                 st.rejected,
                 st.turns_continued,
                 st.continue_rejected,
                 st.forks,
                 st.fork_rejected,
                 st.freed,
                 st.pages_drawn,
                 st.surplus_pages_released,
                 st.reclaimed_pages,
                 st.page_copies,
                 st.staging_pages_returned,
                 st.spare_pages_kept})
    v.push_back(x);
  auto ps = m.pool().stats();
  for (auto x : {ps.free,
                 ps.reserved,
                 ps.used,
                 ps.peak_used,
                 ps.allocations,
                 ps.frees,
                 ps.retired,
                 ps.retirements,
                 m.current_epoch(),
                 m.released_epoch()})
    v.push_back(x);
  m.pool().for_each_retired([&](page_id p, std::int64_t e) {
    v.push_back(p);
    v.push_back(e);
  });
  for (page_id p = 0; p < m.pool().capacity(); ++p) v.push_back(m.pool().ref_count(p));
  v.push_back(m.live_sequences());
  for (auto kind : {batch_kind::decode, batch_kind::prefill}) {
    v.push_back(m.batch_size(kind));
    v.push_back(m.batch_padding(kind));
    for (std::int32_t r = 0; r < m.batch_size(kind) - m.batch_padding(kind); ++r)
      v.push_back(m.batch_sequence(kind, r).slot);
  }
  for (auto id : ids) {
    if (!m.contains(id)) {
      v.push_back(-1);
      continue;
    }
    auto i = m.info(id);
    for (auto x : {static_cast<std::int64_t>(i.phase),
                   i.seq_tokens,
                   i.appended,
                   i.prompt_remaining,
                   i.chunk_pending,
                   i.max_new,
                   i.decoded,
                   i.reserved_pages,
                   i.held_pages})
      v.push_back(x);
    v.push_back(m.elastic_page_limit(id));
    for (std::int32_t g = 0; g < m.num_groups(); ++g) {
      v.push_back(m.group_target(id, g));
      v.push_back(m.group_reserved(id, g));
      auto n = m.group_page_count(id, g);
      auto p = m.group_pages(id, g);
      v.insert(v.end(), p, p + n);
    }
    for (std::int32_t l = 0; l < m.plan().num_layers; ++l)
      for (std::int32_t h = 0; h < m.plan().num_kv_heads; ++h) v.push_back(m.head_len(id, l, h));
  }
  for (auto c : m.pending_copies()) {
    v.push_back(c.src);
    v.push_back(c.dst);
  }
  return s;
}
}  // namespace tangram::test
