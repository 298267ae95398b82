// SPDX-License-Identifier: Apache-2.0
/**
 * @file memory/detail/decode_buckets.hpp
 * @brief Which growing groups of a sequence start a new page at a given decode step, so that a
 * decode step touches only those groups instead of all G.
 */
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace tangram::detail {

/**
 * @brief Per slot, the growing groups bucketed by (longest base length mod P). A group whose
 * longest head holds b tokens before decoding starts its next page when b + appended is 1 mod P,
 * i.e. at the step that makes `appended` = a exactly the groups of bucket (1 - a) mod P cross a
 * page boundary. Sized once; every mutator is noexcept and allocation-free.
 */
class decode_buckets {
 public:
  decode_buckets() = default;
  decode_buckets(std::int32_t slots, std::int32_t page_tokens, std::vector<std::int32_t> growing)
      : page_tokens_(page_tokens),
        growing_(std::move(growing)),
        start_(static_cast<std::size_t>(slots) * static_cast<std::size_t>(page_tokens + 1), 0),
        groups_(static_cast<std::size_t>(slots) * growing_.size(), 0) {}

  /// A fresh sequence: every base length is 0, so every growing group is in bucket 0.
  void reset(std::int32_t s) noexcept {
    auto* start = starts(s);
    start[0]    = 0;
    std::fill_n(start + 1, page_tokens_, static_cast<std::int32_t>(growing_.size()));
    std::copy(growing_.begin(), growing_.end(), groups(s));
  }

  /// Re-buckets slot s by `longest_base(g) mod P` (a counting sort, no second array).
  template <class LongestBaseModP>
  void rebuild(std::int32_t s, LongestBaseModP longest_base_mod_p) noexcept {
    auto* start = starts(s);
    auto* out   = groups(s);
    std::fill_n(start, page_tokens_ + 1, 0);
    for (auto g : growing_) ++start[longest_base_mod_p(g) + 1];
    for (std::int32_t r = 0; r < page_tokens_; ++r) start[r + 1] += start[r];
    // Place, then shift the starts back.
    for (auto g : growing_) out[start[longest_base_mod_p(g)]++] = g;
    for (std::int32_t r = page_tokens_; r > 0; --r) start[r] = start[r - 1];
    start[0] = 0;
  }

  /// Groups of slot s in bucket b (in [0, P)): [bucket_begin, bucket_end).
  [[nodiscard]] std::int32_t const* bucket_begin(std::int32_t s, std::int32_t b) const noexcept {
    return groups(s) + starts(s)[b];
  }
  [[nodiscard]] std::int32_t const* bucket_end(std::int32_t s, std::int32_t b) const noexcept {
    return groups(s) + starts(s)[b + 1];
  }

 private:
  [[nodiscard]] std::int32_t* starts(std::int32_t s) noexcept {
    return start_.data() + static_cast<std::size_t>(s) * static_cast<std::size_t>(page_tokens_ + 1);
  }
  [[nodiscard]] std::int32_t const* starts(std::int32_t s) const noexcept {
    return start_.data() + static_cast<std::size_t>(s) * static_cast<std::size_t>(page_tokens_ + 1);
  }
  [[nodiscard]] std::int32_t* groups(std::int32_t s) noexcept {
    return groups_.data() + static_cast<std::size_t>(s) * growing_.size();
  }
  [[nodiscard]] std::int32_t const* groups(std::int32_t s) const noexcept {
    return groups_.data() + static_cast<std::size_t>(s) * growing_.size();
  }

  std::int32_t page_tokens_ = 1;
  std::vector<std::int32_t> growing_;
  std::vector<std::int32_t> start_;   ///< [slots][P + 1] bucket starts
  std::vector<std::int32_t> groups_;  ///< [slots][growing groups] groups by bucket
};

}  // namespace tangram::detail
