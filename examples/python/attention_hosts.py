# SPDX-License-Identifier: Apache-2.0
"""Tangram's pages read by FlashInfer's block-sparse decode and by FlashAttention's paged varlen
decode, on the CPU (docs/integration.md, section 10).

The exports (`KVCacheManager.flashinfer_block_sparse`, `.flash_attn_varlen`) give the arrays those
APIs take; the K/V caches are strided views of the pool (no copy). Without a GPU the kernels
themselves cannot run, so each API's semantics is written out here in NumPy (what
`trtllm_batch_decode_with_kv_cache(..., enable_block_sparse_attention=True)` and
`flash_attn_with_kvcache(..., block_table=...)` compute from these arrays) and compared with
Tangram's own decode reference on the same pool. On a GPU, pass the same arrays and the same
strided views (torch.as_strided over `torch.from_dlpack(kv.pool())`) to the real kernels.

Run: python examples/python/attention_hosts.py
"""
import json

import numpy as np
from numpy.lib.stride_tricks import as_strided

import tangram

# A small GQA model (8 query heads on 4 KV heads, d 64) with an f16 cache, two heads per page
# (Hp 2: a group's heads share pool pages, each in its own column; the default global scope pairs
# each head of layer 0, column 0, with one of layer 1, column 1) and per-head budgets, so every
# head of a request holds a different number of tokens.
L, HQ, H, D, P = 2, 8, 4, 64, 16
G = HQ // H
BUDGETS = [[1.0, 0.5, 0.3, 0.7], [0.6, 1.0, 0.4, 0.8]]  # [layer][KV head]
PROMPTS = [70, 100, 130]


def make_plan() -> "tangram.StaticPlan":
    spec = tangram.parse_model_spec(json.dumps({
        "name": "tiny-gqa", "num_layers": L, "num_query_heads": HQ, "num_kv_heads": H,
        "head_dim": D, "kv_dtype": "f16", "layers": [{"kind": "compressed"}] * L}), "example")
    profile = tangram.parse_budget_profile(json.dumps({
        "format": "tangram-budget-profile/v1", "model": spec.name, "scorer": "key_norm",
        "num_model_layers": L, "num_kv_heads": H, "layer_ids": list(range(L)),
        "sink_tokens": 4, "window_tokens": 8, "target_keep_ratio": 0.66, "budgets": BUDGETS}),
        "example")
    o = tangram.PlanOptions()
    o.reservation = "static"  # fixed per-head counts; the exports read either reservation alike
    o.page_tokens = P
    o.group_size = 2
    return tangram.build_plan(spec, profile, o)


def fill(plan, rng):
    """Three requests prefilled (one chunk each, evicted by key norm) and one decode token
    appended, in a decode batch padded to 4 as a CUDA graph's would be. Returns the manager."""
    kv = tangram.KVCacheManager(plan, num_pages=400, max_sequences=4)
    seqs = [kv.try_admit(n, 4) for n in PROMPTS]
    prefill = tangram.BatchKind.prefill
    for seq, n in zip(seqs, PROMPTS):
        kv.set_batch(prefill, [seq])
        kv.prepare_chunk(seq, n)
        indptr = np.array([0, n], dtype=np.int32)
        kept = []
        for layer in range(L):
            k = rng.standard_normal((n, H, D)).astype(np.float16)
            v = rng.standard_normal((n, H, D)).astype(np.float16)
            kept.append(tangram.reference_evict(kv, layer, indptr, k, v, source="key_norm",
                                                max_candidates=n, kind=prefill).ravel())
        kv.commit_chunk(seq, np.concatenate(kept).astype(np.int32))
    kv.set_batch(tangram.BatchKind.decode, seqs, padded_size=4)
    kv.decode_step()
    for layer in range(L):
        new = rng.standard_normal((2, 4, H, D)).astype(np.float32)  # [K|V][B][H][d]
        tangram.reference_append(kv, layer, new[0], new[1])
    return kv, seqs


def attend(q, keys, values, sm_scale):
    """Softmax attention of q [G, d] over keys/values [n, d], in float64."""
    s = (q.astype(np.float64) @ keys.astype(np.float64).T) * sm_scale
    w = np.exp(s - s.max(-1, keepdims=True))
    return (w / w.sum(-1, keepdims=True)) @ values.astype(np.float64)


def flashinfer_block_sparse_decode(q, k_cache, v_cache, block_tables, seq_lens, sm_scale):
    """What FlashInfer's trtllm-gen block-sparse decode computes (kv_layout "HND"): request b's
    query heads h*G..h*G+G-1 attend over the first seq_lens[h, b] tokens of the pages
    block_tables[h, b, :] of KV head h. q [B, H*G, d], caches [pages, H, P, d]."""
    B = q.shape[0]
    o = np.zeros(q.shape, dtype=np.float64)
    for b in range(B):
        for h in range(H):
            n = int(seq_lens[h, b])
            if n == 0:
                continue  # a padding request
            pages = block_tables[h, b, : -(-n // P)]
            keys = k_cache[pages, h].reshape(-1, D)[:n]
            values = v_cache[pages, h].reshape(-1, D)[:n]
            o[b, h * G:(h + 1) * G] = attend(q[b, h * G:(h + 1) * G], keys, values, sm_scale)
    return o


def flash_attn_paged_decode(q, k_cache, v_cache, seqused_k, block_table, sm_scale, window_left):
    """What flash_attn_with_kvcache computes with a block table: sequence j's G query heads (one
    query, the last position, causal) attend over its seqused_k[j] tokens in the pages
    block_table[j, :], only the last window_left + 1 of them when window_left >= 0.
    q [J, 1, G, d], caches [pages, P, 1, d]."""
    o = np.zeros(q.shape, dtype=np.float64)
    for j in range(q.shape[0]):
        n = int(seqused_k[j])
        if n == 0:
            continue
        pages = block_table[j, : -(-n // P)]
        keys = k_cache[pages, :, 0].reshape(-1, D)[:n]
        values = v_cache[pages, :, 0].reshape(-1, D)[:n]
        lo = max(0, n - 1 - window_left) if window_left >= 0 else 0
        o[j, 0] = attend(q[j, 0], keys[lo:], values[lo:], sm_scale)
    return o


def run(verbose: bool = True) -> dict:
    rng = np.random.default_rng(3)
    plan = make_plan()
    kv, seqs = fill(plan, rng)
    B = kv.batch_size  # 4: three requests and one padding slot
    sm_scale = 1.0 / np.sqrt(D)
    pool = kv.pool().view(np.float16).ravel()  # torch: torch.from_dlpack(kv.pool()).view(...)
    item = pool.itemsize
    result = {"flashinfer_max_err": 0.0, "flash_attn_max_err": 0.0, "layers": L,
              "head_lens": [[kv.head_len(s, 0, h) for h in range(H)] for s in seqs]}
    for layer in range(L):
        q = rng.standard_normal((B, HQ, D)).astype(np.float32)
        want, _ = tangram.reference_decode_attention(kv, layer, q, sm_scale=sm_scale)
        want[3] = 0.0  # the padding request's output is not defined

        # FlashInfer: block_tables [H, B, pages] of virtual page ids; the caches' head stride is
        # 0, since each head's virtual pages already carry its column.
        t = kv.flashinfer_block_sparse(layer)
        lay = t["layout"]
        shape = (lay["num_virtual_pages"], H, P, D)
        strides = tuple(item * s for s in (lay["page_stride_elements"], 0, D, 1))
        k_cache = as_strided(pool, shape, strides, writeable=False)
        v_cache = as_strided(pool[lay["v_offset_elements"]:], shape, strides, writeable=False)
        got = flashinfer_block_sparse_decode(q, k_cache, v_cache, t["block_tables"],
                                             t["seq_lens"], sm_scale)
        result["flashinfer_max_err"] = max(result["flashinfer_max_err"],
                                           float(np.abs(got - want).max()))

        # FlashAttention varlen: one sequence per (request, KV head), j = b * H + h; the queries
        # [B, H * G, d] are [B * H, 1, G, d] with no copy.
        f = kv.flash_attn_varlen(layer)
        lay = f["layout"]
        shape = (lay["num_virtual_pages"], P, 1, D)
        strides = tuple(item * s for s in (lay["page_stride_elements"], D, D, 1))
        k_cache = as_strided(pool, shape, strides, writeable=False)
        v_cache = as_strided(pool[lay["v_offset_elements"]:], shape, strides, writeable=False)
        got = flash_attn_paged_decode(q.reshape(B * H, 1, G, D), k_cache, v_cache, f["seqused_k"],
                                      f["block_table"], sm_scale, f["window_left"])
        result["flash_attn_max_err"] = max(result["flash_attn_max_err"],
                                           float(np.abs(got.reshape(B, HQ, D) - want).max()))
    for s in seqs:
        kv.free(s)
    kv.check_invariants()
    if verbose:
        print(f"tokens held per KV head, layer 0: {result['head_lens']}")
        print(f"FlashInfer block-sparse vs Tangram decode: max |diff| "
              f"{result['flashinfer_max_err']:.2e}")
        print(f"FlashAttention varlen   vs Tangram decode: max |diff| "
              f"{result['flash_attn_max_err']:.2e}")
    return result


if __name__ == "__main__":
    out = run()
    assert out["flashinfer_max_err"] < 1e-4 and out["flash_attn_max_err"] < 1e-4, out
