// SPDX-License-Identifier: Apache-2.0
// A hand-built paged KV cache for kernel tests (CPU and GPU): owns every array a kv_cache_view
// points to, fills held tokens with random values rounded to the KV dtype, scatters them into
// randomly numbered pages with its own address arithmetic, and keeps the dense (non-paged) copy
// the tests compare against. Unheld cells are filled with 0xff bytes (NaN in every float type),
// so a kernel that reads outside the held tokens poisons its output.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "tangram/core/kv_view.hpp"
#include "tangram/core/numeric.hpp"
#include "tangram/plan/split_planner.hpp"
#include "tangram/reference/storage.hpp"

namespace tangram::test {

/// Shape of the cache: geometry, heads, their (group, column) cells and the groups' windows.
struct cache_layout {
  page_geometry geometry;
  std::int32_t num_layers   = 1;
  std::int32_t num_kv_heads = 1;
  std::vector<head_slot> slots;                ///< [L * H]
  std::vector<std::int32_t> group_window;      ///< [G], 0 = growing
  std::vector<std::int32_t> group_ring_pages;  ///< [G]

  [[nodiscard]] std::int32_t num_groups() const {
    return static_cast<std::int32_t>(group_window.size());
  }
  [[nodiscard]] head_slot slot(std::int32_t l, std::int32_t h) const {
    return slots[static_cast<std::size_t>(l * num_kv_heads + h)];
  }
};

/// Heads of each layer in index order, Hp per group; layers in `sliding` get window `window` and
/// rings of `ring_pages` pages. Requires H % Hp == 0.
inline cache_layout adjacent_layout(page_geometry g,
                                    std::int32_t layers,
                                    std::int32_t heads,
                                    std::vector<std::int32_t> const& sliding = {},
                                    std::int32_t window                      = 0,
                                    std::int32_t ring_pages                  = 0) {
  cache_layout c;
  c.geometry     = g;
  c.num_layers   = layers;
  c.num_kv_heads = heads;
  for (std::int32_t l = 0; l < layers; ++l) {
    bool slide = std::find(sliding.begin(), sliding.end(), l) != sliding.end();
    for (std::int32_t h = 0; h < heads; ++h) {
      if (h % g.group_size == 0) {
        c.group_window.push_back(slide ? window : 0);
        c.group_ring_pages.push_back(slide ? ring_pages : 0);
      }
      c.slots.push_back({c.num_groups() - 1, h % g.group_size});
    }
  }
  return c;
}

/// One sequence to place in the cache.
struct sequence_spec {
  std::int32_t seq_tokens = 0;         ///< tokens seen (sets ring lengths)
  std::int32_t appended   = 0;         ///< decode tokens appended to growing heads
  std::vector<std::int32_t> base_len;  ///< [L * H] base length of growing heads (others ignored)
  std::int32_t reserve = 0;            ///< extra positions reserved in every growing group
};

/**
 * Sequences with ragged heads for decode tests: in every layer head 0 holds lens[r] tokens and
 * each other head ceil(lens[r] * f), f uniform in [0, 1.2) drawn from `rng` in (request, layer,
 * head) order; appended[r] of a head's tokens are decode tokens, the rest its base; sequence r
 * has seen seq_tokens[r] tokens (which sets ring lengths).
 */
template <class Rng>
std::vector<sequence_spec> ragged_sequences(std::vector<std::int32_t> const& lens,
                                            std::vector<std::int32_t> const& appended,
                                            std::vector<std::int32_t> const& seq_tokens,
                                            std::int32_t layers,
                                            std::int32_t heads,
                                            Rng& rng) {
  std::vector<sequence_spec> seqs;
  for (std::size_t r = 0; r < lens.size(); ++r) {
    sequence_spec s;
    s.appended   = appended[r];
    s.seq_tokens = seq_tokens[r];
    for (std::int32_t i = 0; i < layers * heads; ++i) {
      double f = i % heads == 0 ? 1.0 : std::uniform_real_distribution<double>(0.0, 1.2)(rng);
      s.base_len.push_back(
          std::max(0, static_cast<std::int32_t>(std::ceil(lens[r] * f)) - s.appended));
    }
    seqs.push_back(s);
  }
  return seqs;
}

class test_cache {
 public:
  test_cache(cache_layout layout, std::vector<sequence_spec> seqs, std::uint64_t seed)
      : layout_(std::move(layout)), seqs_(std::move(seqs)), rng_(seed) {
    auto const& g  = layout_.geometry;
    std::int32_t L = layout_.num_layers, H = layout_.num_kv_heads, G = layout_.num_groups();
    std::int32_t S = static_cast<std::int32_t>(seqs_.size());
    head_slots_    = layout_.slots;
    for (auto const& s : seqs_) {
      appended_.push_back(s.appended);
      seq_tokens_.push_back(s.seq_tokens);
      for (std::int32_t i = 0; i < L * H; ++i)
        base_len_.push_back(s.base_len[static_cast<std::size_t>(i)]);
    }
    // Page lists: growing groups get enough pages for their longest column plus the reserve,
    // sliding groups their ring. Page ids are a random permutation.
    std::int32_t total = 0;
    for (std::int32_t s = 0; s < S; ++s)
      for (std::int32_t grp = 0; grp < G; ++grp) {
        page_offset_.push_back(total);
        std::int32_t n = 0;
        if (layout_.group_window[static_cast<std::size_t>(grp)] > 0) {
          n = layout_.group_ring_pages[static_cast<std::size_t>(grp)];
        } else {
          std::int32_t longest = 0;
          for (std::int32_t l = 0; l < L; ++l)
            for (std::int32_t h = 0; h < H; ++h)
              if (layout_.slot(l, h).group == grp) longest = std::max(longest, len(s, l, h));
          n = (longest + seqs_[static_cast<std::size_t>(s)].reserve + g.page_tokens - 1) /
              g.page_tokens;
        }
        total += n;
      }
    pages_.resize(static_cast<std::size_t>(total));
    std::iota(pages_.begin(), pages_.end(), 0);
    std::shuffle(pages_.begin(), pages_.end(), rng_);
    num_pages_ = total;
    pool_.assign(static_cast<std::size_t>(std::max<std::int64_t>(1, total) * g.page_bytes()),
                 std::byte{0xff});
    dense_k_.resize(static_cast<std::size_t>(S * L * H));
    dense_v_.resize(static_cast<std::size_t>(S * L * H));
    for (std::int32_t s = 0; s < S; ++s)
      for (std::int32_t l = 0; l < L; ++l)
        for (std::int32_t h = 0; h < H; ++h) {
          std::int32_t n = len(s, l, h);
          auto& dk       = dense(dense_k_, s, l, h);
          auto& dv       = dense(dense_v_, s, l, h);
          dk.resize(static_cast<std::size_t>(n) * g.head_dim);
          dv.resize(static_cast<std::size_t>(n) * g.head_dim);
          for (std::int32_t i = 0; i < n; ++i)
            for (std::int32_t x = 0; x < g.head_dim; ++x) {
              auto at = static_cast<std::size_t>(i) * g.head_dim + x;
              dk[at]  = random_value();
              dv[at]  = random_value();
              store(s, l, h, position(s, l, h, i), x, 0, dk[at]);
              store(s, l, h, position(s, l, h, i), x, 1, dv[at]);
            }
        }
  }

  test_cache(test_cache const&)            = delete;
  test_cache& operator=(test_cache const&) = delete;

  /// Host view of the batch `slots` (sequence indices, in request order).
  kv_cache_view view(std::vector<std::int32_t> const& batch) {
    batch_slots_ = batch;
    kv_cache_view v;
    v.pool             = pool_.data();
    v.geometry         = layout_.geometry;
    v.num_layers       = layout_.num_layers;
    v.num_kv_heads     = layout_.num_kv_heads;
    v.num_groups       = layout_.num_groups();
    v.head_slots       = head_slots_.data();
    v.group_window     = layout_.group_window.data();
    v.group_ring_pages = layout_.group_ring_pages.data();
    v.page_offset      = page_offset_.data();
    v.pages            = pages_.data();
    v.head_base_len    = base_len_.data();
    v.appended         = appended_.data();
    v.seq_tokens       = seq_tokens_.data();
    v.pinned_tokens    = pinned_.empty() ? nullptr : pinned_.data();
    v.batch_size       = static_cast<std::int32_t>(batch_slots_.size());
    v.batch_slots      = batch_slots_.data();
    return v;
  }

  /// Tokens held by (sequence s, layer l, head h), computed from the spec.
  [[nodiscard]] std::int32_t len(std::int32_t s, std::int32_t l, std::int32_t h) const {
    auto grp       = layout_.slot(l, h).group;
    auto w         = layout_.group_window[static_cast<std::size_t>(grp)];
    auto const& sq = seqs_[static_cast<std::size_t>(s)];
    if (w > 0) return std::min(sq.seq_tokens, w);
    return sq.base_len[static_cast<std::size_t>(l * layout_.num_kv_heads + h)] + sq.appended;
  }
  /// Column position of held token i.
  [[nodiscard]] std::int32_t position(std::int32_t s,
                                      std::int32_t l,
                                      std::int32_t h,
                                      std::int32_t i) const {
    auto grp = layout_.slot(l, h).group;
    if (layout_.group_window[static_cast<std::size_t>(grp)] == 0) return i;
    std::int32_t ring =
        layout_.group_ring_pages[static_cast<std::size_t>(grp)] * layout_.geometry.page_tokens;
    return (seqs_[static_cast<std::size_t>(s)].seq_tokens - len(s, l, h) + i) % ring;
  }
  /// Dense K (kv == 0) or V of (s, l, h): [len * d] floats, exactly the stored values.
  std::vector<float>& dense(std::int32_t kv, std::int32_t s, std::int32_t l, std::int32_t h) {
    return dense(kv == 0 ? dense_k_ : dense_v_, s, l, h);
  }
  /// Value `x` of K (kv == 0) or V at column position `pos` of (s, l, h), read from the pool.
  [[nodiscard]] float stored(std::int32_t s,
                             std::int32_t l,
                             std::int32_t h,
                             std::int32_t pos,
                             std::int32_t x,
                             std::int32_t kv) const {
    return reference::detail::load_as_float(
        pool_.data(), layout_.geometry.kv_dtype, element(s, l, h, pos, x, kv));
  }
  /// Raw bytes of K or V (d elements) at column position `pos` of (s, l, h).
  [[nodiscard]] std::vector<std::byte> stored_bytes(
      std::int32_t s, std::int32_t l, std::int32_t h, std::int32_t pos, std::int32_t kv) const {
    auto es  = static_cast<std::size_t>(layout_.geometry.element_bytes());
    auto off = static_cast<std::size_t>(element(s, l, h, pos, 0, kv)) * es;
    return {pool_.begin() + static_cast<std::ptrdiff_t>(off),
            pool_.begin() + static_cast<std::ptrdiff_t>(
                                off + es * static_cast<std::size_t>(layout_.geometry.head_dim))};
  }
  /// A random value rounded to the KV dtype (what `dense` holds).
  float random_value(float lo = -1.f, float hi = 1.f) {
    float f = std::uniform_real_distribution<float>(lo, hi)(rng_);
    return reference::detail::visit_storage(layout_.geometry.kv_dtype, [&](auto tag) {
      using T = decltype(tag);
      return to_float(from_float<T>(f));
    });
  }

  cache_layout const& layout() const { return layout_; }
  std::vector<std::byte>& pool() { return pool_; }
  std::vector<head_slot> const& head_slots() const { return head_slots_; }
  std::vector<std::int32_t> const& page_offset() const { return page_offset_; }
  std::vector<std::int32_t> const& pages() const { return pages_; }
  /// Pages of the pool (at least 1 page of bytes is allocated even for none).
  std::int32_t num_pages() const { return num_pages_; }
  std::vector<std::int32_t>& base_len() { return base_len_; }
  std::vector<std::int32_t>& appended() { return appended_; }
  std::vector<std::int32_t>& seq_tokens() { return seq_tokens_; }
  /// [sequences * G] pinned leading tokens of each (sequence, group); empty: the view has none.
  std::vector<std::int32_t>& pinned() { return pinned_; }
  /// Pins, in every growing group of every sequence, `pages` whole pages (at most the pages its
  /// shortest head fills) as a shared prefix's (kv_cache_view::pinned_tokens).
  void pin_leading_pages(std::int32_t pages) {
    std::int32_t L = layout_.num_layers, H = layout_.num_kv_heads, G = layout_.num_groups();
    std::int32_t P = layout_.geometry.page_tokens;
    auto S         = static_cast<std::int32_t>(seqs_.size());
    pinned_.assign(static_cast<std::size_t>(S * G), 0);
    for (std::int32_t s = 0; s < S; ++s)
      for (std::int32_t grp = 0; grp < G; ++grp) {
        if (layout_.group_window[static_cast<std::size_t>(grp)] > 0) continue;
        std::int32_t shortest = std::numeric_limits<std::int32_t>::max();
        for (std::int32_t l = 0; l < L; ++l)
          for (std::int32_t h = 0; h < H; ++h)
            if (layout_.slot(l, h).group == grp) shortest = std::min(shortest, len(s, l, h));
        if (shortest == std::numeric_limits<std::int32_t>::max()) continue;
        pinned_[static_cast<std::size_t>(s * G + grp)] = std::min(pages, shortest / P) * P;
      }
  }
  std::vector<std::int32_t> const& batch_slots() const { return batch_slots_; }
  std::mt19937_64& rng() { return rng_; }

 private:
  std::vector<float>& dense(std::vector<std::vector<float>>& d,
                            std::int32_t s,
                            std::int32_t l,
                            std::int32_t h) {
    return d[static_cast<std::size_t>((s * layout_.num_layers + l) * layout_.num_kv_heads + h)];
  }
  [[nodiscard]] std::int64_t element(std::int32_t s,
                                     std::int32_t l,
                                     std::int32_t h,
                                     std::int32_t pos,
                                     std::int32_t x,
                                     std::int32_t kv) const {
    auto const& g     = layout_.geometry;
    head_slot hs      = layout_.slot(l, h);
    std::int32_t page = pages_[static_cast<std::size_t>(
        page_offset_[static_cast<std::size_t>(s * layout_.num_groups() + hs.group)] +
        pos / g.page_tokens)];
    std::int64_t in_page =
        ((static_cast<std::int64_t>(kv) * g.group_size + hs.column) * g.page_tokens +
         pos % g.page_tokens) *
            g.head_dim +
        x;
    return static_cast<std::int64_t>(page) * g.page_elements() + in_page;
  }
  void store(std::int32_t s,
             std::int32_t l,
             std::int32_t h,
             std::int32_t pos,
             std::int32_t x,
             std::int32_t kv,
             float value) {
    reference::detail::store_from_float(
        pool_.data(), layout_.geometry.kv_dtype, element(s, l, h, pos, x, kv), value);
  }

  cache_layout layout_;
  std::vector<sequence_spec> seqs_;
  std::mt19937_64 rng_;
  std::vector<head_slot> head_slots_;
  std::vector<std::int32_t> page_offset_, pages_, base_len_, appended_, seq_tokens_, batch_slots_;
  std::vector<std::int32_t> pinned_;
  std::int32_t num_pages_ = 0;
  std::vector<std::byte> pool_;
  std::vector<std::vector<float>> dense_k_, dense_v_;
};

/**
 * The eviction tests' cache (CPU and GPU): 3 layers x 4 KV heads, Hp 2 or 1. Layers 0 and 2 grow;
 * with Hp 2 they share head groups (global clustering: group h holds head h of layer 0 in column 0
 * and of layer 2 in column 1), with Hp 1 (per-head pages) every head is its own group. Their head
 * 3 is uncompressed, heads 0-2 compressed with budget 0.1 + 0.25 h + 0.05 l and `protect`
 * protected tokens. Layer 1 is sliding-window (`window`, rings one page longer than the window),
 * heads paired into groups (Hp 2) or one group each (Hp 1). Six requests, each (tokens seen
 * before the chunk, chunk length); those that have seen more than 100 tokens hold 5 decode tokens
 * since their last compression. The batch takes them in the order {2, 0, 5, 1, 4, 3}.
 */
struct eviction_scenario {
  static constexpr std::int32_t num_layers = 3, num_kv_heads = 4;
  cache_layout layout;
  std::vector<head_rule> rules;                                 ///< [L * H]
  std::vector<std::pair<std::int32_t, std::int32_t>> requests;  ///< (seen, chunk) per sequence
  std::vector<sequence_spec> seqs;
  std::vector<std::int32_t> batch = {2, 0, 5, 1, 4, 3};
  std::vector<std::int32_t> chunk_indptr;  ///< [batch + 1] chunk rows, in batch order
};

/// @param long_seen, long_chunk the (seen, chunk) of request 2, the longest
inline eviction_scenario make_eviction_scenario(page_geometry g,
                                                std::int32_t window,
                                                std::int32_t protect,
                                                std::int32_t long_seen  = 1000,
                                                std::int32_t long_chunk = 300) {
  constexpr std::int32_t L = eviction_scenario::num_layers, H = eviction_scenario::num_kv_heads;
  eviction_scenario s;
  auto& c        = s.layout;
  c.geometry     = g;
  c.num_layers   = L;
  c.num_kv_heads = H;
  c.slots.resize(static_cast<std::size_t>(L * H));
  std::int32_t const ring = (window + g.page_tokens - 1) / g.page_tokens + 1;
  if (g.group_size == 1) {  // per-head pages: every head its own group
    for (std::int32_t l = 0; l < L; ++l)
      for (std::int32_t h = 0; h < H; ++h) {
        c.group_window.push_back(l == 1 ? window : 0);
        c.group_ring_pages.push_back(l == 1 ? ring : 0);
        c.slots[static_cast<std::size_t>(l * H + h)] = {c.num_groups() - 1, 0};
      }
  } else {
    for (std::int32_t h = 0; h < H; ++h) {
      c.group_window.push_back(0);
      c.group_ring_pages.push_back(0);
      c.slots[static_cast<std::size_t>(0 * H + h)] = {h, 0};
      c.slots[static_cast<std::size_t>(2 * H + h)] = {h, 1};
    }
    for (std::int32_t h = 0; h < H; h += 2) {
      c.group_window.push_back(window);
      c.group_ring_pages.push_back(ring);
      c.slots[static_cast<std::size_t>(1 * H + h)]     = {c.num_groups() - 1, 0};
      c.slots[static_cast<std::size_t>(1 * H + h + 1)] = {c.num_groups() - 1, 1};
    }
  }
  for (std::int32_t l = 0; l < L; ++l)
    for (std::int32_t h = 0; h < H; ++h) {
      head_rule r;
      if (l == 1) {
        r.kind   = layer_kind::sliding_window;
        r.window = window;
      } else if (h == 3) {
        r.kind = layer_kind::uncompressed;
      } else {
        r.kind    = layer_kind::compressed;
        r.budget  = 0.1 + 0.25 * h + 0.05 * l;
        r.protect = protect;
      }
      s.rules.push_back(r);
    }
  s.requests = {{300, 64}, {0, 50}, {long_seen, long_chunk}, {12, 3}, {500, 0}, {37, 120}};
  for (auto [n, chunk] : s.requests) {
    sequence_spec q;
    q.seq_tokens = n;
    q.appended   = n > 100 ? 5 : 0;
    q.reserve    = chunk;
    for (auto const& r : s.rules)
      q.base_len.push_back(static_cast<std::int32_t>(retained_tokens(r, n - q.appended)));
    s.seqs.push_back(q);
  }
  s.chunk_indptr = {0};
  for (auto b : s.batch)
    s.chunk_indptr.push_back(s.chunk_indptr.back() +
                             s.requests[static_cast<std::size_t>(b)].second);
  return s;
}

/// Split-map boundaries with random shares (at least one CTA per head) for every layer:
/// [L * (H + 1)] entries, each layer's shares summing to n_cta.
template <class Rng>
std::vector<std::int32_t> random_cta_begin(std::int32_t L,
                                           std::int32_t H,
                                           std::int32_t n_cta,
                                           Rng& rng) {
  std::vector<std::int32_t> begin;
  for (std::int32_t l = 0; l < L; ++l) {
    std::vector<double> w(static_cast<std::size_t>(H));
    for (auto& x : w) x = std::uniform_real_distribution<double>(0, 1)(rng);
    auto seats     = apportion(w, n_cta);
    std::int32_t b = 0;
    for (auto s : seats) {
      begin.push_back(b);
      b += s;
    }
    begin.push_back(b);
  }
  return begin;
}

}  // namespace tangram::test
