# SPDX-License-Identifier: Apache-2.0
"""Hostile inputs found by an adversarial review: each gets the clean Python error
docs/python.md promises (never a crash, a silent wrap or a reinterpretation). The cases that used to
crash the interpreter run in a subprocess so that a regression cannot take pytest down."""
import copy
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import tangram
from conftest import make_plan, prepared_chunk

PRELUDE = """
import numpy as np, tangram
samples = tangram.load_retention_samples(str(tangram.profile_path("snapkv/llama-3.1-8b-instruct")))
options = tangram.PlanOptions()
options.reservation = "static"  # as the static_plan fixture (conftest.make_plan)
plan = tangram.build_plan(tangram.model_preset("llama-3.1-8b"), tangram.calibrate(samples), options)
H, d = plan.num_kv_heads, plan.model.head_dim
kv = tangram.KVCacheManager(plan, num_pages=600, max_sequences=2)
seq = kv.try_admit(24, 4)
kv.set_batch([seq])
"""


def run_isolated(body):
    """Runs PRELUDE + body in a fresh interpreter; returns (returncode, output)."""
    code = PRELUDE + textwrap.dedent(body)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ))
    return r.returncode, r.stdout + r.stderr


# ----- reference_evict: memory safety ----------------------------------------------------------

CLEAN = """
try:
    {call}
    print("NO-ERROR")
except (ValueError, tangram.UsageError) as e:
    print("CLEAN", type(e).__name__, e)
"""


@pytest.mark.parametrize("case,setup,call", [
    # the binding slices plan.rules at layer * H before it checks the layer (reference.cpp)
    ("huge layer", "kv.prepare_chunk(seq, 24); k = np.zeros((24, H, d), np.uint16)",
     "tangram.reference_evict(kv, 2**30, np.array([0, 24], np.int32), k, k, max_candidates=24)"),
    # no prepare_chunk: the chunk is written to positions no page backs
    ("no prepare_chunk", "k = np.zeros((24, H, d), np.uint16)",
     "tangram.reference_evict(kv, 0, np.array([0, 24], np.int32), k, k, max_candidates=24)"),
    # chunk_indptr says 100000 rows for a prepared chunk of 24
    ("chunk longer than prepared", "kv.prepare_chunk(seq, 24); k = np.zeros((100000, H, d), np.uint16)",
     "tangram.reference_evict(kv, 0, np.array([0, 100000], np.int32), k, k, max_candidates=200000)"),
    # chunk_indptr[0] != 0: rows are read from chunk_k at indptr[r], past its end
    ("indptr not from 0", "kv.prepare_chunk(seq, 24); k = np.zeros((24, H, d), np.uint16)",
     "tangram.reference_evict(kv, 0, np.array([2**30, 2**30 + 24], np.int32), k, k, max_candidates=24)"),
])
def test_reference_evict_never_crashes(case, setup, call):
    rc, out = run_isolated(setup + "\n" + CLEAN.format(call=call))
    assert rc == 0 and "CLEAN" in out, f"{case}: rc={rc} (-11 = SIGSEGV), output: {out[-400:]}"


# ----- silent integer wrap / dtype conversion --------------------------------------------------

def test_commit_chunk_rejects_int64_counts_that_wrap(static_plan):
    kv = tangram.KVCacheManager(static_plan, num_pages=600, max_sequences=2)
    seq = kv.try_admit(24, 4)
    kv.prepare_chunk(seq, 24)
    kept = np.array(kv.expected_kept(seq, 24), dtype=np.int64) + 2**32  # nonsense counts
    with pytest.raises((ValueError, TypeError)):
        kv.commit_chunk(seq, kept)  # must not wrap to int32 (it once did, and was accepted)


def test_commit_chunk_rejects_fractional_counts(static_plan):
    kv = tangram.KVCacheManager(static_plan, num_pages=600, max_sequences=2)
    seq = kv.try_admit(24, 4)
    kv.prepare_chunk(seq, 24)
    kept = np.array(kv.expected_kept(seq, 24), dtype=np.float64) - 0.5  # 23.5: truncated to 23
    with pytest.raises((ValueError, TypeError)):
        kv.commit_chunk(seq, kept)


def test_reference_evict_rejects_int64_indptr_that_wraps(static_plan):
    kv, seq, H, d = prepared_chunk(static_plan, 24)
    k = np.zeros((24, H, d), np.uint16)
    with pytest.raises((ValueError, TypeError)):
        tangram.reference_evict(kv, 0, np.array([0, 2**32 + 24], np.int64), k, k, max_candidates=24)


def test_reference_evict_rejects_float16_as_bf16(static_plan):
    # any_array has no dtype: float16 (same itemsize) is reinterpreted as bf16 bit patterns
    kv, seq, H, d = prepared_chunk(static_plan, 24)
    k = np.ones((24, H, d), np.float16)
    with pytest.raises((ValueError, TypeError)):
        tangram.reference_evict(kv, 0, np.array([0, 24], np.int32), k, k, max_candidates=24)


# ----- value semantics -------------------------------------------------------------------------

def test_plan_options_of_a_built_plan_are_not_mutable(model, profile):
    plan = make_plan(model, profile)
    plan.options.reservation = "elastic"  # a static plan's rules and split map, elastic mode
    plan.options.tp_size = 4
    assert plan.options.reservation == "static" and plan.options.tp_size == 1


def test_sequence_id_compares_unequal_to_other_types(static_plan):
    kv = tangram.KVCacheManager(static_plan, num_pages=600, max_sequences=2)
    seq = kv.try_admit(24, 4)
    assert (seq == None) is False  # noqa: E711  (once a TypeError from __eq__)
    assert seq not in [None, 3]


# ----- samples of another model ----------------------------------------------------------------

def test_build_plan_rejects_samples_of_another_model(model, profile):
    path = tangram.profile_path("snapkv/llama-3.1-8b-instruct")
    d = json.load(open(path))
    d["num_model_layers"] = 48
    d["layer_ids"] = [i + 16 for i in d["layer_ids"]]
    other = tangram.parse_retention_samples(json.dumps(d))
    with pytest.raises(ValueError):
        make_plan(model, profile, "elastic", other)  # once: layers >= 32 skipped, built


def test_reference_evict_on_an_empty_batch_returns_empty(static_plan):
    # decode attention and append accept an empty batch; evict raises about an internal field:
    # ValueError "eviction_params.new_len: null" (a zero-size std::vector's data() is null)
    kv = tangram.KVCacheManager(static_plan, num_pages=600, max_sequences=2)
    kv.set_batch([])
    H, d = static_plan.num_kv_heads, static_plan.model.head_dim
    k = np.zeros((0, H, d), np.uint16)
    out = tangram.reference_evict(kv, 0, np.array([0], np.int32), k, k, max_candidates=1)
    assert out.shape == (0, H)
