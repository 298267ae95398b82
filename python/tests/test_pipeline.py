# SPDX-License-Identifier: Apache-2.0
"""Pipeline-stage plans through the bindings: options.layers, the balanced partition, files."""
import numpy as np
import pytest

import tangram


def _static(**fields):
    o = tangram.PlanOptions()
    o.reservation, o.scope, o.weighting = "static", "layer", "budget"
    for k, v in fields.items():
        setattr(o, k, v)
    return o


def test_layers_option_round_trips_and_defaults_to_none():
    o = tangram.PlanOptions()
    assert o.layers is None
    o.layers = (8, 16)
    assert o.layers == (8, 16)
    o.layers = None
    assert o.layers is None


def test_stage_plan_is_the_whole_plans_layers(model, profile):
    whole = tangram.build_plan(model, profile, _static())
    stage = tangram.build_plan(model, profile, _static(layers=(8, 16)))
    assert (stage.num_layers, stage.first_layer, stage.stage_layers) == (8, 8, (8, 16))
    assert whole.stage_layers == (0, model.num_layers)
    heads = whole.num_kv_heads
    assert stage.head_rules == whole.head_rules[8 * heads:16 * heads]
    assert np.array_equal(stage.cta_begin, whole.cta_begin[8:16])


def test_balanced_stages_build_and_round_trip(tmp_path, model, profile):
    o = _static()
    weights = tangram.layer_kv_tokens(model, profile, o, 32768)
    assert len(weights) == model.num_layers
    stages = tangram.balanced_pipeline_stages(weights, 4)
    assert len(stages) == 4 and stages[0][0] == 0 and stages[-1][1] == model.num_layers
    tangram.check_pipeline_stages(stages, model.num_layers)
    heaviest = max(sum(weights[a:b]) for a, b in stages)
    even = [(k * model.num_layers // 4, (k + 1) * model.num_layers // 4) for k in range(4)]
    assert heaviest <= max(sum(weights[a:b]) for a, b in even)
    plans = tangram.build_stage_plans(model, profile, o, stages)
    assert [p.stage_layers for p in plans] == stages
    path = tmp_path / "stage1.json"
    tangram.save_plan(plans[1], str(path))
    back = tangram.load_plan(str(path))
    assert back.stage_layers == stages[1] and back.options.layers == stages[1]


def test_stage_managers_admit_independently(model, profile):
    plans = tangram.build_stage_plans(model, profile, _static(), [(0, 16), (16, 32)])
    whole = tangram.build_plan(model, profile, _static())
    kvs = [tangram.KVCacheManager(p, num_pages=1000, max_sequences=4) for p in plans]
    full = tangram.KVCacheManager(whole, num_pages=1000, max_sequences=4)
    assert sum(kv.admission_pages(20000, 100) for kv in kvs) == full.admission_pages(20000, 100)


def test_bad_stages_raise_value_errors_naming_the_range(model, profile):
    with pytest.raises(ValueError, match=r"pipeline_stages\[1\]: \[10, 32\) overlaps"):
        tangram.check_pipeline_stages([(0, 12), (10, 32)], 32)
    with pytest.raises(ValueError, match=r"pipeline_stages: must be in \[1, 3\]"):
        tangram.balanced_pipeline_stages([1, 2, 3], 4)
    with pytest.raises(ValueError, match=r"plan_options.layers: \[4, 40\) is outside"):
        tangram.build_plan(model, profile, _static(layers=(4, 40)))
    with pytest.raises(ValueError, match=r"plan_options.layers: \[0, 8\) is set"):
        tangram.build_stage_plans(model, profile, _static(layers=(0, 8)), [(0, 32)])
