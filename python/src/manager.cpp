// SPDX-License-Identifier: Apache-2.0
// The KV-cache manager over host memory, its whole lifecycle, and its view arrays as read-only
// NumPy arrays that alias the manager's own memory (zero copies; each array keeps the manager
// alive). The pool is a writable NumPy array over the page arena, for the CPU reference kernels.
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "arguments.hpp"
#include "arrays.hpp"
#include "bindings.hpp"
#include "bound_kv_cache.hpp"
#include "tangram/interop/flashinfer.hpp"
#include "tangram/memory/answer_window.hpp"
#include "tangram/memory/host_memory_resource.hpp"

#if TANGRAM_HAS_KERNELS
#include "tangram/memory/cuda_memory_resource.hpp"
#endif

namespace nb = nanobind;

namespace tangram::python {

namespace {

nb::dict stats_dict(manager_stats const& s) {
  nb::dict d;
  d["admitted"]               = s.admitted;
  d["rejected"]               = s.rejected;
  d["turns_continued"]        = s.turns_continued;
  d["continue_rejected"]      = s.continue_rejected;
  d["forks"]                  = s.forks;
  d["fork_rejected"]          = s.fork_rejected;
  d["freed"]                  = s.freed;
  d["pages_drawn"]            = s.pages_drawn;
  d["surplus_pages_released"] = s.surplus_pages_released;
  d["reclaimed_pages"]        = s.reclaimed_pages;
  d["page_copies"]            = s.page_copies;
  d["index_compactions"]      = s.index_compactions;
  d["staging_pages_returned"] = s.staging_pages_returned;
  d["extended"]                = s.extended;
  d["extend_rejected"]         = s.extend_rejected;
  d["rolled_back_tokens"]      = s.rolled_back_tokens;
  d["rollback_pages_returned"] = s.rollback_pages_returned;
  d["parked"]                 = s.parked;
  d["parked_mid_turn"]        = s.parked_mid_turn;
  d["unparked"]               = s.unparked;
  d["unpark_rejected"]        = s.unpark_rejected;
  d["resumed"]                = s.resumed;
  d["resume_rejected"]        = s.resume_rejected;
  d["pages_parked"]           = s.pages_parked;
  d["pages_restored"]         = s.pages_restored;
  d["spare_pages_kept"]       = s.spare_pages_kept;
  d["prefix_admits"]          = s.prefix_admits;
  d["prefix_rejected"]        = s.prefix_rejected;
  d["prefix_pages_shared"]    = s.prefix_pages_shared;
  return d;
}

nb::dict info_dict(sequence_info const& i) {
  nb::dict d;
  d["phase"]            = std::string(to_string(i.phase));
  d["pinned"]           = i.pinned;
  d["seq_tokens"]       = i.seq_tokens;
  d["appended"]         = i.appended;
  d["prompt_remaining"] = i.prompt_remaining;
  d["chunk_pending"]    = i.chunk_pending;
  d["max_new"]          = i.max_new;
  d["decoded"]          = i.decoded;
  d["reserved_pages"]   = i.reserved_pages;
  d["held_pages"]       = i.held_pages;
  return d;
}

}  // namespace

std::unique_ptr<memory_resource> make_memory(std::string const& name, std::int32_t device) {
  if (name == "host") return std::make_unique<host_memory_resource>();
  if (name == "cuda") {
#if TANGRAM_HAS_KERNELS
    TANGRAM_EXPECTS(device >= 0, invalid_argument, "device: must be >= 0, got ", device);
    return std::make_unique<cuda_memory_resource>(device);
#else
    TANGRAM_FAIL(invalid_argument,
                 "memory: 'cuda' needs the package built with the CUDA kernels (`pip install . "
                 "-Ccmake.define.TANGRAM_ENABLE_CUDA=ON`, with nvcc); this one is host-only");
#endif
  }
  TANGRAM_FAIL(invalid_argument, "memory: must be 'host' or 'cuda', got '", name, "'");
}

void bind_manager(nb::module_& m) {
  nb::enum_<batch_kind>(m, "BatchKind",
                        "The manager's two batches (batch_kind): decode (append, decode attention)\n"
                        "and prefill (prefill attention, eviction), each set by set_batch(kind, ids).")
      .value("decode", batch_kind::decode)
      .value("prefill", batch_kind::prefill);
  nb::class_<sequence_id>(m, "SequenceId", "Handle of a live sequence: slot and generation.")
      .def_ro("slot", &sequence_id::slot)
      .def_ro("generation", &sequence_id::generation)
      .def("__eq__", [](sequence_id a, sequence_id b) { return a == b; }, nb::is_operator())
      .def("__hash__",
           [](sequence_id a) {
             return static_cast<std::int64_t>(a.slot) * 0x100000000LL + a.generation;
           })
      .def("__repr__", [](sequence_id a) {
        return "SequenceId(slot=" + std::to_string(a.slot) +
               ", generation=" + std::to_string(a.generation) + ")";
      });

  nb::class_<parked_session>(
      m, "ParkedSession",
      "A session parked in host memory (KVCacheManager.park): ended (try_unpark restores it with\n"
      "its next turn) or a turn parked in decode (mid_turn; try_resume continues it), into fresh\n"
      "pages of any manager over the same plan. A value; its pages live wherever the engine\n"
      "copied them (host page k <- device_pages[k]).")
      .def_ro("plan_fingerprint", &parked_session::plan_fingerprint)
      .def_ro("page_bytes", &parked_session::page_bytes)
      .def_ro("seq_tokens", &parked_session::seq_tokens)
      .def_ro("appended", &parked_session::appended)
      .def_ro("mid_turn", &parked_session::mid_turn)
      .def_ro("decoded", &parked_session::decoded)
      .def_ro("max_new", &parked_session::max_new)
      .def_prop_ro("host_pages", &parked_session::host_pages)
      .def_prop_ro("group_pages",
                   [](parked_session const& p) {
                     return numpy_copy(p.group_pages, {p.group_pages.size()});
                   })
      .def_prop_ro("device_pages",
                   [](parked_session const& p) {
                     return numpy_copy(p.device_pages, {p.device_pages.size()});
                   },
                   "Pages to copy out, device_pages[k] -> host page k; valid only until\n"
                   "complete_park (a copy).");
  add_value_copies<parked_session>();

  nb::class_<answer_window>(
      m, "AnswerWindow",
      "Answers that grow (memory/answer_window.hpp): answer tokens reserved a window at a time,\n"
      "whom to park in host memory when a growth does not fit, and the host memory parked\n"
      "sessions may take. victims: 'idle_then_newest' (default: the least recently used ended\n"
      "session, then the running turn started last), 'newest' or 'largest'. A value.")
      .def(
          "__init__",
          [](answer_window* self, std::int64_t window_tokens, std::string const& victims,
             double host_pool_ratio) {
            auto order = park_victim_order_named(victims);
            TANGRAM_EXPECTS(order, invalid_argument,
                            "answer_window_options.victims: must be 'idle_then_newest', 'newest' "
                            "or 'largest', got '", victims, "'");
            answer_window_options o;
            o.window_tokens   = window_tokens;
            o.victims         = *order;
            o.host_pool_ratio = host_pool_ratio;
            new (self) answer_window(o);
          },
          nb::kw_only(), nb::arg("window_tokens") = default_answer_window,
          nb::arg("victims") = "idle_then_newest", nb::arg("host_pool_ratio") = default_host_pool_ratio)
      .def_prop_ro("window_tokens", [](answer_window const& w) { return w.options().window_tokens; })
      .def_prop_ro("victims",
                   [](answer_window const& w) { return std::string(to_string(w.options().victims)); })
      .def_prop_ro("host_pool_ratio",
                   [](answer_window const& w) { return w.options().host_pool_ratio; })
      .def("first", &answer_window::first, nb::arg("max_tokens"),
           "Answer tokens a turn reserves at admission: min(window, max_tokens).")
      .def("growth", &answer_window::growth, nb::arg("max_tokens"), nb::arg("reserved"),
           "Answer tokens a turn that reserved `reserved` adds when it reaches them (0: none left).")
      .def("host_limit_bytes", &answer_window::host_limit_bytes, nb::arg("device_pool_bytes"),
           "Host bytes parked sessions may take beside a device pool of that many bytes.")
      .def(
          "choose_victim",
          [](answer_window const& w,
             std::vector<std::tuple<sequence_id, std::string, std::int64_t, std::int64_t>> const& c,
             std::int64_t page_bytes, std::int64_t host_bytes_free) -> nb::object {
            std::vector<park_candidate> list;
            for (std::size_t i = 0; i < c.size(); ++i) {
              auto const& [id, phase, last_used, pages] = c[i];
              park_candidate pc{id, sequence_phase::free, last_used, pages};
              for (auto ph : {sequence_phase::prefill, sequence_phase::decode,
                              sequence_phase::ended, sequence_phase::parking})
                if (phase == to_string(ph)) pc.phase = ph;
              TANGRAM_EXPECTS(pc.phase != sequence_phase::free, invalid_argument,
                              "choose_victim.candidates[", i, "]: unknown phase '", phase, "'");
              list.push_back(pc);
            }
            auto k = w.choose_victim(list, page_bytes, host_bytes_free);
            if (!k) return nb::none();
            return nb::int_(*k);
          },
          nb::arg("candidates"), nb::arg("page_bytes"), nb::arg("host_bytes_free"),
          "Index of the candidate to park next among (SequenceId, phase, last_used, pages)\n"
          "tuples (only 'ended' and 'decode' ones whose pages fit host_bytes_free), or None.");

  nb::class_<bound_kv_cache>(
      m, "KVCacheManager",
      "The paged KV-cache manager of one rank (kv_cache_manager), its arena in host memory or\n"
      "(memory='cuda') on a CUDA device.\n"
      "Single-threaded: the caller serialises every call. Reservations are exact and all or\n"
      "nothing; 'does not fit' is a None return, misuse raises UsageError.")
      .def(
          "__init__",
          [](bound_kv_cache* self, static_plan const& plan, std::int64_t num_pages,
             std::int64_t pool_bytes, std::int32_t max_sequences, std::int32_t max_batch,
             std::int64_t index_capacity, std::int64_t max_view_changes,
             std::int64_t max_chunk_tokens, std::string const& memory, std::int32_t device,
             bool deferred_reuse, bool share_compressed_prefix) {
            manager_options o;
            o.num_pages        = num_pages;
            o.pool_bytes       = pool_bytes;
            o.max_sequences    = max_sequences;
            o.max_batch        = max_batch;
            o.index_capacity   = index_capacity;
            o.max_view_changes = max_view_changes;
            o.max_chunk_tokens = max_chunk_tokens;
            o.deferred_reuse   = deferred_reuse;
            o.share_compressed_prefix = share_compressed_prefix;
            auto resource = make_memory(memory, device);
            new (self) bound_kv_cache(plan, o, std::move(resource), memory == "cuda" ? device : -1);
          },
          nb::arg("plan"), nb::kw_only(), nb::arg("num_pages") = 0, nb::arg("pool_bytes") = 0,
          nb::arg("max_sequences") = 256, nb::arg("max_batch") = 0, nb::arg("index_capacity") = 0,
          nb::arg("max_view_changes") = 0, nb::arg("max_chunk_tokens") = 2048,
          nb::arg("memory") = "host", nb::arg("device") = 0, nb::arg("deferred_reuse") = false,
          nb::arg("share_compressed_prefix") = true,
          "memory='host' (default): the page arena in host memory, for the CPU reference kernels.\n"
          "memory='cuda': the arena on CUDA device `device` (a package built with the CUDA\n"
          "kernels: tangram.cuda), for tangram.cuda's launchers.\n"
          "deferred_reuse=True: freed pages retire until release_epochs_through (several streams).\n"
          "share_compressed_prefix=False: a request over a pinned prefix copies its compressed\n"
          "groups' pages instead of sharing them pinned (manager_options).")
      // ----- shape
      .def_prop_ro("plan", [](bound_kv_cache const& c) { return c.kv.plan(); })
      .def_prop_ro("num_pages", [](bound_kv_cache const& c) { return c.kv.pool().capacity(); })
      .def_prop_ro("used_pages", [](bound_kv_cache const& c) { return c.kv.pool().used_pages(); })
      .def_prop_ro("reserved_pages",
                   [](bound_kv_cache const& c) { return c.kv.pool().reserved_pages(); },
                   "Free pages promised to admitted sequences.")
      .def_prop_ro("available_pages",
                   [](bound_kv_cache const& c) { return c.kv.pool().available_pages(); },
                   "Free pages no reservation holds: what admission can still promise.")
      .def("stage_key_words",
           [](bound_kv_cache const& c,
              nb::ndarray<std::int32_t const, nb::ndim<1>, nb::c_contig, nb::device::cpu>
                  chunk_indptr,
              batch_kind kind) {
             std::vector<std::int64_t> base;
             return stage_key_layout_of(c.kv, chunk_indptr.data(), chunk_indptr.size(), kind,
                                        base);
           },
           nb::arg("chunk_indptr").noconvert(), nb::kw_only(),
           nb::arg("kind") = batch_kind::decode,
           "Words of the elastic stage keys for the batch of `kind` and its prepared chunks\n"
           "(chunk_indptr [batch + 1] int32, host, as passed to reference_evict): the stage_keys\n"
           "argument of reference_evict / reference_evict_elastic (and, for tangram.cuda's\n"
           "evict_chunk / evict_elastic, DeviceMirror.stage_key_layout). C++\n"
           "tangram::stage_key_layout (kernels/eviction.hpp) over the host view: for each\n"
           "request and group holding a compressed head, ceil(extent / P) * Hp * P words, extent\n"
           "= the group's longest compressed column after the chunk (held + chunk tokens); laid\n"
           "out like the staged groups' page lists, no padding. Call it after prepare_chunk and\n"
           "set_batch; the keys are needed only from the chunk's stage launches to its\n"
           "reference_evict_elastic, so one buffer (numpy.empty(words, numpy.uint32), contents\n"
           "irrelevant) can serve every chunk: pass a slice of exactly `words` elements.")
      .def_prop_ro("num_groups", [](bound_kv_cache const& c) { return c.kv.num_groups(); })
      .def_prop_ro("max_sequences", [](bound_kv_cache const& c) { return c.kv.max_sequences(); })
      .def_prop_ro("max_batch", [](bound_kv_cache const& c) { return c.kv.view_extents().batch; },
                   "Requests one batch may hold (workspaces are sized for it).")
      .def_prop_ro("live_sequences", [](bound_kv_cache const& c) { return c.kv.live_sequences(); })
      .def_prop_ro("stats", [](bound_kv_cache const& c) { return stats_dict(c.kv.stats()); })
      // ----- admission and prefill
      .def("admission_pages",
           [](bound_kv_cache const& c, std::int64_t n, std::int64_t t) {
             return c.kv.admission_pages(n, t);
           },
           nb::arg("prompt_tokens"), nb::arg("max_new_tokens"),
           "Pages try_admit would reserve for this request.")
      .def("admit",
           [](bound_kv_cache& c, std::int64_t n, std::int64_t t) {
             auto r = c.kv.admit(n, t);
             nb::dict d;
             d["id"]            = r.id ? nb::cast(*r.id) : nb::none();
             d["reason"]        = std::string(to_string(r.reason));
             d["pages_needed"]  = r.pages_needed;
             d["pages_missing"] = r.pages_missing;
             d["pages_retired"] = r.pages_retired;
             return d;
           },
           nb::arg("prompt_tokens"), nb::arg("max_new_tokens"),
           "try_admit that says why: {'id': SequenceId or None, 'reason': 'none', 'no_free_slot',\n"
           "'not_enough_pages', 'page_table_arena_full', 'never_fits' or\n"
           "'pages_awaiting_release', 'pages_needed', 'pages_missing', 'pages_retired'}.")
      .def("try_extend",
           [](bound_kv_cache& c, sequence_id s, std::int64_t more) { return c.kv.try_extend(s, more); },
           nb::arg("seq"), nb::arg("more_tokens"),
           "Grows a decoding turn's reservation by more_tokens, all or nothing: False when it does\n"
           "not fit (nothing changed).")
      .def("append_tokens",
           [](bound_kv_cache& c, sequence_id s, std::int64_t n) { c.kv.append_tokens(s, n); },
           nb::arg("seq"), nb::arg("tokens"), "Room for `tokens` more decode tokens of one sequence.")
      .def("rollback",
           [](bound_kv_cache& c, sequence_id s, std::int64_t n) { c.kv.rollback(s, n); },
           nb::arg("seq"), nb::arg("tokens"),
           "Drops the last `tokens` appended tokens (rejected speculation); their pages go back to\n"
           "the sequence's own reservation.")
      .def("max_rollback",
           [](bound_kv_cache const& c, sequence_id s) { return c.kv.max_rollback(s); },
           nb::arg("seq"))
      .def("try_admit",
           [](bound_kv_cache& c, std::int64_t n, std::int64_t t) { return c.kv.try_admit(n, t); },
           nb::arg("prompt_tokens"), nb::arg("max_new_tokens"),
           "Reserves the request's pages, all or nothing: a SequenceId, or None (nothing changed).")
      .def("prepare_chunk",
           [](bound_kv_cache& c, sequence_id s, std::int64_t n) { c.kv.prepare_chunk(s, n); },
           nb::arg("seq"), nb::arg("chunk_tokens"))
      .def("expected_kept",
           [](bound_kv_cache const& c, sequence_id s, std::int64_t n) {
             auto const& p = c.kv.plan();
             std::vector<std::int32_t> out(static_cast<std::size_t>(p.num_layers) *
                                           static_cast<std::size_t>(p.num_kv_heads));
             c.kv.expected_kept(s, n, out.data());
             return out;
           },
           nb::arg("seq"), nb::arg("chunk_tokens"),
           "Per (layer, KV head) tokens each head keeps after this chunk under the plan's rules.")
      .def("commit_chunk",
           [](bound_kv_cache& c, sequence_id s,
              nb::ndarray<std::int32_t const, nb::ndim<1>, nb::c_contig, nb::device::cpu> kept) {
             c.kv.commit_chunk(s, kept.data(), kept.shape(0));
           },
           nb::arg("seq"), nb::arg("kept").noconvert())
      .def("commit_chunk",
           [](bound_kv_cache& c, sequence_id s, std::vector<std::int32_t> const& kept) {
             c.kv.commit_chunk(s, kept);
           },
           nb::arg("seq"), nb::arg("kept").noconvert(),
           "Records the chunk's eviction: kept[layer * H + head] tokens per head (an int32 array,\n"
           "or a list of ints; other integer arrays are refused, never converted).")
      .def("elastic_page_limit",
           [](bound_kv_cache const& c, sequence_id s) { return c.kv.elastic_page_limit(s); },
           nb::arg("seq"))
      .def("elastic_wanted_tokens",
           [](bound_kv_cache const& c, sequence_id s) { return c.kv.elastic_wanted_tokens(s); },
           nb::arg("seq"),
           "The scorer's total over the compressed heads once the prepared chunk is in (0 under\n"
           "static budgets): the elastic eviction's `wanted`.")
      // ----- batch and decode
      .def("set_batch",
           [](bound_kv_cache& c, std::vector<sequence_id> const& ids) { c.kv.set_batch(ids); },
           nb::arg("ids"))
      .def_prop_ro("batch_size", [](bound_kv_cache const& c) { return c.kv.batch_size(); })
      .def("decode_step", [](bound_kv_cache& c) { c.kv.decode_step(); },
           "Room for one more token in every head of every batch member (its reservation always\n"
           "has it; UsageError past max_new_tokens or for a freed member).")
      .def("decode_step",
           [](bound_kv_cache& c,
              nb::ndarray<std::int32_t const, nb::ndim<1>, nb::c_contig, nb::device::cpu> tokens) {
             c.kv.decode_step(tokens.data(), tokens.shape(0));
           },
           nb::arg("tokens").noconvert(),
           "Room for tokens[r] more tokens (int32, 0 allowed) for batch member r: speculative\n"
           "decoding's several tokens per step.")
      // ----- turns, forks, free
      .def("end_turn", [](bound_kv_cache& c, sequence_id s) { c.kv.end_turn(s); }, nb::arg("seq"))
      .def("continue_turn",
           [](bound_kv_cache& c, sequence_id s, std::int64_t n, std::int64_t t) {
             return c.kv.continue_turn(s, n, t);
           },
           nb::arg("seq"), nb::arg("prompt_tokens"), nb::arg("max_new_tokens"),
           "Reserves the next turn: True, or False when it does not fit (nothing changed).")
      .def("fork", [](bound_kv_cache& c, sequence_id s) { return c.kv.fork(s); }, nb::arg("parent"),
           "A copy-on-write child: a SequenceId, or None when it does not fit.")
      .def("free", [](bound_kv_cache& c, sequence_id s) { c.kv.free(s); }, nb::arg("seq"))
      // ----- shared prefixes
      .def("pin_prefix", [](bound_kv_cache& c, sequence_id s) { c.kv.pin_prefix(s); },
           nb::arg("seq"),
           "Pins an ended sequence read-only as a shared prefix (free unregisters it).")
      .def("try_admit_with_prefix",
           [](bound_kv_cache& c, sequence_id prefix, std::int64_t n, std::int64_t t) {
             return c.kv.try_admit_with_prefix(prefix, n, t);
           },
           nb::arg("prefix"), nb::arg("prompt_tokens"), nb::arg("max_new_tokens"),
           "Admits n + t tokens after a pinned prefix, sharing its pages: a SequenceId, or None\n"
           "when it does not fit (nothing changed).")
      // ----- deferred reuse (several streams)
      .def("advance_epoch", [](bound_kv_cache& c) { return c.kv.advance_epoch(); },
           "Closes the open epoch (once per step, after the step's work was enqueued and an event\n"
           "recorded behind it) and returns its id.")
      .def("release_epochs_through",
           [](bound_kv_cache& c, std::int64_t e) { return c.kv.release_epochs_through(e); },
           nb::arg("epoch"),
           "The work of every epoch <= epoch completed: their retired pages become free.\n"
           "Returns the pages freed.")
      .def_prop_ro("current_epoch", [](bound_kv_cache const& c) { return c.kv.current_epoch(); })
      .def_prop_ro("released_epoch", [](bound_kv_cache const& c) { return c.kv.released_epoch(); })
      .def_prop_ro("retired_pages", [](bound_kv_cache const& c) { return c.kv.retired_pages(); },
                   "Pages waiting for release_epochs_through (deferred_reuse).")
      .def("park", [](bound_kv_cache& c, sequence_id s) { return c.kv.park(s); }, nb::arg("seq"),
           "Starts parking a sequence in host memory, ended or in decode (a growth that does not\n"
           "fit: AnswerWindow): a ParkedSession whose device_pages the engine copies out, then\n"
           "complete_park (pages and reservation back to the pool, slot released) or cancel_park\n"
           "(the sequence is back in its phase, unchanged).")
      .def("complete_park", [](bound_kv_cache& c, sequence_id s) { c.kv.complete_park(s); },
           nb::arg("seq"))
      .def("cancel_park", [](bound_kv_cache& c, sequence_id s) { c.kv.cancel_park(s); },
           nb::arg("seq"))
      .def("unpark_pages",
           [](bound_kv_cache const& c, parked_session const& p, std::int64_t n, std::int64_t t) {
             return c.kv.unpark_pages(p, n, t);
           },
           nb::arg("session"), nb::arg("prompt_tokens"), nb::arg("max_new_tokens"),
           "Pages try_unpark would reserve (the history in fresh pages plus the next turn).")
      .def("try_unpark",
           [](bound_kv_cache& c, parked_session const& p, std::int64_t n,
              std::int64_t t) -> nb::object {
             auto r = c.kv.try_unpark(p, n, t);
             if (!r) return nb::none();
             return nb::make_tuple(r->id, numpy_copy(r->device_pages, {r->device_pages.size()}));
           },
           nb::arg("session"), nb::arg("prompt_tokens"), nb::arg("max_new_tokens"),
           "Restores a parked session with its next turn, all or nothing: (SequenceId,\n"
           "device_pages) where host page k goes to device_pages[k] before any kernel reads the\n"
           "sequence, or None when it does not fit (nothing changed).")
      .def("resume_pages",
           [](bound_kv_cache const& c, parked_session const& p, std::int64_t t) {
             return c.kv.resume_pages(p, t);
           },
           nb::arg("session"), nb::arg("max_new_tokens"),
           "Pages try_resume would reserve (the history in fresh pages plus the answer's growth).")
      .def("try_resume",
           [](bound_kv_cache& c, parked_session const& p, std::int64_t t) -> nb::object {
             auto r = c.kv.try_resume(p, t);
             if (!r) return nb::none();
             return nb::make_tuple(r->id, numpy_copy(r->device_pages, {r->device_pages.size()}));
           },
           nb::arg("session"), nb::arg("max_new_tokens"),
           "Resumes a turn parked in decode (session.mid_turn) with max_new_tokens answer tokens\n"
           "in all (>= session.decoded), all or nothing: (SequenceId, device_pages) as try_unpark,\n"
           "the sequence in decode where it stopped, or None when it does not fit.")
      .def("pending_copies",
           [](bound_kv_cache const& c) {
             std::vector<std::pair<std::int32_t, std::int32_t>> out;
             for (auto const& x : c.kv.pending_copies()) out.emplace_back(x.src, x.dst);
             return out;
           },
           "(src, dst) page copies recorded by fork / continue_turn, not yet completed.")
      .def("complete_page_copies", [](bound_kv_cache& c) { c.kv.complete_page_copies(); })
      .def("execute_page_copies",
           [](bound_kv_cache& c) {
             c.expect_host_pool("execute_page_copies");
             c.kv.execute_page_copies_host();
           },
           "Performs the pending copies in the host pool, then completes them (a device arena:\n"
           "tangram.cuda.execute_page_copies).")
      // ----- queries
      .def("contains", [](bound_kv_cache const& c, sequence_id s) { return c.kv.contains(s); },
           nb::arg("seq"))
      .def("info", [](bound_kv_cache const& c, sequence_id s) { return info_dict(c.kv.info(s)); },
           nb::arg("seq"))
      .def("sequences",
           [](bound_kv_cache const& c) {
             nb::list out;
             c.kv.for_each_sequence([&](sequence_info const& i) {
               auto d  = info_dict(i);
               d["id"] = i.id;
               out.append(d);
             });
             return out;
           },
           "Every live sequence's info (with its 'id'), in slot order.")
      .def("head_len",
           [](bound_kv_cache const& c, sequence_id s, std::int32_t l, std::int32_t h) {
             return c.kv.head_len(s, l, h);
           },
           nb::arg("seq"), nb::arg("layer"), nb::arg("head"))
      .def("group_pages",
           [](bound_kv_cache const& c, sequence_id s, std::int32_t g) {
             auto const* p = c.kv.group_pages(s, g);
             return std::vector<std::int32_t>(p, p + c.kv.group_page_count(s, g));
           },
           nb::arg("seq"), nb::arg("group"))
      .def("group_pinned_tokens",
           [](bound_kv_cache const& c, sequence_id s, std::int32_t g) {
             return c.kv.group_pinned_tokens(s, g);
           },
           nb::arg("seq"), nb::arg("group"),
           "Leading tokens of every head of the group on a pinned prefix's shared read-only pages\n"
           "(kept in place by the eviction); 0 for a sequence not admitted over a prefix.")
      .def("check_invariants", [](bound_kv_cache const& c) { c.kv.check_invariants(); },
           "Full consistency check (O(pool)); raises UsageError naming the broken invariant.")
      // ----- zero-copy views
      .def(
          "view",
          [](nb::handle self, std::string const& framework, batch_kind kind) {
            auto alias = [&](auto const* data, std::int64_t count) {
              if (framework == "numpy") return numpy_alias(data, count, self);
              if (framework == "dlpack") return dlpack_alias(data, count, self);
              TANGRAM_FAIL(invalid_argument, "view: framework must be 'numpy' or 'dlpack', got '",
                           framework, "'");
            };
            auto& c = nb::cast<bound_kv_cache&>(self);
            auto v  = c.kv.view(kind);
            auto e  = c.kv.view_extents();
            nb::dict d;
            d["page_offset"]      = alias(v.page_offset, e.page_offset);
            d["pinned_tokens"]    = alias(v.pinned_tokens, e.page_offset);
            d["pages"]            = alias(v.pages, e.pages);
            d["head_base_len"]    = alias(v.head_base_len, e.head_base_len);
            d["appended"]         = alias(v.appended, e.slots);
            d["seq_tokens"]       = alias(v.seq_tokens, e.slots);
            d["batch_slots"]      = alias(v.batch_slots, v.batch_size);
            d["group_window"]     = alias(v.group_window, e.groups);
            d["group_ring_pages"] = alias(v.group_ring_pages, e.groups);
            d["head_group"] =
                alias(reinterpret_cast<std::int32_t const*>(v.head_slots), 2 * e.head_slots);
            // The decode split map: the manager's own plan copy, fixed for its life.
            auto const& splits = c.kv.plan().splits.cta_begin;
            d["cta_begin"]     = alias(splits.data(), static_cast<std::int64_t>(splits.size()));
            return d;
          },
          nb::arg("framework") = "numpy", nb::arg("kind") = batch_kind::decode,
          "The batch view's arrays aliasing the manager's memory (no copy; each keeps the manager\n"
          "alive). framework='numpy': read-only NumPy arrays; 'dlpack': read-only tensors that\n"
          "export DLPack (torch.from_dlpack, np.from_dlpack) in both DLPack flavours. Contents\n"
          "change with later calls. head_group interleaves (group, column) per (layer, head);\n"
          "pinned_tokens ([slots * groups], as page_offset) counts each group's leading tokens on\n"
          "a pinned prefix's shared pages, which the eviction keeps in place;\n"
          "cta_begin is the plan's decode split map ([layers * (KV heads + 1)]). kind: whose\n"
          "batch_slots (BatchKind; every other array is shared by both batches).")
      .def(
          "flashinfer_layer",
          [](bound_kv_cache const& c, std::int32_t layer) {
            flashinfer_paged_kv out;
            export_flashinfer_layer(c.kv, layer, out);
            nb::dict d;
            d["indptr"]               = numpy_copy(out.indptr, {out.indptr.size()});
            d["indices"]              = numpy_copy(out.indices, {out.indices.size()});
            d["last_page_len"]        = numpy_copy(out.last_page_len, {out.last_page_len.size()});
            d["first_page_skip"]      = numpy_copy(out.first_page_skip, {out.first_page_skip.size()});
            d["page_size"]            = out.page_size;
            d["v_offset_elements"]    = out.v_offset_elements;
            d["page_stride_elements"] = out.page_stride_elements;
            return d;
          },
          nb::arg("layer"),
          "FlashInfer's paged-KV CSR of `layer` for the current batch (interop/flashinfer.hpp):\n"
          "one single-head request per (batch request r, KV head h) at r * H + h; int32 arrays\n"
          "indptr, indices (virtual page ids: K of pool page p, column c is p * 2 * Hp + c),\n"
          "last_page_len, first_page_skip (copies: the CSR is computed), and the layout scalars.")
      .def(
          "pool",
          [](nb::handle self) -> nb::object {
            auto& c              = nb::cast<bound_kv_cache&>(self);
            auto const& p        = c.kv.pool();
            std::size_t shape[2] = {static_cast<std::size_t>(p.capacity()),
                                    static_cast<std::size_t>(c.kv.plan().page_bytes())};
            auto* base           = reinterpret_cast<std::uint8_t*>(p.base());
            if (c.on_device())
              return nb::ndarray<nb::array_api, std::uint8_t, nb::ndim<2>>(
                         base, 2, shape, self, nullptr, nb::dtype<std::uint8_t>(),
                         nb::device::cuda::value, c.device)
                  .cast();
            return nb::ndarray<nb::numpy, std::uint8_t, nb::ndim<2>>(base, 2, shape, self).cast();
          },
          "[num_pages, page_bytes] writable uint8 array over the page arena (no copy): a NumPy\n"
          "array for memory='host'; for memory='cuda' a device tensor exporting DLPack\n"
          "(torch.from_dlpack(kv.pool())).");
}

}  // namespace tangram::python
