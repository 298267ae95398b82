// SPDX-License-Identifier: Apache-2.0
/**
 * @file memory/detail/head_lengths.hpp
 * @brief Per-head lengths of every slot: each head's base length (tokens kept at the last
 * compression), the decode tokens appended since (shared by every growing head of a slot), and
 * the tokens the sequence has seen. Exactly the view's `head_base_len`, `appended`, `seq_tokens`.
 */
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace tangram::detail {

/// @brief Lengths of `slots` sequences of `heads` heads each; mutators are noexcept.
class head_lengths {
 public:
  head_lengths() = default;
  head_lengths(std::int32_t slots, std::int32_t heads)
      : heads_(heads),
        base_(static_cast<std::size_t>(slots) * static_cast<std::size_t>(heads), 0),
        appended_(static_cast<std::size_t>(slots), 0),
        tokens_(static_cast<std::size_t>(slots), 0) {}

  /// Heads per slot (L * H).
  [[nodiscard]] std::int32_t heads() const noexcept { return heads_; }
  /// Base lengths of slot s: `heads` entries, flat head index layer * H + head.
  std::int32_t* base(std::int32_t s) noexcept { return base_.data() + row(s); }
  [[nodiscard]] std::int32_t const* base(std::int32_t s) const noexcept {
    return base_.data() + row(s);
  }
  /// Decode tokens appended to every growing head of slot s since its last compression.
  std::int32_t& appended(std::int32_t s) noexcept { return appended_[static_cast<std::size_t>(s)]; }
  [[nodiscard]] std::int32_t appended(std::int32_t s) const noexcept {
    return appended_[static_cast<std::size_t>(s)];
  }
  /// Tokens slot s's sequence has seen (prompts and decoded tokens of all turns).
  std::int32_t& tokens(std::int32_t s) noexcept { return tokens_[static_cast<std::size_t>(s)]; }
  [[nodiscard]] std::int32_t tokens(std::int32_t s) const noexcept {
    return tokens_[static_cast<std::size_t>(s)];
  }
  /// Tokens held by flat head h of slot s when it grows (not a sliding ring).
  [[nodiscard]] std::int64_t held(std::int32_t s, std::int32_t h) const noexcept {
    return static_cast<std::int64_t>(base(s)[h]) + appended(s);
  }

  /// A new sequence in slot s: every length 0.
  void reset(std::int32_t s) noexcept {
    std::fill_n(base(s), heads_, 0);
    appended(s) = tokens(s) = 0;
  }
  /// After a chunk: base lengths are the kept counts (0 where `sliding(h)`: a ring's length is
  /// the token count), nothing is appended since, `n` tokens seen.
  template <class IsSliding>
  void commit_chunk(std::int32_t s,
                    std::int32_t const* kept,
                    std::int32_t n,
                    IsSliding sliding) noexcept {
    auto* b = base(s);
    for (std::int32_t h = 0; h < heads_; ++h) b[h] = sliding(h) ? 0 : kept[h];
    appended(s) = 0;
    tokens(s)   = n;
  }
  /// Slot `to` gets the lengths of slot `from` (a fork).
  void copy(std::int32_t from, std::int32_t to) noexcept {
    std::copy_n(base(from), heads_, base(to));
    appended(to) = appended(from);
    tokens(to)   = tokens(from);
  }

  // View arrays.
  [[nodiscard]] std::int32_t const* base_array() const noexcept { return base_.data(); }
  [[nodiscard]] std::int32_t const* appended_array() const noexcept { return appended_.data(); }
  [[nodiscard]] std::int32_t const* tokens_array() const noexcept { return tokens_.data(); }

 private:
  [[nodiscard]] std::size_t row(std::int32_t s) const noexcept {
    return static_cast<std::size_t>(s) * static_cast<std::size_t>(heads_);
  }

  std::int32_t heads_ = 0;
  std::vector<std::int32_t> base_, appended_, tokens_;
};

}  // namespace tangram::detail
