# SPDX-License-Identifier: Apache-2.0
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
