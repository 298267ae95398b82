# SPDX-License-Identifier: Apache-2.0
"""The elastic eviction's CPU reference on NumPy: every layer stages the chunk and writes its
candidates' keys beside their tokens (reference_evict with slot_keys: one uint32 per pool slot,
KVCacheManager.slot_key_words of them, allocated once beside the pool), then
reference_evict_elastic picks the request-wide top-K and the group lengths within the sequence's
elastic_page_limit. A tiny model with a short protected window, so the chunks really are
evicted."""
import json

import numpy as np
import pytest

import tangram

SINK, WINDOW = 4, 16


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    spec = {"name": "tiny", "num_layers": 2, "num_query_heads": 4, "num_kv_heads": 2, "head_dim": 8,
            "kv_dtype": "f32", "layers": [{"kind": "compressed"}, {"kind": "compressed"}]}
    path = tmp_path_factory.mktemp("model") / "tiny.json"
    path.write_text(json.dumps(spec))
    model = tangram.load_model_spec(str(path))
    rng = np.random.default_rng(3)
    samples = []
    for i in range(24):
        n = int(rng.integers(150, 400))
        kept = (SINK + WINDOW + rng.dirichlet(np.ones(4)) * 4 * (0.3 * n - SINK - WINDOW))
        samples.append({"context_tokens": n,
                        "kept_tokens": np.minimum(kept, n).astype(int).reshape(2, 2).tolist()})
    text = json.dumps({"format": "retention-samples/v1", "model": "tiny", "scorer": "snapkv",
                       "target_keep_ratio": 0.3, "sink_tokens": SINK, "window_tokens": WINDOW,
                       "num_model_layers": 2, "layer_ids": [0, 1], "num_kv_heads": 2,
                       "samples": samples})
    s = tangram.parse_retention_samples(text)
    profile = tangram.calibrate(s)
    o = tangram.PlanOptions()
    o.reservation = "elastic"
    elastic = tangram.build_plan(model, profile, o, s)
    o.reservation = "static"
    return model, tangram.build_plan(model, profile, o), elastic


def stage_all_layers(kv, plan, seq, chunk, slot_keys, rng, max_candidates):
    L, H, d = plan.num_layers, plan.num_kv_heads, plan.model.head_dim
    indptr = np.array([0, chunk], dtype=np.int32)
    for layer in range(L):
        ck = rng.standard_normal((chunk, H, d), dtype=np.float32)
        cv = rng.standard_normal((chunk, H, d), dtype=np.float32)
        staged = tangram.reference_evict(kv, layer, indptr, ck, cv, source="key_norm",
                                         max_candidates=max_candidates, slot_keys=slot_keys)
        assert staged.shape == (1, H)
    return indptr


def test_elastic_prefill_stays_within_the_reservation(tiny):
    _, _, plan = tiny
    L, H = plan.num_layers, plan.num_kv_heads
    rng = np.random.default_rng(11)
    kv = tangram.KVCacheManager(plan, num_pages=400, max_sequences=2, max_chunk_tokens=64)
    prompt, max_candidates = 300, 400
    seq = kv.try_admit(prompt, 8)
    kv.set_batch([seq])
    seen = 0
    # Allocated once beside the pool, reused by every chunk: one uint32 per pool slot.
    assert kv.slot_key_words == kv.num_pages * plan.group_size * plan.page_tokens
    keys = np.zeros(kv.slot_key_words, dtype=np.uint32)
    while (left := kv.info(seq)["prompt_remaining"]) > 0:
        chunk = min(64, left)
        kv.prepare_chunk(seq, chunk)
        indptr = stage_all_layers(kv, plan, seq, chunk, keys, rng, max_candidates)
        wanted, limit = kv.elastic_wanted_tokens(seq), kv.elastic_page_limit(seq)
        assert keys.any()  # the staged heads wrote their keys into the caller's array
        new_len, pages = tangram.reference_evict_elastic(kv, indptr, keys,
                                                         max_candidates=max_candidates)
        seen += chunk
        assert new_len.shape == (1, L * H) and pages.shape == (1,)
        assert 0 <= pages[0] <= limit
        # Every head keeps its protected sink and recent window; together they keep at least the
        # scorer's total (padding inside a group only adds tokens).
        assert (new_len[0] >= min(seen, SINK + WINDOW)).all() and (new_len[0] <= seen).all()
        assert new_len[0].sum() >= min(wanted, L * H * seen)
        kv.commit_chunk(seq, new_len[0].astype(np.int32))
        kv.check_invariants()
    held = [kv.head_len(seq, layer, h) for layer in range(L) for h in range(H)]
    assert max(held) < prompt  # really evicted
    assert kv.stats["reclaimed_pages"] == 0
    kv.free(seq)
    assert kv.used_pages == 0 and kv.reserved_pages == 0


def test_slot_keys_belong_to_elastic_plans_only(tiny):
    _, static, elastic = tiny
    rng = np.random.default_rng(5)
    H, d = static.num_kv_heads, static.model.head_dim
    ck = rng.standard_normal((32, H, d), dtype=np.float32)
    indptr = np.array([0, 32], dtype=np.int32)

    kv = tangram.KVCacheManager(static, num_pages=200, max_sequences=1, max_chunk_tokens=64)
    keys = np.zeros(kv.slot_key_words, dtype=np.uint32)
    seq = kv.try_admit(32, 4)
    kv.set_batch([seq])
    kv.prepare_chunk(seq, 32)
    with pytest.raises(ValueError, match="slot_keys: only for a plan with elastic reservation"):
        tangram.reference_evict(kv, 0, indptr, ck, ck, max_candidates=64, slot_keys=keys)
    with pytest.raises(ValueError, match="reference_evict_elastic: the plan reserves static"):
        tangram.reference_evict_elastic(kv, indptr, keys, max_candidates=64)

    kv = tangram.KVCacheManager(elastic, num_pages=200, max_sequences=1, max_chunk_tokens=64)
    seq = kv.try_admit(32, 4)
    kv.set_batch([seq])
    kv.prepare_chunk(seq, 32)
    with pytest.raises(ValueError, match=r"slot_keys: the plan reserves elastically: pass "
                                         r"slot_keys \(uint32 \[KVCacheManager.slot_key_words\]"):
        tangram.reference_evict(kv, 0, indptr, ck, ck, max_candidates=64)
    kv.check_invariants()


def test_slot_keys_of_the_wrong_size_or_type_are_refused_before_any_work(tiny):
    _, _, elastic = tiny
    rng = np.random.default_rng(6)
    H, d = elastic.num_kv_heads, elastic.model.head_dim
    ck = rng.standard_normal((32, H, d), dtype=np.float32)
    indptr = np.array([0, 32], dtype=np.int32)
    kv = tangram.KVCacheManager(elastic, num_pages=200, max_sequences=1, max_chunk_tokens=64)
    words = kv.slot_key_words
    assert words == 200 * elastic.group_size * elastic.page_tokens
    seq = kv.try_admit(32, 4)
    kv.set_batch([seq])
    kv.prepare_chunk(seq, 32)
    pool = kv.pool().copy()

    def refused(keys, message):
        with pytest.raises(ValueError, match=message):
            tangram.reference_evict(kv, 0, indptr, ck, ck, max_candidates=64, slot_keys=keys)
        with pytest.raises(ValueError, match=message):
            tangram.reference_evict_elastic(kv, indptr, keys, max_candidates=64)

    short = np.zeros(words - 1, dtype=np.uint32)
    refused(short, rf"slot_keys: expected shape \[{words}\] \(KVCacheManager.slot_key_words: one "
                   rf"uint32 per pool slot\), got \[{words - 1}\]")
    refused(np.zeros(words + 5, dtype=np.uint32),
            rf"slot_keys: expected shape \[{words}\] .*, got \[{words + 5}\]")
    # The old per-request layout [batch, layers * H, max_candidates] (or any 2-D array) is refused.
    refused(np.zeros((1, words), dtype=np.uint32),
            rf"slot_keys: expected shape \[{words}\] .*, got \[1, {words}\]")
    refused(np.zeros((1, elastic.num_layers * H, 64), dtype=np.uint32),
            rf"slot_keys: expected shape \[{words}\] .*, got \[1, {elastic.num_layers * H}, 64\]")
    # Keys are uint32 and never converted: a converted copy would take the staged keys away.
    refused(np.zeros(words, dtype=np.int64),
            rf"slot_keys: expected uint32 elements, got int64 \(shape \[{words}\]")
    refused(np.zeros(words, dtype=np.int32), r"slot_keys: expected uint32 elements, got int32")
    refused(np.zeros(words, dtype=np.float32), r"slot_keys: expected uint32 elements, got float32")
    # Not contiguous: refused rather than copied.
    refused(np.zeros(2 * words, dtype=np.uint32)[::2], r"slot_keys: must be contiguous")
    # Nothing was written: the pool and the sequence are as they were.
    assert (kv.pool() == pool).all()
    assert [kv.head_len(seq, layer, h) for layer in range(elastic.num_layers)
            for h in range(H)] == [0] * (elastic.num_layers * H)
    kv.check_invariants()


SENTINEL = np.uint32(0xDEADBEEF)


def staged_slots(kv, plan, seq, chunk):
    """Per (layer, head) of the sequence, the slot-key indices of its candidates (held tokens
    then the prepared chunk), computed from the page table: the token at column position `pos`
    of a head on (group, column) lives at (page * Hp + column) * P + pos % P, page the group's
    page pos // P. Heads of sliding-window groups (a ring, nothing staged) are left out."""
    view = kv.view()
    head_group, window = view["head_group"], view["group_window"]
    L, H = plan.num_layers, plan.num_kv_heads
    P, Hp = plan.page_tokens, plan.group_size
    out = {}
    for layer in range(L):
        for h in range(H):
            g, column = (int(x) for x in head_group[2 * (layer * H + h): 2 * (layer * H + h) + 2])
            if window[g] > 0:
                continue
            pages = kv.group_pages(seq, g)
            n = kv.head_len(seq, layer, h) + chunk
            out[(layer, h)] = [(pages[pos // P] * Hp + column) * P + pos % P for pos in range(n)]
    return out


def test_stage_writes_every_candidate_key_beside_its_token_but_the_sinks(tiny):
    _, _, plan = tiny
    L, H = plan.num_layers, plan.num_kv_heads
    rng = np.random.default_rng(12)
    kv = tangram.KVCacheManager(plan, num_pages=400, max_sequences=2, max_chunk_tokens=64)
    keys = np.empty(kv.slot_key_words, dtype=np.uint32)
    seq = kv.try_admit(200, 8)
    kv.set_batch([seq])
    staged_chunks = 0
    while (left := kv.info(seq)["prompt_remaining"]) > 0:
        chunk = min(64, left)
        kv.prepare_chunk(seq, chunk)
        slots = staged_slots(kv, plan, seq, chunk)
        assert len(slots) == L * H  # every head of the tiny model is compressed
        keys.fill(SENTINEL)
        indptr = stage_all_layers(kv, plan, seq, chunk, keys, rng, 400)
        written = set()
        for (layer, h), where in slots.items():
            assert len(where) > SINK
            # The protected lead (the sink here: no pinned prefix) is never written: its key is
            # implied. Every later candidate's key lands in its own slot.
            assert (keys[where[:SINK]] == SENTINEL).all(), (layer, h)
            assert (keys[where[SINK:]] != SENTINEL).all(), (layer, h)
            written.update(where[SINK:])
        changed = np.flatnonzero(keys != SENTINEL)
        assert sorted(written) == changed.tolist()  # and nothing else
        assert len(changed) == sum(len(w) - SINK for w in slots.values())
        new_len, _ = tangram.reference_evict_elastic(kv, indptr, keys, max_candidates=400)
        kv.commit_chunk(seq, new_len[0].astype(np.int32))
        kv.check_invariants()
        staged_chunks += 1
    assert staged_chunks >= 3  # later chunks stage held (compacted) tokens too
    kv.free(seq)


def run_prefill(plan, fresh_keys_each_chunk, prompt=260, seed=21):
    """Prefills one sequence chunk by chunk; returns each chunk's (new_len, pages) and the final
    pool. fresh_keys_each_chunk: a new zeroed slot-key array per chunk, else one array (filled
    with garbage first) reused by every chunk."""
    rng = np.random.default_rng(seed)
    kv = tangram.KVCacheManager(plan, num_pages=400, max_sequences=2, max_chunk_tokens=64)
    kv.pool()[:] = 0
    reused = np.random.default_rng(99).integers(0, 2**32, kv.slot_key_words, dtype=np.uint32)
    seq = kv.try_admit(prompt, 8)
    kv.set_batch([seq])
    out = []
    while (left := kv.info(seq)["prompt_remaining"]) > 0:
        chunk = min(64, left)
        kv.prepare_chunk(seq, chunk)
        keys = np.zeros(kv.slot_key_words, dtype=np.uint32) if fresh_keys_each_chunk else reused
        indptr = stage_all_layers(kv, plan, seq, chunk, keys, rng, 400)
        new_len, pages = tangram.reference_evict_elastic(kv, indptr, keys, max_candidates=400)
        kv.commit_chunk(seq, new_len[0].astype(np.int32))
        out.append((new_len.copy(), pages.copy()))
    kv.check_invariants()
    held = [kv.head_len(seq, layer, h) for layer in range(plan.num_layers)
            for h in range(plan.num_kv_heads)]
    return out, held, kv.pool().copy()


def test_one_slot_key_array_reused_across_chunks_equals_fresh_arrays(tiny):
    _, _, plan = tiny
    reused, held_reused, pool_reused = run_prefill(plan, fresh_keys_each_chunk=False)
    fresh, held_fresh, pool_fresh = run_prefill(plan, fresh_keys_each_chunk=True)
    assert len(reused) == len(fresh) >= 2
    for (len_a, pages_a), (len_b, pages_b) in zip(reused, fresh):
        assert (len_a == len_b).all() and (pages_a == pages_b).all()
    assert held_reused == held_fresh and max(held_reused) < 260  # really evicted
    assert (pool_reused == pool_fresh).all()  # the same survivors in the same slots
