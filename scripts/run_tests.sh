#!/usr/bin/env bash
# Builds everything and runs every check CI runs, in stages:
#   main      the fresh-machine check (the README's first command with Catch2 and Google Benchmark
#             hidden: tangram_cli builds and `tangram simulate` prints its table); then the Release
#             build of the library, kernels (when nvcc exists), tools, tests, benchmarks and the
#             whole ctest suite (GPU tests report "Skipped" without a GPU)
#   python    `pip install .` (the nanobind package, docs/python.md) into a fresh virtual
#             environment, then its pytest suite and the Python engine loop example
#   hf        (only on request: TANGRAM_STAGES=hf) tangram.hf against transformers and kvpress:
#             torch, transformers and kvpress at python/requirements-hf.txt's pins (several GB from
#             PyPI) and the package into a fresh virtual environment, then python/tests/test_hf.py
#   asan      the CPU test suites again under AddressSanitizer + UndefinedBehaviorSanitizer
#   valgrind  the CPU test executables of the main build under valgrind memcheck (not the tests
#             tagged [slow], nor the sim suite's `simulate ...` command-line tests)
#   tsan      the concurrent engine tests ([concurrent], the only multi-threaded ones) under TSan
#   soak      random operation storms against the memory manager (tangram_soak, bounded time)
#   fuzz      every libFuzzer harness for a bounded time (needs clang)
# TANGRAM_STAGES selects stages (default: all), e.g. TANGRAM_STAGES=main scripts/run_tests.sh.
# First installs what the selected stages need and the machine lacks (scripts/install_deps.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
stages=${TANGRAM_STAGES:-main,python,asan,valgrind,tsan,soak,fuzz}
IFS=, read -ra stage_list <<<"$stages"
scripts/install_deps.sh "${stage_list[@]}"
jobs=${TANGRAM_JOBS:-$(nproc)}
build=${TANGRAM_BUILD_DIR:-build}
want() { [[ ",$stages," == *",$1,"* ]]; }
stage() { echo; echo "=== $1 ($(date +%T))"; }
cpu_suites=(tangram_core_tests tangram_plan_tests tangram_memory_tests tangram_reference_tests
            tangram_sim_tests tangram_reliability_tests tangram_fake_cuda_tests
            tangram_fake_cuda_gpu_mirror tangram_fake_cuda_gpu_epochs)
# The kernel emulation suite switches stacks per emulated thread: ASan understands that (fiber
# annotations), valgrind memcheck does not, so it runs natively and under ASan only.
asan_suites=("${cpu_suites[@]}" tangram_emu_tests)
# ccache (installed by install_deps.sh) lets the GPU check's build reuse the main build's kernel
# objects; CMake reads these variables as the default compiler launchers.
if command -v ccache >/dev/null; then
  export CMAKE_CXX_COMPILER_LAUNCHER=ccache CMAKE_CUDA_COMPILER_LAUNCHER=ccache
  # Paths relative to the checkout, so another clone of the same commit hits the same cache.
  export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD}
fi

if want main; then
  stage "main: fresh-machine check (README's first command without Catch2 or Google Benchmark)"
  fresh="$build-fresh"
  configure_log=$(cmake -S . -B "$fresh" -DCMAKE_BUILD_TYPE=Release -DTANGRAM_ENABLE_CUDA=OFF \
    -DCMAKE_DISABLE_FIND_PACKAGE_Catch2=ON -DCMAKE_DISABLE_FIND_PACKAGE_benchmark=ON)
  # Configure must say what it skipped (one line per framework) rather than fail.
  for skipped in "Catch2 2.x not found" "Google Benchmark >= 1.7 not found"; do
    grep -F "$skipped" <<<"$configure_log" || { echo "configure did not report: $skipped"; exit 1; }
  done
  cmake --build "$fresh" -j"$jobs" --target tangram_cli
  # Exactly the README's command; its progress line (stderr) is shown only on failure.
  table=$("$fresh/tangram" simulate 2>"$fresh/simulate.err") || { cat "$fresh/simulate.err"; exit 1; }
  grep -E '^ +resident sessions, peak( +[0-9]+)+$' <<<"$table" ||
    { echo "$table"; echo "tangram simulate did not print the table"; exit 1; }
  if command -v nvcc >/dev/null; then
    # The build above leaves CUDA off to stay cheap. The GPU machine's path: scripts/gpu_check.sh
    # configures with both frameworks hidden and builds the kernels, GPU tests and GPU benchmarks,
    # stopping where a device is needed.
    stage "main: scripts/gpu_check.sh --build-only (the bare GPU machine's build path)"
    TANGRAM_GPU_BUILD_DIR="$build-gpu-check" scripts/gpu_check.sh --build-only "$build-gpu-check/out"
  fi

  stage "main: build and ctest"
  # Required here (a plain configure only skips them): CI must never pass with the suites missing.
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_REQUIRE_FIND_PACKAGE_Catch2=ON -DCMAKE_REQUIRE_FIND_PACKAGE_benchmark=ON
  cmake --build "$build" -j"$jobs"
  ctest --test-dir "$build" --output-on-failure --no-tests=error -j"$jobs"
fi

if want python; then
  stage "python: pip install . into a fresh virtual environment, then pytest"
  venv="$build-python"
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check ".[test]"
  # The C++ twin of the Python engine loop, whose page accounting the tests compare.
  cmake -S . -B "$build-examples" -DCMAKE_BUILD_TYPE=Release -DTANGRAM_ENABLE_CUDA=OFF \
    -DTANGRAM_BUILD_TESTS=OFF -DTANGRAM_BUILD_BENCHMARKS=OFF -DTANGRAM_BUILD_TOOLS=OFF \
    -DTANGRAM_BUILD_EXAMPLES=ON >/dev/null
  cmake --build "$build-examples" -j"$jobs" --target example_engine_loop
  export TANGRAM_CPP_ENGINE_LOOP="$PWD/$build-examples/examples/example_engine_loop"
  # From outside the checkout, so that `import tangram` is the installed package.
  (cd "$venv" && bin/python -c "import tangram; print('tangram', tangram.__version__)" &&
    bin/python -m pytest -q -p no:cacheprovider "$OLDPWD/python/tests" &&
    bin/python "$OLDPWD/examples/python/engine_loop.py")
fi

# The hf stage (block owned by h-eco): the Hugging Face tests need torch, transformers and kvpress,
# too large for every run, so the stage runs only when TANGRAM_STAGES names it; there the tests
# must not skip (TANGRAM_REQUIRE_HF).
if want hf; then
  stage "hf: tangram.hf against transformers and kvpress in a fresh virtual environment"
  venv="$build-hf"
  rm -rf "$venv"
  python3 -m venv "$venv"
  # Host-only package: tangram.hf runs the CPU reference kernels (no CUDA kernels to compile).
  "$venv/bin/pip" install --quiet --disable-pip-version-check -r python/requirements-hf.txt \
    -Ccmake.define.TANGRAM_ENABLE_CUDA=OFF ".[test]"
  (cd "$venv" && TANGRAM_REQUIRE_HF=1 bin/python -m pytest -q -p no:cacheprovider \
    "$OLDPWD/python/tests/test_hf.py")
fi

if want asan; then
  stage "asan: CPU suites under AddressSanitizer + UndefinedBehaviorSanitizer"
  # -O1 -g1: the instrumented build compiles in less than half the time of -O2 -g.
  cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS_RELEASE="-O1 -g1 -DNDEBUG" \
    -DTANGRAM_SANITIZE=address,undefined -DTANGRAM_ENABLE_CUDA=OFF -DTANGRAM_BUILD_BENCHMARKS=OFF \
    -DTANGRAM_BUILD_EXAMPLES=OFF -DCMAKE_REQUIRE_FIND_PACKAGE_Catch2=ON >/dev/null
  cmake --build build-asan -j"$jobs" --target "${asan_suites[@]}"
  # The kernel emulation suite (the bulk of this stage) runs one schedule per scenario here (all
  # of them in the main stage) and leaves out what adds no new code path to instrument, only
  # length or repetition: the mutation tests (kernels broken on purpose), the longest-context
  # decode, the batch-invariance comparisons across batches (the invariant kernels themselves
  # run) and the check that the invariance check fails. The main stage runs all of them.
  emu_native_only='emu:(mutation: |emulated decode equals the CPU reference: long and batched'
  emu_native_only+='|emulated batch-invariant decode: (a request|empty requests)'
  emu_native_only+='|the batch-invariance check finds)'
  TANGRAM_EMU_MAX_SCHEDULES=1 ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
    UBSAN_OPTIONS=print_stacktrace=1 ctest --test-dir build-asan --output-on-failure -j"$jobs" \
    -L cpu -E "^((consumer|headers|install):|$emu_native_only)"
fi

if want valgrind; then
  stage "valgrind: memcheck over the CPU test executables"
  command -v valgrind >/dev/null || { echo "valgrind not installed"; exit 1; }
  for t in "${cpu_suites[@]}"; do
    echo "-- $t"
    # The `simulate ...` command-line tests of the sim suite re-run the whole simulator once per
    # option (over half an hour under memcheck on CI's 2 cores); memcheck runs the in-process
    # simulator tests, the main and asan stages run all of them.
    filter='~[slow]'
    [ "$t" = tangram_sim_tests ] && filter='~[slow]~simulate*'
    valgrind --quiet --error-exitcode=1 --leak-check=full --errors-for-leak-kinds=definite,indirect \
      "$build/test/$t" "$filter" --reporter compact
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
