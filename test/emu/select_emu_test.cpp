// SPDX-License-Identifier: Apache-2.0
// The multi-CTA top-k threshold search of the eviction kernels (select_reset_kernel and three
// select_histogram_pass launches, include/tangram/kernels/detail/eviction.cuh) in the host
// emulator, on one head's keys chosen to break a wrong multi-CTA threshold: equal keys across
// slices, k at slice boundaries, one slice and many, k = 1 and k = n, keys that differ only in
// the last digit. The threshold and tie count it leaves in the head's state must give exactly
// the reference's set (the k largest, ties to the earlier position), and the histogram and
// ticket must be clear afterwards so that a second launch on the same workspace is right too.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "emu_support.hpp"
#include "simt/simt.hpp"
#include "tangram/kernels/detail/eviction.cuh"

using namespace tangram;

namespace {

/// One head's selection workspace on the host, poisoned like unwritten device memory.
struct select_workspace {
  std::vector<std::uint32_t> keys, hist, state;
  explicit select_workspace(std::int64_t n)
      : keys(static_cast<std::size_t>(n), 0xffffffffu),
        hist(select_radix_bins, 0xffffffffu),
        state(select_state_words, 0xffffffffu) {}
  detail::select_slots slots() { return {hist.data(), state.data()}; }
};

/// The launches of one selection: reset (when asked), then the three radix passes over
/// ceil(n / select_slice) CTAs, pass 0 building the keys from `src` as the eviction kernel does.
void run_selection(select_workspace& w,
                   std::vector<std::uint32_t> const& src,
                   std::int64_t k,
                   bool reset) {
  const auto n = static_cast<std::int64_t>(src.size());
  if (reset)
    emu::emulated_launch{}(
        detail::select_reset_kernel<>, dim3(1), 256, 0, w.hist.data(), w.state.data());
  const auto slices = static_cast<unsigned>((n + select_slice - 1) / select_slice);
  for (int pass = 0; pass < select_radix_passes; ++pass)
    emu::launch(dim3(slices), dim3(256), 0, [&] {
      __shared__ detail::select_hist_smem sm;
      std::uint32_t* keys = w.keys.data();
      detail::select_histogram_pass(
          w.slots(),
          pass,
          n,
          k,
          [&](std::int64_t i) { return keys[i]; },
          [&](std::int64_t i) {
            keys[i] = src[static_cast<std::size_t>(i)];
            return keys[i];
          },
          sm);
    });
}

/// The reference set: indices of the k largest keys, ties to the earlier position.
std::vector<std::int64_t> reference_set(std::vector<std::uint32_t> const& keys, std::int64_t k) {
  std::vector<std::int64_t> idx(keys.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](std::int64_t a, std::int64_t b) {
    return keys[static_cast<std::size_t>(a)] > keys[static_cast<std::size_t>(b)];
  });
  idx.resize(static_cast<std::size_t>(k));
  std::sort(idx.begin(), idx.end());
  return idx;
}

/// The set the compaction keeps from the state's threshold and tie count (compact_selected's
/// rule, applied on the host).
std::vector<std::int64_t> selected_set(select_workspace const& w, std::int64_t n) {
  const std::uint32_t threshold = w.state[detail::select_prefix];
  std::uint32_t ties            = w.state[detail::select_remaining];
  std::vector<std::int64_t> out;
  for (std::int64_t i = 0; i < n; ++i) {
    const std::uint32_t key = w.keys[static_cast<std::size_t>(i)];
    if (key > threshold || (key == threshold && ties > 0)) {
      if (key == threshold) --ties;
      out.push_back(i);
    }
  }
  return out;
}

/// "" when the selection of `k` of `src` is exact and the workspace is clear afterwards.
std::string check_selection(select_workspace& w,
                            std::vector<std::uint32_t> const& src,
                            std::int64_t k,
                            bool reset) {
  run_selection(w, src, k, reset);
  const auto n = static_cast<std::int64_t>(src.size());
  if (!std::equal(src.begin(), src.end(), w.keys.begin())) return "pass 0 stored wrong keys";
  if (selected_set(w, n) != reference_set(src, k))
    return "selected set differs (threshold " + std::to_string(w.state[detail::select_prefix]) +
           ", ties " + std::to_string(w.state[detail::select_remaining]) + ")";
  if (std::any_of(w.hist.begin(), w.hist.end(), [](std::uint32_t c) { return c != 0; }))
    return "histogram not cleared";
  if (w.state[detail::select_ticket] != 0) return "ticket not cleared";
  return {};
}

/// Keys of one selection scenario.
struct key_case {
  const char* what;
  std::vector<std::uint32_t> keys;
  std::vector<std::int64_t> ks;
};

std::vector<std::uint32_t> draw(std::int64_t n, std::uint64_t seed, std::uint32_t values) {
  std::mt19937_64 rng(seed);
  std::vector<std::uint32_t> v(static_cast<std::size_t>(n));
  for (auto& x : v)
    x = values == 0 ? static_cast<std::uint32_t>(rng()) : 0x80000000u + rng() % values;
  return v;
}

std::vector<key_case> key_cases() {
  constexpr std::int64_t S = select_slice;
  std::vector<key_case> out;
  // Protected keys only: every key in one bin of every pass; ties straddle all slices.
  out.push_back({"all protected",
                 std::vector<std::uint32_t>(3 * S + 17, protected_score_key),
                 {1, 5000, S, 3 * S + 16, 3 * S + 17}});
  // Seven values (the supplied-score tests' tie pattern) over several slices; k at and next to
  // slice boundaries.
  out.push_back({"seven values", draw(3 * S, 3, 7), {S - 1, S, S + 1, 2 * S, 3 * S - 1, 3 * S}});
  // Protected sink and window around random keys (the real key layout).
  {
    auto v = draw(2 * S + 300, 5, 0);
    for (std::size_t i = 0; i < 4; ++i) v[i] = protected_score_key;
    for (std::size_t i = v.size() - 64; i < v.size(); ++i) v[i] = protected_score_key;
    out.push_back({"protected ends", v, {68, 69, 1000, S, 2 * S + 299}});
  }
  // Keys equal above the last digit: the threshold is decided in pass 2 only.
  {
    auto v = draw(S + 500, 7, 0);
    for (auto& x : v) x = 0x7a5c0000u | (x & 0x3ffu);
    out.push_back({"last digit only", v, {1, 700, S, S + 499}});
  }
  // Descending keys: the top k are exactly the first k (a slice boundary when k = S).
  {
    std::vector<std::uint32_t> v(2 * S);
    for (std::size_t i = 0; i < v.size(); ++i)
      v[i] = 0xf0000000u - static_cast<std::uint32_t>(i) * 4099u;
    out.push_back({"descending", v, {S, S + 1, 2 * S - 1}});
  }
  // Fewer candidates than one slice, and exactly one slice.
  out.push_back({"n 1", {0x12345678u}, {1}});
  out.push_back({"n 100", draw(100, 11, 5), {1, 37, 99, 100}});
  out.push_back({"n = slice", draw(S, 13, 0), {1, S / 2, S}});
  // Many slices.
  out.push_back({"ten slices", draw(10 * S - 3, 17, 3000000), {1, 12345, 10 * S - 4}});
  return out;
}

}  // namespace

TEST_CASE("emulator: __match_any_sync, __popc and __ffs as on the GPU", "[emu][simt]") {
  std::vector<unsigned> peers(64), popc(64), first(64);
  emu::launch(dim3(1), dim3(64), 0, [&] {
    const auto t     = static_cast<int>(threadIdx.x);
    const unsigned v = t < 32 ? static_cast<unsigned>(t % 3) : 7u;  // warp 1: all equal
    peers[static_cast<std::size_t>(t)] = __match_any_sync(0xffffffffu, v);
    popc[static_cast<std::size_t>(t)] =
        static_cast<unsigned>(__popc(peers[static_cast<std::size_t>(t)]));
    first[static_cast<std::size_t>(t)] =
        static_cast<unsigned>(__ffs(static_cast<int>(peers[static_cast<std::size_t>(t)])));
  });
  for (int t = 0; t < 32; ++t) {
    unsigned want = 0;
    for (int l = 0; l < 32; ++l)
      if (l % 3 == t % 3) want |= 1u << l;
    CHECK(peers[static_cast<std::size_t>(t)] == want);
    CHECK(popc[static_cast<std::size_t>(t)] == (t % 3 == 2 ? 10u : 11u));
    CHECK(first[static_cast<std::size_t>(t)] == static_cast<unsigned>(t % 3 + 1));
  }
  for (int t = 32; t < 64; ++t) {
    CHECK(peers[static_cast<std::size_t>(t)] == 0xffffffffu);
    CHECK(popc[static_cast<std::size_t>(t)] == 32u);
    CHECK(first[static_cast<std::size_t>(t)] == 1u);
  }
}

TEST_CASE("emulated multi-CTA top-k: exact set and a clear workspace for every k",
          "[emu][eviction][select]") {
  std::uint64_t seed = 300;
  for (auto const& c : key_cases())
    for (std::int64_t k : c.ks) {
      emu::scoped_options scope({++seed, emu::copy_mode::deferred, 0});
      INFO(c.what << ", n " << c.keys.size() << ", k " << k << ", schedule seed " << seed);
      select_workspace w(static_cast<std::int64_t>(c.keys.size()));
      CHECK(check_selection(w, c.keys, k, true) == "");
    }
}

TEST_CASE("emulated multi-CTA top-k: a second launch reuses the workspace without a reset",
          "[emu][eviction][select]") {
  // The passes clear the histogram and ticket after themselves: the next selection on the same
  // workspace (other keys, other k, no reset kernel) must be exact too, and so must a third.
  constexpr std::int64_t n = 3 * select_slice + 5;
  select_workspace w(n);
  emu::scoped_options scope({77, emu::copy_mode::deferred, 0});
  REQUIRE(check_selection(w, draw(n, 21, 7), 5000, true) == "");
  CHECK(check_selection(w, draw(n, 22, 0), 2 * select_slice, false) == "");
  CHECK(check_selection(w, std::vector<std::uint32_t>(n, protected_score_key), 17, false) == "");
}

TEST_CASE("emulated multi-CTA top-k: a stale histogram changes the selection",
          "[emu][mutation][select]") {
  // The check can fail: one count left behind in the histogram (what a missing clear would leave)
  // moves the threshold, and the set no longer equals the reference.
  constexpr std::int64_t n = 2 * select_slice;
  const auto keys          = draw(n, 31, 7);
  select_workspace w(n);
  emu::scoped_options scope({5, emu::copy_mode::deferred, 0});
  REQUIRE(check_selection(w, keys, select_slice, true) == "");
  const std::uint32_t top_bin = (keys[0] >> detail::select_shift(0)) & 0x7ffu;
  w.hist[top_bin + 1]         = 600;  // stale counts above the true threshold's bin
  CHECK_FALSE(check_selection(w, keys, select_slice, false).empty());
}
