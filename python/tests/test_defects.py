# SPDX-License-Identifier: Apache-2.0
"""Issue 31 through the bindings: one dtype rule for every reference kernel (a uint16 array is
bfloat16 bit patterns, never cast by value), empty fp8 scales refused, and objects of many
members loaded in n log n (load_plan shares the C++ reader)."""
import json

import numpy as np
import pytest

import tangram


def bf16_bits(x):
    """float32 -> bfloat16 bit patterns (round to nearest even), as uint16."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def decoding(plan, n=4):
    kv = tangram.KVCacheManager(plan, num_pages=600, max_sequences=2)
    seq = kv.try_admit(n, 4)
    kv.set_batch([seq])
    kv.prepare_chunk(seq, n)
    kv.commit_chunk(seq, np.array(kv.expected_kept(seq, n), dtype=np.int32))
    kv.decode_step()
    return kv, seq


def test_reference_append_reads_uint16_as_bf16_bits_like_evict(static_plan):
    # The example: K = V = 1.0 given as bf16 bits (0x3F80 = 16256) was cast by value to
    # 16256.0, so attention returned 16256 instead of 1. The same token as bf16 bits, float32 and
    # float16 must give the same cache contents, hence the same attention.
    H, d, group = static_plan.num_kv_heads, static_plan.model.head_dim, static_plan.model.gqa_group
    kv, seq = decoding(static_plan, n=1)
    q = np.ones((1, H * group, d), dtype=np.float32)
    outputs = []
    for k in (np.full((1, H, d), 0x3F80, dtype=np.uint16), np.ones((1, H, d), dtype=np.float32),
              np.ones((1, H, d), dtype=np.float16)):
        tangram.reference_append(kv, 0, k, k)  # the same decode slot each time
        outputs.append(tangram.reference_decode_attention(kv, 0, q))
    for o, lse in outputs[1:]:
        np.testing.assert_array_equal(o, outputs[0][0])
        np.testing.assert_array_equal(lse, outputs[0][1])
    assert np.abs(outputs[0][0]).max() < 100  # not 16256
    kv.free(seq)


def test_reference_queries_take_the_same_rule(static_plan):
    H, d, group = static_plan.num_kv_heads, static_plan.model.head_dim, static_plan.model.gqa_group
    kv, seq = decoding(static_plan)
    rng = np.random.default_rng(3)
    q32 = bf16_bits(rng.standard_normal((1, H * group, d), dtype=np.float32))
    as_float = (q32.astype(np.uint32) << 16).view(np.float32)
    o_bits, lse_bits = tangram.reference_decode_attention(kv, 0, q32)
    o_f32, lse_f32 = tangram.reference_decode_attention(kv, 0, as_float)
    np.testing.assert_array_equal(o_bits, o_f32)
    np.testing.assert_array_equal(lse_bits, lse_f32)
    kv.free(seq)


@pytest.mark.parametrize("dtype", [np.float64, np.int32, np.int16, np.uint8])
def test_other_element_types_are_refused_naming_the_argument(static_plan, dtype):
    H, d, group = static_plan.num_kv_heads, static_plan.model.head_dim, static_plan.model.gqa_group
    kv, seq = decoding(static_plan)
    bad = np.ones((1, H, d), dtype=dtype)
    f32 = np.ones((1, H, d), dtype=np.float32)
    before = kv.pool().copy()
    with pytest.raises(ValueError, match="^k: expected float32, float16 or bfloat16"):
        tangram.reference_append(kv, 0, bad, f32)
    with pytest.raises(ValueError, match="^v: expected float32, float16 or bfloat16"):
        tangram.reference_append(kv, 0, f32, bad)
    q = np.ones((1, H * group, d), dtype=dtype)
    with pytest.raises(ValueError, match="^q: expected float32, float16 or bfloat16"):
        tangram.reference_decode_attention(kv, 0, q)
    sinks = np.ones(H * group, dtype=dtype)
    with pytest.raises(ValueError, match="^sinks: expected float32 elements"):
        tangram.reference_decode_attention(kv, 0, np.ones((1, H * group, d), np.float32),
                                           sinks=sinks)
    assert np.array_equal(kv.pool(), before)
    kv.free(seq)


def test_k_and_v_must_share_one_element_type(static_plan):
    H, d = static_plan.num_kv_heads, static_plan.model.head_dim
    kv, seq = decoding(static_plan)
    with pytest.raises(ValueError, match="k, v: must have one element type, got float32 and uint16"):
        tangram.reference_append(kv, 0, np.ones((1, H, d), np.float32),
                                 np.ones((1, H, d), np.uint16))
    kv.free(seq)


def test_empty_scales_are_refused_not_read_as_none(static_plan):
    H, d, group = static_plan.num_kv_heads, static_plan.model.head_dim, static_plan.model.gqa_group
    kv, seq = decoding(static_plan)
    empty = np.zeros(0, dtype=np.float32)
    k = np.ones((1, H, d), dtype=np.float32)
    q = np.ones((1, H * group, d), dtype=np.float32)
    msg = rf"k_scale: expected 1 \(per tensor\) or {H} \(per KV head\) elements, got 0"
    with pytest.raises(ValueError, match=msg):
        tangram.reference_append(kv, 0, k, k, k_scale=empty, v_scale=empty)
    with pytest.raises(ValueError, match=msg):
        tangram.reference_decode_attention(kv, 0, q, k_scale=empty, v_scale=empty)
    with pytest.raises(ValueError, match="k_scale: expected float32 elements, got float64"):
        tangram.reference_decode_attention(kv, 0, q, k_scale=np.ones(1), v_scale=np.ones(1))
    kv.free(seq)


def test_load_plan_reads_an_object_of_many_members(tmp_path, static_plan):
    # 300,000 members in one object: minutes with the old per-member scan, a fraction of a second
    # in n log n (no timing asserted: the plan must simply load back unchanged).
    path = tmp_path / "plan.json"
    tangram.save_plan(static_plan, str(path))
    doc = json.loads(path.read_text())
    padded = {f"pad{i}": 0 for i in range(300000)}
    padded.update(doc)
    path.write_text(json.dumps(padded))
    back = tangram.load_plan(str(path))
    assert back.head_rules == static_plan.head_rules
    assert np.array_equal(back.cta_begin, static_plan.cta_begin)
    # A repeated member is still found.
    text = path.read_text()
    path.write_text(text[:-1] + ', "pad7": 1}')
    with pytest.raises(ValueError, match='duplicate member "pad7"'):
        tangram.load_plan(str(path))
