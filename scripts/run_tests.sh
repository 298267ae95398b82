#!/usr/bin/env bash
# Builds everything (library, kernels when nvcc exists, tools, tests, benchmarks, examples) and
# runs the whole test suite. GPU tests report "Skipped" on machines without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${TANGRAM_BUILD_DIR:-build}
jobs=${TANGRAM_JOBS:-$(nproc)}
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release
cmake --build "$build" -j"$jobs"
ctest --test-dir "$build" --output-on-failure --no-tests=error -j"$jobs"
