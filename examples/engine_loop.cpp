// SPDX-License-Identifier: Apache-2.0
// An engine loop over kv_cache_manager (docs/integration.md), the C++ twin of
// examples/python/engine_loop.py: the same requests, the same calls, the same page accounting
// (python/tests/test_engine_loop.py compares the two checkpoint by checkpoint).
//
// Admission until the pool is full (with the reason when a request does not fit), mixed steps as
// vLLM v1 / SGLang schedule them (one prefill chunk of every request still in prefill, evicted by
// one launch over the prefill batch, beside a decode step over the decode batch, padded to a fixed
// capacity as a CUDA graph would be), chunked prefill (prepare, eviction, commit), decode steps
// over a batch, speculative tokens rolled back, a turn's
// reservation extended, a second turn, a copy-on-write fork, the session parked in host memory and
// brought back for a third turn, and free: at the end every page and slot is back. Pages are
// reused only after the work that read them is done (deferred reuse: one epoch per step, released
// a step later, as a GPU running one step behind the host would be). Each chunk is evicted by the CPU reference kernel (`reference::evict_chunk`,
// layer by layer, key-norm scores) on K/V written into the manager's own host pool, as the CUDA
// kernel would on a device pool. Under elastic reservation (the default) every layer stages the
// chunk and its keys, and one request-wide `reference::evict_elastic` per chunk chooses the
// groups' lengths within `elastic_page_limit`; under static budgets (`--reservation static`) the
// counts are known in advance, so the loop checks them against `expected_kept`.
//
// Run: build/examples/example_engine_loop [--json] [--reservation elastic|static]
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

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
  // Elastic: every layer stages its chunk and writes its candidates' keys [B][L * H][candidates].
  std::vector<std::uint32_t> keys(elastic ? B * static_cast<std::size_t>(L * H) *
                                                static_cast<std::size_t>(max_candidates)
                                          : 0);
  tangram::eviction_params p;
  p.kv             = kv.view(tangram::batch_kind::prefill);
  p.sink           = plan.profile.sink_tokens;
  p.chunk_indptr   = indptr.data();
  p.chunk_k        = data.data();
  p.chunk_v        = data.data();
  p.max_candidates = max_candidates;
  p.source         = tangram::score_source::key_norm;
  p.group          = plan.model.gqa_group();
  p.stage_keys     = elastic ? keys.data() : nullptr;
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
    e.keys           = keys.data();
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
  // Elastic reserves one chunk's staging per compressed group on top of what the prompt keeps
  // (these prompts are below the profile's protected 4128 tokens: nothing is compressed), so the
  // same three requests need a larger pool (docs/integration.md, page accounting).
  options.num_pages     = static_budgets ? 8000 : 12000;
  options.max_sequences = 16;
  options.deferred_reuse = true;  // freed pages wait for the engine's release (several streams)
  tangram::kv_cache_manager kv(plan, memory, options);
  std::vector<checkpoint> trace;

  // Admission until full: the reservation is exact, so "does not fit" is known up front.
  std::deque<std::pair<std::int64_t, std::int64_t>> waiting;  // (prompt, max new tokens)
  for (int i = 0; i < 12; ++i) waiting.emplace_back(300 + 100 * i, 64);
  std::vector<tangram::sequence_id> running;
  while (!waiting.empty()) {
    auto result = kv.admit(waiting.front().first, waiting.front().second);
    if (!result) {
      if (!json)
        std::printf("waiting: %s, %lld pages missing\n",
                    std::string(tangram::to_string(result.reason)).c_str(),
                    static_cast<long long>(result.pages_missing));
      break;
    }
    waiting.pop_front();
    running.push_back(*result.id);
  }
  trace.push_back(snapshot("admitted", kv));
  // Mixed steps: each step prefills the next chunk of the first `chunks_per_step` requests still
  // in prefill (the prefill batch, one eviction launch; the scheduler's prefill budget) beside
  // one decode token for every request already in decode (the decode batch, padded to max_batch:
  // a CUDA graph captured once at that size replays every step), until every request is
  // prefilled and has decoded 32 tokens. With three requests of one chunk each: step 0 prefills
  // two, step 1 prefills the third beside the first two's decodes, then decodes only.
  constexpr std::size_t chunks_per_step = 2;
  auto const graph_batch = static_cast<std::size_t>(kv.options().max_batch);
  bool prefilled         = false;
  int mixed_steps        = 0;
  std::int64_t in_flight = -1;  // the epoch of the step the device still runs
  for (;;) {
    std::vector<tangram::sequence_id> to_prefill, to_decode;
    for (auto seq : running) {
      auto i = kv.info(seq);
      if (i.phase == tangram::sequence_phase::prefill && to_prefill.size() < chunks_per_step)
        to_prefill.push_back(seq);
      if (i.phase == tangram::sequence_phase::decode && i.decoded < 32) to_decode.push_back(seq);
    }
    bool any_prefill = false;
    for (auto seq : running)
      any_prefill |= kv.info(seq).phase == tangram::sequence_phase::prefill;
    if (!any_prefill && !prefilled) {
      trace.push_back(snapshot("prefilled", kv));
      prefilled = true;
    }
    if (to_prefill.empty() && to_decode.empty()) break;
    if (!to_prefill.empty() && !to_decode.empty()) ++mixed_steps;
    // The decode batch: decode_step skips the padding; the append and attention kernels would
    // run over kv.view() (= view(batch_kind::decode)), a no-op for padding requests.
    kv.set_batch(tangram::batch_kind::decode, to_decode, graph_batch);
    if (!to_decode.empty()) kv.decode_step();
    if (!to_prefill.empty()) prefill_chunks(kv, to_prefill);
    // End of the step: close its epoch; the previous step's work is done by now, so the pages it
    // freed (evicted tokens' pages) become reusable.
    auto done = kv.advance_epoch();
    if (in_flight >= 0) kv.release_epochs_through(in_flight);
    in_flight = done;
  }
  settle(kv);
  trace.push_back(snapshot("decoded", kv));
  if (mixed_steps == 0) {
    std::fprintf(stderr, "no step mixed prefill chunks and decodes\n");
    return 1;
  }
  // Speculative decoding: 4 draft tokens per member, then the rejected ones are rolled back.
  kv.set_batch(running);
  std::vector<std::int32_t> drafts(running.size(), 4);
  kv.decode_step(drafts.data(), drafts.size());
  for (auto seq : running) kv.rollback(seq, 3);  // 1 of 4 accepted
  trace.push_back(snapshot("rolled_back", kv));
  // The first session's answer runs long: grow its reservation (all or nothing).
  if (!kv.try_extend(running[0], 32)) {
    std::fprintf(stderr, "could not extend the first turn\n");
    return 1;
  }
  decode(kv, {running[0]}, 64 + 32 - 33);  // to the end of the extended turn
  trace.push_back(snapshot("extended", kv));

  // A second turn for the first session; the others end.
  auto first = running[0];
  kv.end_turn(first);  // keeps the compressed history, returns the unused reservation
  for (std::size_t i = 1; i < running.size(); ++i) kv.free(running[i]);
  trace.push_back(snapshot("turn_ended", kv));  // the freed pages wait for their release
  settle(kv);
  if (!kv.continue_turn(first, 300, 32)) {  // "does not fit" is a return value
    std::fprintf(stderr, "the second turn did not fit\n");
    return 1;
  }
  prefill(kv, first);
  trace.push_back(snapshot("second_turn", kv));
  // A fork shares the parent's pages copy-on-write.
  if (auto child = kv.fork(first)) {
    kv.execute_page_copies_host();
    trace.push_back(snapshot("forked", kv));
    decode(kv, {first, *child}, 32);
    kv.free(*child);
  } else {
    decode(kv, {first}, 32);
  }
  settle(kv);
  trace.push_back(snapshot("fork_done", kv));

  // The session idles between turns: park it in host memory (its pages go back to the pool),
  // then bring it back into fresh pages for a third turn.
  kv.end_turn(first);
  auto parked = kv.park(first);
  std::vector<std::byte> host(static_cast<std::size_t>(parked.host_pages() * parked.page_bytes));
  tangram::copy_pages_to_host(kv.pool().base(), parked.page_bytes, parked.device_pages.data(),
                              parked.device_pages.size(), host.data());  // the engine's copy-out
  kv.complete_park(first);
  settle(kv);
  trace.push_back(snapshot("parked", kv));
  auto restored = kv.try_unpark(parked, 200, 16);  // "does not fit" is nullopt
  if (!restored) {
    std::fprintf(stderr, "the parked session did not fit back\n");
    return 1;
  }
  first = restored->id;
  // The copy-in, before any kernel reads the sequence.
  tangram::copy_pages_from_host(kv.pool().base(), parked.page_bytes,
                                restored->device_pages.data(), restored->device_pages.size(),
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
    std::printf("{\"admitted\": %lld, \"rejected_waiting\": %zu, \"reclaimed_pages\": %lld,\n",
                static_cast<long long>(s.admitted), waiting.size(),
                static_cast<long long>(s.reclaimed_pages));
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
                  static_cast<long long>(c.live_sequences), static_cast<long long>(c.pages_drawn));
    std::printf("admitted %lld, rejected_waiting %zu, reclaimed_pages %lld\n",
                static_cast<long long>(s.admitted), waiting.size(),
                static_cast<long long>(s.reclaimed_pages));
  }
  auto const& end = trace.back();
  return end.used_pages == 0 && end.reserved_pages == 0 && end.retired_pages == 0 &&
                 end.live_sequences == 0
             ? 0
             : 1;
}
