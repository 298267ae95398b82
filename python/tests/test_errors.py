# SPDX-License-Identifier: Apache-2.0
"""C++ errors reach Python with their message: ValueError, ParseError (a ValueError), UsageError."""
import pytest

import tangram


def test_unknown_preset_is_a_value_error_naming_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown preset \"nope\".*llama-3.1-8b"):
        tangram.model_preset("nope")


def test_a_bad_file_is_a_parse_error_naming_the_field(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('{"format": "retention-samples/v1", "model": 3}')
    with pytest.raises(tangram.ParseError, match="model") as info:
        tangram.load_retention_samples(str(path))
    assert isinstance(info.value, ValueError)


def test_bad_option_names_the_field_and_value():
    o = tangram.PlanOptions()
    with pytest.raises(ValueError, match=r"PlanOptions.reservation: unknown mode \"dynamic\""):
        o.reservation = "dynamic"
    with pytest.raises(ValueError, match="PlanOptions.scope"):
        o.scope = "everywhere"
    o.group_size = 0
    with pytest.raises(ValueError, match="group_size"):
        o.validate()


def test_misuse_is_a_usage_error_and_changes_nothing(static_plan):
    kv = tangram.KVCacheManager(static_plan, num_pages=24000, max_sequences=4)
    seq = kv.try_admit(1000, 16)
    assert seq is not None
    before = kv.stats
    kv.prepare_chunk(seq, 512)
    with pytest.raises(tangram.UsageError, match="already"):
        kv.prepare_chunk(seq, 512)
    kv.free(seq)
    with pytest.raises(tangram.UsageError):
        kv.free(seq)  # a freed handle is stale
    assert kv.stats["admitted"] == before["admitted"]
    kv.check_invariants()


def test_does_not_fit_is_a_return_value_not_an_exception(static_plan):
    kv = tangram.KVCacheManager(static_plan, num_pages=100, max_sequences=4)
    assert kv.try_admit(100_000, 16) is None
    assert kv.stats["rejected"] == 1
    assert kv.available_pages == kv.num_pages
