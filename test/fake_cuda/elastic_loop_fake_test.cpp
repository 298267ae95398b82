// SPDX-License-Identifier: Apache-2.0
// The sync-free elastic engine loop (docs/integration.md, "Elastic chunks without a host wait")
// against the fake CUDA runtime (shim/cuda_runtime_api.h), whose stream work runs only when the
// test lets the "GPU" progress: kv_view_mirror uploads the page tables, the stage and elastic
// eviction launches run as host functions in stream order (the CPU references standing in for the
// kernels, over the mirror's "device" arrays), async_readback brings `new_len` back into pinned
// slots, and the host commits each chunk once `ready` says its copy landed. The GPU trails the
// host by one step, as an engine that plans step k + 1 while step k runs.
//
// Checked: no call that makes the host wait for the device (cudaEventSynchronize,
// cudaStreamSynchronize, cudaDeviceSynchronize, a synchronous cudaMemcpy) in any step, chunk or
// decode; and every request ends with the same heads, token for token, as the same requests run
// by a synchronous loop (kernels run at once, commit at once).
#include <cuda_runtime_api.h>  // the fake: shim/ comes first on the include path

#include <catch2/catch.hpp>

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "../../kernels/async_readback.cu"
#include "../memory/memory_fixtures.hpp"
#include "tangram/device/async_readback.hpp"
#include "tangram/device/kv_view_mirror.hpp"
#include "tangram/kernels/head_cursor.hpp"
#include "tangram/memory/host_memory_resource.hpp"
#include "tangram/reference/elastic_eviction.hpp"
#include "tangram/reference/eviction.hpp"

using namespace tangram;
using namespace tangram::test;

namespace {

/// A deterministic value in [0, 1) from a few integers (scores and K/V noise that depend only on
/// the request, its chunk, the head and the position, never on the batch or the step).
float hash01(std::uint64_t a, std::uint64_t b, std::uint64_t c, std::uint64_t d) {
  std::uint64_t x = a * 0x9E3779B97F4A7C15ull ^ (b + 0x632BE59BD9B4E019ull) * 0xC2B2AE3D27D4EB4Full;
  x ^= (c + 17) * 0x165667B19E3779F9ull;
  x ^= (d + 5) * 0xD6E8FEB86659FD93ull;
  x ^= x >> 31;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 29;
  return static_cast<float>(x >> 40) / static_cast<float>(1ull << 24);
}

/// The requests: (prompt, answer tokens, chunk size).
struct request_spec {
  std::int64_t prompt, answer, chunk;
};

std::vector<request_spec> requests() {
  return {{37, 6, 8}, {21, 4, 8}, {8, 3, 8}, {29, 5, 6}, {16, 2, 8}};
}

/// One step's GPU work on the prefill batch: the stage launch of every layer, then the elastic
/// selection, writing new_len and pages_out. Every buffer lives here until the readback landed.
struct gpu_step {
  static_plan const* plan = nullptr;
  kv_cache_view view;  ///< the mirror's prefill view as of this step's sync (or the host's)
  std::vector<std::int32_t> indptr;
  std::int32_t max_candidates = 1;
  std::vector<float> chunk_k, chunk_v, scores;  ///< scores [layer][batch][H][max_candidates]
  std::vector<std::uint32_t> keys;     ///< the stage keys (stage_key_layout of the host view)
  std::vector<std::int64_t> key_base;  ///< [batch * G]
  std::vector<std::int32_t> stage_len, new_len;
  std::vector<std::int64_t> wanted, limit, pages_out;

  void run() {
    std::int32_t const L = plan->num_layers, H = plan->num_kv_heads;
    auto const B = static_cast<std::size_t>(view.batch_size);
    for (std::int32_t l = 0; l < L; ++l) {
      eviction_params p;
      p.kv             = view;
      p.layer          = l;
      p.rules          = plan->rules.data() + l * H;
      p.sink           = plan->profile.sink_tokens;
      p.chunk_indptr   = indptr.data();
      p.chunk_k        = chunk_k.data();
      p.chunk_v        = chunk_v.data();
      p.max_candidates = max_candidates;
      p.source         = score_source::supplied;
      p.scores = scores.data() + static_cast<std::size_t>(l) * B * static_cast<std::size_t>(H) *
                                     static_cast<std::size_t>(max_candidates);
      p.new_len    = stage_len.data();
      p.stage_keys     = keys.data();
      p.stage_key_base = key_base.data();
      reference::evict_chunk(p);
    }
    elastic_eviction_params e;
    e.kv             = view;
    e.rules          = plan->rules.data();
    e.sink           = plan->profile.sink_tokens;
    e.chunk_indptr   = indptr.data();
    e.max_candidates = max_candidates;
    e.stage_keys     = keys.data();
    e.stage_key_base = key_base.data();
    e.wanted         = wanted.data();
    e.page_limit     = limit.data();
    e.new_len        = new_len.data();
    e.pages_out      = pages_out.data();
    reference::evict_elastic(e);
  }
  static void CUDART_CB launch(void* self) { static_cast<gpu_step*>(self)->run(); }
};

/// Per request of the loop: its sequence, where it is, and the chunk whose commit is pending.
struct request_state {
  sequence_id id;
  std::int64_t seen = 0, chunks = 0, decoded = 0;
  gpu_step* pending = nullptr;  ///< the step that evicts its last chunk, until committed
  std::int32_t row  = 0;        ///< its row in that step's batch
};

/// Builds the GPU work of one prefill step over `view` (batch order = `batch`), after every
/// `prepare_chunk`; the host values (wanted, limit, candidates) come from the manager.
std::unique_ptr<gpu_step> make_step(static_plan const& plan,
                                    kv_cache_manager const& m,
                                    kv_cache_view const& host_view,
                                    kv_cache_view const& run_view,
                                    std::vector<std::size_t> const& batch,
                                    std::vector<request_state> const& st,
                                    std::vector<request_spec> const& spec) {
  std::int32_t const L = plan.num_layers, H = plan.num_kv_heads, d = plan.geometry.head_dim;
  auto g  = std::make_unique<gpu_step>();
  g->plan = &plan;
  g->view = run_view;
  g->indptr.assign(1, 0);
  for (auto q : batch)
    g->indptr.push_back(g->indptr.back() + static_cast<std::int32_t>(std::min(
                                               spec[q].chunk, spec[q].prompt - st[q].seen)));
  auto B = static_cast<std::int32_t>(batch.size());
  for (std::int32_t r = 0; r < B; ++r)
    for (std::int32_t i = 0; i < L * H; ++i)
      g->max_candidates = std::max(
          g->max_candidates, host_view.head_len(r, i / H, i % H) + g->indptr[r + 1] - g->indptr[r]);
  std::int32_t rows = g->indptr.back();
  g->chunk_k.resize(static_cast<std::size_t>(rows * H * d));
  g->chunk_v.resize(g->chunk_k.size());
  for (std::int32_t r = 0; r < B; ++r) {
    auto q = batch[static_cast<std::size_t>(r)];
    for (std::int32_t t = g->indptr[r]; t < g->indptr[r + 1]; ++t)
      for (std::int32_t h = 0; h < H; ++h)
        for (std::int32_t x = 0; x < d; ++x) {
          auto pos       = static_cast<std::uint64_t>(st[q].seen + t - g->indptr[r]);
          auto at        = static_cast<std::size_t>((t * H + h) * d + x);
          float id       = static_cast<float>(q * 1000 + pos);  // element 0: the token's id
          g->chunk_k[at] = x == 0 ? id : hash01(q, pos, static_cast<std::uint64_t>(h), 1 + x);
          g->chunk_v[at] = x == 0 ? id : hash01(q, pos, static_cast<std::uint64_t>(h), 100 + x);
        }
  }
  auto M = static_cast<std::size_t>(g->max_candidates);
  g->scores.assign(static_cast<std::size_t>(L * B * H) * M, 0.f);
  for (std::int32_t l = 0; l < L; ++l)
    for (std::int32_t r = 0; r < B; ++r)
      for (std::int32_t h = 0; h < H; ++h)
        for (std::size_t c = 0; c < M; ++c)
          g->scores[((static_cast<std::size_t>(l) * B + r) * H + h) * M + c] =
              hash01(batch[static_cast<std::size_t>(r)] * 64 +
                         static_cast<std::uint64_t>(st[batch[r]].chunks),
                     static_cast<std::uint64_t>(l),
                     static_cast<std::uint64_t>(h),
                     c);
  g->key_base.resize(static_cast<std::size_t>(B * host_view.num_groups));
  g->keys.assign(static_cast<std::size_t>(stage_key_layout(
                     host_view, plan.rules.data(), g->indptr.data(), g->key_base.data())),
                 0);
  g->stage_len.assign(static_cast<std::size_t>(B * H), 0);
  g->new_len.assign(static_cast<std::size_t>(B * L * H), -7);
  g->pages_out.assign(static_cast<std::size_t>(B), -7);
  for (auto q : batch) {
    g->wanted.push_back(m.elastic_wanted_tokens(st[q].id));
    g->limit.push_back(m.elastic_page_limit(st[q].id));
  }
  return g;
}

/// What every growing head of a request holds from its prompt: the token ids, in order (sliding
/// rings, which mix in decode tokens, and decode positions, never written here, are left out).
using heads_t = std::vector<std::vector<std::int64_t>>;

heads_t heads_of(kv_cache_manager& m, sequence_id id) {
  std::int32_t const L = m.plan().num_layers, H = m.plan().num_kv_heads;
  m.set_batch(batch_kind::prefill, {id});
  auto v = m.view(batch_kind::prefill);
  heads_t out(static_cast<std::size_t>(L * H));
  for (std::int32_t i = 0; i < L * H; ++i) {
    if (m.plan().rules[static_cast<std::size_t>(i)].kind == layer_kind::sliding_window) continue;
    auto cur          = make_head_cursor(v, 0, i / H, i % H);
    std::int32_t base = v.head_len(0, i / H, i % H) - v.appended[v.batch_slots[0]];
    for (std::int32_t pos = 0; pos < base; ++pos)
      out[static_cast<std::size_t>(i)].push_back(
          static_cast<std::int64_t>(*cur.ptr_at_position<float>(pos, 0)));
  }
  return out;
}

static_plan loop_plan() {
  reservation_options r;
  r.mode   = reservation_mode::elastic;
  r.margin = default_elastic_margin;
  return tiny_plan(tiny_budgets(), 4, default_group_size, 10, grouping_scope::global, r);
}

manager_options loop_options() {
  auto o             = opts(600, 8);
  o.max_chunk_tokens = 8;
  return o;
}

/// The synchronous loop: every chunk's kernels run at once on the host view and commit at once.
std::vector<heads_t> run_synchronously(static_plan const& plan) {
  host_memory_resource mr;
  kv_cache_manager m(plan, mr, loop_options());
  auto spec = requests();
  std::vector<request_state> st(spec.size());
  std::vector<heads_t> out(spec.size());
  for (std::size_t q = 0; q < spec.size(); ++q) {
    st[q].id = *m.try_admit(spec[q].prompt, spec[q].answer);
    while (st[q].seen < spec[q].prompt) {
      auto c = std::min(spec[q].chunk, spec[q].prompt - st[q].seen);
      m.prepare_chunk(st[q].id, c);
      m.set_batch(batch_kind::prefill, {st[q].id});
      auto v = m.view(batch_kind::prefill);
      auto g = make_step(plan, m, v, v, {q}, st, spec);
      g->run();
      REQUIRE(g->pages_out[0] >= 0);
      m.commit_chunk(st[q].id, g->new_len);
      st[q].seen += c;
      ++st[q].chunks;
    }
    out[q] = heads_of(m, st[q].id);
  }
  return out;
}

}  // namespace

TEST_CASE("the elastic engine loop runs every chunk and decode step without a host wait",
          "[fake_cuda][elastic][sync_free]") {
  auto& fs = fake_cuda::state();
  fake_cuda::run();  // nothing of another test left in the queue
  auto plan = loop_plan();
  REQUIRE(plan.geometry.group_size == 1);  // the defaults: per-head pages, elastic
  auto expected = run_synchronously(plan);

  host_memory_resource mr;  // the fake's "device" memory is host memory: the stand-ins read it
  kv_cache_manager m(plan, mr, loop_options());
  kv_view_mirror mirror(m);
  std::int32_t const L = plan.num_layers, H = plan.num_kv_heads;
  auto const max_batch = static_cast<std::size_t>(m.max_sequences());
  async_readback readback(max_batch * static_cast<std::size_t>(L * H) * sizeof(std::int32_t) +
                              async_readback::part_alignment + max_batch * sizeof(std::int64_t),
                          4);
  cudaStream_t stream = nullptr;
  auto spec           = requests();
  std::vector<request_state> st(spec.size());
  for (std::size_t q = 0; q < spec.size(); ++q)
    st[q].id = *m.try_admit(spec[q].prompt, spec[q].answer);

  struct in_flight {
    std::unique_ptr<gpu_step> step;
    std::optional<readback_ticket> ticket;
    std::int32_t waiting = 0;  ///< requests of the step not yet committed
  };
  std::deque<in_flight> flights;
  auto const waits_before = fake_cuda::host_waits();
  std::int64_t steps = 0, sat_out = 0, chunks = 0, decode_tokens = 0;
  std::size_t queued_after_previous_step = fs.queue.size();
  for (;; ++steps) {
    REQUIRE(steps < 200);
    // 1. Commit every chunk whose readback landed (never a wait).
    for (auto& f : flights) {
      if (f.waiting == 0 || !f.ticket || !readback.ready(*f.ticket)) continue;
      auto const* new_len = static_cast<std::int32_t const*>(readback.part(*f.ticket, 0));
      auto const* pages   = static_cast<std::int64_t const*>(readback.part(*f.ticket, 1));
      for (auto& s : st) {
        if (s.pending != f.step.get()) continue;
        REQUIRE(pages[s.row] >= 0);
        m.commit_chunk(s.id,
                       new_len + static_cast<std::ptrdiff_t>(s.row) * L * H,
                       static_cast<std::size_t>(L * H));
        s.pending = nullptr;
        --f.waiting;
      }
      if (f.waiting == 0) readback.release(*f.ticket);
    }
    while (!flights.empty() && flights.front().waiting == 0) flights.pop_front();
    // 2. Schedule: the next chunk of every prefilling request whose last chunk is committed,
    // beside one decode token of every decoding request.
    std::vector<std::size_t> pre;
    std::vector<sequence_id> pre_ids, dec_ids;
    bool busy = false;
    for (std::size_t q = 0; q < st.size(); ++q) {
      auto& s = st[q];
      if (s.pending) {
        ++sat_out;
        busy = true;
        continue;
      }
      if (s.seen < spec[q].prompt) {
        m.prepare_chunk(s.id, std::min(spec[q].chunk, spec[q].prompt - s.seen));
        pre.push_back(q);
        pre_ids.push_back(s.id);
      } else if (s.decoded < spec[q].answer) {
        dec_ids.push_back(s.id);
      }
    }
    if (pre.empty() && dec_ids.empty() && !busy) break;
    m.set_batch(batch_kind::prefill, pre_ids);
    m.set_batch(batch_kind::decode, dec_ids);
    if (!dec_ids.empty()) m.decode_step();  // the append and decode kernels would follow
    chunks += static_cast<std::int64_t>(pre.size());
    decode_tokens += static_cast<std::int64_t>(dec_ids.size());
    // 3. One upload of the page tables, then the step's kernels behind it on the stream.
    auto host_view = m.view(batch_kind::prefill);
    mirror.sync(m, stream);
    if (!pre.empty()) {
      in_flight f;
      f.step = make_step(plan, m, host_view, mirror.view(batch_kind::prefill), pre, st, spec);
      REQUIRE(cudaLaunchHostFunc(stream, gpu_step::launch, f.step.get()) == cudaSuccess);
      readback_part parts[2] = {
          {f.step->new_len.data(), f.step->new_len.size() * sizeof(std::int32_t)},
          {f.step->pages_out.data(), f.step->pages_out.size() * sizeof(std::int64_t)}};
      f.ticket = readback.enqueue(parts, 2, stream);
      REQUIRE(f.ticket);  // 4 slots: at most two steps are ever in flight
      for (std::size_t r = 0; r < pre.size(); ++r) {
        st[pre[r]].pending = f.step.get();
        st[pre[r]].row     = static_cast<std::int32_t>(r);
        st[pre[r]].seen += std::min(spec[pre[r]].chunk, spec[pre[r]].prompt - st[pre[r]].seen);
        ++st[pre[r]].chunks;
      }
      f.waiting = static_cast<std::int32_t>(pre.size());
      flights.push_back(std::move(f));
    }
    for (auto q = std::size_t{0}; q < st.size(); ++q)
      if (std::find(dec_ids.begin(), dec_ids.end(), st[q].id) != dec_ids.end()) ++st[q].decoded;
    // 4. The GPU finishes the previous step's work while the host plans the next one.
    fake_cuda::run(static_cast<std::int64_t>(queued_after_previous_step));
    queued_after_previous_step = fs.queue.size();
  }
  // The loop never waited for the device: every step, chunk and decode token.
  CHECK(fake_cuda::host_waits() == waits_before);
  CHECK(fs.event_queries > 0);
  std::int64_t want_chunks = 0, want_tokens = 0;
  for (auto const& r : spec) {
    want_chunks += (r.prompt + r.chunk - 1) / r.chunk;
    want_tokens += r.answer;
  }
  CHECK(chunks == want_chunks);
  CHECK(decode_tokens == want_tokens);
  // What the protocol costs: a request sits out the steps until its chunk's lengths are back.
  CHECK(sat_out > 0);
  WARN("sync-free elastic loop: " << steps << " steps, " << chunks << " chunks, " << sat_out
                                  << " request-steps waiting for a commit");
  // The same heads as the synchronous loop, token for token (decode tokens are not written here).
  for (std::size_t q = 0; q < st.size(); ++q) {
    INFO("request " << q);
    auto got = heads_of(m, st[q].id);
    for (std::int32_t i = 0; i < L * H; ++i) {
      auto want = expected[q][static_cast<std::size_t>(i)];
      auto& g   = got[static_cast<std::size_t>(i)];
      g.resize(std::min(g.size(), want.size()));  // decode positions hold no token ids
      CHECK(g == want);
    }
  }
  m.check_invariants();
  for (auto const& s : st) m.free(s.id);
  CHECK(m.pool().used_pages() == 0);
  fake_cuda::run();  // the last step's work, before its buffers go
}

TEST_CASE("kv_view_mirror::sync waits only when the host runs two syncs ahead of the stream",
          "[fake_cuda][sync_free]") {
  auto& fs = fake_cuda::state();
  fake_cuda::run();
  auto plan = loop_plan();
  host_memory_resource mr;
  kv_cache_manager m(plan, mr, loop_options());
  kv_view_mirror mirror(m);
  auto a = *m.try_admit(8, 20);
  m.prepare_chunk(a, 8);
  std::vector<std::int32_t> kept(static_cast<std::size_t>(plan.num_layers * plan.num_kv_heads));
  m.expected_kept(a, 8, kept.data());  // candidates; compressed heads keep their protected 3
  for (std::size_t h = 0; h < kept.size(); ++h)
    if (plan.rules[h].kind == layer_kind::compressed) kept[h] = 3;
  m.commit_chunk(a, kept);
  m.set_batch({a});
  auto waits = fake_cuda::host_waits();
  // The GPU trails by one sync: the upload two syncs back has run, so no wait.
  for (int k = 0; k < 8; ++k) {
    m.decode_step();
    mirror.sync(m, nullptr);
    fake_cuda::run(static_cast<std::int64_t>(fs.queue.size()) - 2);  // all but this sync's
  }
  CHECK(fake_cuda::host_waits() == waits);
  // Two syncs ahead: the third must wait for the first's upload (one cudaEventSynchronize).
  fake_cuda::run();
  m.decode_step();
  mirror.sync(m, nullptr);
  m.decode_step();
  mirror.sync(m, nullptr);
  CHECK(fake_cuda::host_waits() == waits);
  m.decode_step();
  mirror.sync(m, nullptr);
  CHECK(fake_cuda::host_waits() == waits + 1);
  CHECK(fs.waits_that_ran_work >= 1);
}

TEST_CASE("async_readback: copies land only when the stream runs them, tickets are checked",
          "[fake_cuda][sync_free]") {
  fake_cuda::run();
  async_readback rb(1024, 2);
  std::vector<std::int32_t> dev_a(10), dev_b(3);
  for (std::size_t i = 0; i < dev_a.size(); ++i) dev_a[i] = static_cast<std::int32_t>(i * 3);
  for (std::size_t i = 0; i < dev_b.size(); ++i) dev_b[i] = static_cast<std::int32_t>(100 + i);
  readback_part parts[2] = {{dev_a.data(), dev_a.size() * 4}, {dev_b.data(), dev_b.size() * 4}};
  auto waits             = fake_cuda::host_waits();
  auto t                 = rb.enqueue(parts, 2, nullptr);
  REQUIRE(t);
  CHECK_FALSE(rb.ready(*t));  // nothing ran
  TANGRAM_REQUIRE_THROWS_WITH_ALL((void)rb.part(*t, 0), logic_error, "not ready");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(rb.release(*t), logic_error, "not ready");
  dev_a[0] = 77;  // the copy reads its source when it runs, as a DMA engine does
  auto u   = rb.enqueue(parts, 1, nullptr);
  REQUIRE(u);
  CHECK_FALSE(rb.enqueue(parts, 1, nullptr));  // both slots in use: nullopt, no wait
  fake_cuda::run();
  REQUIRE(rb.ready(*t));
  auto const* a = static_cast<std::int32_t const*>(rb.part(*t, 0));
  auto const* b = static_cast<std::int32_t const*>(rb.part(*t, 1));
  CHECK(a[0] == 77);
  CHECK(a[9] == 27);
  CHECK(b[2] == 102);
  CHECK(reinterpret_cast<std::uintptr_t>(b) % async_readback::part_alignment == 0);
  rb.release(*t);
  TANGRAM_REQUIRE_THROWS_WITH_ALL(rb.release(*t), logic_error, "not in flight");
  TANGRAM_REQUIRE_THROWS_WITH_ALL((void)rb.ready(*t), logic_error, "not in flight");
  auto v = rb.enqueue(parts, 1, nullptr);  // the freed slot, a new use: the old ticket stays stale
  REQUIRE(v);
  CHECK(v->slot == t->slot);
  TANGRAM_REQUIRE_THROWS_WITH_ALL((void)rb.ready(*t), logic_error, "not in flight");
  CHECK(fake_cuda::host_waits() == waits);
  // Bad input names the field.
  readback_part big[1] = {{dev_a.data(), 2000}};
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      (void)rb.enqueue(big, 1, nullptr), invalid_argument, "parts[0].bytes", "2000");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      (void)rb.enqueue(parts, 5, nullptr), invalid_argument, "count", "5");
  readback_part null_src[1] = {{nullptr, 4}};
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      (void)rb.enqueue(null_src, 1, nullptr), invalid_argument, "parts[0].src");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(async_readback(0, 1), invalid_argument, "slot_bytes");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(async_readback(8, 0), invalid_argument, "slots");
  rb.drain();
  CHECK(rb.ready(*u));
  CHECK(rb.ready(*v));
}
