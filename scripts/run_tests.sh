#!/usr/bin/env bash
# Builds and runs the project's checks in stages and prints each stage's wall time and the total.
#   scripts/run_tests.sh                  the default set, what CI runs (.ci/run): main, python,
#                                         asan, tsan, soak
#   scripts/run_tests.sh --extended       the extended set: valgrind, emu, fuzz; run it (after the
#                                         default set) before resolving work on the memory manager
#                                         or the kernels (CONTRIBUTING.md)
#   TANGRAM_STAGES=main,asan scripts/run_tests.sh    the stages named, in this order
# Default stages:
#   main      one build folder for three checks, so nothing is compiled twice: (1) the fresh-machine
#             check, the README's main command exactly (Catch2 and Google Benchmark hidden) whose
#             `tangram simulate` must print its table, compiling no .cu file even where nvcc
#             exists; (2) where nvcc exists, scripts/gpu_check.sh --build-only (the bare GPU
#             machine's path: kernels, GPU tests, GPU benchmarks); (3) with both frameworks
#             required, the rest of the build and the whole ctest suite, the kernel emulation
#             suite as a sample (one schedule per scenario, every kernel, dtype, code path and
#             mutation check; the whole grid is the emu stage); GPU tests report "Skipped"
#   python    `pip install .` (with the CUDA kernels where nvcc exists, linking the main build's
#             kernel library rather than compiling it again) into a fresh virtual environment, its
#             pytest suite and the Python engine loop example beside its C++ twin
#   asan      the CPU suites under AddressSanitizer + UndefinedBehaviorSanitizer (clang), among
#             them the replay of every fuzzer finding and seed (core suite); the kernel emulation
#             suite runs natively here (main stage) and under ASan in the extended emu stage
#   tsan      the concurrent engine tests ([concurrent], the only multi-threaded ones) under TSan
#   soak      random operation storms against the memory manager (tangram_soak, bounded time)
# On request only (TANGRAM_STAGES=hf):
#   hf        tangram.hf against transformers and kvpress: torch, transformers and kvpress at
#             python/requirements-hf.txt's pins (several GB from PyPI) and the host-only package
#             into a fresh virtual environment, then python/tests/test_hf.py (which may not skip)
# Extended stages:
#   valgrind  the CPU test executables of the main build under valgrind memcheck (not the tests
#             tagged [slow], nor the sim suite's `simulate ...` command-line tests)
#   emu       the whole kernel emulation grid natively: every schedule, the longest contexts, the
#             cross-batch invariance comparisons; then the grid sampled under ASan + UBSan (every
#             third scenario of each test, one schedule, less the mutation checks)
#   fuzz      every libFuzzer harness for FUZZ_SECONDS (default 60) each, coverage-guided
# First installs what the selected stages need and the machine lacks (scripts/install_deps.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
default_stages=main,python,asan,tsan,soak
extended_stages=valgrind,emu,fuzz
case "${1:-}" in
  "") stages=${TANGRAM_STAGES:-$default_stages} ;;
  --extended) stages=$extended_stages ;;
  *) echo "usage: scripts/run_tests.sh [--extended]  (or TANGRAM_STAGES=a,b,...)" >&2; exit 2 ;;
esac
IFS=, read -ra stage_list <<<"$stages"
scripts/install_deps.sh "${stage_list[@]}"
jobs=${TANGRAM_JOBS:-$(nproc)}
build=${TANGRAM_BUILD_DIR:-build}
want() { [[ ",$stages," == *",$1,"* ]]; }
# Ninja where installed (install_deps.sh installs it): every folder of one run uses one generator.
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)

# Stage clock: each stage's wall time, printed at the end (and on failure, up to the failing one).
run_start=$(date +%s)
stage_names=()
stage_secs=()
current=""
current_start=0
# stage NAME DESCRIPTION
stage() {
  end_stage
  current=$1
  current_start=$(date +%s)
  echo
  echo "=== $1: $2 ($(date +%T))"
}
end_stage() {
  if [ -n "$current" ]; then
    stage_names+=("$current")
    stage_secs+=($(($(date +%s) - current_start)))
    current=""
  fi
}
print_times() {
  local status=$1
  end_stage
  echo
  echo "=== stage wall times"
  for i in "${!stage_names[@]}"; do
    printf '  %-16s %5d s  (%d min %02d s)\n' "${stage_names[$i]}" "${stage_secs[$i]}" \
      $((stage_secs[i] / 60)) $((stage_secs[i] % 60))
  done
  local total=$(($(date +%s) - run_start))
  printf '  %-16s %5d s  (%d min %02d s)\n' total "$total" $((total / 60)) $((total % 60))
  [ "$status" -eq 0 ] || echo "=== FAILED in stage: ${stage_names[${#stage_names[@]} - 1]:-setup}"
}
trap 'print_times $?' EXIT

cpu_suites=(tangram_core_tests tangram_plan_tests tangram_memory_tests tangram_reference_tests
            tangram_sim_tests tangram_reliability_tests tangram_fake_cuda_tests
            tangram_fake_cuda_gpu_mirror tangram_fake_cuda_gpu_epochs)
# The kernel emulation suite switches stacks per emulated thread: ASan understands that (fiber
# annotations), valgrind memcheck does not, so it runs natively and under ASan only. Its
# instrumented build and run were over half of the asan stage (about 10 of 20 minutes on CI's 2
# cores, 2026-12-04), so they moved to the extended emu stage; every emulated case still runs
# natively in the main stage (sampled) and the emu stage (whole grid).
asan_suites=("${cpu_suites[@]}")
# The emulation grid outside the default set (the emu stage runs all of it): cases that add
# length or repetition, no kernel, dtype or code path the rest does not run. The mutation checks
# stay in the default set.
emu_extended_only='emu:(emulated decode equals the CPU reference: long and batched'
emu_extended_only+='|emulated batch-invariant decode: (a request|empty requests)'
emu_extended_only+='|the batch-invariance check finds)'
# Under ASan the mutation checks (kernels broken on purpose) are left out as well: they add no
# instrumented code path, and they run natively in the main stage.
emu_native_only='emu:mutation: '
# One CUDA architecture, sm_90 (the library's default list is sm_80, sm_90 and sm_100: three
# times the nvcc work); scripts/gpu_check.sh pins the same.
export CUDAARCHS=${CUDAARCHS:-90}
if command -v ccache >/dev/null; then
  export CMAKE_CXX_COMPILER_LAUNCHER=${CMAKE_CXX_COMPILER_LAUNCHER:-ccache}
  export CMAKE_CUDA_COMPILER_LAUNCHER=${CMAKE_CUDA_COMPILER_LAUNCHER:-ccache}
  # Paths relative to the checkout, so another clone of the same commit hits the same cache.
  export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD}
fi

if want main; then
  stage main/fresh "fresh-machine check (the README's main command, Catch2 and Google Benchmark hidden)"
  # The README's command exactly (CUDA left on: the CLI must not need nvcc's work), into the
  # folder the rest of this stage reuses (REQUIRE off: a folder left by an earlier run has it on).
  configure_log=$(cmake -S . -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_DISABLE_FIND_PACKAGE_Catch2=ON -DCMAKE_DISABLE_FIND_PACKAGE_benchmark=ON \
    -DCMAKE_REQUIRE_FIND_PACKAGE_Catch2=OFF -DCMAKE_REQUIRE_FIND_PACKAGE_benchmark=OFF 2>&1) ||
    { echo "$configure_log"; exit 1; }
  # Configure must say what it skipped (one line per framework) rather than fail.
  for skipped in "Catch2 2.x not found" "Google Benchmark >= 1.7 not found"; do
    grep -F "$skipped" <<<"$configure_log" || { echo "configure did not report: $skipped"; exit 1; }
  done
  cli_log=$(cmake --build "$build" -j"$jobs" --target tangram_cli 2>&1) || { echo "$cli_log"; exit 1; }
  if grep -F "Building CUDA" <<<"$cli_log"; then
    echo "the main command compiled CUDA sources (above); tangram_cli must not need the kernels"
    exit 1
  fi
  echo "main command: $(grep -c 'Building CXX' <<<"$cli_log" || true) C++ files compiled, no CUDA file"
  # Exactly the README's command; its progress line (stderr) is shown only on failure.
  table=$("$build/tangram" simulate 2>"$build/simulate.err") || { cat "$build/simulate.err"; exit 1; }
  grep -E '^ +resident sessions, peak( +[0-9]+)+$' <<<"$table" ||
    { echo "$table"; echo "tangram simulate did not print the table"; exit 1; }
  if command -v nvcc >/dev/null; then
    # The bare GPU machine's build path, in the same folder: its kernels, GPU tests and GPU
    # benchmarks are the main build's (nvcc runs once per kernel).
    stage main/gpu-check "scripts/gpu_check.sh --build-only (the bare GPU machine's build path)"
    TANGRAM_GPU_BUILD_DIR="$build" scripts/gpu_check.sh --build-only "$build/gpu-check"
  fi

  stage main/build "build and ctest"
  # Required here (a plain configure only skips them): CI must never pass with the suites
  # missing. The options gpu_check.sh set for the GPU machine are set back.
  cmake -S . -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_DISABLE_FIND_PACKAGE_Catch2=OFF -DCMAKE_DISABLE_FIND_PACKAGE_benchmark=OFF \
    -DCMAKE_REQUIRE_FIND_PACKAGE_Catch2=ON -DCMAKE_REQUIRE_FIND_PACKAGE_benchmark=ON \
    -DTANGRAM_BUILD_EXAMPLES=ON -DTANGRAM_WERROR=ON >/dev/null
  cmake --build "$build" -j"$jobs"
  TANGRAM_EMU_MAX_SCHEDULES=1 ctest --test-dir "$build" --output-on-failure --no-tests=error \
    -j"$jobs" -E "^($emu_extended_only)"
fi

if want python; then
  stage python "pip install . into a fresh virtual environment, then pytest"
  venv="$build-python"
  rm -rf "$venv"
  python3 -m venv "$venv"
  pip_args=()
  if [ -f "$build/libtangram_kernels.a" ]; then
    # The package with tangram.cuda (opt-in for users, docs/python.md), linking the kernels the
    # main stage compiled from this same checkout instead of running nvcc again.
    pip_args=(--config-settings=cmake.define.TANGRAM_ENABLE_CUDA=ON
              "--config-settings=cmake.define.TANGRAM_KERNELS_LIBRARY=$PWD/$build/libtangram_kernels.a")
  fi
  "$venv/bin/pip" install --quiet --disable-pip-version-check "${pip_args[@]}" ".[test]"
  # The C++ twin of the Python engine loop, whose page accounting the tests compare (the main
  # stage's folder when it ran).
  [ -f "$build/CMakeCache.txt" ] ||
    cmake -S . -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DTANGRAM_ENABLE_CUDA=OFF \
      -DTANGRAM_BUILD_TESTS=OFF -DTANGRAM_BUILD_BENCHMARKS=OFF -DTANGRAM_BUILD_TOOLS=OFF >/dev/null
  cmake --build "$build" -j"$jobs" --target example_engine_loop
  export TANGRAM_CPP_ENGINE_LOOP="$PWD/$build/examples/example_engine_loop"
  # From outside the checkout, so that `import tangram` is the installed package.
  (cd "$venv" && bin/python -c "import tangram; print('tangram', tangram.__version__)" &&
    bin/python -m pytest -q -p no:cacheprovider "$OLDPWD/python/tests" &&
    bin/python "$OLDPWD/examples/python/engine_loop.py")
fi

# The hf stage: the Hugging Face tests need torch, transformers and kvpress,
# too large for every run, so the stage runs only when TANGRAM_STAGES names it; there the tests
# must not skip (TANGRAM_REQUIRE_HF).
if want hf; then
  stage hf "tangram.hf against transformers and kvpress in a fresh virtual environment"
  venv="$build-hf"
  rm -rf "$venv"
  python3 -m venv "$venv"
  # Host-only package: tangram.hf runs the CPU reference kernels (no CUDA kernels to compile).
  "$venv/bin/pip" install --quiet --disable-pip-version-check -r python/requirements-hf.txt \
    -Ccmake.define.TANGRAM_ENABLE_CUDA=OFF ".[test]"
  (cd "$venv" && TANGRAM_REQUIRE_HF=1 bin/python -m pytest -q -p no:cacheprovider \
    "$OLDPWD/python/tests/test_hf.py")
fi

# configure_asan: the instrumented build folder (clang compiles the instrumented suites in about
# half of g++'s time, -O1 -g1 on a memory test file: 23 s of CPU against 42 s; warnings are the
# main build's business, g++ -Werror).
configure_asan() {
  CC=clang CXX=clang++ cmake -S . -B build-asan "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CXX_FLAGS_RELEASE="-O1 -g1 -DNDEBUG" -DTANGRAM_SANITIZE=address,undefined \
    -DTANGRAM_ENABLE_CUDA=OFF -DTANGRAM_BUILD_BENCHMARKS=OFF -DTANGRAM_BUILD_EXAMPLES=OFF \
    -DTANGRAM_WERROR=OFF -DTANGRAM_INSTALL=OFF -DCMAKE_REQUIRE_FIND_PACKAGE_Catch2=ON >/dev/null
}
asan_env=(ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1)

if want asan; then
  stage asan "CPU suites under AddressSanitizer + UndefinedBehaviorSanitizer (clang)"
  configure_asan
  cmake --build build-asan -j"$jobs" --target "${asan_suites[@]}"
  # The core suite replays every fuzzer finding and seed (fuzz/regressions, fuzz/corpus) through
  # the harnesses' properties here as well as natively.
  env "${asan_env[@]}" ctest --test-dir build-asan --output-on-failure -j"$jobs" \
    -L cpu -E "^((consumer|headers|install|emu):)"
fi

if want tsan; then
  stage tsan "concurrent engine test under ThreadSanitizer"
  scripts/tsan.sh "[concurrent]"  # the only tests with threads; the rest run natively and under ASan
fi

if want soak; then
  stage soak "operation storms"
  SOAK_SECONDS=${SOAK_SECONDS:-45} TANGRAM_BUILD_DIR="$build" scripts/soak.sh
fi

if want valgrind; then
  stage valgrind "memcheck over the CPU test executables"
  command -v valgrind >/dev/null || { echo "valgrind not installed"; exit 1; }
  [ -f "$build/CMakeCache.txt" ] ||
    cmake -S . -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DTANGRAM_ENABLE_CUDA=OFF >/dev/null
  cmake --build "$build" -j"$jobs" --target "${cpu_suites[@]}"
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

if want emu; then
  stage emu "the whole kernel emulation grid natively, then sampled under ASan + UBSan"
  [ -f "$build/CMakeCache.txt" ] ||
    cmake -S . -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DTANGRAM_ENABLE_CUDA=OFF >/dev/null
  cmake --build "$build" -j"$jobs" --target tangram_emu_tests
  ctest --test-dir "$build" --output-on-failure --no-tests=error -j"$jobs" -R '^emu:'
  # Under ASan: every third scenario of each test, one schedule (the emulator's memory handling
  # is the same code for every case), less the long and batched cases and the mutation checks
  # (kernels broken on purpose: no instrumented code path the rest does not run).
  configure_asan
  cmake --build build-asan -j"$jobs" --target tangram_emu_tests
  env "${asan_env[@]}" TANGRAM_EMU_MAX_SCHEDULES=1 TANGRAM_EMU_CASE_STRIDE=3 \
    ctest --test-dir build-asan --output-on-failure --no-tests=error -j"$jobs" -L cpu \
    -R '^emu:' -E "^($emu_extended_only|$emu_native_only)"
fi

if want fuzz; then
  stage fuzz "libFuzzer harnesses, FUZZ_SECONDS each"
  FUZZ_SECONDS=${FUZZ_SECONDS:-60} scripts/fuzz.sh
fi

end_stage
echo
echo "=== all requested stages passed: $stages"
