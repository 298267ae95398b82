// SPDX-License-Identifier: Apache-2.0
/**
 * @file reference/elastic_eviction.hpp
 * @brief CPU reference of the elastic chunk eviction (kernels/elastic_eviction.hpp) over host
 * memory. The per-layer stage step is `reference::evict_chunk` with `stage_keys` set
 * (reference/eviction.hpp); this file is the request-wide step after the last layer: a sort for
 * the global top-K (ties by layer, head, position), the shared `elastic_group_pages` for the group
 * lengths, and a stable sort per head for the survivors, gathered then written in order.
 * Allocates scratch; not for hot paths.
 */
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <utility>
#include <vector>

#include "tangram/kernels/elastic_eviction.hpp"
#include "tangram/kernels/eviction.hpp"
#include "tangram/kernels/head_cursor.hpp"
#include "tangram/reference/storage.hpp"

namespace tangram::reference {

namespace detail {

/// Keeps the `keep` best candidates of a staged head (all `n` in its column) by `key`, ties to
/// the earlier position, and writes them in order to positions [0, keep), leaving a survivor
/// already at its position unwritten (as the CUDA compaction).
template <class T>
void compact_staged(head_cursor const& cur,
                    std::uint32_t const* key,
                    std::int64_t n,
                    std::int64_t keep) {
  std::vector<std::int64_t> order(static_cast<std::size_t>(n));
  std::iota(order.begin(), order.end(), std::int64_t{0});
  std::stable_sort(
      order.begin(), order.end(), [&](std::int64_t a, std::int64_t b) { return key[a] > key[b]; });
  order.resize(static_cast<std::size_t>(keep));
  std::sort(order.begin(), order.end());
  auto d = static_cast<std::size_t>(cur.head_dim);
  std::vector<T> k(static_cast<std::size_t>(keep) * d), v(k.size());
  for (std::size_t j = 0; j < order.size(); ++j) {
    auto pos = static_cast<std::int32_t>(order[j]);
    std::memcpy(&k[j * d], cur.ptr_at_position<T>(pos, 0), sizeof(T) * d);
    std::memcpy(&v[j * d], cur.ptr_at_position<T>(pos, 1), sizeof(T) * d);
  }
  for (std::size_t j = 0; j < order.size(); ++j) {
    if (order[j] == static_cast<std::int64_t>(j)) continue;  // in place (pinned prefix pages too)
    auto pos = static_cast<std::int32_t>(j);
    std::memcpy(cur.ptr_at_position<T>(pos, 0), &k[j * d], sizeof(T) * d);
    std::memcpy(cur.ptr_at_position<T>(pos, 1), &v[j * d], sizeof(T) * d);
  }
}

/// The staged keys of every head of request `r` (`staged_key`), gathered from its groups' blocks
/// of the stage keys; empty for the heads that did not stage.
inline std::vector<std::vector<std::uint32_t>> staged_keys(
    elastic_eviction_params const& p,
    std::int32_t r,
    std::vector<head_cursor> const& cur,
    std::vector<eviction_plan> const& plans) {
  std::vector<std::vector<std::uint32_t>> keys(plans.size());
  const std::int32_t H = p.kv.num_kv_heads;
  for (std::size_t i = 0; i < plans.size(); ++i) {
    if (plans[i].action != eviction_action::stage) continue;
    auto l = static_cast<std::int32_t>(i) / H, h = static_cast<std::int32_t>(i) % H;
    std::int64_t base = stage_key_block(p.stage_key_base, p.kv, r, l, h);
    for (std::int64_t c = 0; c < plans[i].candidates; ++c)
      keys[i].push_back(staged_key(p.stage_keys, base, cur[i], plans[i].lead, c));
  }
  return keys;
}

/// Each head's need: its candidates among the request's `wanted` largest keys (ties by the flat
/// index (layer * H + head) * max_candidates + position, lower first). Non-staged heads: 0.
inline std::vector<std::int64_t> elastic_needs(
    elastic_eviction_params const& p,
    std::int32_t r,
    std::vector<std::vector<std::uint32_t>> const& keys) {
  auto heads = keys.size();
  std::vector<std::pair<std::uint32_t, std::int64_t>> all;  // (key, flat index)
  for (std::size_t i = 0; i < heads; ++i)
    for (std::size_t c = 0; c < keys[i].size(); ++c)
      all.emplace_back(
          keys[i][c],
          static_cast<std::int64_t>(i) * p.max_candidates + static_cast<std::int64_t>(c));
  auto k = std::clamp<std::int64_t>(p.wanted[r], 0, static_cast<std::int64_t>(all.size()));
  std::sort(all.begin(), all.end(), [](auto const& a, auto const& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  });
  std::vector<std::int64_t> need(heads, 0);
  for (std::int64_t j = 0; j < k; ++j)
    ++need[static_cast<std::size_t>(all[static_cast<std::size_t>(j)].second / p.max_candidates)];
  return need;
}

template <class T>
void evict_elastic_request(elastic_eviction_params const& p, std::int32_t r) {
  const std::int32_t L = p.kv.num_layers, H = p.kv.num_kv_heads, HH = p.heads();
  std::vector<head_cursor> cur;
  std::vector<eviction_plan> plans;
  for (std::int32_t l = 0; l < L; ++l) {
    eviction_params q = p.layer_params(l);
    for (std::int32_t h = 0; h < H; ++h) {
      cur.push_back(make_head_cursor(p.kv, r, l, h));
      plans.push_back(plan_eviction(q, cur.back(), r, h));
    }
  }
  auto keys = staged_keys(p, r, cur, plans);
  auto need = elastic_needs(p, r, keys);
  std::vector<std::int64_t> grouped(static_cast<std::size_t>(p.kv.num_groups) *
                                    static_cast<std::size_t>(p.kv.geometry.group_size));
  std::vector<std::int64_t> index(static_cast<std::size_t>(p.kv.num_groups));
  std::vector<std::int64_t> pages(static_cast<std::size_t>(p.kv.num_groups));
  std::int64_t status =
      elastic_group_pages(p, r, need.data(), grouped.data(), index.data(), pages.data());
  if (p.pages_out) p.pages_out[r] = status;
  for (std::int32_t i = 0; i < HH; ++i) {
    auto const& e = plans[static_cast<std::size_t>(i)];
    auto& out     = p.new_len[static_cast<std::int64_t>(r) * HH + i];
    if (e.action != eviction_action::stage) {
      out = static_cast<std::int32_t>(e.keep);
      continue;
    }
    if (status < 0) {
      out = -1;
      continue;
    }
    auto g    = index[static_cast<std::size_t>(p.kv.slot_of(i / H, i % H).group)];
    auto keep = elastic_head_keep(
        pages[static_cast<std::size_t>(g)], p.kv.geometry.page_tokens, e.candidates);
    compact_staged<T>(cur[static_cast<std::size_t>(i)],
                      keys[static_cast<std::size_t>(i)].data(),
                      e.candidates,
                      keep);
    out = static_cast<std::int32_t>(keep);
  }
}

}  // namespace detail

/**
 * @brief The elastic selection of one chunk on the CPU (kernels/elastic_eviction.hpp for the
 * rule): compacts compressed heads in place, writes `new_len` and `pages_out`.
 * @throw invalid_argument from `elastic_eviction_params::validate`.
 */
inline void evict_elastic(elastic_eviction_params const& p) {
  p.validate();
  detail::visit_storage(p.kv.geometry.kv_dtype, [&](auto tag) {
    using T = decltype(tag);
    for (std::int32_t r = 0; r < p.kv.batch_size; ++r) detail::evict_elastic_request<T>(p, r);
  });
}

}  // namespace tangram::reference
