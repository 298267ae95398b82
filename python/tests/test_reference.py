# SPDX-License-Identifier: Apache-2.0
"""The CPU reference kernels on NumPy arrays, checked against attention computed here in NumPy."""
import numpy as np
import pytest

import tangram
from conftest import prepared_chunk


def to_bf16_bits(x):
    """float32 -> bfloat16 bit patterns (round to nearest even), as uint16."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def from_bf16_bits(b):
    return (b.astype(np.uint32) << 16).view(np.float32)


def test_prefill_eviction_append_and_decode_match_numpy(static_plan):
    plan = static_plan
    L, H, d = plan.num_layers, plan.num_kv_heads, plan.model.head_dim
    group = plan.model.gqa_group
    n = 24  # below the protected 4128 tokens: every head keeps the whole chunk
    rng = np.random.default_rng(7)
    kv = tangram.KVCacheManager(plan, num_pages=600, max_sequences=2)
    seq = kv.try_admit(n, 4)
    kv.set_batch([seq])
    kv.prepare_chunk(seq, n)
    chunk_k = to_bf16_bits(rng.standard_normal((L, n, H, d), dtype=np.float32))
    chunk_v = to_bf16_bits(rng.standard_normal((L, n, H, d), dtype=np.float32))
    indptr = np.array([0, n], dtype=np.int32)
    kept = np.concatenate([
        tangram.reference_evict(kv, l, indptr, chunk_k[l], chunk_v[l], source="key_norm",
                                max_candidates=n).ravel()
        for l in range(L)])
    assert kept.tolist() == kv.expected_kept(seq, n)
    kv.commit_chunk(seq, kept.astype(np.int32))

    kv.decode_step()
    new_k = rng.standard_normal((L, 1, H, d), dtype=np.float32)
    new_v = rng.standard_normal((L, 1, H, d), dtype=np.float32)
    for l in range(L):
        tangram.reference_append(kv, l, new_k[l], new_v[l])
    q = rng.standard_normal((1, H * group, d), dtype=np.float32)
    o, lse = tangram.reference_decode_attention(kv, 0, q)
    assert o.shape == (1, H * group, d) and lse.shape == (1, H * group)

    # Independent: softmax attention over the 24 prompt tokens and the decoded one, in NumPy.
    keys = np.concatenate([from_bf16_bits(chunk_k[0]), from_bf16_bits(to_bf16_bits(new_k[0]))])
    vals = np.concatenate([from_bf16_bits(chunk_v[0]), from_bf16_bits(to_bf16_bits(new_v[0]))])
    for qh in range(H * group):
        h = qh // group
        logits = keys[:, h, :] @ q[0, qh] / np.sqrt(d)
        m = logits.max()
        w = np.exp(logits - m)
        want = (w / w.sum()) @ vals[:, h, :]
        np.testing.assert_allclose(o[0, qh], want, rtol=2e-4, atol=2e-5)
        assert lse[0, qh] == pytest.approx(m + np.log(w.sum()), rel=1e-5, abs=1e-5)
    # Batch-invariant pieces (25 tokens: one piece, where the split map cuts them over the
    # head's CTAs): the same attention up to rounding; K is range-checked.
    o_inv, lse_inv = tangram.reference_decode_attention(kv, 0, q, invariant_pieces=4)
    np.testing.assert_allclose(o_inv, o, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(lse_inv, lse, rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="invariant_pieces.*65"):
        tangram.reference_decode_attention(kv, 0, q, invariant_pieces=65)
    kv.free(seq)
    kv.check_invariants()


def test_wrong_sizes_and_dtypes_name_the_argument(static_plan):
    kv, seq, H, d = prepared_chunk(static_plan, 16, max_new=2)
    indptr = np.array([0, 16], dtype=np.int32)
    as_f32 = np.zeros((16, H, d), dtype=np.float32)  # the cache holds bf16 (2 bytes)
    with pytest.raises(ValueError, match="chunk_k: the cache holds bf16; pass float32 for f32"):
        tangram.reference_evict(kv, 0, indptr, as_f32, as_f32, max_candidates=16)
    short = np.zeros((15, H, d), dtype=np.uint16)
    with pytest.raises(ValueError, match="chunk_k: expected"):
        tangram.reference_evict(kv, 0, indptr, short, short, max_candidates=16)
    with pytest.raises(ValueError, match="source: unknown score source"):
        ok = np.zeros((16, H, d), dtype=np.uint16)
        tangram.reference_evict(kv, 0, indptr, ok, ok, source="random", max_candidates=16)


def causal_attention(q, keys, vals, past, group):
    """Softmax attention of chunk rows q [c, Hq, d] over `past` earlier keys and the chunk's rows
    up to each row (keys/vals [past + c, H, d]); returns (o, lse)."""
    c, hq, d = q.shape
    o = np.zeros_like(q)
    lse = np.zeros((c, hq), dtype=np.float32)
    for t in range(c):
        for qh in range(hq):
            k = keys[: past + t + 1, qh // group]
            logits = k @ q[t, qh] / np.sqrt(d)
            m = logits.max()
            w = np.exp(logits - m)
            o[t, qh] = (w / w.sum()) @ vals[: past + t + 1, qh // group]
            lse[t, qh] = m + np.log(w.sum())
    return o, lse


def test_prefill_attention_over_the_kept_past_and_the_chunk(static_plan):
    plan = static_plan
    L, H, d, group = plan.num_layers, plan.num_kv_heads, plan.model.head_dim, plan.model.gqa_group
    rng = np.random.default_rng(9)
    kv = tangram.KVCacheManager(plan, num_pages=2400, max_sequences=2)
    seq = kv.try_admit(40, 4)  # two chunks, 24 then 16 rows; all below the protected 4128
    kv.set_batch([seq])
    ks, vs = [], []
    for n in (24, 16):
        kv.prepare_chunk(seq, n)
        indptr = np.array([0, n], dtype=np.int32)
        ck = to_bf16_bits(rng.standard_normal((L, n, H, d), dtype=np.float32))
        cv = to_bf16_bits(rng.standard_normal((L, n, H, d), dtype=np.float32))
        q = rng.standard_normal((n, H * group, d), dtype=np.float32)
        o, lse = tangram.reference_prefill_attention(kv, 1, indptr, q, ck[1], cv[1])
        ks.append(from_bf16_bits(ck[1]))
        vs.append(from_bf16_bits(cv[1]))
        want_o, want_lse = causal_attention(q, np.concatenate(ks), np.concatenate(vs),
                                            sum(len(k) for k in ks[:-1]), group)
        np.testing.assert_allclose(o, want_o, rtol=2e-4, atol=2e-5)
        np.testing.assert_allclose(lse, want_lse, rtol=1e-5, atol=1e-5)
        kept = np.concatenate([tangram.reference_evict(kv, l, indptr, ck[l], cv[l],
                                                       max_candidates=64).ravel()
                               for l in range(L)])
        kv.commit_chunk(seq, kept.astype(np.int32))
    kv.free(seq)


def test_snapkv_takes_the_prefill_lse_and_checks_it(static_plan):
    # The weights exp(s - lse) themselves are checked in C++ (eviction reference and kernel
    # tests); here: the keyword reaches eviction_params.q_lse, sized and validated.
    plan = static_plan
    group = plan.model.gqa_group
    rng = np.random.default_rng(11)
    kv, seq, H, d = prepared_chunk(plan, 24, max_sequences=1)
    indptr = np.array([0, 24], dtype=np.int32)
    ck = to_bf16_bits(rng.standard_normal((24, H, d), dtype=np.float32))
    q = rng.standard_normal((24, H * group, d), dtype=np.float32)
    _, lse = tangram.reference_prefill_attention(kv, 0, indptr, q, ck, ck)
    with pytest.raises(ValueError, match="q_lse"):
        tangram.reference_evict(kv, 0, indptr, ck, ck, source="snapkv", q=q, q_lse=lse[:5],
                                max_candidates=64)
    with pytest.raises(ValueError, match="q_lse.*key_norm"):
        tangram.reference_evict(kv, 0, indptr, ck, ck, source="key_norm", q_lse=lse,
                                max_candidates=64)
    kept = tangram.reference_evict(kv, 0, indptr, ck, ck, source="snapkv", q=q, q_lse=lse,
                                   max_candidates=64)
    assert kept.shape == (1, H) and ((kept >= 0) & (kept <= 24)).all()
    kv.free(seq)


def test_too_few_candidates_is_refused_before_anything_changes(static_plan):
    kv, seq, H, d = prepared_chunk(static_plan, 24, max_sequences=1)
    before = kv.pool().copy()
    kv_data = np.ones((24, H, d), dtype=np.uint16)
    indptr = np.array([0, 24], dtype=np.int32)
    with pytest.raises(ValueError, match=r"max_candidates: 1 is below the 24 candidates \(held \+ chunk\) of request 0, layer 0"):
        tangram.reference_evict(kv, 0, indptr, kv_data, kv_data, max_candidates=1)
    assert np.array_equal(kv.pool(), before)
    kv.check_invariants()


def test_fp8_scales_reach_the_reference_and_are_validated(static_plan):
    # The fixture's cache is bf16: scales are refused naming the field (they are for fp8 caches
    # only, kernels/kv_scales.hpp); the count and the pairing are checked too.
    plan = static_plan
    H, d, group = plan.num_kv_heads, plan.model.head_dim, plan.model.gqa_group
    kv = tangram.KVCacheManager(plan, num_pages=600, max_sequences=2)
    seq = kv.try_admit(4, 4)
    kv.set_batch([seq])
    kv.prepare_chunk(seq, 4)
    kv.commit_chunk(seq, np.array(kv.expected_kept(seq, 4), dtype=np.int32))
    kv.decode_step()
    k = np.zeros((1, H, d), dtype=np.float32)
    one = np.ones(1, dtype=np.float32)
    with pytest.raises(ValueError, match="append_params.scales: only for fp8 KV dtypes, kv dtype is bf16"):
        tangram.reference_append(kv, 0, k, k, k_scale=one, v_scale=one)
    with pytest.raises(ValueError, match="k_scale, v_scale: pass both or neither"):
        tangram.reference_append(kv, 0, k, k, k_scale=one)
    q = np.zeros((1, H * group, d), dtype=np.float32)
    with pytest.raises(ValueError, match=rf"k_scale: expected 1 \(per tensor\) or {H} \(per KV head\) elements, got {H + 1}"):
        tangram.reference_decode_attention(kv, 0, q, k_scale=np.ones(H + 1, dtype=np.float32),
                                           v_scale=np.ones(H + 1, dtype=np.float32))
    with pytest.raises(ValueError, match="v_scale: expected 1 elements, got 2"):
        tangram.reference_decode_attention(kv, 0, q, k_scale=one,
                                           v_scale=np.ones(2, dtype=np.float32))
    o, _ = tangram.reference_decode_attention(kv, 0, q)  # no scales: fine
    assert o.shape == (1, H * group, d)


def test_eviction_takes_fp8_scales_and_validates_them(static_plan):
    # reference_evict passes k_scale / v_scale to eviction_params.scales (Python plans build bf16
    # caches, so the check that they arrive is the fp8-only refusal naming the field and dtype;
    # the fp8 arithmetic is covered by the C++ reference and emulation tests).
    plan = static_plan
    H, d = plan.num_kv_heads, plan.model.head_dim
    kv = tangram.KVCacheManager(plan, num_pages=600, max_sequences=2)
    seq = kv.try_admit(8, 4)
    kv.set_batch([seq])
    kv.prepare_chunk(seq, 8)
    chunk = np.zeros((8, H, d), dtype=np.uint16)
    indptr = np.array([0, 8], dtype=np.int32)
    one = np.ones(1, dtype=np.float32)
    before = kv.pool().copy()
    with pytest.raises(ValueError, match="eviction_params.scales: only for fp8 KV dtypes, kv dtype is bf16"):
        tangram.reference_evict(kv, 0, indptr, chunk, chunk, max_candidates=8, k_scale=one,
                                v_scale=one)
    with pytest.raises(ValueError, match="k_scale, v_scale: pass both or neither"):
        tangram.reference_evict(kv, 0, indptr, chunk, chunk, max_candidates=8, v_scale=one)
    assert np.array_equal(kv.pool(), before)
    kept = tangram.reference_evict(kv, 0, indptr, chunk, chunk, max_candidates=8)  # no scales
    assert kept.shape == (1, H)


def test_balanced_split_map_fits_the_batch_and_leaves_attention_unchanged(static_plan):
    # Two requests of 40 and 7 tokens decoding: the map balanced on their head lengths gives every
    # head at least one CTA, sums to the plan's N_CTA, never holds more in its fullest CTA than
    # the plan's map, and decode attention on it equals attention on the plan's map.
    plan = static_plan
    L, H, d, group = plan.num_layers, plan.num_kv_heads, plan.model.head_dim, plan.model.gqa_group
    kv = tangram.KVCacheManager(plan, num_pages=4000, max_sequences=2)
    rng = np.random.default_rng(11)
    seqs = []
    for n in (40, 7):
        seq = kv.try_admit(n, 4)
        assert seq is not None
        kv.set_batch([seq])
        kv.prepare_chunk(seq, n)
        kv.commit_chunk(seq, np.array(kv.expected_kept(seq, n), dtype=np.int32))
        seqs.append(seq)
    kv.set_batch(seqs)
    kv.decode_step()
    for l in range(L):
        k = rng.standard_normal((2, H, d), dtype=np.float32)
        tangram.reference_append(kv, l, k, k)
    m = tangram.reference_balance_decode_splits(kv)
    v = kv.view()
    plan_map = np.asarray(v["cta_begin"]).reshape(L, H + 1)
    N = int(plan_map[0, -1])
    assert m.shape == (L, H + 1) and m.dtype == np.int32
    assert (m[:, 0] == 0).all() and (m[:, -1] == N).all()
    assert (np.diff(m, axis=1) >= 1).all()
    # Each head's tokens over the batch, from the view's own arrays (no window in this plan).
    slots = np.asarray(v["batch_slots"])
    base = np.asarray(v["head_base_len"]).reshape(-1, L, H)
    tokens = sum(base[s] + np.asarray(v["appended"])[s] for s in slots)  # [L, H]
    assert tokens.sum() > 0

    def fullest(bounds):
        shares = np.diff(bounds, axis=1)
        return (-(-tokens // shares)).max(axis=1)  # ceil per head, max per layer

    assert (fullest(m) <= fullest(plan_map)).all()
    assert (fullest(m) < fullest(plan_map)).any()  # these two requests are far from the plan's mix
    q = rng.standard_normal((2, H * group, d), dtype=np.float32)
    for l in (0, L - 1):
        o_plan, lse_plan = tangram.reference_decode_attention(kv, l, q)
        o_bal, lse_bal = tangram.reference_decode_attention(kv, l, q, balanced_splits=True)
        np.testing.assert_allclose(o_bal, o_plan, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(lse_bal, lse_plan, rtol=1e-6, atol=1e-6)
        # No map at all: the CTAs cut the layer's tokens across heads; the same attention.
        o_ls, lse_ls = tangram.reference_decode_attention(kv, l, q, layer_stream=True)
        np.testing.assert_allclose(o_ls, o_plan, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(lse_ls, lse_plan, rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="balanced_splits and layer_stream: pass at most one"):
        tangram.reference_decode_attention(kv, 0, q, balanced_splits=True, layer_stream=True)
    for seq in seqs:
        kv.free(seq)
