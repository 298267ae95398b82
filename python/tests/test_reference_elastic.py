# SPDX-License-Identifier: Apache-2.0
"""The elastic eviction's CPU reference on NumPy: every layer stages the chunk and its keys
(reference_evict with stage_keys), then reference_evict_elastic picks the request-wide top-K and
the group lengths within the sequence's elastic_page_limit. A tiny model with a short protected
window, so the chunks really are evicted."""
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


def stage_all_layers(kv, plan, seq, chunk, keys, rng, max_candidates):
    L, H, d = plan.num_layers, plan.num_kv_heads, plan.model.head_dim
    indptr = np.array([0, chunk], dtype=np.int32)
    for layer in range(L):
        ck = rng.standard_normal((chunk, H, d), dtype=np.float32)
        cv = rng.standard_normal((chunk, H, d), dtype=np.float32)
        staged = tangram.reference_evict(kv, layer, indptr, ck, cv, source="key_norm",
                                         max_candidates=max_candidates, stage_keys=keys)
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
    while (left := kv.info(seq)["prompt_remaining"]) > 0:
        chunk = min(64, left)
        kv.prepare_chunk(seq, chunk)
        keys = np.zeros((1, L * H, max_candidates), dtype=np.uint32)
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


def test_stage_keys_belong_to_elastic_plans_only(tiny):
    _, static, elastic = tiny
    rng = np.random.default_rng(5)
    H, d = static.num_kv_heads, static.model.head_dim
    ck = rng.standard_normal((32, H, d), dtype=np.float32)
    indptr = np.array([0, 32], dtype=np.int32)
    keys = np.zeros((1, static.num_layers * H, 64), dtype=np.uint32)

    kv = tangram.KVCacheManager(static, num_pages=200, max_sequences=1, max_chunk_tokens=64)
    seq = kv.try_admit(32, 4)
    kv.set_batch([seq])
    kv.prepare_chunk(seq, 32)
    with pytest.raises(ValueError, match="stage_keys: only for a plan with elastic reservation"):
        tangram.reference_evict(kv, 0, indptr, ck, ck, max_candidates=64, stage_keys=keys)
    with pytest.raises(ValueError, match="reference_evict_elastic: the plan reserves static"):
        tangram.reference_evict_elastic(kv, indptr, keys, max_candidates=64)

    kv = tangram.KVCacheManager(elastic, num_pages=200, max_sequences=1, max_chunk_tokens=64)
    seq = kv.try_admit(32, 4)
    kv.set_batch([seq])
    kv.prepare_chunk(seq, 32)
    with pytest.raises(ValueError, match="stage_keys: the plan reserves elastically"):
        tangram.reference_evict(kv, 0, indptr, ck, ck, max_candidates=64)
    short = np.zeros((1, elastic.num_layers * H, 63), dtype=np.uint32)
    with pytest.raises(ValueError, match=r"stage_keys: expected shape \[1, 4, 64\], got dimension 2 = 63"):
        tangram.reference_evict(kv, 0, indptr, ck, ck, max_candidates=64, stage_keys=short)
    # Keys are uint32 and never converted: a converted copy would take the staged keys away.
    with pytest.raises(TypeError):
        tangram.reference_evict(kv, 0, indptr, ck, ck, max_candidates=64,
                                stage_keys=keys.astype(np.int64))
    with pytest.raises(TypeError):
        tangram.reference_evict_elastic(kv, indptr, keys.astype(np.int64), max_candidates=64)
    kv.check_invariants()
