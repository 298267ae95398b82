#!/usr/bin/env bash
# Static figures of the CUDA kernels that need no GPU, per kernel and instantiation:
#   scripts/kernel_stats.sh [OUT.md]
# registers, spill stores/loads, stack frame, static shared memory and barriers (ptxas -v), the
# decode split kernels' dynamic shared memory (decode_config, decode_mma_config), and the SASS
# instruction count of their per-tile loop per byte of K/V the tile loads (cuobjdump -sass; the
# loop is the smallest backward branch whose body holds the tile's cp.async copies (LDGSTS) and
# a barrier: BAR.SYNC for decode_split_kernel, whose 128 threads share a tile; for
# decode_mma_kernel, whose warps stream their own tiles with a warp sync, the tile's tensor-core
# instructions (HMMA) mark it instead). The last column multiplies by the warps that execute the
# loop for one tile (4 and 1), so it counts warp instructions issued per byte on either kernel.
# Needs nvcc (CUDA arch: CUDAARCHS, default 90); the SASS column also needs cuobjdump and
# nvdisasm (toolkit bin/, PATH, or CUOBJDUMP / NVDISASM_PATH; without them the column says n/a).
# Writes a markdown table to OUT.md (default: stdout). Takes a few minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-/dev/stdout}
arch=${CUDAARCHS:-90}
nvcc_bin=${CUDACXX:-$(command -v nvcc || true)}
[ -n "$nvcc_bin" ] || { echo "kernel_stats: nvcc not found (PATH or CUDACXX)" >&2; exit 2; }
cuobjdump_bin=${CUOBJDUMP:-$(command -v cuobjdump || true)}
[ -n "$cuobjdump_bin" ] || cuobjdump_bin=$(dirname "$nvcc_bin")/cuobjdump
[ -x "$cuobjdump_bin" ] || cuobjdump_bin=""
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

for f in decode_attention_f32 decode_attention_f16 decode_attention_bf16 \
  decode_attention_fp8_e4m3 decode_attention_fp8_e5m2 decode_attention \
  eviction_f32 eviction_f16 eviction_bf16 eviction_fp8_e4m3 eviction_fp8_e5m2 elastic_eviction \
  append prefill_attention; do
  echo "kernel_stats: compiling kernels/$f.cu" >&2
  "$nvcc_bin" -arch=sm_"$arch" -std=c++17 -O3 -DNDEBUG --expt-relaxed-constexpr -I include \
    -cubin -Xptxas -v "kernels/$f.cu" -o "$work/$f.cubin" 2>"$work/$f.ptxas"
  if [ -n "$cuobjdump_bin" ]; then
    "$cuobjdump_bin" -sass "$work/$f.cubin" >"$work/$f.sass" 2>"$work/$f.sass.err" || rm -f "$work/$f.sass"
  fi
done

python3 - "$work" "$arch" "$("$nvcc_bin" --version | tail -1)" >"$out" <<'PY'
import glob, os, re, subprocess, sys
work, arch, nvcc = sys.argv[1], sys.argv[2], sys.argv[3]

def demangle(names):
    r = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True)
    return r.stdout.split("\n")

def short(name):
    name = re.sub(r"^void ", "", name).replace("tangram::detail::", "").replace("tangram::", "")
    name = re.sub(r"\((detail::)?(decode_args|eviction_args|append_params|prefill_args)\)$", "", name)
    name = re.sub(r", int\)$", "", name)
    return name.replace("float16", "f16").replace("bfloat16", "bf16").replace("float8_e4m3", "fp8_e4m3").replace("float8_e5m2", "fp8_e5m2")

# ptxas -v: one block of lines per entry function.
rows = {}
for path in sorted(glob.glob(os.path.join(work, "*.ptxas"))):
    cur = None
    for line in open(path):
        m = re.search(r"Compiling entry function '(\S+)'", line)
        if m:
            cur = m.group(1); rows[cur] = {}
            continue
        if cur is None:
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m:
            rows[cur].update(stack=int(m.group(1)), spill_st=int(m.group(2)), spill_ld=int(m.group(3)))
        m = re.search(r"Used (\d+) registers", line)
        if m:
            rows[cur]["regs"] = int(m.group(1))
            b = re.search(r"used (\d+) barriers", line); rows[cur]["bars"] = int(b.group(1)) if b else 0
            s = re.search(r"(\d+) bytes smem", line); rows[cur]["smem"] = int(s.group(1)) if s else 0

# SASS of the decode split kernels: the per-tile loop.
sass = {}
for path in glob.glob(os.path.join(work, "*.sass")):
    fun = None
    for line in open(path):
        m = re.match(r"\s+Function : (\S+)", line)
        if m:
            fun = m.group(1); sass[fun] = []
            continue
        m = re.match(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?);", line)
        if m and fun:
            sass[fun].append((int(m.group(1), 16), m.group(2)))

def tile_loop(instrs, marker="BAR.SYNC"):
    best = None
    for addr, text in instrs:
        m = re.search(r"\bBRA\b.*?(0x[0-9a-f]+)", text)
        if not m:
            continue
        target = int(m.group(1), 16)
        if target >= addr:
            continue
        body = [t for a, t in instrs if target <= a <= addr]
        if any("LDGSTS" in t for t in body) and any(marker in t for t in body):
            if best is None or len(body) < best:
                best = len(body)
    return best

def decode_shape(T, D):
    es = {"float": 4, "f16": 2, "bf16": 2, "fp8_e4m3": 1, "fp8_e5m2": 1}[T]
    vec = max(min(16 // es, 8), D // 32); bdx = D // vec; groups = 128 // bdx  # decode_config
    tile = max(8192 // (2 * D * es), groups)
    pipeline = 4 * 2 * tile * D * es; prefix = 4096 * 8; merge = groups * 8 * D * 4
    return tile * 2 * D * es, max(pipeline, prefix, merge), tile

def mma_shape(T, D):  # decode_mma_config (16-bit K/V, or fp8 widened to an f16 tile)
    es = 1 if T.startswith("fp8") else 2
    warps, tile, row = 2, (32 if D == 64 else 16), D + 8
    stage, wide, q = 2 * tile * (D * es + 16), (tile * row * 2 if es == 1 else 0), 16 * row * 2
    stages = min(4, (45 * 1024 - q - warps * wide) // (warps * stage))
    return tile * 2 * D * es, max(warps * (stages * stage + wide) + q, 4096 * 8)

names = sorted(rows)
pretty = dict(zip(names, demangle(names)))
print(f"Generated by `scripts/kernel_stats.sh` ({nvcc}, sm_{arch}, -O3).\n")
print("| kernel | registers | spill st/ld (B) | stack (B) | static smem (B) | dynamic smem (B) | barriers | SASS per tile loop | KV bytes per tile | SASS instr per KV byte | warp instr per KV byte |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for n in sorted(names, key=lambda k: short(pretty[k])):
    r = rows[n]; p = short(pretty[n])
    dyn = loop = kvb = per = wper = "-"
    m = re.match(r"decode_(split|mma)_kernel<(\w+), (\d+), (\d+)(?:, (?:true|false))?>", p)
    if m:
        if m.group(1) == "split":
            kvb_, dyn_, _ = decode_shape(m.group(2), int(m.group(3)))
            marker, warps = "BAR.SYNC", 4
        else:
            (kvb_, dyn_), marker, warps = mma_shape(m.group(2), int(m.group(3))), "HMMA", 1
        dyn, kvb = str(dyn_), str(kvb_)
        l = tile_loop(sass.get(n, []), marker) if sass else None
        loop = str(l) if l else "n/a"
        per = f"{l / kvb_:.3f}" if l else "n/a"
        wper = f"{warps * l / kvb_:.3f}" if l else "n/a"
    print(f"| `{p}` | {r.get('regs','?')} | {r.get('spill_st','?')}/{r.get('spill_ld','?')} | {r.get('stack','?')} | {r.get('smem','?')} | {dyn} | {r.get('bars','?')} | {loop} | {kvb} | {per} | {wper} |")
PY
