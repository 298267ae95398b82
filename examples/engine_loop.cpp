// SPDX-License-Identifier: Apache-2.0
// An engine loop over kv_cache_manager (docs/integration.md), the C++ twin of
// examples/python/engine_loop.py: the same requests, the same calls, the same page accounting
// (python/tests/test_engine_loop.py compares the two checkpoint by checkpoint).
//
// Admission until the pool is full (with the reason when a request does not fit), each request
// reserving one answer window (memory/answer_window.hpp) rather than its max_tokens; mixed steps
// as vLLM v1 / SGLang schedule them (one prefill chunk of every request still in prefill, evicted
// by one launch over the prefill batch, beside a decode step over the decode batch, padded to a
// fixed capacity as a CUDA graph would be), chunked prefill (prepare, eviction, commit), decode
// steps over a batch; answers that reach their window grow, and when a growth does not fit a
// session is parked in host memory (an idle one first, else the newest running turn, which
// resumes where it stopped): nothing recomputed; then a second turn (restored from host memory
// when its session was parked while idle), speculative tokens rolled back, a copy-on-write fork,
// a turn's reservation grown, the session parked in host memory and brought back for a third
// turn, and free: at the end every page and slot is back. Pages are
// reused only after the work that read them is done (deferred reuse: one epoch per step, released
// a step later, as a GPU running one step behind the host would be). Each chunk is evicted by the
// CPU reference kernel (`reference::evict_chunk`, layer by layer, key-norm scores) on K/V written
// into the manager's own host pool, as the CUDA kernel would on a device pool. Under elastic
// reservation (the default) every layer stages the chunk and its keys, and one request-wide
// `reference::evict_elastic` per chunk chooses the groups' lengths within `elastic_page_limit`;
// under static budgets (`--reservation static`) the counts are known in advance, so the loop checks
// them against `expected_kept`.
//
// Each decode step balances the split map for its batch (`reference::balance_decode_splits`, as
// `balance_decode_splits` would on the device).
//
// Run: build/examples/example_engine_loop [--json] [--reservation elastic|static]
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <iterator>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "tangram/memory/host_memory_resource.hpp"
#include "tangram/reference/elastic_eviction.hpp"
#include "tangram/reference/eviction.hpp"
#include "tangram/tangram.hpp"

namespace {

constexpr std::int64_t chunk_size = 512;

/// Page accounting at one point of the loop.
struct checkpoint {
  std::string label;
  std::int64_t used_pages, reserved_pages, available_pages, retired_pages, live_sequences,
      pages_drawn;
};

checkpoint snapshot(char const* label, tangram::kv_cache_manager const& kv) {
  return {label,
          kv.pool().used_pages(),
          kv.pool().reserved_pages(),
          kv.pool().available_pages(),
          kv.retired_pages(),
          kv.live_sequences(),
          kv.stats().pages_drawn};
}

/// A chunk's K (or V) for one layer as bf16 bit patterns, [rows][heads][head_dim]: a fixed
/// pattern (the Python twin writes the same), standing in for the model's projections.
std::vector<std::uint16_t> chunk_kv(std::int64_t rows, std::int32_t heads, std::int32_t head_dim) {
  std::vector<std::uint16_t> out(static_cast<std::size_t>(rows * heads * head_dim));
  for (std::int64_t t = 0; t < rows; ++t)
    for (std::int32_t h = 0; h < heads; ++h)
      for (std::int32_t x = 0; x < head_dim; ++x)
        out[static_cast<std::size_t>((t * heads + h) * head_dim + x)] =
            static_cast<std::uint16_t>((t * 31 + h * 7 + x) % 128 + 0x3F00);
  return out;
}

/// The next chunk of every sequence of `seqs` (all in prefill): prepare each, then ONE eviction
/// launch per layer over the prefill batch (`view(batch_kind::prefill)`; the decode batch is left
/// as it is), then commit each with its kept counts.
void prefill_chunks(tangram::kv_cache_manager& kv, std::vector<tangram::sequence_id> const& seqs) {
  auto const& plan = kv.plan();
  std::int32_t const L = plan.num_layers, H = plan.num_kv_heads, d = plan.model.head_dim;
  auto const B = seqs.size();
  std::vector<std::int32_t> indptr{0};
  std::vector<std::uint16_t> data;  // the batch's chunks, one after the other
  std::int32_t max_candidates = 1;
  for (auto seq : seqs) {
    std::int64_t left  = kv.info(seq).prompt_remaining;
    std::int64_t chunk = left < chunk_size ? left : chunk_size;
    kv.prepare_chunk(seq, chunk);
    auto rows = chunk_kv(chunk, H, d);
    data.insert(data.end(), rows.begin(), rows.end());
    indptr.push_back(indptr.back() + static_cast<std::int32_t>(chunk));
    auto bound = static_cast<std::int32_t>(kv.info(seq).seq_tokens + chunk);  // held + chunk
    max_candidates = bound > max_candidates ? bound : max_candidates;
  }
  kv.set_batch(tangram::batch_kind::prefill, seqs);  // the eviction's own batch
  bool const elastic = plan.options.reservation.mode == tangram::reservation_mode::elastic;
  // new_len[layer][request][head], as each layer's launch writes it.
  std::vector<std::int32_t> new_len(static_cast<std::size_t>(L) * B * static_cast<std::size_t>(H));
  tangram::eviction_params p;
  p.kv             = kv.view(tangram::batch_kind::prefill);
  // Elastic: every layer stages its chunk and writes its candidates' keys into blocks laid out
  // like the staged groups' page lists (no padding to the longest request; an engine allocates
  // one buffer of tangram::stage_key_words_bound(plan, context limit, largest prefill batch)
  // words up front and passes its first `stage_key_layout` words at each chunk).
  std::vector<std::int64_t> key_base(elastic ? B * static_cast<std::size_t>(kv.num_groups()) : 0);
  std::vector<std::uint32_t> keys(
      elastic ? static_cast<std::size_t>(tangram::stage_key_layout(
                    p.kv, plan.rules.data(), indptr.data(), key_base.data()))
              : 0);
  p.sink           = plan.profile.sink_tokens;
  p.chunk_indptr   = indptr.data();
  p.chunk_k        = data.data();
  p.chunk_v        = data.data();
  p.max_candidates = max_candidates;
  p.source         = tangram::score_source::key_norm;
  p.group          = plan.model.gqa_group();
  p.stage_keys     = elastic ? keys.data() : nullptr;
  p.stage_key_base = elastic ? key_base.data() : nullptr;
  for (std::int32_t layer = 0; layer < L; ++layer) {
    p.layer   = layer;
    p.rules   = plan.rules.data() + static_cast<std::ptrdiff_t>(layer) * H;
    p.new_len = new_len.data() + static_cast<std::size_t>(layer) * B * static_cast<std::size_t>(H);
    tangram::reference::evict_chunk(p);  // one launch for the whole prefill batch
  }
  std::vector<std::int32_t> kept(static_cast<std::size_t>(L) * static_cast<std::size_t>(H));
  if (elastic) {  // after the last layer: the request-wide selection, one call per chunk
    std::vector<std::int64_t> wanted(B), limit(B);
    for (std::size_t r = 0; r < B; ++r) {
      wanted[r] = kv.elastic_wanted_tokens(seqs[r]);
      limit[r]  = kv.elastic_page_limit(seqs[r]);
    }
    std::vector<std::int32_t> lengths(B * kept.size());
    tangram::elastic_eviction_params e;
    e.kv             = kv.view(tangram::batch_kind::prefill);
    e.rules          = plan.rules.data();
    e.sink           = plan.profile.sink_tokens;
    e.chunk_indptr   = indptr.data();
    e.max_candidates = max_candidates;
    e.stage_keys     = keys.data();
    e.stage_key_base = key_base.data();
    e.wanted         = wanted.data();
    e.page_limit     = limit.data();
    e.new_len        = lengths.data();
    tangram::reference::evict_elastic(e);
    for (std::size_t r = 0; r < B; ++r)
      kv.commit_chunk(seqs[r], lengths.data() + r * kept.size(), kept.size());
    return;
  }
  std::vector<std::int32_t> expected(kept.size());
  for (std::size_t r = 0; r < B; ++r) {
    for (std::int32_t layer = 0; layer < L; ++layer)
      for (std::int32_t h = 0; h < H; ++h)
        kept[static_cast<std::size_t>(layer * H + h)] =
            new_len[(static_cast<std::size_t>(layer) * B + r) * static_cast<std::size_t>(H) +
                    static_cast<std::size_t>(h)];
    // Static budgets: the kernel keeps exactly what the rules say.
    kv.expected_kept(seqs[r], kv.info(seqs[r]).chunk_pending, expected.data());
    if (kept != expected) throw std::logic_error("the reference eviction kept other counts");
    kv.commit_chunk(seqs[r], kept);
  }
}

/// Every remaining prompt token of the turn, one chunk at a time: prepare, evict, commit.
void prefill(tangram::kv_cache_manager& kv, tangram::sequence_id seq) {
  while (kv.info(seq).prompt_remaining > 0) prefill_chunks(kv, {seq});
}

/// The work of every step so far is done (an engine: its last event completed): every page those
/// steps freed may be handed out again.
void settle(tangram::kv_cache_manager& kv) { kv.release_epochs_through(kv.advance_epoch()); }

void decode(tangram::kv_cache_manager& kv,
            std::vector<tangram::sequence_id> const& batch,
            int steps) {
  kv.set_batch(batch);
  for (int i = 0; i < steps; ++i) kv.decode_step();  // room for one token per head
}

/// A request's answer in flight: its sequence, the tokens it will answer (a stand-in for where
/// EOS comes; the engine only learns it when it gets there) and when it last ran (the victim
/// order's clock).
struct request {
  tangram::sequence_id id;  ///< changes when a parked turn resumes
  std::int64_t answer    = 0;
  std::int64_t last_used = 0;
  int key                = 0;  ///< which request (its admission order)
};
/// A session in host memory: what park returned and its pages' bytes (the engine's copy).
struct parked {
  tangram::parked_session session;
  std::vector<std::byte> host;
  request req;
};

/// Answers that grow (memory/answer_window.hpp): turns reserve a window of their max_tokens, grow
/// by a window when they reach it, and when a growth (or a resume) does not fit, sessions are
/// parked in host memory in the window's victim order (ended ones first, then the newest running
/// turn, the growing one included) and come back later: never recomputed, never lost.
class answer_scheduler {
 public:
  answer_scheduler(tangram::kv_cache_manager& kv, tangram::answer_window window)
      : kv_(kv), window_(window), host_limit_(window.host_limit_bytes(kv.pool().arena_bytes())) {}

  tangram::answer_window const& window() const { return window_; }
  std::int64_t tick() { return ++clock_; }

  /// Before a decode step: parked turns resume first (oldest first; idle sessions are parked to
  /// make room for them), then every turn at the end of its reservation grows by a window.
  void grow(std::vector<request>& running, std::vector<request>& idle) {
    while (!turns_.empty()) {
      auto& p     = turns_.front();
      auto grown  = p.session.max_new + window_.growth(max_tokens, p.session.max_new);
      auto resume = kv_.try_resume(
          p.session, p.session.decoded < p.session.max_new ? p.session.max_new : grown);
      if (!resume) {
        // Pages awaiting their release (deferred reuse) come back within two steps: wait for
        // them rather than park more.
        if (kv_.retired_pages() == 0 && park_victim(running, idle, /*idle_only=*/true)) continue;
        break;  // waits for memory
      }
      tangram::copy_pages_from_host(kv_.pool().base(),
                                    p.session.page_bytes,
                                    resume->device_pages.data(),
                                    resume->device_pages.size(),
                                    p.host.data());
      host_used_ -= static_cast<std::int64_t>(p.host.size());
      running.push_back({resume->id, p.req.answer, tick(), p.req.key});
      turns_.pop_front();
    }
    for (std::size_t i = 0; i < running.size(); ++i) {
      auto info = kv_.info(running[i].id);
      if (info.phase != tangram::sequence_phase::decode || info.decoded < info.max_new ||
          info.decoded >= running[i].answer)
        continue;
      auto id   = running[i].id;
      auto more = window_.growth(max_tokens, info.max_new);
      while (!kv_.try_extend(id, more)) {
        // It waits a step (decodes nothing) while freed pages await their release, or when
        // nothing may be parked; else the victim goes (perhaps the growing turn itself).
        if (kv_.retired_pages() > 0 || !park_victim(running, idle, false)) break;
        if (!kv_.contains(id)) break;
      }
      if (!kv_.contains(id)) --i;  // `running` lost it
    }
  }

  /// Parks the window's victim among the idle sessions and (unless `idle_only`) the running
  /// turns in decode, within the host memory left. False when none may be parked.
  bool park_victim(std::vector<request>& running, std::vector<request>& idle, bool idle_only) {
    std::vector<tangram::park_candidate> candidates;
    std::vector<std::pair<std::vector<request>*, std::size_t>> where;
    auto add = [&](std::vector<request>& list) {
      for (std::size_t i = 0; i < list.size(); ++i) {
        auto info = kv_.info(list[i].id);
        candidates.push_back({list[i].id, info.phase, list[i].last_used, info.held_pages});
        where.emplace_back(&list, i);
      }
    };
    add(idle);
    if (!idle_only) add(running);
    auto k = window_.choose_victim(candidates, kv_.pool().page_bytes(), host_limit_ - host_used_);
    if (!k) return false;
    auto [list, i] = where[*k];
    parked p{kv_.park((*list)[i].id), {}, (*list)[i]};
    p.host.resize(p.session.device_pages.size() * static_cast<std::size_t>(p.session.page_bytes));
    tangram::copy_pages_to_host(kv_.pool().base(),
                                p.session.page_bytes,
                                p.session.device_pages.data(),
                                p.session.device_pages.size(),
                                p.host.data());  // the engine's copy-out
    kv_.complete_park((*list)[i].id);
    host_used_ += static_cast<std::int64_t>(p.host.size());
    list->erase(list->begin() + static_cast<std::ptrdiff_t>(i));
    if (p.session.mid_turn)
      turns_.push_back(std::move(p));
    else
      sessions_.push_back(std::move(p));
    return true;
  }

  /// The idle session of request `key` if it was parked (its next turn restores it).
  std::optional<parked> take_parked_session(int key) {
    for (auto it = sessions_.begin(); it != sessions_.end(); ++it)
      if (it->req.key == key) {
        parked p = std::move(*it);
        sessions_.erase(it);
        host_used_ -= static_cast<std::int64_t>(p.host.size());
        return p;
      }
    return std::nullopt;
  }
  bool turns_waiting() const { return !turns_.empty(); }
  /// Forgets the parked idle sessions (their users left): their host copies go.
  void drop_parked_sessions() {
    for (auto const& p : sessions_) host_used_ -= static_cast<std::int64_t>(p.host.size());
    sessions_.clear();
  }

  static constexpr std::int64_t max_tokens = 64;  ///< every request's max_tokens here

 private:
  tangram::kv_cache_manager& kv_;
  tangram::answer_window window_;
  std::int64_t host_limit_ = 0, host_used_ = 0, clock_ = 0;
  std::deque<parked> turns_;      ///< running turns parked mid-answer, oldest first
  std::vector<parked> sessions_;  ///< ended sessions parked while idle
};

}  // namespace

int main(int argc, char** argv) {
  bool json          = false;
  bool static_budgets = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--json") == 0) {
      json = true;
    } else if (std::strcmp(argv[i], "--reservation") == 0 && i + 1 < argc &&
               (std::strcmp(argv[i + 1], "static") == 0 ||
                std::strcmp(argv[i + 1], "elastic") == 0)) {
      static_budgets = std::strcmp(argv[++i], "static") == 0;
    } else {
      std::fprintf(stderr, "usage: %s [--json] [--reservation elastic|static], got '%s'\n",
                   argv[0], argv[i]);
      return 2;
    }
  }
  auto samples = tangram::load_retention_samples(std::string(TANGRAM_DATA_DIR) +
                                                 "/profiles/snapkv/llama-3.1-8b-instruct.json");
  tangram::plan_options plan_options;  // elastic reservation unless --reservation static
  if (static_budgets) plan_options.reservation.mode = tangram::reservation_mode::static_budgets;
  // An elastic plan weighs its split map on the samples' placements (docs/integration.md §1).
  auto plan = tangram::build_static_plan(tangram::model_preset("llama-3.1-8b"),
                                         tangram::calibrate(samples), plan_options, samples);
  tangram::host_memory_resource memory;
  tangram::manager_options options;
  // Pages of one head each (the default per-head pages): 32,000 hold four of these requests at
  // once, so admission stops with requests waiting and answers that grow must park sessions. Both
  // reservations admit the same: below the profile's 4128 protected tokens nothing is compressed,
  // and no admission reserves more than the request uncompressed (docs/memory.md).
  options.num_pages     = 32000;
  options.max_sequences = 16;
  options.deferred_reuse = true;  // freed pages wait for the engine's release (several streams)
  tangram::kv_cache_manager kv(plan, memory, options);
  // Answers reserve 16 tokens at a time here (the default window, 256, exceeds these answers).
  tangram::answer_window_options window_options;
  window_options.window_tokens = 16;
  answer_scheduler answers(kv, tangram::answer_window(window_options));
  auto const& window = answers.window();
  std::vector<checkpoint> trace;

  // Admission until full: a request reserves its prompt and one answer window, or waits.
  std::deque<std::pair<std::int64_t, std::int64_t>> waiting;  // (prompt, answer length)
  for (int i = 0; i < 14; ++i) waiting.emplace_back(300 + 100 * i, 40 + 4 * i);
  std::vector<request> running, idle;
  while (!waiting.empty()) {
    auto result = kv.admit(waiting.front().first, window.first(answer_scheduler::max_tokens));
    if (!result) {
      if (!json)
        std::printf("waiting: %s, %lld pages missing\n",
                    std::string(tangram::to_string(result.reason)).c_str(),
                    static_cast<long long>(result.pages_missing));
      break;
    }
    running.push_back(
        {*result.id, waiting.front().second, answers.tick(), static_cast<int>(running.size())});
    waiting.pop_front();
  }
  trace.push_back(snapshot("admitted", kv));
  // Mixed steps: each step resumes parked turns and grows the answers that reached their window
  // (parking a session when a growth does not fit), then prefills the next chunk of the first
  // `chunks_per_step` requests still in prefill (the prefill batch, one eviction launch) beside
  // one decode token for every request answering (the decode batch, padded to max_batch: a CUDA
  // graph captured once at that size replays every step). A finished answer ends its turn: the
  // session stays on the GPU, idle, until it is parked or continues.
  constexpr std::size_t chunks_per_step = 2;
  auto const graph_batch = static_cast<std::size_t>(kv.options().max_batch);
  bool prefilled         = false;
  int mixed_steps        = 0;
  std::int64_t in_flight = -1;  // the epoch of the step the device still runs
  // The decode split map balanced per step for the batch's head lengths (allocated once): on a
  // GPU `tangram::balance_decode_splits` after `mirror.sync`, and the step's decode launches take
  // its view() as `decode_params::splits`; here the CPU reference writes it.
  std::vector<std::int32_t> balanced_map(static_cast<std::size_t>(plan.num_layers) *
                                         static_cast<std::size_t>(plan.num_kv_heads + 1));
  tangram::balanced_split_params balanced;
  balanced.num_ctas  = plan.splits.num_ctas();
  balanced.cta_begin = balanced_map.data();
  for (;;) {
    answers.grow(running, idle);
    std::vector<tangram::sequence_id> to_prefill, to_decode;
    bool any_prefill = false;
    for (auto const& r : running) {
      auto i = kv.info(r.id);
      any_prefill |= i.phase == tangram::sequence_phase::prefill;
      if (i.phase == tangram::sequence_phase::prefill && to_prefill.size() < chunks_per_step)
        to_prefill.push_back(r.id);
      if (i.phase == tangram::sequence_phase::decode && i.decoded < i.max_new)
        to_decode.push_back(r.id);
    }
    if (!any_prefill && !prefilled) {
      trace.push_back(snapshot("prefilled", kv));
      prefilled = true;
    }
    if (running.empty() && !answers.turns_waiting()) break;
    if (!to_prefill.empty() && !to_decode.empty()) ++mixed_steps;
    // The decode batch: decode_step skips the padding; the append and attention kernels would
    // run over kv.view() (= view(batch_kind::decode)), a no-op for padding requests.
    kv.set_batch(tangram::batch_kind::decode, to_decode, graph_batch);
    if (!to_decode.empty()) {
      kv.decode_step();
      balanced.kv = kv.view();
      tangram::reference::balance_decode_splits(balanced);
    }
    if (!to_prefill.empty()) prefill_chunks(kv, to_prefill);
    // Finished answers end their turns (unused reservation back; the history stays).
    for (std::size_t i = 0; i < running.size();) {
      auto info = kv.info(running[i].id);
      if (info.phase != tangram::sequence_phase::decode || info.decoded < running[i].answer) {
        ++i;
        continue;
      }
      kv.end_turn(running[i].id);
      idle.push_back({running[i].id, running[i].answer, answers.tick(), running[i].key});
      running.erase(running.begin() + static_cast<std::ptrdiff_t>(i));
    }
    // End of the step: close its epoch; the previous step's work is done by now, so the pages it
    // freed (evicted tokens' pages, parked sessions' pages) become reusable.
    auto done = kv.advance_epoch();
    if (in_flight >= 0) kv.release_epochs_through(in_flight);
    in_flight = done;
  }
  settle(kv);
  trace.push_back(snapshot("decoded", kv));
  if (mixed_steps == 0 || kv.stats().parked_mid_turn == 0 || kv.stats().resumed == 0) {
    std::fprintf(stderr,
                 "no step mixed prefill chunks and decodes, or no turn parked and resumed\n");
    return 1;
  }

  // A second turn for the first session (request 0, on the GPU or parked while idle); the others
  // leave (their users are done).
  tangram::sequence_id first{};
  for (auto const& r : idle) {
    if (r.key == 0)
      first = r.id;
    else
      kv.free(r.id);
  }
  auto first_parked = answers.take_parked_session(0);
  answers.drop_parked_sessions();
  trace.push_back(snapshot("turn_ended", kv));  // the freed pages wait for their release
  settle(kv);
  if (first_parked) {  // parked while idle: restored with its next turn
    auto back =
        kv.try_unpark(first_parked->session, 300, window.first(answer_scheduler::max_tokens));
    if (!back) {
      std::fprintf(stderr, "the second turn did not fit\n");
      return 1;
    }
    first = back->id;
    tangram::copy_pages_from_host(kv.pool().base(),
                                  first_parked->session.page_bytes,
                                  back->device_pages.data(),
                                  back->device_pages.size(),
                                  first_parked->host.data());
  } else if (!kv.continue_turn(first, 300, window.first(answer_scheduler::max_tokens))) {
    std::fprintf(stderr, "the second turn did not fit\n");  // "does not fit" is a return value
    return 1;
  }
  prefill(kv, first);
  trace.push_back(snapshot("second_turn", kv));
  // Speculative decoding: 4 draft tokens, then the 3 the verifier rejected are rolled back.
  kv.set_batch({first});
  std::vector<std::int32_t> drafts(1, 4);
  kv.decode_step(drafts.data(), drafts.size());
  kv.rollback(first, 3);
  trace.push_back(snapshot("rolled_back", kv));
  // A fork shares the parent's pages copy-on-write; both decode.
  if (auto child = kv.fork(first)) {
    kv.execute_page_copies_host();
    trace.push_back(snapshot("forked", kv));
    decode(kv, {first, *child}, 8);
    kv.free(*child);
  } else {
    decode(kv, {first}, 8);
  }
  settle(kv);
  trace.push_back(snapshot("fork_done", kv));
  // The answer reaches its window and grows by another (all or nothing; nothing else is live).
  decode(kv, {first}, static_cast<int>(kv.info(first).max_new - kv.info(first).decoded));
  if (!kv.try_extend(first, window.growth(answer_scheduler::max_tokens, kv.info(first).max_new))) {
    std::fprintf(stderr, "could not extend the second turn\n");
    return 1;
  }
  decode(kv, {first}, 16);  // to the end of the grown reservation
  trace.push_back(snapshot("extended", kv));

  // The session idles between turns: park it in host memory (its pages go back to the pool),
  // then bring it back into fresh pages for a third turn.
  kv.end_turn(first);
  auto parked_first = kv.park(first);
  std::vector<std::byte> host(
      static_cast<std::size_t>(parked_first.host_pages() * parked_first.page_bytes));
  tangram::copy_pages_to_host(kv.pool().base(),
                              parked_first.page_bytes,
                              parked_first.device_pages.data(),
                              parked_first.device_pages.size(),
                              host.data());  // the engine's copy-out
  kv.complete_park(first);
  settle(kv);
  trace.push_back(snapshot("parked", kv));
  auto restored = kv.try_unpark(parked_first, 200, 16);  // "does not fit" is nullopt
  if (!restored) {
    std::fprintf(stderr, "the parked session did not fit back\n");
    return 1;
  }
  first = restored->id;
  // The copy-in, before any kernel reads the sequence.
  tangram::copy_pages_from_host(kv.pool().base(),
                                parked_first.page_bytes,
                                restored->device_pages.data(),
                                restored->device_pages.size(),
                                host.data());
  prefill(kv, first);
  decode(kv, {first}, 16);
  trace.push_back(snapshot("unparked", kv));
  kv.free(first);
  settle(kv);
  kv.check_invariants();
  trace.push_back(snapshot("freed", kv));

  auto const& s = kv.stats();
  if (json) {
    std::printf("{\"admitted\": %lld, \"rejected_waiting\": %zu, \"reclaimed_pages\": %lld, "
                "\"parks\": %lld, \"resumed\": %lld,\n",
                static_cast<long long>(s.admitted), waiting.size(),
                static_cast<long long>(s.reclaimed_pages), static_cast<long long>(s.parked),
                static_cast<long long>(s.resumed));
    // Every counter of manager_stats, as Python's `kv.stats` names them.
    std::pair<char const*, std::int64_t> const counters[] = {
        {"admitted", s.admitted},
        {"rejected", s.rejected},
        {"turns_continued", s.turns_continued},
        {"continue_rejected", s.continue_rejected},
        {"forks", s.forks},
        {"fork_rejected", s.fork_rejected},
        {"freed", s.freed},
        {"pages_drawn", s.pages_drawn},
        {"surplus_pages_released", s.surplus_pages_released},
        {"reclaimed_pages", s.reclaimed_pages},
        {"page_copies", s.page_copies},
        {"index_compactions", s.index_compactions},
        {"staging_pages_returned", s.staging_pages_returned},
        {"extended", s.extended},
        {"extend_rejected", s.extend_rejected},
        {"rolled_back_tokens", s.rolled_back_tokens},
        {"rollback_pages_returned", s.rollback_pages_returned},
        {"parked", s.parked},
        {"parked_mid_turn", s.parked_mid_turn},
        {"unparked", s.unparked},
        {"unpark_rejected", s.unpark_rejected},
        {"resumed", s.resumed},
        {"resume_rejected", s.resume_rejected},
        {"pages_parked", s.pages_parked},
        {"pages_restored", s.pages_restored},
        {"spare_pages_kept", s.spare_pages_kept},
        {"prefix_admits", s.prefix_admits},
        {"prefix_rejected", s.prefix_rejected},
        {"prefix_pages_shared", s.prefix_pages_shared}};
    std::printf(" \"stats\": {");
    for (std::size_t i = 0; i < std::size(counters); ++i)
      std::printf("%s\"%s\": %lld",
                  i ? ", " : "",
                  counters[i].first,
                  static_cast<long long>(counters[i].second));
    std::printf("},\n");
    std::printf(" \"checkpoints\": [\n");
    for (std::size_t i = 0; i < trace.size(); ++i) {
      auto const& c = trace[i];
      std::printf("  {\"label\": \"%s\", \"used_pages\": %lld, \"reserved_pages\": %lld, "
                  "\"available_pages\": %lld, \"retired_pages\": %lld, \"live_sequences\": %lld, "
                  "\"pages_drawn\": %lld}%s\n",
                  c.label.c_str(), static_cast<long long>(c.used_pages),
                  static_cast<long long>(c.reserved_pages),
                  static_cast<long long>(c.available_pages),
                  static_cast<long long>(c.retired_pages),
                  static_cast<long long>(c.live_sequences), static_cast<long long>(c.pages_drawn),
                  i + 1 < trace.size() ? "," : "");
    }
    std::printf(" ]}\n");
  } else {
    for (auto const& c : trace)
      std::printf(
          "%-12s used %6lld  reserved %6lld  available %6lld  retired %5lld  live %2lld  drawn "
          "%6lld\n",
          c.label.c_str(), static_cast<long long>(c.used_pages),
          static_cast<long long>(c.reserved_pages), static_cast<long long>(c.available_pages),
          static_cast<long long>(c.retired_pages),
          static_cast<long long>(c.live_sequences),
          static_cast<long long>(c.pages_drawn));
    std::printf("admitted %lld, rejected_waiting %zu, reclaimed_pages %lld, parks %lld, "
                "resumed %lld\n",
                static_cast<long long>(s.admitted), waiting.size(),
                static_cast<long long>(s.reclaimed_pages), static_cast<long long>(s.parked),
                static_cast<long long>(s.resumed));
  }
  auto const& end = trace.back();
  return end.used_pages == 0 && end.reserved_pages == 0 && end.retired_pages == 0 &&
                 end.live_sequences == 0
             ? 0
             : 1;
}
