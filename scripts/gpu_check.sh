#!/usr/bin/env bash
# GPU checks for a machine with an NVIDIA GPU (written for an H200, sm_90). Needs only the CUDA
# toolkit, CMake >= 3.23 and a C++ compiler: no Catch2, no Google Benchmark, no network (the GPU
# tests and benchmarks have their own small runners; both frameworks are hidden from the configure
# so the build path is the same everywhere).
#   scripts/gpu_check.sh [--full] [--build-only | --run-only] OUT_DIR
# Configures a fresh build (CUDA arch 90 unless CUDAARCHS is set: one architecture, not the
# library's default list of three), builds only the GPU tests and
# the GPU benchmarks, runs the tests, runs the benchmarks (a short set unless --full) with JSON
# output into OUT_DIR and writes OUT_DIR/summary.md. On a lent GPU machine (each call at most 10
# minutes) run it as two calls on the same machine, the build folder kept between them:
#   scripts/gpu_check.sh --build-only out    configure + build, needs no device (about 2 min on
#                                            16 cores: 20 kernel files, the longest ~35 s of CPU)
#   scripts/gpu_check.sh --run-only out      the tests (cut at 240 s) and the short benchmarks (cut
#                                            at 150 s each) from that build: at most 9 minutes
# --build-only (or TANGRAM_GPU_CHECK_BUILD_ONLY=1) stops after the build, before anything needs a
# device: CI runs it on CPU machines to keep this path building (scripts/run_tests.sh, main).
# Exit status: 0 when the tests pass (benchmark failures are reported in the summary), 1 when a
# test fails, 2 when nvcc or a recent enough CMake is missing, the configure or build fails or
# --run-only finds no build, 77 when no GPU is visible.
set -uo pipefail

full=0
build_only=${TANGRAM_GPU_CHECK_BUILD_ONLY:-0}
run_only=0
out=""
usage="usage: scripts/gpu_check.sh [--full] [--build-only | --run-only] OUT_DIR"
for arg in "$@"; do
  case "$arg" in
    --full) full=1 ;;
    --build-only) build_only=1 ;;
    --run-only) run_only=1 ;;
    -*) echo "gpu_check: unknown option $arg (--full, --build-only, --run-only)" >&2; exit 2 ;;
    *) out=$arg ;;
  esac
done
[ -n "$out" ] || { echo "$usage" >&2; exit 2; }
[ "$build_only" = 1 ] && [ "$run_only" = 1 ] &&
  { echo "gpu_check: --build-only and --run-only exclude each other; $usage" >&2; exit 2; }
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$(dirname "$0")/.."
build=${TANGRAM_GPU_BUILD_DIR:-build-gpu-check}
jobs=${TANGRAM_JOBS:-$(nproc)}
arch=${CUDAARCHS:-90}
summary="$out/summary.md"
start=$(date +%s)

log() { echo "[gpu_check $(($(date +%s) - start))s] $*"; }

# Fail early: nothing here works without nvcc or an older CMake, and without a device only the
# build is useful.
need_cmake=$(sed -n 's/^cmake_minimum_required(VERSION \([0-9.]*\)).*/\1/p' CMakeLists.txt)
have_cmake=$(cmake --version 2>/dev/null | sed -n 's/^cmake version \([0-9][0-9.]*\).*/\1/p')
if [ "$run_only" != 1 ]; then
  if [ -z "$have_cmake" ]; then
    echo "gpu_check: cmake not found; the build needs CMake >= $need_cmake" >&2
    exit 2
  fi
  if [ "$(printf '%s\n%s\n' "$need_cmake" "$have_cmake" | sort -V | head -1)" != "$need_cmake" ]; then
    echo "gpu_check: CMake $have_cmake found; the build needs >= $need_cmake (CMakeLists.txt)." >&2
    echo "gpu_check: offline, carry the cmake wheel from PyPI and put its bin/ first on PATH." >&2
    exit 2
  fi
fi
nvcc_bin=${CUDACXX:-$(command -v nvcc || true)}
if [ -z "$nvcc_bin" ] || [ ! -x "$nvcc_bin" ]; then
  echo "gpu_check: nvcc not found (put the CUDA toolkit's bin/ on PATH or set CUDACXX)" >&2
  exit 2
fi
if [ "$build_only" != 1 ]; then
  if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
    echo "gpu_check: no NVIDIA GPU visible (nvidia-smi -L lists none); nothing to run." >&2
    echo "gpu_check: use --build-only to check the build path on a machine without one." >&2
    exit 77
  fi
fi

{
  echo "# Tangram GPU check"
  echo
  echo "- date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "- commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (with local changes)')"
  echo "- nvcc: $("$nvcc_bin" --version 2>/dev/null | tail -1 || echo missing)"
  echo "- gpu: $(nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv,noheader 2>/dev/null || echo 'nvidia-smi unavailable')"
  echo "- CUDA arch: $arch"
  echo "- mode: $([ "$build_only" = 1 ] && echo build-only || ([ "$full" = 1 ] && echo full || echo short))$([ "$run_only" = 1 ] && echo ', run-only (built by an earlier --build-only call)')"
  echo "- cmake: ${have_cmake:-not checked (--run-only)}"
} >"$summary"
nvidia-smi >"$out/nvidia_smi.txt" 2>&1 || true

if [ "$run_only" = 1 ]; then
  for bin in test/tangram_gpu_tests bench/bench_gpu_decode bench/bench_gpu_eviction; do
    [ -x "$build/$bin" ] || {
      echo "gpu_check: --run-only: $build/$bin is missing; run scripts/gpu_check.sh --build-only first" >&2
      exit 2
    }
  done
else
  generator=()
  command -v ninja >/dev/null && generator=(-G Ninja)
  log "configure $build"
  if ! cmake -S . -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CUDA_COMPILER="$nvcc_bin" -DCMAKE_CUDA_ARCHITECTURES="$arch" \
    -DCMAKE_DISABLE_FIND_PACKAGE_Catch2=ON -DCMAKE_DISABLE_FIND_PACKAGE_benchmark=ON \
    -DCMAKE_REQUIRE_FIND_PACKAGE_Catch2=OFF -DCMAKE_REQUIRE_FIND_PACKAGE_benchmark=OFF \
    -DTANGRAM_BUILD_EXAMPLES=OFF -DTANGRAM_WERROR=OFF \
    >"$out/configure.log" 2>&1; then
    echo "- configure: FAILED (see configure.log)" >>"$summary"
    tail -30 "$out/configure.log"
    exit 2
  fi
  log "build GPU tests and benchmarks with $jobs jobs"
  b0=$(date +%s)
  if ! cmake --build "$build" -j"$jobs" --target tangram_gpu_tests bench_gpu_decode bench_gpu_eviction \
    >"$out/build.log" 2>&1; then
    echo "- build: FAILED (see build.log)" >>"$summary"
    grep -E "error|Error" "$out/build.log" | head -30
    exit 2
  fi
  echo "- build: $(($(date +%s) - b0)) s" >>"$summary"
  if [ "$build_only" = 1 ]; then
    echo "- build only: stopped before the GPU tests (they need a device)" >>"$summary"
    cat "$summary"
    log "build-only: tangram_gpu_tests and the GPU benchmarks built; stopping here, the next step needs a CUDA device"
    exit 0
  fi
fi

log "GPU tests"
t0=$(date +%s)
timeout 240 "$build/test/tangram_gpu_tests" >"$out/gpu_tests.log" 2>&1
test_rc=$?
echo "- gpu tests: exit $test_rc in $(($(date +%s) - t0)) s ($(grep -E 'test cases' "$out/gpu_tests.log" | tail -1))" >>"$summary"
tail -5 "$out/gpu_tests.log"
if [ "$test_rc" -eq 77 ]; then
  echo "- no usable GPU: tests skipped, benchmarks not run" >>"$summary"
  cat "$summary"
  exit 77
fi

bench_rc=0
for b in decode eviction; do
  log "benchmark $b"
  mode_arg=(--short)
  [ "$full" = 1 ] && mode_arg=()
  timeout 150 "$build/bench/bench_gpu_$b" "${mode_arg[@]}" --out "$out/bench_$b.json" \
    >"$out/bench_$b.log" 2>&1 || bench_rc=$?
done
echo "- benchmarks: exit $bench_rc" >>"$summary"

if command -v python3 >/dev/null; then
  python3 - "$out" >>"$summary" <<'PY'
import json, os, sys
out = sys.argv[1]
def rows(name):
    path = os.path.join(out, f"bench_{name}.json")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return json.load(f).get("benchmarks", [])
print("\n## Decode bandwidth (bf16, 8 KV heads, GQA 4, d 128; cold L2; peak 4.8 TB/s)\n")
print("| benchmark | time us | TB/s | fraction of peak |")
print("|---|---|---|---|")
for b in rows("decode"):
    if b["name"].startswith("BM_decode_bandwidth"):
        if b.get("error_occurred"):
            print(f"| {b['name']} | error: {b.get('error_message')} | | |"); continue
        print(f"| {b['name']} | {b['real_time']:.1f} | {b['TB_per_s']:.2f} | {b['hbm_fraction']:.2f} |")
print("\n## Skew: non-uniform vs uniform heads at equal KV bytes (goal aot/uniform <= 1.05)\n")
print("| benchmark | uniform us | AOT split us | equal split us | balanced us | stream us | AOT / uniform | equal / uniform | balanced / uniform | stream / uniform | balance launch us | bytes ratio |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|")
for b in rows("decode"):
    if b["name"].startswith("BM_decode_skew") and not b.get("error_occurred"):
        print(f"| {b['name']} | {b['uniform_us']:.1f} | {b['aot_us']:.1f} | {b['equal_split_us']:.1f} | "
              f"{b['balanced_us']:.1f} | {b['stream_us']:.1f} | {b['aot_over_uniform']:.3f} | "
              f"{b['equal_over_uniform']:.3f} | {b['balanced_over_uniform']:.3f} | "
              f"{b['stream_over_uniform']:.3f} | {b['balance_launch_us']:.1f} | {b['bytes_ratio']:.3f} |")
print("\n## Balanced split map: one balance_decode_splits launch (one layer)\n")
print("| benchmark | time us |")
print("|---|---|")
for b in rows("decode"):
    if b["name"].startswith("BM_balance_splits") and not b.get("error_occurred"):
        print(f"| {b['name']} | {b['real_time']:.1f} |")
def side_by_side(prefix, title, columns):
    """A table of the decode benchmarks named prefix*: (header, counter, digits) per column."""
    print(f"\n## {title}\n")
    print("| benchmark | " + " | ".join(h for h, _, _ in columns) + " |")
    print("|---" * (len(columns) + 1) + "|")
    for b in rows("decode"):
        if b["name"].startswith(prefix) and not b.get("error_occurred"):
            print(f"| {b['name']} | " + " | ".join(f"{b[k]:.{n}f}" for _, k, n in columns) + " |")
side_by_side("BM_decode_invariant", "Batch-invariant decode beside the split map's pieces",
             [("split us", "split_us", 1), ("invariant us", "invariant_us", 1),
              ("invariant / split", "invariant_over_split", 3)])
side_by_side("BM_decode_stream", "Layer-stream split against the balanced map (non-uniform heads; stream / (launch + balanced))",
             [("balance launch us", "balance_launch_us", 1), ("balanced us", "balanced_us", 1),
              ("stream us", "stream_us", 1), ("stream / balanced", "stream_over_balanced", 3),
              ("stream HBM fraction", "hbm_fraction_stream", 2)])
side_by_side("BM_decode_pdl", "Programmatic dependent launch: 32 back-to-back decode launches",
             [("plain us", "plain_us", 1), ("PDL us", "pdl_us", 1), ("PDL / plain", "pdl_over_plain", 3)])
print("\n## Eviction throughput (candidate K+V bytes per second; scorer 0 supplied, 1 key norm, 2 SnapKV, "
      "3 SnapKV from the prefill's lse on tensor cores, 4 the same on CUDA cores)\n")
print("| benchmark | time us | GB/s | candidates | kept |")
print("|---|---|---|---|---|")
for b in rows("eviction"):
    if b.get("error_occurred"):
        print(f"| {b['name']} | error: {b.get('error_message')} | | | |"); continue
    print(f"| {b['name']} | {b['real_time']:.1f} | {b['GB_per_s']:.1f} | {b['candidates']:.0f} | {b['keep']:.0f} |")
PY
fi
echo "- total: $(($(date +%s) - start)) s" >>"$summary"
cat "$summary"
[ "$test_rc" -eq 0 ] || exit 1
exit 0
