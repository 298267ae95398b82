#!/usr/bin/env bash
# Builds everything and runs every check CI runs, in stages:
#   main      Release build of the library, kernels (when nvcc exists), tools, tests, benchmarks;
#             the whole ctest suite (GPU tests report "Skipped" without a GPU)
#   asan      the CPU test suites again under AddressSanitizer + UndefinedBehaviorSanitizer
#   valgrind  the CPU test executables of the main build under valgrind memcheck
#   tsan      the concurrent engine tests ([concurrent], the only multi-threaded ones) under TSan
#   soak      random operation storms against the memory manager (tangram_soak, bounded time)
#   fuzz      every libFuzzer harness for a bounded time (needs clang)
# TANGRAM_STAGES selects stages (default: all), e.g. TANGRAM_STAGES=main scripts/run_tests.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
stages=${TANGRAM_STAGES:-main,asan,valgrind,tsan,soak,fuzz}
jobs=${TANGRAM_JOBS:-$(nproc)}
build=${TANGRAM_BUILD_DIR:-build}
want() { [[ ",$stages," == *",$1,"* ]]; }
stage() { echo; echo "=== $1 ($(date +%T))"; }
cpu_suites=(tangram_core_tests tangram_plan_tests tangram_memory_tests tangram_reference_tests
            tangram_sim_tests tangram_reliability_tests)

if want main; then
  stage "main: build and ctest"
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release
  cmake --build "$build" -j"$jobs"
  ctest --test-dir "$build" --output-on-failure --no-tests=error -j"$jobs"
fi

if want asan; then
  stage "asan: CPU suites under AddressSanitizer + UndefinedBehaviorSanitizer"
  # -O1 -g1: the instrumented build compiles in less than half the time of -O2 -g.
  cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS_RELEASE="-O1 -g1 -DNDEBUG" \
    -DTANGRAM_SANITIZE=address,undefined -DTANGRAM_ENABLE_CUDA=OFF -DTANGRAM_BUILD_BENCHMARKS=OFF \
    -DTANGRAM_BUILD_EXAMPLES=OFF >/dev/null
  cmake --build build-asan -j"$jobs" --target "${cpu_suites[@]}"
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
    ctest --test-dir build-asan --output-on-failure -j"$jobs" -L cpu -E '^(consumer|headers):'
fi

if want valgrind; then
  stage "valgrind: memcheck over the CPU test executables"
  command -v valgrind >/dev/null || { echo "valgrind not installed"; exit 1; }
  for t in "${cpu_suites[@]}"; do
    echo "-- $t"
    valgrind --quiet --error-exitcode=1 --leak-check=full --errors-for-leak-kinds=definite,indirect \
      "$build/test/$t" '~[slow]' --reporter compact
  done
fi

if want tsan; then
  stage "tsan: concurrent engine test under ThreadSanitizer"
  scripts/tsan.sh "[concurrent]"  # the only tests with threads; the rest run natively and under ASan
fi

if want soak; then
  stage "soak: operation storms"
  SOAK_SECONDS=${SOAK_SECONDS:-45} TANGRAM_BUILD_DIR="$build" scripts/soak.sh
fi

if want fuzz; then
  stage "fuzz: libFuzzer harnesses"
  FUZZ_SECONDS=${FUZZ_SECONDS:-20} scripts/fuzz.sh
fi

stage "all requested stages passed: $stages"
