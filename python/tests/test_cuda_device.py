# SPDX-License-Identifier: Apache-2.0
"""tangram.cuda on a GPU: the same prefill, append and decode run by the CUDA kernels on a device
arena (through DeviceMirror) and by the CPU reference on a host arena must leave byte-identical
pools and matching attention. Needs a device and PyTorch or CuPy for the tensors; skipped
otherwise (scripts/gpu_check.sh runs the C++ GPU tests on a bare GPU machine)."""
import numpy as np
import pytest

import tangram

torch = cupy = None
try:
    import torch  # noqa: F811
    if not torch.cuda.is_available():
        torch = None
except ImportError:
    pass
if torch is None:
    try:
        import cupy  # noqa: F811
    except ImportError:
        pass

pytestmark = pytest.mark.skipif(
    not tangram.has_cuda_kernels or tangram.cuda.device_count() == 0 or (torch is None and cupy is None),
    reason="needs the CUDA kernels, a device, and PyTorch or CuPy")


def dev(a):
    return torch.from_numpy(np.ascontiguousarray(a)).cuda() if torch else cupy.asarray(a)


def host(t):
    return t.cpu().numpy() if torch else cupy.asnumpy(t)


def empty(shape, dtype):
    return dev(np.zeros(shape, dtype=dtype))


def zero_pool(kv):
    if kv.pool().__dlpack_device__()[0] == 1:  # host
        kv.pool()[:] = 0
    elif torch:
        torch.from_dlpack(kv.pool()).zero_()
    else:
        cupy.from_dlpack(kv.pool()).fill(0)


def pool_bytes(kv):
    if torch:
        return torch.from_dlpack(kv.pool()).cpu().numpy()
    return cupy.asnumpy(cupy.from_dlpack(kv.pool()))


def test_device_kernels_match_the_cpu_reference(static_plan):
    plan = static_plan
    L, H, d, group = plan.num_layers, plan.num_kv_heads, plan.model.head_dim, plan.model.gqa_group
    n = 24
    rng = np.random.default_rng(5)
    chunk_k = rng.integers(0, 1 << 16, (L, n, H, d), dtype=np.uint16) & 0x3FFF  # finite bf16 bits
    chunk_v = rng.integers(0, 1 << 16, (L, n, H, d), dtype=np.uint16) & 0x3FFF
    new_k = rng.standard_normal((L, 1, H, d), dtype=np.float32)
    new_v = rng.standard_normal((L, 1, H, d), dtype=np.float32)
    q = rng.standard_normal((1, H * group, d), dtype=np.float32)
    q_chunk = rng.standard_normal((n, H * group, d), dtype=np.float32)
    indptr = np.array([0, n], dtype=np.int32)

    managers = {}
    for memory in ("host", "cuda"):
        kv = tangram.KVCacheManager(plan, num_pages=600, max_sequences=2, memory=memory)
        zero_pool(kv)  # arenas start uninitialised: the comparison below must see only writes
        seq = kv.try_admit(n, 4)
        kv.set_batch([seq])
        kv.prepare_chunk(seq, n)
        managers[memory] = (kv, seq)

    kv, seq = managers["host"]
    o_pre_ref, lse_pre_ref = tangram.reference_prefill_attention(kv, 0, indptr, q_chunk,
                                                                chunk_k[0], chunk_v[0])
    kept = np.concatenate([tangram.reference_evict(kv, l, indptr, chunk_k[l], chunk_v[l],
                                                   max_candidates=n).ravel() for l in range(L)])
    kv.commit_chunk(seq, kept.astype(np.int32))
    kv.decode_step()
    for l in range(L):
        tangram.reference_append(kv, l, new_k[l], new_v[l])
    o_ref, lse_ref = tangram.reference_decode_attention(kv, 0, q)

    kv, seq = managers["cuda"]
    mirror = tangram.cuda.DeviceMirror(kv)
    mirror.sync()
    ws = empty((max(mirror.decode_workspace_bytes(),
                    mirror.eviction_workspace_bytes(n, "key_norm")),), np.uint8)
    new_len = empty((1, H), np.int32)
    d_indptr = dev(indptr)
    o_pre, lse_pre = empty((n, H * group, d), np.float32), empty((n, H * group), np.float32)
    tangram.cuda.prefill_attention(mirror, 0, d_indptr, dev(q_chunk), dev(chunk_k[0]),
                                   dev(chunk_v[0]), o_pre, max_chunk=n, lse=lse_pre)
    np.testing.assert_allclose(host(o_pre), o_pre_ref, rtol=2e-3, atol=2e-4)
    np.testing.assert_allclose(host(lse_pre), lse_pre_ref, rtol=1e-4, atol=1e-4)
    kept_dev = []
    for l in range(L):
        tangram.cuda.evict_chunk(mirror, l, d_indptr, dev(chunk_k[l]), dev(chunk_v[l]), new_len,
                                 workspace=ws, max_candidates=n, source="key_norm")
        kept_dev.append(host(new_len).ravel().copy())
    kept_dev = np.concatenate(kept_dev)
    assert kept_dev.tolist() == kept.tolist()
    kv.commit_chunk(seq, kept_dev.astype(np.int32))
    kv.decode_step()
    mirror.sync()
    for l in range(L):
        tangram.cuda.append_decode_kv(mirror, l, dev(new_k[l]), dev(new_v[l]))
    o = empty((1, H * group, d), np.float32)
    lse = empty((1, H * group), np.float32)
    tangram.cuda.decode_attention(mirror, 0, dev(q), o, workspace=ws, lse=lse)
    np.testing.assert_allclose(host(o), o_ref, rtol=2e-3, atol=2e-4)
    np.testing.assert_allclose(host(lse), lse_ref, rtol=1e-4, atol=1e-4)
    # Batch-invariant pieces, PDL and the folded merge: the same attention; the counters end zero.
    ws_inv = empty((mirror.decode_workspace_bytes(invariant_pieces=64),), np.uint8)
    counters = dev(np.zeros(H * kv.max_batch, dtype=np.int32))
    o2 = empty((1, H * group, d), np.float32)
    tangram.cuda.decode_attention(mirror, 0, dev(q), o2, workspace=ws_inv, invariant_pieces=64,
                                  pdl=True, merge_counters=counters)
    np.testing.assert_allclose(host(o2), o_ref, rtol=2e-3, atol=2e-4)
    assert not host(counters).any()
    # The split map balanced on the device for this batch: the reference's map, the same attention.
    tangram.cuda.balance_decode_splits(mirror)
    o3 = empty((1, H * group, d), np.float32)
    tangram.cuda.decode_attention(mirror, 0, dev(q), o3, workspace=ws, balanced_splits=True)
    np.testing.assert_allclose(host(o3), o_ref, rtol=2e-3, atol=2e-4)
    # No map: the layer stream (CTAs across heads), the same attention.
    o4 = empty((1, H * group, d), np.float32)
    tangram.cuda.decode_attention(mirror, 0, dev(q), o4, workspace=ws, layer_stream=True)
    np.testing.assert_allclose(host(o4), o_ref, rtol=2e-3, atol=2e-4)

    host_kv, _ = managers["host"]
    assert np.array_equal(pool_bytes(kv), host_kv.pool()), "the pools differ after the same writes"


def test_device_elastic_eviction_matches_the_cpu_reference(elastic_plan):
    """Elastic reservation: every layer's evict_chunk stages the chunk into stage_keys (blocks at
    mirror.stage_key_layout()'s base), then evict_elastic selects; the same on the CPU reference
    must give the same kept counts, pages and pool bytes."""
    plan = elastic_plan
    L, H, d = plan.num_layers, plan.num_kv_heads, plan.model.head_dim
    n = 24
    rng = np.random.default_rng(7)
    chunk_k = rng.integers(0, 1 << 16, (L, n, H, d), dtype=np.uint16) & 0x3FFF
    chunk_v = rng.integers(0, 1 << 16, (L, n, H, d), dtype=np.uint16) & 0x3FFF
    indptr = np.array([0, n], dtype=np.int32)
    managers = {}
    for memory in ("host", "cuda"):
        kv = tangram.KVCacheManager(plan, num_pages=600, max_sequences=2, memory=memory)
        zero_pool(kv)
        seq = kv.try_admit(n, 4)
        kv.set_batch([seq])
        kv.prepare_chunk(seq, n)
        managers[memory] = (kv, seq)

    kv, seq = managers["host"]
    keys = np.zeros(kv.stage_key_words(indptr), dtype=np.uint32)
    for l in range(L):
        tangram.reference_evict(kv, l, indptr, chunk_k[l], chunk_v[l], max_candidates=n,
                                stage_keys=keys)
    new_len_ref, pages_ref = tangram.reference_evict_elastic(kv, indptr, keys, max_candidates=n)
    wanted = np.array([kv.elastic_wanted_tokens(seq)], dtype=np.int64)
    limit = np.array([kv.elastic_page_limit(seq)], dtype=np.int64)

    kv, seq = managers["cuda"]
    mirror = tangram.cuda.DeviceMirror(kv)
    mirror.sync()
    base, words = mirror.stage_key_layout()
    assert words == keys.size and base.dtype == np.int64 and base.shape == (kv.num_groups,)
    d_keys, d_base = dev(np.zeros(words, dtype=np.uint32)), dev(base)
    ws = empty((max(mirror.eviction_workspace_bytes(n, "key_norm"),
                    mirror.elastic_workspace_bytes()),), np.uint8)
    d_indptr, staged = dev(indptr), empty((1, H), np.int32)
    with pytest.raises(ValueError, match="stage_keys"):
        tangram.cuda.evict_chunk(mirror, 0, d_indptr, dev(chunk_k[0]), dev(chunk_v[0]), staged,
                                 workspace=ws, max_candidates=n,
                                 stage_keys=dev(np.zeros(words + 1, dtype=np.uint32)),
                                 stage_key_base=d_base)
    for l in range(L):
        tangram.cuda.evict_chunk(mirror, l, d_indptr, dev(chunk_k[l]), dev(chunk_v[l]), staged,
                                 workspace=ws, max_candidates=n, source="key_norm",
                                 stage_keys=d_keys, stage_key_base=d_base)
    new_len, pages = empty((1, L * H), np.int32), empty((1,), np.int64)
    tangram.cuda.evict_elastic(mirror, d_indptr, d_keys, d_base, dev(wanted), dev(limit), new_len,
                               workspace=ws, max_candidates=n, pages_out=pages)
    assert host(new_len).tolist() == new_len_ref.tolist()
    assert host(pages).tolist() == pages_ref.tolist()
    host_kv, _ = managers["host"]
    assert np.array_equal(pool_bytes(kv), host_kv.pool()), "the pools differ after the same writes"
