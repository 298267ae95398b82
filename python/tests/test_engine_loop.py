# SPDX-License-Identifier: Apache-2.0
"""The Python engine loop (examples/python/engine_loop.py) against its C++ twin
(examples/engine_loop.cpp): the same calls must give the same page accounting at every checkpoint.

The C++ binary comes from TANGRAM_CPP_ENGINE_LOOP (scripts/run_tests.sh builds it and sets it);
without it the comparison is skipped, never silently passed.
"""
import importlib.util
import json
import os
import pathlib
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


MODES = ["elastic", "static"]


def python_loop(reservation="elastic"):
    spec = importlib.util.spec_from_file_location("engine_loop", ROOT / "examples/python/engine_loop.py")
    loop = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loop)
    return loop.run(verbose=False, reservation=reservation)


@pytest.mark.parametrize("reservation", MODES)
def test_python_loop_returns_everything(reservation):
    out = python_loop(reservation)
    assert out["admitted"] >= 2 and out["rejected_waiting"] > 0
    assert (out["used_pages"], out["reserved_pages"], out["live_sequences"]) == (0, 0, 0)
    assert out["reclaimed_pages"] == 0
    labels = [c["label"] for c in out["checkpoints"]]
    assert labels[0] == "admitted" and labels[-1] == "freed"
    admitted = out["checkpoints"][0]
    # Admission reserves everything up front and draws nothing yet; the pool conserves pages.
    assert admitted["used_pages"] == 0 and admitted["reserved_pages"] > 0
    for c in out["checkpoints"]:
        pages = c["used_pages"] + c["reserved_pages"] + c["available_pages"] + c["retired_pages"]
        assert pages == out["num_pages"]
    # Deferred reuse: the pages freed at the end of the first turn wait for their release.
    by_label = {c["label"]: c for c in out["checkpoints"]}
    assert by_label["turn_ended"]["retired_pages"] > 0
    assert by_label["freed"]["retired_pages"] == 0


@pytest.mark.parametrize("reservation", MODES)
def test_python_loop_matches_the_cpp_example(reservation):
    binary = os.environ.get("TANGRAM_CPP_ENGINE_LOOP")
    if not binary:
        pytest.skip("TANGRAM_CPP_ENGINE_LOOP not set (scripts/run_tests.sh sets it)")
    assert pathlib.Path(binary).is_file(), f"TANGRAM_CPP_ENGINE_LOOP={binary} does not exist"
    done = subprocess.run([binary, "--json", "--reservation", reservation], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    cpp = json.loads(done.stdout)
    py = python_loop(reservation)
    assert [c["label"] for c in py["checkpoints"]] == [c["label"] for c in cpp["checkpoints"]]
    for p, c in zip(py["checkpoints"], cpp["checkpoints"]):
        assert p == c, f"checkpoint {p['label']}: Python {p} vs C++ {c}"
    for key in ("admitted", "rejected_waiting", "reclaimed_pages"):
        assert py[key] == cpp[key], key
    # Every counter of C++ manager_stats, under the same name (Python at parity with C++); the
    # loop extends a turn and rolls back speculative tokens, so those counters are not all zero.
    assert py["stats"] == cpp["stats"]
    assert cpp["stats"]["extended"] > 0 and cpp["stats"]["rolled_back_tokens"] == 3
