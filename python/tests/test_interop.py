# SPDX-License-Identifier: Apache-2.0
"""Both batch kinds from Python, and the FlashInfer block-sparse / FlashAttention varlen exports,
checked against the manager's own head lengths and page lists (the attention equality of the
exports is tested in C++: test/interop)."""
import numpy as np
import pytest

import tangram


def prefilled(plan, n=40, t=8):
    kv = tangram.KVCacheManager(plan, num_pages=8000, max_sequences=4)
    seqs = [kv.try_admit(n + 8 * i, t) for i in range(3)]
    for s in seqs:
        kv.set_batch(tangram.BatchKind.prefill, [s])
        chunk = kv.info(s)["prompt_remaining"]
        kv.prepare_chunk(s, chunk)
        kv.commit_chunk(s, kv.expected_kept(s, chunk))
    return kv, seqs


def test_both_batch_kinds_are_kept_apart(static_plan):
    kv, seqs = prefilled(static_plan)
    kv.set_batch(tangram.BatchKind.decode, seqs[:2], padded_size=4)
    kv.set_batch(tangram.BatchKind.prefill, [seqs[2]])
    assert kv.batch_size_of(tangram.BatchKind.decode) == 4
    assert kv.batch_padding(tangram.BatchKind.decode) == 2
    assert kv.batch_size_of(tangram.BatchKind.prefill) == 1
    assert kv.batch_padding(tangram.BatchKind.prefill) == 0
    assert kv.batch_size == 4  # the decode batch, as C++ batch_size()
    assert kv.batch_sequence(1) == seqs[1]
    assert kv.batch_sequence(0, tangram.BatchKind.prefill) == seqs[2]
    assert kv.view(kind=tangram.BatchKind.prefill)["batch_slots"].tolist() == [seqs[2].slot]
    assert kv.view()["batch_slots"][:2].tolist() == [seqs[0].slot, seqs[1].slot]
    kv.set_batch(seqs[:1])  # set_batch(ids) is the decode batch
    assert kv.batch_size_of(tangram.BatchKind.decode) == 1
    assert kv.batch_size_of(tangram.BatchKind.prefill) == 1
    with pytest.raises(ValueError, match="set_batch.padded_size: .* got 1"):
        kv.set_batch(tangram.BatchKind.decode, seqs[:2], padded_size=1)


def test_exports_list_each_head_pages(static_plan):
    plan = static_plan
    kv, seqs = prefilled(plan)
    kv.set_batch(tangram.BatchKind.decode, seqs, padded_size=4)
    kv.decode_step(np.array([1, 1, 1, 0], dtype=np.int32))
    H, P, Hp = plan.num_kv_heads, plan.page_tokens, plan.group_size
    head_group = kv.view()["head_group"].reshape(-1, 2)
    for layer in (0, plan.num_layers - 1):
        fi = kv.flashinfer_block_sparse(layer)
        fa = kv.flash_attn_varlen(layer, max_pages=16)
        assert fi["block_tables"].shape[:2] == (H, 4)
        assert fa["block_table"].shape == (4 * H, 16)
        assert fa["cu_seqlens_q"].tolist() == list(range(4 * H + 1))
        assert fa["window_left"] == -1
        assert fi["layout"]["v_offset_elements"] == Hp * P * plan.model.head_dim
        assert fi["layout"]["num_virtual_pages"] == 2 * Hp * kv.num_pages - Hp
        for b in range(4):
            for h in range(H):
                n = kv.head_len(seqs[b], layer, h) if b < 3 else 0
                assert fi["seq_lens"][h, b] == n
                assert fa["seqused_k"][b * H + h] == n
                if n == 0:
                    continue
                g, col = head_group[layer * H + h]
                pages = kv.group_pages(seqs[b], int(g))[: -(-n // P)]
                want = [p * 2 * Hp + col for p in pages]
                assert fi["block_tables"][h, b, : len(want)].tolist() == want
                assert fa["block_table"][b * H + h, : len(want)].tolist() == want
        assert np.diff(fa["cu_seqlens_k"]).tolist() == fa["seqused_k"].tolist()
    with pytest.raises(ValueError, match="max_pages: 1 is shorter"):
        kv.flash_attn_varlen(0, max_pages=1)
    with pytest.raises(ValueError, match="layer: must be in"):
        kv.flashinfer_block_sparse(plan.num_layers)
    kv.free(seqs[0])
    with pytest.raises(tangram.UsageError, match="export_flashinfer_block_sparse"):
        kv.flashinfer_block_sparse(0)


def test_prefill_reference_kernels_run_on_the_prefill_batch(static_plan):
    plan = static_plan
    L, H, d, group = plan.num_layers, plan.num_kv_heads, plan.model.head_dim, plan.model.gqa_group
    kv = tangram.KVCacheManager(plan, num_pages=2400, max_sequences=2)
    a, b = kv.try_admit(16, 2), kv.try_admit(24, 2)
    kv.set_batch([a])  # the decode batch holds another sequence meanwhile
    kv.set_batch(tangram.BatchKind.prefill, [b])
    kv.prepare_chunk(b, 24)
    indptr = np.array([0, 24], dtype=np.int32)
    rng = np.random.default_rng(3)
    ck = rng.integers(0, 1 << 14, (24, H, d), dtype=np.uint16)  # small bf16 bit patterns
    q = rng.standard_normal((24, H * group, d), dtype=np.float32)
    kind = tangram.BatchKind.prefill
    o, lse = tangram.reference_prefill_attention(kv, 0, indptr, q, ck, ck, kind=kind)
    assert o.shape == (24, H * group, d)
    kept = tangram.reference_evict(kv, 0, indptr, ck, ck, max_candidates=24, kind=kind)
    assert kept.shape == (1, H)
    # On the decode batch the same call sees a's unprepared chunk and refuses.
    with pytest.raises(ValueError, match="prepared chunk"):
        tangram.reference_evict(kv, 0, indptr, ck, ck, max_candidates=24)
