#!/usr/bin/env bash
# Static figures and the static roofline of the CUDA kernels, with no GPU:
#   scripts/kernel_stats.sh [--json] [--check] [--objects DIR] [--files "f1 f2 ..."] [OUT]
# Per kernel and instantiation: registers, spill stores, stack, static and dynamic shared memory,
# the decode split kernels' tile loops in SASS instructions per byte of K/V; and the static
# roofline (modelled, not measured: scripts/kernel_stats.py, docs/kernels.md "Static roofline"):
# per case, the fraction of H200 HBM bandwidth bounded by instruction issue, bytes in flight
# against the latency-bandwidth product and L1 wavefronts, and the CTAs per SM of the launched
# variant against those planned.
#   (default)   a markdown table to OUT (default: stdout), led by the roofline
#   --json      {"roofline": [{"case", "modelled_hbm_fraction", "ctas_per_sm_planned",
#               "ctas_per_sm_launched", "spill_bytes", ...}, ...], "occupancy": [...]}
#   --check     exit 1 when a modelled fraction is below its acceptance bound, a roofline kernel
#               spills, or a launched variant holds fewer CTAs per SM than planned (CI: ctest
#               kernels:roofline)
#   --objects D read the kernels from an existing nvcc build's object files (D: the directory of
#               kernels/*.cu.o, e.g. build/CMakeFiles/tangram_kernels.dir/kernels): compiles
#               nothing. Without it each file is compiled here (nvcc -cubin; minutes on 2 cores).
#   --files L   only these kernels/*.cu files (names without .cu); default: all of them, or with
#               --objects every object found
# Needs cuobjdump and nvdisasm (CUDA toolkit bin/, PATH, CUOBJDUMP / NVDISASM_PATH, or the
# nvidia-cuda-cuobjdump / nvidia-cuda-nvdisasm Python wheels that scripts/install_sass_tools.sh
# installs) and, without --objects, nvcc. CUDA arch: CUDAARCHS, default 90 (the roofline models an
# H200); with --objects only that architecture's code is read.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=markdown check=0 objects="" files="" out=/dev/stdout
while [ $# -gt 0 ]; do
  case $1 in
    --json) mode=json ;;
    --check) check=1 ;;
    --objects) objects=$2; shift ;;
    --files) files=$2; shift ;;
    -h | --help) sed -n '2,25p' "$0"; exit 0 ;;
    -*) echo "kernel_stats: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) out=$1 ;;
  esac
  shift
done
arch=${CUDAARCHS:-90}
nvcc_bin=${CUDACXX:-$(command -v nvcc || true)}

# The SASS tools: the toolkit's, PATH's, the environment's, or the wheels' (install_sass_tools.sh).
wheel_bin=$(scripts/install_sass_tools.sh --print-bin 2>/dev/null || true)
cuobjdump_bin=${CUOBJDUMP:-}
for c in "$(dirname "${nvcc_bin:-/nonexistent/x}")/cuobjdump" "$(command -v cuobjdump || true)" \
  "$wheel_bin/cuobjdump"; do
  [ -n "$cuobjdump_bin" ] && break
  [ -x "$c" ] && cuobjdump_bin=$c
done
[ -n "$cuobjdump_bin" ] || {
  echo "kernel_stats: cuobjdump not found (CUOBJDUMP, PATH, the toolkit or" \
    "scripts/install_sass_tools.sh)" >&2
  exit 2
}
if [ -z "${NVDISASM_PATH:-}" ] && ! command -v nvdisasm >/dev/null; then
  for d in "$(dirname "$cuobjdump_bin")" "$wheel_bin"; do
    [ -x "$d/nvdisasm" ] && export PATH="$d:$PATH" && break
  done
fi
[ -n "${NVDISASM_PATH:-}" ] && export PATH="$NVDISASM_PATH:$PATH"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
dump() {  # dump <binary> <name>: resource usage and SASS of one cubin or object file
  # Only the sm_$arch code: an object built for several architectures (the default
  # 80-real;90-real;100) holds one copy of every kernel per architecture, with other registers.
  "$cuobjdump_bin" -arch sm_"$arch" -res-usage "$1" >"$work/$2.res" 2>"$work/$2.err"
  "$cuobjdump_bin" -arch sm_"$arch" -sass "$1" >"$work/$2.sass" 2>>"$work/$2.err" || {
    cat "$work/$2.err" >&2
    echo "kernel_stats: cuobjdump -sass failed on $1 (nvdisasm on PATH or NVDISASM_PATH?)" >&2
    exit 2
  }
  if ! grep -q "Function" "$work/$2.res" && "$cuobjdump_bin" -res-usage "$1" 2>/dev/null |
    grep -q "Function"; then
    echo "kernel_stats: no sm_$arch code in $1 (CUDAARCHS: an architecture it was built for)" >&2
    exit 2
  fi
}
if [ -n "$objects" ]; then
  [ -d "$objects" ] || { echo "kernel_stats: --objects $objects: not a directory" >&2; exit 2; }
  found=0
  for o in "$objects"/*.cu.o; do
    [ -e "$o" ] || continue
    f=$(basename "$o" .cu.o)
    [ -z "$files" ] || [[ " $files " == *" $f "* ]] || continue
    dump "$o" "$f"
    found=1
  done
  [ $found = 1 ] || { echo "kernel_stats: no kernels/*.cu.o in $objects" >&2; exit 2; }
  compiler="objects of an existing build"
else
  [ -n "$nvcc_bin" ] || { echo "kernel_stats: nvcc not found (PATH or CUDACXX)" >&2; exit 2; }
  [ -n "$files" ] || files=$(cd kernels && ls *.cu | sed 's/\.cu$//' | tr '\n' ' ')
  for f in $files; do
    echo "kernel_stats: compiling kernels/$f.cu" >&2
    "$nvcc_bin" -arch=sm_"$arch" -std=c++17 -O3 -DNDEBUG --expt-relaxed-constexpr -I include \
      -cubin "kernels/$f.cu" -o "$work/$f.cubin"
    dump "$work/$f.cubin" "$f"
  done
  compiler="$("$nvcc_bin" --version | tail -1), sm_$arch, -O3"
fi

header="Generated by \`scripts/kernel_stats.sh\` ($compiler; SASS by cuobjdump $("$cuobjdump_bin" --version | tail -1 | sed 's/^Build //'))."
args=()
[ $mode = json ] && args+=(--json)
[ $check = 1 ] && args+=(--check)
if [ $check = 1 ] && [ $mode = markdown ]; then
  python3 scripts/kernel_stats.py "$work" --check --header "$header"
else
  python3 scripts/kernel_stats.py "$work" "${args[@]}" --header "$header" >"$out"
fi
