# SPDX-License-Identifier: Apache-2.0
"""examples/python/attention_hosts.py: FlashInfer's block-sparse decode and FlashAttention's paged
varlen decode, written out in NumPy and fed the exports and the strided pool views, equal
Tangram's decode reference (GQA 2, two heads per page, per-head lengths, a padded batch)."""
import importlib.util
import pathlib

import numpy as np
from numpy.lib.stride_tricks import as_strided

import tangram

ROOT = pathlib.Path(__file__).resolve().parents[2]


def example():
    spec = importlib.util.spec_from_file_location(
        "attention_hosts", ROOT / "examples/python/attention_hosts.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_both_hosts_read_what_tangram_decode_reads():
    ex = example()
    out = ex.run(verbose=False)
    assert out["flashinfer_max_err"] < 1e-5
    assert out["flash_attn_max_err"] < 1e-5
    # The heads of a request hold different counts (the per-head budgets bite), so a table that
    # mixed up heads or columns could not pass.
    for lens in out["head_lens"]:
        assert len(set(lens)) == ex.H


def test_the_semantics_are_sensitive_to_the_column():
    """The NumPy stand-ins are not vacuous: physical pages without the head's column (what a
    per-page, not per-head, table would give) read another head's tokens and disagree."""
    ex = example()
    rng = np.random.default_rng(3)
    plan = ex.make_plan()
    kv, seqs = ex.fill(plan, rng)
    q = rng.standard_normal((kv.batch_size, ex.HQ, ex.D)).astype(np.float32)
    sm_scale = 1.0 / np.sqrt(ex.D)
    # Layer 1: its heads sit in column 1 of their groups' pages (the plan's global scope pairs
    # each with a head of layer 0, which has column 0).
    assert [int(c) for c in kv.view()["head_group"].reshape(-1, 2)[ex.H:, 1]] == [1] * ex.H
    want, _ = tangram.reference_decode_attention(kv, 1, q, sm_scale=sm_scale)
    t = kv.flashinfer_block_sparse(1)
    lay = t["layout"]
    pool = kv.pool().view(np.float16).ravel()
    shape = (lay["num_virtual_pages"], ex.H, ex.P, ex.D)
    strides = tuple(pool.itemsize * s for s in (lay["page_stride_elements"], 0, ex.D, 1))
    k = as_strided(pool, shape, strides, writeable=False)
    v = as_strided(pool[lay["v_offset_elements"]:], shape, strides, writeable=False)
    good = ex.flashinfer_block_sparse_decode(q, k, v, t["block_tables"], t["seq_lens"], sm_scale)
    np.testing.assert_allclose(good[:3], want[:3], atol=1e-5)
    hp = plan.group_size
    column_zero = (t["block_tables"] // (2 * hp)) * (2 * hp)  # every head reads column 0
    with np.errstate(all="ignore"):  # column 0 past a layer-0 head's length: any bits
        bad = ex.flashinfer_block_sparse_decode(q, k, v, column_zero, t["seq_lens"], sm_scale)
    assert not np.allclose(bad[:3], want[:3], atol=1e-2)
