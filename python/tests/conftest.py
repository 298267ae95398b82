# SPDX-License-Identifier: Apache-2.0
import numpy as np
import pytest

import tangram


@pytest.fixture(scope="session")
def samples():
    return tangram.load_retention_samples(str(tangram.profile_path("snapkv/llama-3.1-8b-instruct")))


@pytest.fixture(scope="session")
def profile(samples):
    return tangram.calibrate(samples)


@pytest.fixture(scope="session")
def model():
    return tangram.model_preset("llama-3.1-8b")


def make_plan(model, profile, reservation="static", samples=None):
    o = tangram.PlanOptions()
    o.reservation = reservation
    return tangram.build_plan(model, profile, o, samples)


@pytest.fixture(scope="session")
def static_plan(model, profile):
    return make_plan(model, profile)


@pytest.fixture(scope="session")
def elastic_plan(model, profile, samples):
    return make_plan(model, profile, "elastic", samples)


def prefill(kv, seq, chunk=512):
    """Prefills `seq`'s whole prompt, `chunk` tokens at a time, committing the kept counts the
    plan expects."""
    while (left := kv.info(seq)["prompt_remaining"]) > 0:
        c = min(chunk, left)
        kv.prepare_chunk(seq, c)
        kv.commit_chunk(seq, np.asarray(kv.expected_kept(seq, c), dtype=np.int32))


def prepared_chunk(plan, tokens, max_new=4, max_sequences=2):
    """A 600-page manager whose one sequence (`tokens` prompt tokens, `max_new` answer tokens) is
    the decode batch with its whole prompt prepared as one chunk: (kv, seq, H, d)."""
    kv = tangram.KVCacheManager(plan, num_pages=600, max_sequences=max_sequences)
    seq = kv.try_admit(tokens, max_new)
    kv.set_batch([seq])
    kv.prepare_chunk(seq, tokens)
    return kv, seq, plan.num_kv_heads, plan.model.head_dim
