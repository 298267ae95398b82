// SPDX-License-Identifier: Apache-2.0
/**
 * @file memory/page_pool.hpp
 * @brief The page pool: fixed-size KV pages carved from one arena, with O(1) allocate/free,
 * per-page reference counts and all-or-nothing reservations.
 *
 * Invariants (checked by `check_invariants` and by the tests after every operation):
 * - every page is either free (reference count 0, on the free stack exactly once), retired
 *   (reference count 0, in the retire list exactly once: deferred reuse, below) or used
 *   (reference count >= 1, on neither); free + retired + used = capacity;
 * - `used + reserved <= capacity`: reserved pages are free pages promised to an owner, so a
 *   reservation can always be drawn without failing;
 * - a misuse (double free, unknown page, drawing past a reservation, a foreign reservation)
 *   throws `logic_error` naming the page or value and changes nothing.
 *
 * "Does not fit" (no free page, a reservation larger than the unreserved free pages) is a return
 * value, never an exception.
 *
 * Deferred reuse (multi-stream engines; off unless the pool is built with `deferred_reuse`): a
 * page whose last reference is dropped is not pushed on the free stack but appended to a FIFO
 * retire list, tagged with the pool's current epoch. The engine closes an epoch once per step
 * (`advance_epoch`, after recording an event behind the work it launched) and, once that work is
 * known complete, calls `release_epochs_through(e)`: the retired pages of every epoch <= e (oldest
 * first) become free. Until then no allocation, reservation or draw can hand them out, so no
 * kernel still reading a page races with its next owner's writes. Retired pages are neither free
 * nor reserved: they do not count in `available_pages` (admission may answer "does not fit" until
 * a release). The retire list has room for every page (allocated at construction; a page retires
 * at most once between two uses), so retiring never allocates and never fails.
 */
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <utility>
#include <vector>

#include "tangram/core/error.hpp"
#include "tangram/core/page_layout.hpp"
#include "tangram/memory/resource_ref.hpp"

namespace tangram {

/// @brief Index of a page in its pool: page p starts at `base + p * page_bytes`.
using page_id = std::int32_t;

/// @brief Counters of a page pool. Plain value.
struct pool_stats {
  std::int64_t capacity    = 0;  ///< pages in the arena
  std::int64_t free        = 0;  ///< pages on the free stack (includes reserved ones)
  std::int64_t reserved    = 0;  ///< free pages promised to reservations
  std::int64_t used        = 0;  ///< pages with reference count >= 1
  std::int64_t peak_used   = 0;  ///< the most pages ever used at once
  std::int64_t allocations = 0;  ///< pages handed out (allocate + draw), ever
  std::int64_t frees       = 0;  ///< pages returned to the free stack, ever
  /// Deferred reuse: pages unreferenced but waiting for `release_epochs_through` (neither free
  /// nor used); free + retired + used = capacity. 0 without deferred reuse.
  std::int64_t retired     = 0;
  std::int64_t retirements = 0;  ///< pages put in the retire list, ever

  /// Free pages nobody has reserved: what `try_allocate` and `try_reserve` may take.
  [[nodiscard]] std::int64_t available() const { return free - reserved; }
};

template <class Layout>
class page_pool;

/**
 * @brief A promise of `pages()` free pages by one pool to one owner. Move-only handle: the pool
 * that made it is the only one that accepts it; moving leaves the source empty.
 *
 * Dropping a non-empty reservation without `release_unused` keeps its pages promised (the pool
 * cannot know the owner is gone); owners return it explicitly.
 */
class page_reservation {
 public:
  page_reservation() = default;
  page_reservation(page_reservation&& o) noexcept
      : owner_(std::exchange(o.owner_, nullptr)), pages_(std::exchange(o.pages_, 0)) {}
  page_reservation& operator=(page_reservation&& o) noexcept {
    owner_ = std::exchange(o.owner_, nullptr);
    pages_ = std::exchange(o.pages_, 0);
    return *this;
  }
  page_reservation(page_reservation const&)            = delete;
  page_reservation& operator=(page_reservation const&) = delete;
  ~page_reservation()                                  = default;

  /// Pages still promised (not yet drawn or released).
  [[nodiscard]] std::int64_t pages() const noexcept { return pages_; }
  [[nodiscard]] bool empty() const noexcept { return pages_ == 0; }
  /// The pool this reservation belongs to (nullptr when it never held pages).
  [[nodiscard]] void const* owner() const noexcept { return owner_; }

 private:
  template <class Layout>
  friend class page_pool;
  page_reservation(void const* owner, std::int64_t pages) : owner_(owner), pages_(pages) {}

  void const* owner_  = nullptr;
  std::int64_t pages_ = 0;
};

/**
 * @brief Fixed-size pages from one arena obtained once from an upstream resource.
 *
 * @tparam Layout   page geometry, `page_layout<HeadDim, GroupSize, PageTokens>` with compile-time
 *                  or dynamic extents (`page_layout<>` by default); fixes `page_bytes()`.
 *
 * The arena comes from any resource a `resource_ref` refers to (memory/resource_ref.hpp:
 * Tangram's, RMM's, CCCL's): the pool calls it twice in its life, at construction and
 * destruction, so the indirection costs nothing on the allocate/free paths.
 *
 * Ownership: the pool owns its arena (returned to the upstream in the destructor) and its
 * bookkeeping (two arrays of `capacity` integers, allocated at construction: nothing on the
 * allocate/free paths allocates). The upstream is referenced, not owned, and must outlive the
 * pool. The pool neither reads nor writes page contents, so simulated arenas work.
 *
 * Thread safety: a single-threaded object; callers serialise all calls (the KV-cache manager owns
 * one pool and is itself single-threaded). Not copyable or movable (reservations refer to it).
 */
template <class Layout = page_layout<>>
class page_pool {
 public:
  using layout_type = Layout;

  /// Largest pool: page ids are 32-bit.
  static constexpr std::int64_t max_pages = (std::int64_t{1} << 31) - 1;

  /// Pages of `layout` that fit in `bytes`.
  [[nodiscard]] static std::int64_t pages_for_bytes(std::int64_t bytes, Layout const& layout) {
    return bytes > 0 ? bytes / layout.page_bytes() : 0;
  }

  /**
   * @brief Takes an arena of `num_pages * layout.page_bytes()` bytes from `upstream`.
   * @param deferred_reuse  retire released pages until `release_epochs_through` (see the file
   *                        comment) instead of freeing them at once; sizes the retire list (two
   *                        arrays of `num_pages` entries) here.
   * @throw invalid_argument when num_pages is not in [1, max_pages] (names the value).
   * @throw out_of_memory when the upstream cannot provide the arena (no partial state remains).
   */
  page_pool(resource_ref upstream,
            Layout layout,
            std::int64_t num_pages,
            bool deferred_reuse = false)
      : upstream_(upstream), layout_(layout), capacity_(num_pages), deferred_(deferred_reuse) {
    TANGRAM_EXPECTS(num_pages >= 1 && num_pages <= max_pages,
                    invalid_argument,
                    "page_pool.num_pages: must be in [1, ",
                    max_pages,
                    "], got ",
                    num_pages);
    page_bytes_ = layout_.page_bytes();
    TANGRAM_EXPECTS(
        page_bytes_ >= 1 && num_pages <= std::numeric_limits<std::int64_t>::max() / page_bytes_,
        invalid_argument,
        "page_pool.num_pages: ",
        num_pages,
        " pages of ",
        page_bytes_,
        " bytes overflow the arena size");
    refs_.assign(static_cast<std::size_t>(num_pages), 0u);
    free_stack_.resize(static_cast<std::size_t>(num_pages));
    // Page 0 on top, so a fresh pool hands out pages in increasing order.
    for (std::int64_t i = 0; i < num_pages; ++i)
      free_stack_[static_cast<std::size_t>(i)] = static_cast<page_id>(num_pages - 1 - i);
    free_top_ = num_pages;
    if (deferred_) {
      retired_pages_.resize(static_cast<std::size_t>(num_pages));
      retired_epochs_.resize(static_cast<std::size_t>(num_pages));
    }
    arena_ = static_cast<std::byte*>(
        upstream_.allocate_sync(static_cast<std::size_t>(arena_bytes()), default_arena_alignment));
    kind_ = upstream_.kind();
  }

  page_pool(page_pool const&)            = delete;
  page_pool& operator=(page_pool const&) = delete;
  page_pool(page_pool&&)                 = delete;
  page_pool& operator=(page_pool&&)      = delete;

  /// Returns the arena to the upstream. Never throws.
  ~page_pool() {
    upstream_.deallocate_sync(
        arena_, static_cast<std::size_t>(arena_bytes()), default_arena_alignment);
  }

  // ----- geometry and addresses -------------------------------------------------------------

  [[nodiscard]] Layout const& layout() const noexcept { return layout_; }
  [[nodiscard]] std::int64_t page_bytes() const noexcept { return page_bytes_; }
  [[nodiscard]] std::int64_t capacity() const noexcept { return capacity_; }
  [[nodiscard]] std::int64_t arena_bytes() const noexcept { return capacity_ * page_bytes_; }
  /// Start of the arena (page 0). Dereferenceable only when `kind()` is host.
  [[nodiscard]] std::byte* base() const noexcept { return arena_; }
  /// Who may dereference the arena.
  [[nodiscard]] memory_kind kind() const noexcept { return kind_; }
  /// Address of page `p` (computed as an integer, so simulated arenas are never dereferenced).
  /// @throw logic_error when p is not a page of this pool.
  [[nodiscard]] std::byte* page_ptr(page_id p) const {
    check_range(p, "page_ptr");
    return reinterpret_cast<std::byte*>(reinterpret_cast<std::uintptr_t>(arena_) +
                                        static_cast<std::uintptr_t>(p) *
                                            static_cast<std::uintptr_t>(page_bytes_));
  }

  // ----- statistics -------------------------------------------------------------------------

  [[nodiscard]] pool_stats stats() const noexcept {
    pool_stats s;
    s.capacity    = capacity_;
    s.free        = free_top_;
    s.reserved    = reserved_;
    s.used        = used_pages();
    s.peak_used   = peak_used_;
    s.allocations = allocations_;
    s.frees       = frees_;
    s.retired     = retired_count_;
    s.retirements = retirements_;
    return s;
  }
  [[nodiscard]] std::int64_t free_pages() const noexcept { return free_top_; }
  [[nodiscard]] std::int64_t reserved_pages() const noexcept { return reserved_; }
  [[nodiscard]] std::int64_t used_pages() const noexcept {
    return capacity_ - free_top_ - retired_count_;
  }
  /// Deferred reuse: pages waiting for `release_epochs_through` (0 without deferred reuse).
  [[nodiscard]] std::int64_t retired_pages() const noexcept { return retired_count_; }
  /// Free pages nobody has reserved.
  [[nodiscard]] std::int64_t available_pages() const noexcept { return free_top_ - reserved_; }
  /// Forgets the peak so far (the current use becomes the peak).
  void reset_peak() noexcept { peak_used_ = used_pages(); }

  /// Reference count of page `p` (0 = free or retired). @throw logic_error when p is out of range.
  [[nodiscard]] std::uint32_t ref_count(page_id p) const {
    check_range(p, "ref_count");
    return refs_[static_cast<std::size_t>(p)];
  }

  // ----- unreserved allocation --------------------------------------------------------------

  /// @brief Takes one unreserved free page (reference count 1), or nullopt when none is left.
  /// O(1), allocation-free.
  [[nodiscard]] std::optional<page_id> try_allocate() noexcept {
    if (free_top_ - reserved_ <= 0) return std::nullopt;
    return pop();
  }

  /// @brief Adds a reference to a used page (sharing it, e.g. by a forked sequence).
  /// @throw logic_error naming the page when it is out of range or free.
  void retain(page_id p) {
    check_range(p, "retain");
    TANGRAM_EXPECTS(refs_[static_cast<std::size_t>(p)] > 0,
                    logic_error,
                    "page_pool::retain: page ",
                    p,
                    " is free or retired (reference count 0)");
    ++refs_[static_cast<std::size_t>(p)];
  }

  /**
   * @brief Drops one reference; when the count reaches 0 the page returns to the free stack, or,
   * with deferred reuse, to the retire list under `current_epoch()` (exactly once: a retired page
   * has count 0, so neither `retain` nor `release` accepts it again). O(1), allocation-free.
   * @return true when the page became unreferenced (free, or retired).
   * @throw logic_error naming the page when it is out of range or already free or retired
   *        (double free); the pool is unchanged.
   */
  bool release(page_id p) {
    if (!drop_ref(p, "release")) return false;
    free_or_retire(p);
    return true;
  }

  /**
   * @brief Drops one reference to each of `pages[0, n)` in order, as `n` calls of `release(p)`
   * would (under deferred reuse the freed pages retire). O(n), allocation-free; the reference
   * counts of the pages still to come are prefetched, which hides most of their cache misses (a
   * list's pages are scattered over the pool).
   * @return how many pages became unreferenced.
   * @throw logic_error naming the page when one is out of range or already free or retired
   *        (double free), after the pages before it were released.
   * @throw invalid_argument when n < 0, or `pages` is null for n > 0; nothing changes then.
   */
  std::int64_t release(page_id const* pages, std::int64_t n) {
    TANGRAM_EXPECTS(n >= 0, invalid_argument, "page_pool::release: n must be >= 0, got ", n);
    TANGRAM_EXPECTS(n == 0 || pages != nullptr,
                    invalid_argument,
                    "page_pool::release: pages is null for ",
                    n,
                    " pages");
    if (n == 0) return 0;  // (pages may be null)
    std::int64_t freed = 0;
    for (std::int64_t k = 0; k < n; ++k) {
      if (k + prefetch_distance < n) prefetch_ref(pages[k + prefetch_distance]);
      if (!drop_ref(pages[k], "release")) continue;
      free_or_retire(pages[k]);
      ++freed;
    }
    return freed;
  }

  /**
   * @brief Drops one reference to each of `pages[0, n)`, the last first (the order in which a
   * list's pages leave it from its end), and promises every page that becomes free to `res`
   * again: the pool ends as after `release(p)` for each page, followed, when it freed the page,
   * by `try_extend(res, 1)` (which cannot fail then). O(n), allocation-free, counts prefetched
   * as in `release(pages, n)`.
   * @return how many pages were freed and promised to `res` (a page still shared, reference
   *         count above 1, only loses this reference).
   * @throw logic_error when `res` belongs to another pool, or with deferred reuse (a released page
   *        retires there and cannot back a reservation) -- both before any change; or naming the
   *        page when one is out of range or already free (double free), after the pages before it
   *        were released and promised.
   * @throw invalid_argument when n < 0, or `pages` is null for n > 0.
   */
  std::int64_t release_into(page_reservation& res, page_id const* pages, std::int64_t n) {
    TANGRAM_EXPECTS(n >= 0, invalid_argument, "page_pool::release_into: n must be >= 0, got ", n);
    TANGRAM_EXPECTS(n == 0 || pages != nullptr,
                    invalid_argument,
                    "page_pool::release_into: pages is null for ",
                    n,
                    " pages");
    check_owner(res, "release_into");
    TANGRAM_EXPECTS(!deferred_,
                    logic_error,
                    "page_pool::release_into: released pages retire under deferred reuse and "
                    "cannot back a reservation");
    if (n == 0) return 0;  // (pages may be null)
    std::int64_t freed = 0;
    for (std::int64_t k = n - 1; k >= 0; --k) {
      if (k >= prefetch_distance) prefetch_ref(pages[k - prefetch_distance]);
      if (!drop_ref(pages[k], "release_into")) continue;
      free_or_retire(pages[k]);  // freed: no deferred reuse here
      ++freed;
      ++reserved_;  // promised to res at once, so a failure part way leaves the counts exact
      ++res.pages_;
      res.owner_ = this;
    }
    return freed;
  }

  // ----- deferred reuse ---------------------------------------------------------------------

  /// True when released pages retire until `release_epochs_through` (the constructor's flag).
  [[nodiscard]] bool deferred_reuse() const noexcept { return deferred_; }
  /// The open epoch: pages released now retire under this id. Starts at 0.
  [[nodiscard]] std::int64_t current_epoch() const noexcept { return epoch_; }
  /// The newest epoch released so far (-1 before the first release).
  [[nodiscard]] std::int64_t released_through() const noexcept { return released_through_; }

  /**
   * @brief Closes the open epoch and opens the next one. Call it after the work that may still
   * read the pages released so far was enqueued (and an event recorded behind it). O(1),
   * allocation-free. Works without deferred reuse too (no page ever retires then).
   * @return the id of the epoch just closed (what `release_epochs_through` takes once its work
   *         completed).
   * @throw logic_error when the epoch id would overflow int64 (nothing changes).
   */
  std::int64_t advance_epoch() {
    TANGRAM_EXPECTS(epoch_ < std::numeric_limits<std::int64_t>::max(),
                    logic_error,
                    "advance_epoch: epoch id ",
                    epoch_,
                    " cannot advance (int64 overflow)");
    return epoch_++;
  }

  /**
   * @brief The work of every epoch <= `epoch` completed: their retired pages become free, oldest
   * epoch first (FIFO), in the order they retired. An epoch already released is accepted and
   * releases nothing (polling may repeat itself). O(pages released), allocation-free.
   * @return the pages that became free.
   * @throw invalid_argument naming the value when epoch < 0 or epoch is not closed yet
   *        (>= current_epoch(): its work may not even be enqueued); nothing changes then.
   */
  std::int64_t release_epochs_through(std::int64_t epoch) {
    TANGRAM_EXPECTS(
        epoch >= 0, invalid_argument, "release_epochs_through.epoch: must be >= 0, got ", epoch);
    TANGRAM_EXPECTS(epoch < epoch_,
                    invalid_argument,
                    "release_epochs_through.epoch: ",
                    epoch,
                    " is not closed yet (the open epoch is ",
                    epoch_,
                    "; release only epochs advance_epoch returned)");
    std::int64_t released = 0;
    while (retired_count_ > 0 &&
           retired_epochs_[static_cast<std::size_t>(retired_head_)] <= epoch) {
      free_stack_[static_cast<std::size_t>(free_top_++)] =
          retired_pages_[static_cast<std::size_t>(retired_head_)];
      retired_head_ = retired_head_ + 1 == capacity_ ? 0 : retired_head_ + 1;
      --retired_count_;
      ++released;
    }
    frees_ += released;
    if (epoch > released_through_) released_through_ = epoch;
    return released;
  }

  /// Calls `f(page_id, epoch)` for every retired page, oldest first. For tests and debugging.
  template <class F>
  void for_each_retired(F&& f) const {
    for (std::int64_t k = 0; k < retired_count_; ++k) {
      auto at = static_cast<std::size_t>((retired_head_ + k) % capacity_);
      f(retired_pages_[at], retired_epochs_[at]);
    }
  }

  // ----- reservations -----------------------------------------------------------------------

  /**
   * @brief Reserves `n` free pages at once, all or nothing.
   * @return the reservation, or nullopt ("does not fit") when fewer than n unreserved pages are
   *         free; the pool is then unchanged.
   * @throw invalid_argument when n < 0 (names the value).
   */
  [[nodiscard]] std::optional<page_reservation> try_reserve(std::int64_t n) {
    TANGRAM_EXPECTS(
        n >= 0, invalid_argument, "page_pool::try_reserve: pages must be >= 0, got ", n);
    if (n > free_top_ - reserved_) return std::nullopt;
    reserved_ += n;
    return page_reservation(this, n);
  }

  /**
   * @brief Adds `n` pages to an existing (possibly empty) reservation, all or nothing.
   * @return false ("does not fit") when fewer than n unreserved pages are free; nothing changes.
   * @throw logic_error when `res` belongs to another pool; invalid_argument when n < 0.
   */
  [[nodiscard]] bool try_extend(page_reservation& res, std::int64_t n) {
    TANGRAM_EXPECTS(n >= 0, invalid_argument, "page_pool::try_extend: pages must be >= 0, got ", n);
    check_owner(res, "try_extend");
    if (n > free_top_ - reserved_) return false;
    reserved_ += n;
    res.owner_ = this;
    res.pages_ += n;
    return true;
  }

  /**
   * @brief Takes one page promised by `res` (reference count 1). O(1), allocation-free; never
   * fails for lack of memory.
   * @throw logic_error when `res` is empty (drawing more than reserved) or belongs to another pool.
   */
  page_id draw(page_reservation& res) {
    check_owner(res, "draw");
    TANGRAM_EXPECTS(res.pages_ > 0,
                    logic_error,
                    "page_pool::draw: the reservation is exhausted (0 pages left); drawing more "
                    "pages than reserved");
    --res.pages_;
    --reserved_;
    return pop();
  }

  /**
   * @brief Takes `n` pages promised by `res` into `out[0, n)`, in the order `n` calls of
   * `draw(res)` would return them (reference count 1 each). O(n) with one check, allocation-free;
   * all or nothing.
   * @throw logic_error when `res` holds fewer than `n` pages or belongs to another pool;
   *        invalid_argument when n < 0 or `out` is null for n > 0. Nothing changes then.
   */
  void draw(page_reservation& res, std::int64_t n, page_id* out) {
    TANGRAM_EXPECTS(n >= 0, invalid_argument, "page_pool::draw: pages must be >= 0, got ", n);
    TANGRAM_EXPECTS(n == 0 || out != nullptr,
                    invalid_argument,
                    "page_pool::draw: out is null for ",
                    n,
                    " pages");
    check_owner(res, "draw");
    TANGRAM_EXPECTS(n <= res.pages_,
                    logic_error,
                    "page_pool::draw: drawing ",
                    n,
                    " pages but the reservation holds ",
                    res.pages_,
                    "; drawing more pages than reserved");
    res.pages_ -= n;
    reserved_ -= n;
    for (std::int64_t k = 0; k < n; ++k) {
      page_id p                          = free_stack_[static_cast<std::size_t>(--free_top_)];
      refs_[static_cast<std::size_t>(p)] = 1;
      out[k]                             = p;
    }
    allocations_ += n;
    peak_used_ = std::max(peak_used_, used_pages());
  }

  /**
   * @brief Returns `n` unused pages of `res` to the unreserved free pages.
   * @throw logic_error when res belongs to another pool or holds fewer than n pages (names both);
   *        invalid_argument when n < 0.
   */
  void release_unused(page_reservation& res, std::int64_t n) {
    TANGRAM_EXPECTS(
        n >= 0, invalid_argument, "page_pool::release_unused: pages must be >= 0, got ", n);
    check_owner(res, "release_unused");
    TANGRAM_EXPECTS(n <= res.pages_,
                    logic_error,
                    "page_pool::release_unused: releasing ",
                    n,
                    " pages but the reservation holds ",
                    res.pages_);
    res.pages_ -= n;
    reserved_ -= n;
  }

  /// @brief Returns every unused page of `res`; `res` becomes empty.
  /// @throw logic_error when res belongs to another pool.
  void release_unused(page_reservation& res) { release_unused(res, res.pages_); }

  /// @brief True when `res` was made by this pool (or is an empty default reservation).
  [[nodiscard]] bool owns(page_reservation const& res) const noexcept {
    return res.owner_ == nullptr || res.owner_ == this;
  }

  /**
   * @brief Full consistency check, O(capacity): free stack, retire list and reference counts
   * agree, no page is on the stack or in the retire list twice (or in both), retired epochs are
   * in FIFO order within (released_through, current_epoch], reserved <= free. For tests and
   * debugging.
   * @throw logic_error describing the first inconsistency.
   */
  void check_invariants() const {
    TANGRAM_EXPECTS(reserved_ >= 0 && reserved_ <= free_top_,
                    logic_error,
                    "page_pool: reserved ",
                    reserved_,
                    " exceeds free ",
                    free_top_);
    std::vector<char> on_stack(static_cast<std::size_t>(capacity_), 0);
    for (std::int64_t i = 0; i < free_top_; ++i) {
      page_id p = free_stack_[static_cast<std::size_t>(i)];
      TANGRAM_EXPECTS(p >= 0 && p < capacity_, logic_error, "page_pool: free stack holds ", p);
      TANGRAM_EXPECTS(!on_stack[static_cast<std::size_t>(p)],
                      logic_error,
                      "page_pool: page ",
                      p,
                      " is on the free stack twice");
      on_stack[static_cast<std::size_t>(p)] = 1;
      TANGRAM_EXPECTS(refs_[static_cast<std::size_t>(p)] == 0,
                      logic_error,
                      "page_pool: free page ",
                      p,
                      " has reference count ",
                      refs_[static_cast<std::size_t>(p)]);
    }
    TANGRAM_EXPECTS(retired_count_ >= 0 && free_top_ + retired_count_ <= capacity_ &&
                        (deferred_ || retired_count_ == 0),
                    logic_error,
                    "page_pool: ",
                    retired_count_,
                    " retired pages beside ",
                    free_top_,
                    " free ones in a pool of ",
                    capacity_);
    std::int64_t last_epoch = released_through_;
    for_each_retired([&](page_id p, std::int64_t e) {
      TANGRAM_EXPECTS(p >= 0 && p < capacity_, logic_error, "page_pool: retire list holds ", p);
      TANGRAM_EXPECTS(!on_stack[static_cast<std::size_t>(p)],
                      logic_error,
                      "page_pool: page ",
                      p,
                      " is retired twice, or both retired and free");
      on_stack[static_cast<std::size_t>(p)] = 1;
      TANGRAM_EXPECTS(refs_[static_cast<std::size_t>(p)] == 0,
                      logic_error,
                      "page_pool: retired page ",
                      p,
                      " has reference count ",
                      refs_[static_cast<std::size_t>(p)]);
      TANGRAM_EXPECTS(e >= last_epoch && e > released_through_ && e <= epoch_,
                      logic_error,
                      "page_pool: retired page ",
                      p,
                      " has epoch ",
                      e,
                      " out of FIFO order (previous ",
                      last_epoch,
                      ", released through ",
                      released_through_,
                      ", open ",
                      epoch_,
                      ")");
      last_epoch = e;
    });
    for (std::int64_t p = 0; p < capacity_; ++p)
      TANGRAM_EXPECTS(
          on_stack[static_cast<std::size_t>(p)] || refs_[static_cast<std::size_t>(p)] > 0,
          logic_error,
          "page_pool: page ",
          p,
          " is neither free, retired nor referenced (leaked)");
  }

 private:
  page_id pop() noexcept {
    page_id p                          = free_stack_[static_cast<std::size_t>(--free_top_)];
    refs_[static_cast<std::size_t>(p)] = 1;
    ++allocations_;
    std::int64_t used = used_pages();
    if (used > peak_used_) peak_used_ = used;
    return p;
  }
  /// Drops one reference to page p (checked: in range, referenced); true when p became
  /// unreferenced, which the caller then frees or retires.
  bool drop_ref(page_id p, char const* op) {
    check_range(p, op);
    auto& r = refs_[static_cast<std::size_t>(p)];
    TANGRAM_EXPECTS(r > 0,
                    logic_error,
                    "page_pool::",
                    op,
                    ": page ",
                    p,
                    " is already free or retired (double free, or a page that was never "
                    "allocated)");
    return --r == 0;
  }
  /// An unreferenced page returns to the free stack, or with deferred reuse to the retire list
  /// under the open epoch.
  void free_or_retire(page_id p) noexcept {
    if (!deferred_) {
      free_stack_[static_cast<std::size_t>(free_top_++)] = p;
      ++frees_;
      return;
    }
    auto at = (retired_head_ + retired_count_) % capacity_;  // room: every retired page is
    retired_pages_[static_cast<std::size_t>(at)]  = p;       // distinct, so count < capacity
    retired_epochs_[static_cast<std::size_t>(at)] = epoch_;
    ++retired_count_;
    ++retirements_;
  }
  /// Pages ahead whose reference counts a bulk release prefetches: a few cache misses in flight.
  static constexpr std::int64_t prefetch_distance = 32;
  /// Hints the cache to fetch page p's reference count (for writing); ignores an invalid id.
  void prefetch_ref(page_id p) const noexcept {
#if defined(__GNUC__) || defined(__clang__)
    if (p >= 0 && p < capacity_) __builtin_prefetch(refs_.data() + p, 1);
#else
    (void)p;
#endif
  }
  void check_range(page_id p, char const* op) const {
    TANGRAM_EXPECTS(p >= 0 && p < capacity_,
                    logic_error,
                    "page_pool::",
                    op,
                    ": page ",
                    p,
                    " is not a page of this pool (capacity ",
                    capacity_,
                    ")");
  }
  void check_owner(page_reservation const& res, char const* op) const {
    TANGRAM_EXPECTS(owns(res),
                    logic_error,
                    "page_pool::",
                    op,
                    ": the reservation (",
                    res.pages_,
                    " pages) belongs to another pool");
  }

  resource_ref upstream_;
  Layout layout_;
  std::int64_t capacity_;
  std::int64_t page_bytes_ = 0;
  std::byte* arena_        = nullptr;
  memory_kind kind_        = memory_kind::host;
  std::vector<std::uint32_t> refs_;
  std::vector<page_id> free_stack_;
  std::int64_t free_top_    = 0;
  std::int64_t reserved_    = 0;
  std::int64_t peak_used_   = 0;
  std::int64_t allocations_ = 0;
  std::int64_t frees_       = 0;
  // Deferred reuse: a FIFO ring of (page, epoch) with room for every page.
  bool deferred_ = false;
  std::vector<page_id> retired_pages_;
  std::vector<std::int64_t> retired_epochs_;
  std::int64_t retired_head_     = 0;
  std::int64_t retired_count_    = 0;
  std::int64_t retirements_      = 0;
  std::int64_t epoch_            = 0;
  std::int64_t released_through_ = -1;
};

}  // namespace tangram
