# SPDX-License-Identifier: Apache-2.0
"""A Python engine loop over tangram.KVCacheManager (docs/python.md).

Admission until the pool is full (with the reason when a request does not fit), mixed steps (the
next prefill chunk of every request still in prefill beside a decode step of the requests already
in decode, as vLLM v1 / SGLang schedule them), chunked prefill (prepare, eviction, commit), decode
steps over a batch, speculative tokens rolled back, a turn's
reservation extended, a second turn, a copy-on-write fork, the session parked in host memory and
brought back for a third turn, and free: at the end every page and slot is back. examples/engine_loop.cpp is its C++ twin: the same calls give the same page
accounting at every checkpoint (python/tests/test_engine_loop.py compares them).
Each chunk is evicted by the CPU reference kernel (`reference_evict`, layer by layer, key-norm
scores, over the prefill batch) on K/V written into the manager's own pool, as the CUDA kernel
would on a device pool. Under elastic reservation (the default) every layer stages the chunk and
its keys (`stage_keys`) and one `reference_evict_elastic` per chunk chooses the groups' lengths
within `elastic_page_limit`; under static budgets (`--reservation static`) the counts are known in
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
        L, H = plan.num_layers, plan.num_kv_heads
        if plan.options.reservation == "elastic":
            # Every layer stages the chunk and its candidates' keys; then one request-wide
            # selection after the last layer chooses the groups' lengths.
            keys = np.zeros((1, L * H, candidates), dtype=np.uint32)
            for layer in range(L):
                tangram.reference_evict(kv, layer, indptr, data, data, source="key_norm",
                                        max_candidates=candidates, stage_keys=keys, kind=prefill)
            new_len, _ = tangram.reference_evict_elastic(kv, indptr, keys,
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


def run(num_pages: int = 0, verbose: bool = True, reservation: str = "elastic") -> dict:
    # Elastic reserves one chunk's staging per compressed group on top of what the prompt keeps
    # (these prompts are below the profile's protected 4128 tokens: nothing is compressed), so the
    # same three requests need a larger pool (docs/integration.md, page accounting).
    num_pages = num_pages or (12000 if reservation == "elastic" else 8000)
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

    # Admission until full: the reservation is exact, so "does not fit" is known up front.
    waiting = [(300 + 100 * i, 64) for i in range(12)]  # (prompt, max new tokens)
    running = []
    trace = []
    while waiting:
        result = kv.admit(*waiting[0])  # says why when it does not fit
        if result["id"] is None:
            if verbose:
                print(f"waiting: {result['reason']}, {result['pages_missing']} pages missing")
            break
        waiting.pop(0)
        running.append(result["id"])
    trace.append(snapshot("admitted", kv))
    # Mixed steps: the next chunk of the first two requests still in prefill (the scheduler's
    # prefill budget) beside one decode token for every request already in decode, until every
    # request is prefilled and decoded 32 tokens.
    chunks_per_step = 2
    prefilled = False
    in_flight = -1  # the epoch of the step the device still runs
    while True:
        infos = [kv.info(seq) for seq in running]
        in_prefill = [seq for seq, i in zip(running, infos) if i["phase"] == "prefill"]
        to_prefill = in_prefill[:chunks_per_step]
        to_decode = [seq for seq, i in zip(running, infos)
                     if i["phase"] == "decode" and i["decoded"] < 32]
        if not in_prefill and not prefilled:
            trace.append(snapshot("prefilled", kv))
            prefilled = True
        if not to_prefill and not to_decode:
            break
        if to_decode:
            decode(kv, to_decode, 1)
        for seq in to_prefill:
            prefill_chunk(kv, seq)
        done = kv.advance_epoch()  # end of the step; the previous step's work is done by now
        if in_flight >= 0:
            kv.release_epochs_through(in_flight)
        in_flight = done
    settle(kv)
    trace.append(snapshot("decoded", kv))
    # Speculative decoding: 4 draft tokens per member, then the rejected ones are rolled back.
    kv.set_batch(running)
    kv.decode_step(np.full(len(running), 4, dtype=np.int32))
    for seq in running:
        kv.rollback(seq, 3)  # 1 of 4 accepted
    trace.append(snapshot("rolled_back", kv))
    # The first session's answer runs long: grow its reservation (all or nothing).
    if not kv.try_extend(running[0], 32):
        raise SystemExit("could not extend the first turn")
    decode(kv, running[:1], 64 + 32 - 33)  # to the end of the extended turn
    trace.append(snapshot("extended", kv))

    # A second turn for the first session; the others end.
    first = running[0]
    kv.end_turn(first)  # keeps the compressed history, returns the unused reservation
    for seq in running[1:]:
        kv.free(seq)
    trace.append(snapshot("turn_ended", kv))  # the freed pages wait for their release
    settle(kv)
    if not kv.continue_turn(first, 300, 32):  # "does not fit" is a return value
        raise SystemExit("the second turn did not fit")
    prefill(kv, first)
    trace.append(snapshot("second_turn", kv))
    # A fork shares the parent's pages copy-on-write.
    child = kv.fork(first)
    if child is not None:
        kv.execute_page_copies()
        trace.append(snapshot("forked", kv))
        decode(kv, [first, child], 32)
        kv.free(child)
    else:
        decode(kv, [first], 32)
    settle(kv)
    trace.append(snapshot("fork_done", kv))

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
        "used_pages": kv.used_pages,
        "reserved_pages": kv.reserved_pages,
        "live_sequences": kv.live_sequences,
        "reclaimed_pages": kv.stats["reclaimed_pages"],
        "num_pages": num_pages,
        "checkpoints": trace,
    }
    if verbose:
        for c in trace:
            print(f"{c['label']:<12} used {c['used_pages']:6d}  reserved {c['reserved_pages']:6d}  "
                  f"available {c['available_pages']:6d}  retired {c['retired_pages']:5d}  "
                  f"live {c['live_sequences']:2d}  "
                  f"drawn {c['pages_drawn']:6d}")
        print(", ".join(f"{k} {v}" for k, v in result.items() if k != "checkpoints"))
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reservation", choices=("elastic", "static"), default="elastic")
    out = run(reservation=parser.parse_args().reservation)
    assert out["used_pages"] == 0 and out["reserved_pages"] == 0 and out["live_sequences"] == 0
