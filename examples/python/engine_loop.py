# SPDX-License-Identifier: Apache-2.0
"""A Python engine loop over tangram.KVCacheManager (docs/python.md).

Admission until the pool is full (with the reason when a request does not fit), each request
reserving one answer window (tangram.AnswerWindow) rather than its max_tokens; mixed steps (the
next prefill chunk of every request still in prefill beside a decode step of the requests already
in decode, as vLLM v1 / SGLang schedule them), chunked prefill (prepare, eviction, commit), decode
steps over a batch; answers that reach their window grow, and when a growth does not fit a session
is parked in host memory (an idle one first, else the newest running turn, which resumes where it
stopped): nothing recomputed; then a second turn (restored from host memory when its session was
parked while idle), speculative tokens rolled back, a copy-on-write fork, a turn's reservation
grown, the session parked in host memory and brought back for a third turn, and free: at the end
every page and slot is back. examples/engine_loop.cpp is its C++ twin: the same calls give the
same page accounting at every checkpoint (python/tests/test_engine_loop.py compares them).
Each chunk is evicted by the CPU reference kernel (`reference_evict`, layer by layer, key-norm
scores, over the prefill batch) on K/V written into the manager's own pool, as the CUDA kernel
would on a device pool. Under elastic reservation (the default) every layer stages the chunk and
writes its candidates' keys into `stage_keys` (uint32, `kv.stage_key_words(chunk_indptr)` of them
for the chunk's batch: laid out like the staged groups' page lists, no padding, and needed only
from the chunk's stage launches to its `reference_evict_elastic`) and one
`reference_evict_elastic` per chunk chooses the groups' lengths within
`elastic_page_limit`; under static budgets (`--reservation static`) the counts are known in
advance, so the loop checks them against `expected_kept`.

Run: python examples/python/engine_loop.py [--reservation elastic|static]   (after `pip install .`)
"""
from __future__ import annotations

import argparse

import numpy as np

import tangram

CHUNK = 512


def chunk_kv(rows: int, heads: int, head_dim: int) -> np.ndarray:
    """A chunk's K (or V) for one layer as bf16 bit patterns, [rows, heads, head_dim]: a fixed
    pattern (the C++ twin writes the same), standing in for the model's projections."""
    t, h, x = np.meshgrid(np.arange(rows), np.arange(heads), np.arange(head_dim), indexing="ij")
    return (((t * 31 + h * 7 + x) % 128) + 0x3F00).astype(np.uint16)


def prefill_chunk(kv: tangram.KVCacheManager, seq: tangram.SequenceId) -> None:
    """The next chunk of `seq`: prepare, evict over the prefill batch (the decode batch is left as
    it is), commit. (The C++ twin evicts a mixed step's chunks in one launch over a prefill batch
    of several sequences: the same page accounting.)"""
    plan = kv.plan
    left = kv.info(seq)["prompt_remaining"]
    if left > 0:
        chunk = min(CHUNK, left)
        kv.prepare_chunk(seq, chunk)
        prefill = tangram.BatchKind.prefill
        kv.set_batch(prefill, [seq])  # the eviction's own batch
        data = chunk_kv(chunk, plan.num_kv_heads, plan.model.head_dim)
        indptr = np.array([0, chunk], dtype=np.int32)
        candidates = kv.info(seq)["seq_tokens"] + chunk  # bound on held + chunk of any head
        L = plan.num_layers
        if plan.options.reservation == "elastic":
            # Every layer stages the chunk and writes its candidates' keys into stage_keys, sized
            # for this chunk's batch (the staged groups' pages' worth of words, no padding;
            # contents on entry do not matter; an engine allocates one buffer of
            # tangram.stage_key_words_bound(plan, context_limit, max_batch) words up front and
            # passes its first `words` words); then one request-wide selection after the last
            # layer chooses the groups' lengths.
            words = kv.stage_key_words(indptr, kind=prefill)
            stage_keys = np.empty(words, dtype=np.uint32)
            for layer in range(L):
                tangram.reference_evict(kv, layer, indptr, data, data, source="key_norm",
                                        max_candidates=candidates, stage_keys=stage_keys,
                                        kind=prefill)
            new_len, _ = tangram.reference_evict_elastic(kv, indptr, stage_keys,
                                                         max_candidates=candidates, kind=prefill)
            kv.commit_chunk(seq, new_len[0])
            return
        kept = np.concatenate([
            tangram.reference_evict(kv, layer, indptr, data, data, source="key_norm",
                                    max_candidates=candidates, kind=prefill).ravel()
            for layer in range(L)]).astype(np.int32)
        # Static budgets: the kernel keeps exactly what the rules say.
        assert kept.tolist() == kv.expected_kept(seq, chunk)
        kv.commit_chunk(seq, kept)


def prefill(kv: tangram.KVCacheManager, seq: tangram.SequenceId) -> None:
    """Every remaining prompt token of the turn, one chunk at a time: prepare, evict, commit."""
    while kv.info(seq)["prompt_remaining"] > 0:
        prefill_chunk(kv, seq)


def settle(kv: tangram.KVCacheManager) -> None:
    """The work of every step so far is done: the pages those steps freed may be reused."""
    kv.release_epochs_through(kv.advance_epoch())


def decode(kv: tangram.KVCacheManager, batch: list[tangram.SequenceId], steps: int) -> None:
    kv.set_batch(batch)
    for _ in range(steps):
        kv.decode_step()  # room for one token per head; the engine appends K/V and attends


def snapshot(label: str, kv: tangram.KVCacheManager) -> dict:
    """Page accounting at one point of the loop."""
    return {"label": label, "used_pages": kv.used_pages, "reserved_pages": kv.reserved_pages,
            "available_pages": kv.available_pages, "retired_pages": kv.retired_pages,
            "live_sequences": kv.live_sequences,
            "pages_drawn": kv.stats["pages_drawn"]}


MAX_TOKENS = 64  # every request's max_tokens here


class Request:
    """A request's answer in flight: its sequence (a new one when a parked turn resumes), the
    tokens it will answer (a stand-in for where EOS comes), when it last ran (the victim order's
    clock) and which request it is (its admission order)."""

    def __init__(self, seq, answer: int, last_used: int, key: int):
        self.seq, self.answer, self.last_used, self.key = seq, answer, last_used, key


class AnswerScheduler:
    """Answers that grow (tangram.AnswerWindow): turns reserve a window of their max_tokens, grow
    by a window when they reach it, and when a growth (or a resume) does not fit, sessions are
    parked in host memory in the window's victim order (ended ones first, then the newest running
    turn, the growing one included) and come back later: never recomputed, never lost. The C++
    twin's answer_scheduler, call for call."""

    def __init__(self, kv: tangram.KVCacheManager, window: tangram.AnswerWindow):
        self.kv, self.window = kv, window
        self.host_limit = window.host_limit_bytes(kv.num_pages * kv.plan.page_bytes)
        self.host_used, self.clock = 0, 0
        self.turns = []     # running turns parked mid-answer, oldest first: (session, host, req)
        self.sessions = []  # ended sessions parked while idle

    def tick(self) -> int:
        self.clock += 1
        return self.clock

    def grow(self, running: list, idle: list) -> None:
        """Before a decode step: parked turns resume first (oldest first; idle sessions are parked
        to make room for them), then every turn at the end of its reservation grows by a window."""
        kv, window = self.kv, self.window
        while self.turns:
            session, host, req = self.turns[0]
            grown = session.max_new + window.growth(MAX_TOKENS, session.max_new)
            back = kv.try_resume(session, session.max_new if session.decoded < session.max_new
                                 else grown)
            if back is None:
                # Pages awaiting their release (deferred reuse) come back within two steps: wait
                # for them rather than park more.
                if kv.retired_pages == 0 and self.park_victim(running, idle, idle_only=True):
                    continue
                break  # waits for memory
            seq, pages = back
            kv.pool()[pages] = host  # the copy-in, before any kernel reads the sequence
            self.host_used -= host.nbytes
            running.append(Request(seq, req.answer, self.tick(), req.key))
            self.turns.pop(0)
        i = 0
        while i < len(running):
            info = kv.info(running[i].seq)
            if (info["phase"] != "decode" or info["decoded"] < info["max_new"]
                    or info["decoded"] >= running[i].answer):
                i += 1
                continue
            seq = running[i].seq
            more = window.growth(MAX_TOKENS, info["max_new"])
            while not kv.try_extend(seq, more):
                # It waits a step while freed pages await their release, or when nothing may be
                # parked; else the victim goes (perhaps the growing turn itself).
                if kv.retired_pages > 0 or not self.park_victim(running, idle, idle_only=False):
                    break
                if not kv.contains(seq):
                    break
            i += 1 if kv.contains(seq) else 0  # `running` lost it: same index again

    def park_victim(self, running: list, idle: list, idle_only: bool) -> bool:
        """Parks the window's victim among the idle sessions and (unless idle_only) the running
        turns in decode, within the host memory left. False when none may be parked."""
        kv = self.kv
        lists = [idle] if idle_only else [idle, running]
        where, candidates = [], []
        for lst in lists:
            for i, r in enumerate(lst):
                info = kv.info(r.seq)
                candidates.append((r.seq, info["phase"], r.last_used, info["held_pages"]))
                where.append((lst, i))
        k = self.window.choose_victim(candidates, kv.plan.page_bytes,
                                      self.host_limit - self.host_used)
        if k is None:
            return False
        lst, i = where[k]
        req = lst[i]
        session = kv.park(req.seq)
        host = kv.pool()[session.device_pages].copy()  # the engine's copy-out
        kv.complete_park(req.seq)
        self.host_used += host.nbytes
        del lst[i]
        (self.turns if session.mid_turn else self.sessions).append((session, host, req))
        return True

    def take_parked_session(self, key: int):
        """The idle session of request `key` if it was parked (its next turn restores it)."""
        for i, (session, host, req) in enumerate(self.sessions):
            if req.key == key:
                self.host_used -= host.nbytes
                return self.sessions.pop(i)
        return None

    def drop_parked_sessions(self) -> None:
        """Forgets the parked idle sessions (their users left): their host copies go."""
        for _, host, _ in self.sessions:
            self.host_used -= host.nbytes
        self.sessions = []


def run(num_pages: int = 32000, verbose: bool = True, reservation: str = "elastic") -> dict:
    # Pages of one head each (the default per-head pages): 32,000 hold four of these requests at
    # once, so admission stops with requests waiting and answers that grow must park sessions.
    # Both reservations admit the same: below the profile's 4128 protected tokens nothing is
    # compressed, and no admission reserves more than the request uncompressed (docs/memory.md).
    samples = tangram.load_retention_samples(
        str(tangram.profile_path("snapkv/llama-3.1-8b-instruct")))
    options = tangram.PlanOptions()
    options.reservation = reservation  # "elastic" (the default) or "static"
    # An elastic plan weighs its split map on the samples' placements (docs/integration.md §1).
    plan = tangram.build_plan(tangram.model_preset("llama-3.1-8b"), tangram.calibrate(samples),
                              options, samples)
    # deferred_reuse: freed pages wait for the engine's release (several streams; one epoch per
    # step, released a step later, as a GPU running one step behind the host would be).
    kv = tangram.KVCacheManager(plan, num_pages=num_pages, max_sequences=16, deferred_reuse=True)
    # Answers reserve 16 tokens at a time here (the default window, 256, exceeds these answers).
    answers = AnswerScheduler(kv, tangram.AnswerWindow(window_tokens=16))
    window = answers.window

    # Admission until full: a request reserves its prompt and one answer window, or waits.
    waiting = [(300 + 100 * i, 40 + 4 * i) for i in range(14)]  # (prompt, answer length)
    running, idle = [], []
    trace = []
    while waiting:
        result = kv.admit(waiting[0][0], window.first(MAX_TOKENS))  # says why when it does not fit
        if result["id"] is None:
            if verbose:
                print(f"waiting: {result['reason']}, {result['pages_missing']} pages missing")
            break
        running.append(Request(result["id"], waiting[0][1], answers.tick(), len(running)))
        waiting.pop(0)
    trace.append(snapshot("admitted", kv))
    # Mixed steps: each step resumes parked turns and grows the answers that reached their window
    # (parking a session when a growth does not fit), then prefills the next chunk of the first
    # two requests still in prefill beside one decode token for every request answering. A
    # finished answer ends its turn: the session stays on the GPU, idle, until it is parked or
    # continues.
    chunks_per_step = 2
    prefilled = False
    in_flight = -1  # the epoch of the step the device still runs
    mixed_steps = 0
    while True:
        answers.grow(running, idle)
        infos = [kv.info(r.seq) for r in running]
        in_prefill = [r.seq for r, i in zip(running, infos) if i["phase"] == "prefill"]
        to_prefill = in_prefill[:chunks_per_step]
        to_decode = [r.seq for r, i in zip(running, infos)
                     if i["phase"] == "decode" and i["decoded"] < i["max_new"]]
        if not in_prefill and not prefilled:
            trace.append(snapshot("prefilled", kv))
            prefilled = True
        if not running and not answers.turns:
            break
        if to_prefill and to_decode:
            mixed_steps += 1
        if to_decode:
            decode(kv, to_decode, 1)
            # The decode split map balanced for this batch's head lengths: on a GPU
            # tangram.cuda.balance_decode_splits(mirror) after mirror.sync(), and the step's
            # decode_attention(..., balanced_splits=True); here the CPU reference computes it.
            tangram.reference_balance_decode_splits(kv)
        for seq in to_prefill:
            prefill_chunk(kv, seq)
        # Finished answers end their turns (unused reservation back; the history stays).
        for r in list(running):
            info = kv.info(r.seq)
            if info["phase"] == "decode" and info["decoded"] >= r.answer:
                kv.end_turn(r.seq)
                idle.append(Request(r.seq, r.answer, answers.tick(), r.key))
                running.remove(r)
        done = kv.advance_epoch()  # end of the step; the previous step's work is done by now
        if in_flight >= 0:
            kv.release_epochs_through(in_flight)
        in_flight = done
    settle(kv)
    trace.append(snapshot("decoded", kv))
    if mixed_steps == 0 or kv.stats["parked_mid_turn"] == 0 or kv.stats["resumed"] == 0:
        raise SystemExit("no step mixed prefill chunks and decodes, or no turn parked and resumed")

    # A second turn for the first session (request 0, on the GPU or parked while idle); the
    # others leave (their users are done).
    first = None
    for r in idle:
        if r.key == 0:
            first = r.seq
        else:
            kv.free(r.seq)
    first_parked = answers.take_parked_session(0)
    answers.drop_parked_sessions()
    trace.append(snapshot("turn_ended", kv))  # the freed pages wait for their release
    settle(kv)
    if first_parked is not None:  # parked while idle: restored with its next turn
        session, host, _ = first_parked
        back = kv.try_unpark(session, 300, window.first(MAX_TOKENS))
        if back is None:
            raise SystemExit("the second turn did not fit")
        first, pages = back
        kv.pool()[pages] = host
    elif not kv.continue_turn(first, 300, window.first(MAX_TOKENS)):  # "does not fit" is False
        raise SystemExit("the second turn did not fit")
    prefill(kv, first)
    trace.append(snapshot("second_turn", kv))
    # Speculative decoding: 4 draft tokens, then the 3 the verifier rejected are rolled back.
    kv.set_batch([first])
    kv.decode_step(np.full(1, 4, dtype=np.int32))
    kv.rollback(first, 3)
    trace.append(snapshot("rolled_back", kv))
    # A fork shares the parent's pages copy-on-write; both decode.
    child = kv.fork(first)
    if child is not None:
        kv.execute_page_copies()
        trace.append(snapshot("forked", kv))
        decode(kv, [first, child], 8)
        kv.free(child)
    else:
        decode(kv, [first], 8)
    settle(kv)
    trace.append(snapshot("fork_done", kv))
    # The answer reaches its window and grows by another (all or nothing; nothing else is live).
    info = kv.info(first)
    decode(kv, [first], info["max_new"] - info["decoded"])
    if not kv.try_extend(first, window.growth(MAX_TOKENS, kv.info(first)["max_new"])):
        raise SystemExit("could not extend the second turn")
    decode(kv, [first], 16)  # to the end of the grown reservation
    trace.append(snapshot("extended", kv))

    # The session idles between turns: park it in host memory (its pages go back to the pool),
    # then bring it back into fresh pages for a third turn.
    kv.end_turn(first)
    parked = kv.park(first)
    host = kv.pool()[parked.device_pages].copy()  # the engine's copy-out
    kv.complete_park(first)
    settle(kv)
    trace.append(snapshot("parked", kv))
    restored = kv.try_unpark(parked, 200, 16)  # "does not fit" is None
    if restored is None:
        raise SystemExit("the parked session did not fit back")
    first, pages = restored
    kv.pool()[pages] = host  # the copy-in, before any kernel reads the sequence
    prefill(kv, first)
    decode(kv, [first], 16)
    trace.append(snapshot("unparked", kv))
    kv.free(first)
    settle(kv)
    kv.check_invariants()
    trace.append(snapshot("freed", kv))

    result = {
        "admitted": kv.stats["admitted"],
        "rejected_waiting": len(waiting),
        "parks": kv.stats["parked"],
        "resumed": kv.stats["resumed"],
        "used_pages": kv.used_pages,
        "reserved_pages": kv.reserved_pages,
        "live_sequences": kv.live_sequences,
        "reclaimed_pages": kv.stats["reclaimed_pages"],
        "num_pages": num_pages,
        "stats": kv.stats,
        "checkpoints": trace,
    }
    if verbose:
        for c in trace:
            print(f"{c['label']:<12} used {c['used_pages']:6d}  reserved {c['reserved_pages']:6d}  "
                  f"available {c['available_pages']:6d}  retired {c['retired_pages']:5d}  "
                  f"live {c['live_sequences']:2d}  "
                  f"drawn {c['pages_drawn']:6d}")
        print(", ".join(f"{k} {v}" for k, v in result.items() if k not in ("checkpoints", "stats")))
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reservation", choices=("elastic", "static"), default="elastic")
    out = run(reservation=parser.parse_args().reservation)
    assert out["used_pages"] == 0 and out["reserved_pages"] == 0 and out["live_sequences"] == 0
