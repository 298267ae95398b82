# SPDX-License-Identifier: Apache-2.0
"""Per-call cost of the Python bindings beside the same calls from C++ (docs/python.md).

Runs bench/manager_calls.cpp (Google Benchmark) and the same calls through `tangram` in one
process tree, side by side, and prints nanoseconds per call and what the bindings add. Timings are
machine-dependent: compare the columns of one run, not runs.

    python bench/python/bench_bindings.py --cpp build/bench/bench_manager_calls [--json OUT]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import time

import tangram

PROMPT, DECODE = 64, 2048


def start(kv):
    """A fresh sequence in decode, alone in the batch (as the C++ fixture's start())."""
    seq = kv.try_admit(PROMPT, DECODE)
    kv.prepare_chunk(seq, PROMPT)
    kv.commit_chunk(seq, kv.expected_kept(seq, PROMPT))
    kv.set_batch([seq])
    return seq


def make_manager():
    samples = tangram.load_retention_samples(
        str(tangram.profile_path("snapkv/llama-3.1-8b-instruct")))
    options = tangram.PlanOptions()
    options.reservation = "static"  # as bench/manager_calls.cpp and docs/python.md
    plan = tangram.build_plan(tangram.model_preset(samples.model), tangram.calibrate(samples), options)
    kv = tangram.KVCacheManager(plan, num_pages=20000, max_sequences=8)
    return kv, start(kv)


def per_call_ns(fn, calls: int, repeats: int = 5) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter_ns()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter_ns() - start) / calls)
    return best


def python_timings(calls: int) -> dict[str, float]:
    kv, first = make_manager()
    seq, batch = first, [first]

    def admit_free():
        kv.free(kv.try_admit(1000, 64))

    live = {"seq": first}

    def step():
        if kv.info(live["seq"])["decoded"] == DECODE:  # the C++ fixture's cycle
            kv.free(live["seq"])
            live["seq"] = start(kv)
        kv.decode_step()

    out = {
        "try_admit_and_free": per_call_ns(admit_free, calls),
        "info": per_call_ns(lambda: kv.info(seq), calls),
        "set_batch": per_call_ns(lambda: kv.set_batch(batch), calls),
        "view": per_call_ns(kv.view, calls),
        "decode_step": per_call_ns(step, calls),  # with the info() check, as in C++
    }
    return out


def cpp_timings(binary: str) -> dict[str, float]:
    run = subprocess.run([binary, "--benchmark_format=json"], check=True, capture_output=True,
                         text=True)
    return {b["name"]: b["real_time"] for b in json.loads(run.stdout)["benchmarks"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cpp", required=True, help="path of bench_manager_calls")
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--json", help="write the table as JSON here")
    a = ap.parse_args()
    cpp = cpp_timings(a.cpp)
    py = python_timings(a.calls)
    rows = []
    print(f"{'call':<22}{'C++ ns':>10}{'Python ns':>12}{'added us':>10}")
    for name, p in py.items():
        c = cpp[name]
        rows.append({"call": name, "cpp_ns": c, "python_ns": p, "added_us": (p - c) / 1000})
        print(f"{name:<22}{c:>10.0f}{p:>12.0f}{(p - c) / 1000:>10.2f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
