# SPDX-License-Identifier: Apache-2.0
"""The elastic eviction's CPU reference on NumPy: every layer stages the chunk and writes its
candidates' keys into stage_keys (reference_evict with stage_keys: uint32
[KVCacheManager.stage_key_words(chunk_indptr)], laid out like the staged groups' page lists, no
padding; needed only from the chunk's stage launches to its evict_elastic), then
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


def stage_all_layers(kv, plan, chunks, stage_keys, rng, max_candidates):
    """Every layer's stage launch over the batch, whose members prepared `chunks` (a list, or one
    int for a single request). Returns chunk_indptr."""
    chunks = [chunks] if isinstance(chunks, int) else list(chunks)
    L, H, d = plan.num_layers, plan.num_kv_heads, plan.model.head_dim
    indptr = np.concatenate([[0], np.cumsum(chunks)]).astype(np.int32)
    rows = int(indptr[-1])
    for layer in range(L):
        ck = rng.standard_normal((rows, H, d), dtype=np.float32)
        cv = rng.standard_normal((rows, H, d), dtype=np.float32)
        staged = tangram.reference_evict(kv, layer, indptr, ck, cv, source="key_norm",
                                         max_candidates=max_candidates, stage_keys=stage_keys)
        assert staged.shape == (len(chunks), H)
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
    while (left := kv.info(seq)["prompt_remaining"]) > 0:
        chunk = min(64, left)
        kv.prepare_chunk(seq, chunk)
        # Sized for this chunk's batch: the staged groups' pages' worth of words.
        keys = np.zeros(kv.stage_key_words(np.array([0, chunk], dtype=np.int32)), dtype=np.uint32)
        indptr = stage_all_layers(kv, plan, chunk, keys, rng, max_candidates)
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


def one_prepared_chunk(plan, seed):
    """A manager over `plan` with one request admitted, batched and its 32-token chunk prepared;
    random chunk rows for it and its chunk_indptr."""
    rng = np.random.default_rng(seed)
    ck = rng.standard_normal((32, plan.num_kv_heads, plan.model.head_dim), dtype=np.float32)
    kv = tangram.KVCacheManager(plan, num_pages=200, max_sequences=1, max_chunk_tokens=64)
    seq = kv.try_admit(32, 4)
    kv.set_batch([seq])
    kv.prepare_chunk(seq, 32)
    return kv, seq, ck, np.array([0, 32], dtype=np.int32)


def test_stage_keys_belong_to_elastic_plans_only(tiny):
    _, static, elastic = tiny
    kv, seq, ck, indptr = one_prepared_chunk(static, 5)
    keys = np.zeros(kv.stage_key_words(indptr), dtype=np.uint32)
    with pytest.raises(ValueError, match="stage_keys: only for a plan with elastic reservation"):
        tangram.reference_evict(kv, 0, indptr, ck, ck, max_candidates=64, stage_keys=keys)
    with pytest.raises(ValueError, match="reference_evict_elastic: the plan reserves static"):
        tangram.reference_evict_elastic(kv, indptr, keys, max_candidates=64)

    kv, seq, ck, indptr = one_prepared_chunk(elastic, 5)
    with pytest.raises(ValueError, match=r"stage_keys: the plan reserves elastically: pass "
                                         r"stage_keys \(uint32 "
                                         r"\[KVCacheManager.stage_key_words\(chunk_indptr, kind\)\]"):
        tangram.reference_evict(kv, 0, indptr, ck, ck, max_candidates=64)
    kv.check_invariants()


def expected_blocks(kv, plan, seqs, chunks):
    """The stage-key blocks of the batch `seqs` (their prepared `chunks`), computed here from the
    page geometry and the head lengths, independently of stage_key_layout: for each request then
    group, in order, a block of ceil(extent / P) * Hp * P words where extent is the longest
    compressed column of the group after the chunk (held + chunk); groups without a compressed
    head (or of a sliding window) and empty chunks get none. Returns ({(request, group): base},
    words)."""
    view = kv.view()
    head_group, window = view["head_group"], view["group_window"]
    L, H = plan.num_layers, plan.num_kv_heads
    P, Hp = plan.page_tokens, plan.group_size
    bases, words = {}, 0
    for r, (seq, chunk) in enumerate(zip(seqs, chunks)):
        extent = {}
        for layer in range(L):
            for h in range(H):
                i = layer * H + h
                g = int(head_group[2 * i])
                if window[g] > 0 or chunk == 0:
                    continue
                extent[g] = max(extent.get(g, 0), kv.head_len(seq, layer, h) + chunk)
        for g in range(kv.num_groups):
            bases[(r, g)] = words
            if g in extent:
                words += -(-extent[g] // P) * Hp * P
    return bases, words


def staged_words(kv, plan, seqs, chunks):
    """Per (request, layer, head) of the batch, the stage-key word of each candidate (held
    tokens then the prepared chunk): base + ((pos // P) * Hp + column) * P + pos % P, base the
    block of the head's (request, group) from expected_blocks. Heads of sliding-window groups (a
    ring, nothing staged) are left out."""
    bases, _ = expected_blocks(kv, plan, seqs, chunks)
    view = kv.view()
    head_group, window = view["head_group"], view["group_window"]
    L, H = plan.num_layers, plan.num_kv_heads
    P, Hp = plan.page_tokens, plan.group_size
    out = {}
    for r, (seq, chunk) in enumerate(zip(seqs, chunks)):
        for layer in range(L):
            for h in range(H):
                i = layer * H + h
                g, column = int(head_group[2 * i]), int(head_group[2 * i + 1])
                if window[g] > 0 or chunk == 0:
                    continue
                base = bases[(r, g)]
                n = kv.head_len(seq, layer, h) + chunk
                out[(r, layer, h)] = [base + ((pos // P) * Hp + column) * P + pos % P
                                      for pos in range(n)]
    return out


def test_stage_key_words_is_the_staged_groups_pages_without_padding(tiny):
    _, _, plan = tiny
    kv = tangram.KVCacheManager(plan, num_pages=400, max_sequences=3, max_chunk_tokens=64)
    a, b = kv.try_admit(100, 4), kv.try_admit(30, 4)
    kv.set_batch([a, b])
    kv.prepare_chunk(a, 64)
    kv.prepare_chunk(b, 30)
    indptr = np.array([0, 64, 94], dtype=np.int32)
    _, words = expected_blocks(kv, plan, [a, b], [64, 30])
    assert kv.stage_key_words(indptr) == words > 0
    # Each request's own pages' worth: no padding of b to a's 64 tokens.
    P, Hp = plan.page_tokens, plan.group_size
    assert words == kv.num_groups * (-(-64 // P) + -(-30 // P)) * Hp * P  # every group staged
    # The batch of the other kind is empty: nothing staged, one word (a buffer is never empty).
    assert kv.stage_key_words(np.array([0], dtype=np.int32), kind=tangram.BatchKind.prefill) == 1
    # chunk_indptr must match the prepared chunks.
    with pytest.raises(ValueError, match="chunk_indptr: request 1 has 20 rows but its prepared "
                                         "chunk"):
        kv.stage_key_words(np.array([0, 64, 84], dtype=np.int32))
    with pytest.raises(ValueError, match="chunk_indptr: expected 3 elements, got 2"):
        kv.stage_key_words(np.array([0, 64], dtype=np.int32))


def test_stage_keys_of_the_wrong_size_or_type_are_refused_before_any_work(tiny):
    _, _, elastic = tiny
    H = elastic.num_kv_heads
    kv, seq, ck, indptr = one_prepared_chunk(elastic, 6)
    words = kv.stage_key_words(indptr)
    assert words == expected_blocks(kv, elastic, [seq], [32])[1] > 0
    pool = kv.pool().copy()

    def refused(keys, message):
        with pytest.raises(ValueError, match=message):
            tangram.reference_evict(kv, 0, indptr, ck, ck, max_candidates=64, stage_keys=keys)
        with pytest.raises(ValueError, match=message):
            tangram.reference_evict_elastic(kv, indptr, keys, max_candidates=64)

    short = np.zeros(words - 1, dtype=np.uint32)
    refused(short, rf"stage_keys: expected shape \[{words}\] "
                   rf"\(KVCacheManager.stage_key_words\(chunk_indptr, kind\) for this batch\), "
                   rf"got \[{words - 1}\]")
    refused(np.zeros(words + 5, dtype=np.uint32),
            rf"stage_keys: expected shape \[{words}\] .*, got \[{words + 5}\]")
    # The old per-request layout [batch, layers * H, max_candidates] (or any 2-D array) is refused.
    refused(np.zeros((1, words), dtype=np.uint32),
            rf"stage_keys: expected shape \[{words}\] .*, got \[1, {words}\]")
    refused(np.zeros((1, elastic.num_layers * H, 64), dtype=np.uint32),
            rf"stage_keys: expected shape \[{words}\] .*, got \[1, {elastic.num_layers * H}, 64\]")
    # Keys are uint32 and never converted: a converted copy would take the staged keys away.
    refused(np.zeros(words, dtype=np.int64),
            rf"stage_keys: expected uint32 elements, got int64 \(shape \[{words}\]")
    refused(np.zeros(words, dtype=np.int32), r"stage_keys: expected uint32 elements, got int32")
    refused(np.zeros(words, dtype=np.float32), r"stage_keys: expected uint32 elements, got float32")
    # Not contiguous: refused rather than copied.
    refused(np.zeros(2 * words, dtype=np.uint32)[::2], r"stage_keys: must be contiguous")
    # Nothing was written: the pool and the sequence are as they were.
    assert (kv.pool() == pool).all()
    assert [kv.head_len(seq, layer, h) for layer in range(elastic.num_layers)
            for h in range(H)] == [0] * (elastic.num_layers * H)
    assert kv.info(seq)["chunk_pending"] == 32
    kv.check_invariants()


SENTINEL = np.uint32(0xDEADBEEF)


def test_stage_writes_every_candidate_key_but_the_leads(tiny):
    """Two requests of different lengths in one batch, chunk after chunk: the words of each
    head's sink stay untouched, every later candidate's word (at its block's offset, computed
    here) is written, and no other word of the buffer changes."""
    _, _, plan = tiny
    L, H = plan.num_layers, plan.num_kv_heads
    rng = np.random.default_rng(12)
    kv = tangram.KVCacheManager(plan, num_pages=400, max_sequences=2, max_chunk_tokens=64)
    seqs = [kv.try_admit(200, 8), kv.try_admit(90, 8)]
    kv.set_batch(seqs)
    staged_chunks = 0
    while any(kv.info(s)["prompt_remaining"] > 0 for s in seqs):
        chunks = [min(64 if r == 0 else 40, kv.info(s)["prompt_remaining"])
                  for r, s in enumerate(seqs)]
        for s, c in zip(seqs, chunks):
            if c > 0:
                kv.prepare_chunk(s, c)
        words_of = staged_words(kv, plan, seqs, chunks)
        _, words = expected_blocks(kv, plan, seqs, chunks)
        indptr = np.concatenate([[0], np.cumsum(chunks)]).astype(np.int32)
        assert kv.stage_key_words(indptr) == words
        assert len(words_of) == sum(L * H for c in chunks if c > 0)  # all compressed
        keys = np.full(words, 0xDEADBEEF, dtype=np.uint32)
        stage_all_layers(kv, plan, chunks, keys, rng, 400)
        written = set()
        for (r, layer, h), where in words_of.items():
            assert len(where) > SINK
            # The protected lead (the sink here: no pinned prefix) is never written: its key is
            # implied. Every later candidate's key lands in its own word.
            assert (keys[where[:SINK]] == SENTINEL).all(), (r, layer, h)
            assert (keys[where[SINK:]] != SENTINEL).all(), (r, layer, h)
            written.update(where[SINK:])
        changed = np.flatnonzero(keys != SENTINEL)
        assert sorted(written) == changed.tolist()  # and nothing else
        assert len(changed) == sum(len(w) - SINK for w in words_of.values())
        new_len, _ = tangram.reference_evict_elastic(kv, indptr, keys, max_candidates=400)
        for r, (s, c) in enumerate(zip(seqs, chunks)):
            if c > 0:
                kv.commit_chunk(s, new_len[r].astype(np.int32))
        kv.check_invariants()
        staged_chunks += 1
    assert staged_chunks >= 3  # later chunks stage held (compacted) tokens too
    for s in seqs:
        kv.free(s)


def run_prefill(plan, fresh_keys_each_chunk, prompt=260, seed=21):
    """Prefills one sequence chunk by chunk; returns each chunk's (new_len, pages) and the final
    pool. fresh_keys_each_chunk: a new zeroed stage-key array per chunk, else one buffer (filled
    with garbage first, large enough for any chunk) whose first stage_key_words words every
    chunk reuses."""
    rng = np.random.default_rng(seed)
    kv = tangram.KVCacheManager(plan, num_pages=400, max_sequences=2, max_chunk_tokens=64)
    kv.pool()[:] = 0
    reused = np.random.default_rng(99).integers(0, 2**32, 1 << 16, dtype=np.uint32)
    seq = kv.try_admit(prompt, 8)
    kv.set_batch([seq])
    out = []
    while (left := kv.info(seq)["prompt_remaining"]) > 0:
        chunk = min(64, left)
        kv.prepare_chunk(seq, chunk)
        words = kv.stage_key_words(np.array([0, chunk], dtype=np.int32))
        assert words <= reused.size
        keys = np.zeros(words, dtype=np.uint32) if fresh_keys_each_chunk else reused[:words]
        indptr = stage_all_layers(kv, plan, chunk, keys, rng, 400)
        new_len, pages = tangram.reference_evict_elastic(kv, indptr, keys, max_candidates=400)
        kv.commit_chunk(seq, new_len[0].astype(np.int32))
        out.append((new_len.copy(), pages.copy()))
    kv.check_invariants()
    held = [kv.head_len(seq, layer, h) for layer in range(plan.num_layers)
            for h in range(plan.num_kv_heads)]
    return out, held, kv.pool().copy()


def test_one_stage_key_buffer_reused_across_chunks_equals_fresh_arrays(tiny):
    _, _, plan = tiny
    reused, held_reused, pool_reused = run_prefill(plan, fresh_keys_each_chunk=False)
    fresh, held_fresh, pool_fresh = run_prefill(plan, fresh_keys_each_chunk=True)
    assert len(reused) == len(fresh) >= 2
    for (len_a, pages_a), (len_b, pages_b) in zip(reused, fresh):
        assert (len_a == len_b).all() and (pages_a == pages_b).all()
    assert held_reused == held_fresh and max(held_reused) < 260  # really evicted
    assert (pool_reused == pool_fresh).all()  # the same survivors in the same slots
