# SPDX-License-Identifier: Apache-2.0
"""Calibration and plans through the bindings agree with the C++ library's contracts."""
import json
import math

import numpy as np
import pytest

import tangram
from conftest import make_plan


def test_samples_and_profile_shapes(samples, profile):
    assert samples.kept.shape == (len(samples), len(samples.layer_ids) * samples.num_kv_heads)
    assert profile.budgets.shape == (len(profile.layer_ids), profile.num_kv_heads)
    assert np.all((profile.budgets > 0) & (profile.budgets <= 1))


def test_calibration_report_matches_the_budgets(samples, profile):
    report = tangram.evaluate_calibration(samples)
    assert report.num_samples == len(samples)
    assert abs(report.mean_budget - float(profile.budgets.mean())) < 1e-9
    assert report.reserved_over_ideal > 1.0
    assert 0.0 <= report.heldout_clip_fraction < 0.05


def test_plan_options_round_trip_every_field():
    o = tangram.PlanOptions()
    o.group_size, o.page_tokens, o.scope = 2, 32, "layer"
    o.sm_count, o.ctas_per_sm, o.weighting = 78, 3, "budget"
    o.reference_contexts = [2048, 8192]
    o.reference_batch_size, o.reference_batches, o.share_quantile = 8, 64, 0.9
    o.tp_size, o.tp_rank = 2, 1
    o.reservation, o.margin, o.basis = "elastic", 0.1, "compressible_tokens"
    o.validate()
    assert (o.group_size, o.page_tokens, o.scope) == (2, 32, "layer")
    assert (o.sm_count, o.ctas_per_sm, o.weighting) == (78, 3, "budget")
    assert o.reference_contexts == [2048, 8192]
    assert (o.tp_size, o.tp_rank, o.reservation, o.margin, o.basis) == (2, 1, "elastic", 0.1,
                                                                        "compressible_tokens")


def test_plan_options_default_to_elastic_reservation(model, profile):
    o = tangram.PlanOptions()  # follows plan_options' defaults
    assert (o.reservation, o.margin, o.group_size) == ("elastic", None, 1)
    plan = tangram.build_plan(model, profile)
    assert plan.options.reservation == "elastic"
    assert plan.options.margin == 0.02  # no samples: the default, decided at build
    # Per-head pages: one group per KV head of every layer.
    assert plan.group_size == 1 and plan.num_groups == plan.num_layers * plan.num_kv_heads


def test_plan_save_and_load(tmp_path, static_plan):
    path = tmp_path / "plan.json"
    tangram.save_plan(static_plan, str(path))
    back = tangram.load_plan(str(path))
    assert back.num_groups == static_plan.num_groups
    assert np.array_equal(back.cta_begin, static_plan.cta_begin)
    assert back.groups == static_plan.groups
    assert back.options.reservation == "static"


def test_split_map_rows_cover_every_cta(static_plan):
    cta = static_plan.cta_begin
    assert cta.shape == (static_plan.num_layers, static_plan.num_kv_heads + 1)
    assert np.all(cta[:, 0] == 0) and np.all(cta[:, -1] == static_plan.num_ctas)
    assert np.all(np.diff(cta, axis=1) >= 1)


def test_elastic_plan_from_samples_weighs_placements(model, profile, samples, elastic_plan):
    from_profile = make_plan(model, profile, "elastic")
    assert elastic_plan.options.reservation == "elastic"
    assert not np.array_equal(elastic_plan.cta_begin, from_profile.cta_begin)
    static_with_samples = make_plan(model, profile, "static", samples)
    static_without = make_plan(model, profile, "static")
    assert np.array_equal(static_with_samples.cta_begin, static_without.cta_begin)


def test_elastic_plan_margin_comes_from_the_samples(model, profile, samples):
    # The bundled scorer keeps ~0.5% more than its total: the plans' floor, 0.02.
    plan = tangram.build_plan(model, profile, tangram.PlanOptions(), samples)
    assert plan.options.margin == 0.02
    assert tangram.elastic_plan_margin(samples, plan) == 0.02
    # The same samples with every head keeping 10% more (capped by the context): the plan
    # reserves mean + 2 sd of their required margins instead, unless given a margin.
    doc = json.loads(open(tangram.profile_path("snapkv/llama-3.1-8b-instruct")).read())
    for s in doc["samples"]:
        s["kept_tokens"] = [[min(s["context_tokens"], math.ceil(1.1 * k)) for k in layer]
                            for layer in s["kept_tokens"]]
    more = tangram.parse_retention_samples(json.dumps(doc))
    m = tangram.build_plan(model, profile, tangram.PlanOptions(), more).options.margin
    assert 0.09 < m < 0.2
    assert tangram.elastic_plan_margin(more, plan) == m
    o = tangram.PlanOptions()
    o.margin = 0.03
    assert tangram.build_plan(model, profile, o, more).options.margin == 0.03
    o.margin = None
    assert tangram.build_plan(model, profile, o, more).options.margin == m
    with pytest.raises(ValueError, match="margin"):
        o.margin = -1.0
        o.validate()


def test_stage_key_words_bound(model, profile, samples):
    plan = tangram.build_plan(model, profile, tangram.PlanOptions(), samples)
    # 256 per-head groups x ceil(131072 / 16) pages x 16 keys (C++ plan/footprint.hpp).
    assert tangram.stage_key_words_bound(plan, 131072) == 256 * 8192 * 16
    assert tangram.stage_key_words_bound(plan, 17, requests=2) == 2 * 256 * 2 * 16
    with pytest.raises(ValueError, match="stage_key_words_bound: tokens"):
        tangram.stage_key_words_bound(plan, -1)
