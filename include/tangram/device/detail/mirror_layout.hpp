// SPDX-License-Identifier: Apache-2.0
/**
 * @file device/detail/mirror_layout.hpp
 * @brief The CUDA-free half of `kv_view_mirror` (device/kv_view_mirror.hpp): where each array of
 * a manager's view lives in the mirror's one packed block, and which byte ranges of it one sync
 * must refresh in a host shadow and upload, from the manager's change journal.
 *
 * Host-only and allocation-free after construction, so it is tested on the CPU
 * (test/memory/view_mirror_test.cpp) with plain byte vectors standing in for the pinned shadows
 * and the device block.
 */
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <type_traits>
#include <vector>

#include "tangram/core/detail/checked_math.hpp"
#include "tangram/core/error.hpp"
#include "tangram/core/kv_view.hpp"
#include "tangram/memory/kv_cache_types.hpp"

namespace tangram::detail {

/// The arrays of a manager's views, in the order the packed block holds them: the three that never
/// change first, the per-slot rows next, the counters and the two batches (written every step)
/// last, so that a decode step's writes sit close together and coalesce into few copies.
/// `batch_slots` is the decode batch's, `prefill_batch_slots` the prefill batch's; every other
/// array is shared by the views of both kinds.
enum class mirror_array : std::int32_t {
  head_slots,
  group_window,
  group_ring_pages,
  page_offset,
  pinned_tokens,
  head_base_len,
  pages,
  appended,
  seq_tokens,
  batch_slots,
  prefill_batch_slots,
};
inline constexpr std::size_t mirror_array_count = 11;

/// Byte range [begin, end) of the packed block.
struct mirror_range {
  std::int64_t begin = 0;
  std::int64_t end   = 0;
  friend bool operator==(mirror_range a, mirror_range b) {
    return a.begin == b.begin && a.end == b.end;
  }
};

static_assert(std::is_trivially_copyable_v<head_slot> && sizeof(head_slot) == 8,
              "the mirror copies head_slot arrays as bytes");

/**
 * @brief Offsets of the view's arrays in one packed block. Each array starts at a multiple of
 * `alignment` (a GPU cache line, so no array shares a line with its neighbour and every element
 * is naturally aligned); the padding between arrays is zero in every copy.
 */
struct mirror_layout {
  static constexpr std::int64_t alignment = 128;

  kv_view_extents extents;
  std::array<std::int64_t, mirror_array_count> offset{};  ///< byte offset of each array
  std::array<std::int64_t, mirror_array_count> bytes{};   ///< byte size of each array
  std::int64_t total = 0;                                 ///< bytes of the whole block

  /// @throw invalid_argument naming the field and its value when a count is negative or the
  ///        block's byte size overflows int64.
  [[nodiscard]] static mirror_layout of(kv_view_extents const& e) {
    mirror_layout l;
    l.extents = e;
    struct field {
      char const* name;
      std::int64_t count, element_bytes;
    };
    field const fields[mirror_array_count] = {
        {"head_slots", e.head_slots, static_cast<std::int64_t>(sizeof(head_slot))},
        {"groups", e.groups, 4},
        {"groups", e.groups, 4},
        {"page_offset", e.page_offset, 4},
        {"page_offset", e.page_offset, 4},  // pinned_tokens: the same rows
        {"head_base_len", e.head_base_len, 4},
        {"pages", e.pages, 4},
        {"slots", e.slots, 4},
        {"slots", e.slots, 4},
        {"batch", e.batch, 4},
        {"batch", e.batch, 4},
    };
    std::int64_t at = 0;
    for (std::size_t a = 0; a < mirror_array_count; ++a) {
      auto const& f = fields[a];
      TANGRAM_EXPECTS(f.count >= 0,
                      invalid_argument,
                      "kv_view_mirror: kv_view_extents.",
                      f.name,
                      " must be >= 0, got ",
                      f.count);
      auto size = mul_checked(f.count, f.element_bytes);
      TANGRAM_EXPECTS(size.has_value(),
                      invalid_argument,
                      "kv_view_mirror: kv_view_extents.",
                      f.name,
                      " = ",
                      f.count,
                      " elements overflow the mirror's byte size");
      auto end    = add_checked(at, *size);
      auto padded = end ? add_checked(*end, alignment - 1) : std::nullopt;
      TANGRAM_EXPECTS(padded.has_value(),
                      invalid_argument,
                      "kv_view_mirror: kv_view_extents.",
                      f.name,
                      " = ",
                      f.count,
                      " elements overflow the mirror's byte size (block offset ",
                      at,
                      ")");
      l.offset[a] = at;
      l.bytes[a]  = *size;
      at          = *padded / alignment * alignment;
    }
    l.total = at;
    return l;
  }

  [[nodiscard]] std::int64_t offset_of(mirror_array a) const noexcept {
    return offset[static_cast<std::size_t>(a)];
  }
  [[nodiscard]] std::int64_t bytes_of(mirror_array a) const noexcept {
    return bytes[static_cast<std::size_t>(a)];
  }
  /// Bytes [first, last) elements of int32 array `a` occupy in the block.
  [[nodiscard]] mirror_range elements(mirror_array a,
                                      std::int64_t first,
                                      std::int64_t last) const noexcept {
    return {offset_of(a) + 4 * first, offset_of(a) + 4 * last};
  }

  /// Array `a` of a manager's host views (`v`: the decode batch's view, `prefill`: the prefill
  /// batch's; they share every other array), as bytes (`bytes_of(a)` of them).
  [[nodiscard]] static std::byte const* host_array(kv_cache_view const& v,
                                                   kv_cache_view const& prefill,
                                                   mirror_array a) noexcept {
    void const* p = nullptr;
    switch (a) {
      case mirror_array::head_slots:
        p = v.head_slots;
        break;
      case mirror_array::group_window:
        p = v.group_window;
        break;
      case mirror_array::group_ring_pages:
        p = v.group_ring_pages;
        break;
      case mirror_array::page_offset:
        p = v.page_offset;
        break;
      case mirror_array::pinned_tokens:
        p = v.pinned_tokens;
        break;
      case mirror_array::head_base_len:
        p = v.head_base_len;
        break;
      case mirror_array::pages:
        p = v.pages;
        break;
      case mirror_array::appended:
        p = v.appended;
        break;
      case mirror_array::seq_tokens:
        p = v.seq_tokens;
        break;
      case mirror_array::batch_slots:
        p = v.batch_slots;
        break;
      case mirror_array::prefill_batch_slots:
        p = prefill.batch_slots;
        break;
    }
    return static_cast<std::byte const*>(p);
  }

  /// Points every array of `v` into `block` (laid out by this layout), its batch_slots at the
  /// batch of `kind`; scalars are left as they are.
  void attach(kv_cache_view& v, std::byte* block, batch_kind kind = batch_kind::decode) const
      noexcept {
    auto at            = [&](mirror_array a) { return block + offset_of(a); };
    v.head_slots       = reinterpret_cast<head_slot const*>(at(mirror_array::head_slots));
    v.group_window     = reinterpret_cast<std::int32_t const*>(at(mirror_array::group_window));
    v.group_ring_pages = reinterpret_cast<std::int32_t const*>(at(mirror_array::group_ring_pages));
    v.page_offset      = reinterpret_cast<std::int32_t const*>(at(mirror_array::page_offset));
    v.pinned_tokens    = reinterpret_cast<std::int32_t const*>(at(mirror_array::pinned_tokens));
    v.head_base_len    = reinterpret_cast<std::int32_t const*>(at(mirror_array::head_base_len));
    v.pages            = reinterpret_cast<std::int32_t const*>(at(mirror_array::pages));
    v.appended         = reinterpret_cast<std::int32_t const*>(at(mirror_array::appended));
    v.seq_tokens       = reinterpret_cast<std::int32_t const*>(at(mirror_array::seq_tokens));
    v.batch_slots      = reinterpret_cast<std::int32_t const*>(
        at(kind == batch_kind::prefill ? mirror_array::prefill_batch_slots
                                            : mirror_array::batch_slots));
  }

  /// Copies bytes [r.begin, r.end) of the packed image of the host views (`v` decode, `prefill`)
  /// into `block` at the same offsets; padding inside r is left as it is (zero).
  void copy_from(kv_cache_view const& v,
                 kv_cache_view const& prefill,
                 mirror_range r,
                 std::byte* block) const noexcept {
    for (std::size_t a = 0; a < mirror_array_count; ++a) {
      std::int64_t lo = std::max(r.begin, offset[a]), hi = std::min(r.end, offset[a] + bytes[a]);
      if (lo >= hi) continue;
      auto const* src = host_array(v, prefill, static_cast<mirror_array>(a));
      if (src == nullptr)  // an optional array the view leaves null (pinned_tokens): zeros
        std::memset(block + lo, 0, static_cast<std::size_t>(hi - lo));
      else
        std::memcpy(block + lo, src + (lo - offset[a]), static_cast<std::size_t>(hi - lo));
    }
  }
};

/**
 * @brief What one sync of a double-buffered mirror copies: a host shadow of the packed block is
 * brought up to date from the host view, then the ranges in `uploads()` go from that shadow to
 * the device block.
 *
 * Two shadows alternate, so a sync never writes the shadow the previous sync's asynchronous
 * upload may still be reading. A shadow is refreshed with the ranges that changed since it was
 * last used, i.e. the previous sync's changes and this one's: the shadow then equals the host
 * view everywhere, which is what allows uploading whole spans that cover small gaps between
 * changes (`merge_gap`): one copy's fixed cost (a couple of microseconds) is worth tens of
 * kilobytes of bus time.
 *
 * Which ranges changed: the journal's page entries, its slots' `page_offset`, `pinned_tokens`
 * and `head_base_len` rows, its counter slots' `appended` and `seq_tokens` entries, and each
 * batch's whole slot array (`batch_slots`, `prefill_batch_slots`: max_batch entries each; not
 * journaled) when it differs from the last uploaded copy. Everything on the first sync, after `full_resync`, after `invalidate()`, and when the
 * ranges would overflow the lists sized at construction.
 *
 * Protocol per sync: `stage(changes, host decode view, host prefill view, this sync's shadow,
 * previous sync's shadow)`,
 * copy `uploads()` from this sync's shadow, then `commit()`; alternate the shadows only after a
 * commit. A stage that is not committed (the uploads failed) must be followed by `invalidate()`.
 */
class mirror_stager {
 public:
  /// Gaps up to this many bytes between two changed ranges are uploaded rather than split.
  static constexpr std::int64_t default_merge_gap = 32 * 1024;

  mirror_stager() = default;
  /// @param max_view_changes the manager's journal capacity (its resolved
  ///        `options().max_view_changes`); the range lists are sized from it and the extents.
  /// @throw invalid_argument as `mirror_layout::of`, or for a negative max_view_changes or
  ///        merge_gap (names the value).
  mirror_stager(kv_view_extents const& e,
                std::int64_t max_view_changes,
                std::int64_t merge_gap = default_merge_gap)
      : layout_(mirror_layout::of(e)), merge_gap_(merge_gap) {
    TANGRAM_EXPECTS(max_view_changes >= 0,
                    invalid_argument,
                    "kv_view_mirror: max_view_changes must be >= 0, got ",
                    max_view_changes);
    TANGRAM_EXPECTS(merge_gap >= 0,
                    invalid_argument,
                    "kv_view_mirror: merge_gap must be >= 0, got ",
                    merge_gap);
    // Ranges: one per page entry, three rows per slot (page_offset, pinned_tokens,
    // head_base_len), two counters per counter slot, the two batches.
    auto ranges = add_or_throw(max_view_changes,
                               mul_or_throw<std::int64_t>(5, e.slots, "kv_view_mirror: 5 * slots"),
                               "kv_view_mirror: max_view_changes + 5 * slots");
    ranges      = add_or_throw<std::int64_t>(ranges, 2, "kv_view_mirror: range count");
    auto n      = static_cast<std::size_t>(ranges);
    previous_.reserve(n);
    current_.reserve(n);
    uploads_.reserve(n);
    scratch_.reserve(static_cast<std::size_t>(std::max<std::int64_t>(max_view_changes, e.slots)));
  }

  [[nodiscard]] mirror_layout const& layout() const noexcept { return layout_; }
  [[nodiscard]] std::int64_t merge_gap() const noexcept { return merge_gap_; }

  /// The next `stage` uploads (and refreshes) everything, as does the one after it for the other
  /// shadow. For a failed upload, or a journal that someone else cleared.
  void invalidate() noexcept { full_next_ = true; }

  /**
   * @brief Brings `shadow` (this sync's buffer, `layout().total` bytes, last used two syncs ago
   * or never) up to date with the host views (`host`: the decode batch's view, `prefill`: the
   * prefill batch's) and lists the ranges to upload in `uploads()`.
   * @param previous the other shadow (what the last sync uploaded), read to detect a batch change
   * @throw logic_error when the journal names a slot or entry outside the extents (nothing is
   *        written then).
   */
  void stage(view_changes const& c,
             kv_cache_view const& host,
             kv_cache_view const& prefill,
             std::byte* shadow,
             std::byte const* previous) {
    full_ = full_next_ || c.full_resync || !collect(c, host, prefill, previous);
    uploads_.clear();
    if (full_) {
      current_.clear();
      layout_.copy_from(host, prefill, {0, layout_.total}, shadow);
      if (layout_.total > 0) uploads_.push_back({0, layout_.total});
      return;
    }
    if (previous_full_)
      layout_.copy_from(host, prefill, {0, layout_.total}, shadow);
    else
      for (auto r : previous_) layout_.copy_from(host, prefill, r, shadow);
    for (auto r : current_) layout_.copy_from(host, prefill, r, shadow);
    for (auto r : current_) {  // sorted: coalesce across gaps of at most merge_gap bytes
      if (!uploads_.empty() && r.begin - uploads_.back().end <= merge_gap_)
        uploads_.back().end = std::max(uploads_.back().end, r.end);
      else
        uploads_.push_back(r);
    }
  }

  /// The ranges of the staged sync to copy from its shadow to the device, sorted, disjoint.
  [[nodiscard]] std::vector<mirror_range> const& uploads() const noexcept { return uploads_; }
  /// The exact changed ranges of the staged sync (before coalescing; empty when full).
  [[nodiscard]] std::vector<mirror_range> const& changed() const noexcept { return current_; }
  /// True when the staged sync uploads the whole block.
  [[nodiscard]] bool staged_full() const noexcept { return full_; }
  /// Bytes `uploads()` copies.
  [[nodiscard]] std::int64_t upload_bytes() const noexcept {
    std::int64_t n = 0;
    for (auto r : uploads_) n += r.end - r.begin;
    return n;
  }

  /// The staged uploads were enqueued: the next stage refreshes the other shadow with them.
  /// `uploads()` and `changed()` stay readable until the next stage.
  void commit() noexcept {
    previous_.assign(current_.begin(), current_.end());  // same capacity: no allocation
    previous_full_ = full_;
    full_next_     = false;
  }

 private:
  /// Appends r (ranges arrive sorted), merging it into the last one when they touch or overlap.
  /// @return false when the list is full.
  bool push(mirror_range r) noexcept {
    if (!current_.empty() && r.begin <= current_.back().end) {
      current_.back().end = std::max(current_.back().end, r.end);
      return true;
    }
    if (current_.size() == current_.capacity()) return false;
    current_.push_back(r);
    return true;
  }

  /// Sorted copy of `n` indices in `scratch_`, each checked against [0, limit).
  /// @return false when they do not fit in the scratch list.
  bool sorted(std::int32_t const* p, std::size_t n, std::int64_t limit, char const* what) {
    if (n > scratch_.capacity()) return false;
    scratch_.assign(p, p + n);
    for (std::size_t k = 0; k < n; ++k)
      TANGRAM_EXPECTS(scratch_[k] >= 0 && scratch_[k] < limit,
                      logic_error,
                      "kv_view_mirror: view_changes.",
                      what,
                      "[",
                      k,
                      "] = ",
                      scratch_[k],
                      " is outside [0, ",
                      limit,
                      ")");
    std::sort(scratch_.begin(), scratch_.end());
    return true;
  }

  /// The changed ranges in `current_`, in block order. @return false when they overflow.
  bool collect(view_changes const& c,
               kv_cache_view const& host,
               kv_cache_view const& prefill,
               std::byte const* previous) {
    current_.clear();
    auto const& e = layout_.extents;
    // The journal names slots; the rows of a slot are G (page_offset, pinned_tokens) and L * H
    // (head_base_len).
    std::int64_t G  = e.slots > 0 ? e.page_offset / e.slots : 0;
    std::int64_t LH = e.slots > 0 ? e.head_base_len / e.slots : 0;
    bool ok         = sorted(c.slots, c.num_slots, e.slots, "slots");
    for (std::size_t k = 0; ok && k < scratch_.size(); ++k)
      ok =
          push(layout_.elements(mirror_array::page_offset, scratch_[k] * G, (scratch_[k] + 1) * G));
    for (std::size_t k = 0; ok && k < scratch_.size(); ++k)
      ok = push(
          layout_.elements(mirror_array::pinned_tokens, scratch_[k] * G, (scratch_[k] + 1) * G));
    for (std::size_t k = 0; ok && k < scratch_.size(); ++k)
      ok = push(
          layout_.elements(mirror_array::head_base_len, scratch_[k] * LH, (scratch_[k] + 1) * LH));
    ok = ok && sorted(c.page_entries, c.num_page_entries, e.pages, "page_entries");
    for (std::size_t k = 0; ok && k < scratch_.size(); ++k)
      ok = push(layout_.elements(mirror_array::pages, scratch_[k], scratch_[k] + 1));
    ok = ok && sorted(c.counter_slots, c.num_counter_slots, e.slots, "counter_slots");
    for (std::size_t k = 0; ok && k < scratch_.size(); ++k)
      ok = push(layout_.elements(mirror_array::appended, scratch_[k], scratch_[k] + 1));
    for (std::size_t k = 0; ok && k < scratch_.size(); ++k)
      ok = push(layout_.elements(mirror_array::seq_tokens, scratch_[k], scratch_[k] + 1));
    // The batches are not journaled: compare each with what the last sync uploaded
    // (O(max_batch)); a batch that did not change is not uploaded.
    for (auto a : {mirror_array::batch_slots, mirror_array::prefill_batch_slots}) {
      auto bo = layout_.offset_of(a);
      auto bn = layout_.bytes_of(a);
      if (ok && bn > 0 &&
          std::memcmp(layout_.host_array(host, prefill, a),
                      previous + bo,
                      static_cast<std::size_t>(bn)) != 0)
        ok = push({bo, bo + bn});
    }
    return ok;
  }

  mirror_layout layout_;
  std::int64_t merge_gap_ = default_merge_gap;
  std::vector<mirror_range> previous_, current_, uploads_;
  std::vector<std::int32_t> scratch_;
  bool full_next_     = true;  ///< the first sync uploads everything
  bool previous_full_ = true;  ///< the other shadow was never filled
  bool full_          = false;
};

}  // namespace tangram::detail
