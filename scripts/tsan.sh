#!/usr/bin/env bash
# ThreadSanitizer run of the reliability suite (concurrent_kv_cache under a multi-threaded engine,
# plus the storms and fault cases): a separate g++ build with -DTANGRAM_SANITIZE=thread, no CUDA,
# no benchmarks; builds only tangram_reliability_tests and runs it. Any report fails the script.
#   scripts/tsan.sh                      build-tsan/, every reliability test
#   scripts/tsan.sh "[concurrent]"       only the concurrent tests (Catch test spec)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${TANGRAM_TSAN_BUILD_DIR:-build-tsan}
jobs=${TANGRAM_JOBS:-$(nproc)}
CC=gcc CXX=g++ cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DTANGRAM_SANITIZE=thread -DTANGRAM_ENABLE_CUDA=OFF -DTANGRAM_BUILD_BENCHMARKS=OFF \
  -DTANGRAM_BUILD_EXAMPLES=OFF -DTANGRAM_INSTALL=OFF >/dev/null
cmake --build "$build" -j"$jobs" --target tangram_reliability_tests
# halt_on_error: the first race fails the run; exitcode 66 tells a report from a failed test.
export TSAN_OPTIONS="halt_on_error=1 exitcode=66 second_deadlock_stack=1 ${TSAN_OPTIONS:-}"
"$build/test/tangram_reliability_tests" --durations yes "$@"
echo "tsan: no data races or lock-order inversions reported"
