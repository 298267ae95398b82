#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Static figures and the static roofline of the CUDA kernels (called by scripts/kernel_stats.sh).

Input: a directory of `<file>.res` (cuobjdump -res-usage) and `<file>.sass` (cuobjdump -sass) per
kernel source file, from cubins compiled here or from an existing build's object files.

Output: the markdown table of docs/kernels.md ("Static kernel figures"), led by the roofline table,
or with --json `{"roofline": [...], "kernels": [...]}`. With --check it exits 1 when a modelled
figure is below its acceptance bound, a roofline kernel spills, or a launched variant's CTAs per
SM fall short of the planned ones (what decode_device_limits plans with).

The roofline is MODELLED, not measured: per kernel and case, the fraction of H200 HBM bandwidth
the kernel can reach is the smallest of three bounds, each computed from the built SASS and the
kernels' shapes (mirrored below from the .cuh configs):
  issue    4 warp instructions per clock per SM against the warp instructions the kernel's
           steady-state loop issues per byte, at the HBM rate per SM;
  latency  bytes a SM keeps in flight (resident CTAs x bytes each CTA has in flight) against the
           latency-bandwidth product (Little's law), for kernels that stream through a ring of
           cp.async stages; for kernels that load, then compute (a phase at a time), a CTA's time
           is its chain of dependent memory round trips plus the instructions its busiest warp
           issues, and its resident CTAs overlap;
  L1       L1 / shared-memory wavefronts per byte (global-side cache lines per copy instruction,
           shared-side bank-conflict-aware wavefronts of every shared store and load of the loop)
           against one wavefront per clock per SM;
times the wave efficiency when the launched variant holds fewer CTAs per SM than were planned
(the planned grid then runs in several waves).
"""
import argparse
import glob
import json
import math
import os
import re
import subprocess
import sys

# --- Machine constants (H200 SXM; sources in docs/kernels.md, "Static roofline") ---------------
HBM_BYTES_PER_S = 4.8e12  # NVIDIA H200 datasheet: 4.8 TB/s HBM3e
SMS = 132                 # H200 SXM (GH100, 132 SMs as H100 SXM5: NVIDIA Hopper whitepaper)
CLOCK_HZ = 1.98e9         # max boost clock of GH100 SXM (Hopper whitepaper)
ISSUE_PER_CLK = 4         # 4 SM sub-partitions, one warp instruction per clock each (whitepaper)
LATENCY_CLK = 1000        # loaded HBM latency in SM clocks (~505 ns; unloaded pointer-chase
#                           latencies of Hopper HBM are several hundred ns: Luo et al. 2024,
#                           arXiv:2402.13499; Chips and Cheese, "Nvidia's H100: Funny L2, and
#                           Tons of Bandwidth", 2023; taken pessimistically under load)
LATENCY_L2_CLK = 300      # L2 hit latency in SM clocks (~260-300 measured on Hopper, same sources)
L1_WAVES_PER_CLK = 1      # one 128-byte L1 / shared-memory wavefront per clock per SM
SMEM_PER_SM = 233472      # 228 KiB shared memory per SM (sm_90)
SMEM_RESERVED = 1024      # per CTA, reserved by the system (sm_90)
REGS_PER_SM = 65536
MAX_THREADS_PER_SM = 2048
MAX_CTAS_PER_SM = 32
BYTES_PER_CLK = HBM_BYTES_PER_S / SMS / CLOCK_HZ  # HBM bytes per clock per SM (18.4)

# Acceptance bounds (issue #34): modelled fraction of HBM at batch 64, 32K context, Llama-3.1-8B.
BOUNDS = {
    "decode_tensor_core": 0.85,
    "decode_cuda_core_gqa1": 0.75,
    "decode_cuda_core_gqa2": 0.75,
    "snapkv_scorer": 0.50,
    "eviction_pipeline": 0.50,
}


# --- Parsing -------------------------------------------------------------------------------------
def demangle(names):
    r = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True)
    return r.stdout.split("\n")


def short(name):
    name = re.sub(r"^void ", "", name).replace("tangram::detail::", "").replace("tangram::", "")
    name = re.sub(r"\((detail::)?(decode_args|eviction_args|append_params|prefill_args)\)$", "", name)
    name = re.sub(r", int\)$", "", name)
    for a, b in (("float16", "f16"), ("bfloat16", "bf16"), ("float8_e4m3", "fp8_e4m3"),
                 ("float8_e5m2", "fp8_e5m2")):
        name = name.replace(a, b)
    return name


def per_function(paths, header):
    """(function, line) for every line of the dumps after a `header` match naming a function."""
    for path in paths:
        fun = None
        for line in open(path):
            m = re.match(header, line)
            if m:
                fun = m.group(1)
                yield fun, None
            elif fun:
                yield fun, line


def parse(work):
    """{mangled: {regs, stack, smem, local, sass: [(addr, text)]}} over every .res / .sass."""
    kernels = {}
    res = sorted(glob.glob(os.path.join(work, "*.res")))
    for fun, line in per_function(res, r"\s*Function (\S+):"):
        k = kernels.setdefault(fun, {"sass": []})
        m = re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)", line or "")
        if m:
            k["regs"], k["stack"] = int(m.group(1)), int(m.group(2))
            k["smem"], k["local"] = int(m.group(3)), int(m.group(4))
    sass = sorted(glob.glob(os.path.join(work, "*.sass")))
    for fun, line in per_function(sass, r"\s+Function : (\S+)"):
        k = kernels.setdefault(fun, {})
        if line is None:
            k["sass"] = []
            continue
        m = re.match(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?);", line)
        if m:
            k["sass"].append((int(m.group(1), 16), m.group(2)))
    return kernels


def spill_bytes(instrs):
    """Bytes stored to local memory by the kernel's STL instructions (static): its spill stores."""
    total = 0
    for _, t in instrs:
        m = re.search(r"\bSTL(?:\.(\d+))?\b", t)
        if m:
            total += int(m.group(1) or 32) // 8
    return total


def loops(instrs):
    """(first, last) address of every loop: a backward branch and its target."""
    out = []
    for addr, text in instrs:
        m = re.search(r"\bBRA\b.*?(0x[0-9a-f]+)", text)
        if m and int(m.group(1), 16) < addr:
            out.append((int(m.group(1), 16), addr))
    return out


def smallest_loop(instrs, *markers):
    """Instructions of the smallest loop whose body holds every marker (regex), or None."""
    best = None
    for lo, hi in loops(instrs):
        body = [t for a, t in instrs if lo <= a <= hi]
        if all(any(re.search(m, t) for t in body) for m in markers):
            if best is None or len(body) < len(best):
                best = body
    return best


# --- Occupancy (sm_90 rules, as cudaOccupancyMaxActiveBlocksPerMultiprocessor) ------------------
def occupancy(regs, threads, smem_static, smem_dynamic):
    warps = (threads + 31) // 32
    per_warp = math.ceil(regs * 32 / 256) * 256 if regs else 0
    by_regs = (4 * (16384 // per_warp)) // warps if per_warp else MAX_CTAS_PER_SM
    per_cta = math.ceil((smem_static + smem_dynamic + SMEM_RESERVED) / 128) * 128
    by_smem = SMEM_PER_SM // per_cta
    return min(by_regs, by_smem, MAX_THREADS_PER_SM // threads, MAX_CTAS_PER_SM)


def static_smem(k):
    return max(k.get("smem", 0) - SMEM_RESERVED, 0)  # cuobjdump counts the reserved KiB


# --- Shapes (mirrors of the .cuh configs) ------------------------------------------------------
ELEM = {"float": 4, "f16": 2, "bf16": 2, "fp8_e4m3": 1, "fp8_e5m2": 1}


def decode_config(T, D):  # decode_config<T, D> (decode_attention.cuh)
    es = ELEM[T]
    per_vector = min(16 // es, 8)
    vec = max(per_vector, D // 32)
    bdx = D // vec
    groups = 128 // bdx
    tile = max(8192 // (2 * D * es), groups)
    stages = 4
    pipeline = stages * 2 * tile * D * es
    return dict(threads=128, vec=vec, bdx=bdx, groups=groups, tile=tile, stages=stages,
                tile_bytes=2 * tile * D * es, row_bytes=D * es,
                smem=max(pipeline, 4096 * 8, groups * 8 * D * 4))


def decode_mma_config(T, D):  # decode_mma_config<T, D> (decode_mma.cuh)
    es = ELEM[T]
    warps, tile = 2, (32 if D == 64 else 16)
    row = D + 8
    raw_row = D * es + 16
    stage = 2 * tile * raw_row
    wide = tile * row * 2 if es == 1 else 0
    q = 16 * row * 2
    stages = min(4, (45 * 1024 - q - warps * wide) // (warps * stage))
    pipeline = warps * (stages * stage + wide) + q
    return dict(threads=64, warps=warps, tile=tile, stages=stages, lpt=32 // tile,
                tile_bytes=2 * tile * D * es, row_bytes=D * es, raw_row=raw_row,
                smem=max(pipeline, 4096 * 8), row_contiguous=True, half_widen=True)


def snapkv_mma_config(D, pipelined=True):  # snapkv_mma_config<T, D> (snapkv_mma.cuh)
    # (before issue #34: 8 lanes per token, one m16 query tile per step)
    return dict(threads=128, warps=4, keys=64 if D == 256 else 128, row=D + 8,
                lpt=4 if pipelined else 8, sub_tiles=2 if pipelined else 1)


def min_ctas_decode_split(GB):  # decode_min_ctas_per_sm (decode_attention.cuh)
    return {1: 5, 2: 4, 4: 3, 8: 1}[GB]


# --- L1 / shared wavefronts --------------------------------------------------------------------
def global_wavefronts(addrs):
    """Distinct 128-byte lines one warp-wide global access touches (its L1 tag wavefronts)."""
    return len({a // 128 for a in addrs if a is not None})


def shared_wavefronts(addrs, width):
    """Wavefronts of one warp-wide shared access of `width` bytes per lane (None: inactive lane):
    lanes in phases of 128 / width, each phase as many wavefronts as its worst bank conflict."""
    per_phase = max(1, 128 // width)
    total = 0
    for p in range(0, 32, per_phase):
        banks = {}
        for a in addrs[p:p + per_phase]:
            if a is None:
                continue
            for w in range(a // 4, (a + width) // 4):
                banks.setdefault(w % 32, set()).add(w)
        if banks:
            total += max(len(v) for v in banks.values())
    return total


def ldmatrix_wavefronts(rows):
    """ldmatrix.x4: `rows` are the 32 lanes' 16-byte row addresses, one 8x8 matrix per 8 lanes."""
    return sum(shared_wavefronts(rows[m * 8:m * 8 + 8] + [None] * 24, 16) for m in range(4))


def decode_split_wavefronts(T, D, cfg):
    """L1 / shared wavefronts of one tile of decode_split_kernel (all 4 warps): the cp.async
    copies (chunk c = tid + u * 128 of the stage: K rows then V rows, 16 bytes each) and the
    lanes' vector reads of K and V (decode_attention.cuh)."""
    es, tile, rb = ELEM[T], cfg["tile"], cfg["row_bytes"]
    row_chunks = rb // 16
    total = 0
    for w in range(4):
        for u in range(2 * tile * row_chunks // 128):
            g, s = [], []
            for lane in range(32):
                c = 32 * w + lane + 128 * u
                kv, rem = divmod(c, tile * row_chunks)
                tok, part = divmod(rem, row_chunks)
                g.append(kv * (1 << 24) + tok * rb + 16 * part)  # rows of a page are contiguous
                s.append(kv * tile * rb + tok * rb + 16 * part)
            total += global_wavefronts(g) + shared_wavefronts(s, 16)
        vbytes = cfg["vec"] * es
        width = min(vbytes, 16)
        for kv in range(2):
            for u in range(tile // cfg["groups"]):
                for part in range(max(1, vbytes // 16)):
                    s = []
                    for lane in range(32):
                        tid = 32 * w + lane
                        tx, tz = tid % cfg["bdx"], tid // cfg["bdx"]
                        lt = u * cfg["groups"] + tz
                        s.append(kv * tile * rb + lt * rb + tx * vbytes + 16 * part)
                    total += shared_wavefronts(s, width)
    return total


def decode_mma_wavefronts(T, D, cfg):
    """L1 / shared wavefronts of one warp tile of decode_mma_kernel: the cp.async copies (lane l:
    token l / lpt, 16-byte chunks lpt i + l % lpt of its K and V rows; shared rows `raw_row`
    bytes apart), the ldmatrix reads of Q, K and V (rows `row` 16-bit elements apart) and, for
    fp8, the widening's reads and writes (decode_mma.cuh)."""
    es, tile, lpt, rb, raw = ELEM[T], cfg["tile"], cfg["lpt"], cfg["row_bytes"], cfg["raw_row"]
    row = 2 * (D + 8)
    total = 0
    rc = rb // 16
    for kv in range(2):
        if cfg["row_contiguous"]:  # copy i: lane l, chunk l % rc of token i * (32 / rc) + l / rc
            for i in range(tile * rc // 32):
                toks = [i * (32 // rc) + l // rc for l in range(32)]
                g = [t * rb + 16 * (l % rc) for l, t in zip(range(32), toks)]
                s = [t * raw + 16 * (l % rc) for l, t in zip(range(32), toks)]
                total += global_wavefronts(g) + shared_wavefronts(s, 16)
        else:  # before issue #34: lane l, token l / lpt, chunks lpt i + l % lpt
            for i in range(rc // lpt):
                g = [(l // lpt) * rb + 16 * (lpt * i + l % lpt) for l in range(32)]
                s = [(l // lpt) * raw + 16 * (lpt * i + l % lpt) for l in range(32)]
                total += global_wavefronts(g) + shared_wavefronts(s, 16)
    kt_steps = tile // 16
    for kk in range(D // 16):
        total += ldmatrix_wavefronts([(l % 16) * row + (l // 16) * 16 + 32 * kk for l in range(32)])
        for kt in range(kt_steps):
            total += ldmatrix_wavefronts(
                [((l // 16) * 8 + l % 8) * row + ((l // 8) % 2) * 16 + kt * 16 * row + 32 * kk
                 for l in range(32)])
    for kt in range(kt_steps):
        for np_ in range(D // 16):
            total += ldmatrix_wavefronts(
                [(((l // 8) % 2) * 8 + l % 8) * row + (l // 16) * 16 + kt * 16 * row + 32 * np_
                 for l in range(32)])
    if es == 1 and cfg["half_widen"]:  # widen K, then V: lane l, 8-byte halves l + 32 u
        halves = D // 8
        for kv in range(2):
            for u in range(tile * halves // 32):
                r, w = [], []
                for l in range(32):
                    tok, part = divmod(l + 32 * u, halves)
                    r.append(tok * raw + 8 * part)
                    w.append(tok * row + 16 * part)
                total += shared_wavefronts(r, 8) + shared_wavefronts(w, 16)
    elif es == 1:  # before issue #34: a 16-byte read and two 16-byte writes per chunk
        per_row = D // 16
        for kv in range(2):
            for u in range(tile * per_row // 32):
                r, w0, w1 = [], [], []
                for l in range(32):
                    tok, part = divmod(l + 32 * u, per_row)
                    r.append(tok * raw + 16 * part)
                    w0.append(tok * row + 32 * part)
                    w1.append(tok * row + 32 * part + 16)
                total += shared_wavefronts(r, 16) + shared_wavefronts(w0, 16) + \
                    shared_wavefronts(w1, 16)
    return total


def snapkv_wavefronts(T, D, cfg, q_tiles, k_in_registers, vector_q):
    """L1 / shared wavefronts of one CTA of snapkv_mma_kernel: staging the K block (thread: the
    consecutive tokens (tid / lpt) passes + j, 16-byte chunks tid % lpt + lpt u; fp8 widened to
    two 16-byte stores), every warp's
    ldmatrix of its keys (once when they stay in registers, else per query tile), and per query
    tile its copy or element-pair stores and every warp's ldmatrix of the queries (snapkv_mma.cuh)."""
    es, keys, row, threads = ELEM[T], cfg["keys"], 2 * cfg["row"], cfg["threads"]
    rb = D * es
    chunks = rb // 16
    lpt = min(chunks, cfg["lpt"])
    nw = keys // 8 // cfg["warps"]
    total = 0
    for w in range(cfg["warps"]):
        for j in range(keys // (threads // lpt)):
            for u in range(chunks // lpt):
                g, st = [], []
                for l in range(32):
                    tid = 32 * w + l
                    kk = (tid // lpt) * (keys // (threads // lpt)) + j  # consecutive tokens
                    part = tid % lpt + lpt * u
                    g.append(kk * rb + 16 * part)
                    st.append(kk * row + (16 if es == 2 else 32) * part)
                total += global_wavefronts(g) + shared_wavefronts(st, 16)
                if es == 1:  # fp8: 16 values widen to 32 bytes of f16, two stores
                    total += shared_wavefronts([a + 16 for a in st], 16)
    k_reads = 0
    for w in range(cfg["warps"]):
        for kk in range(D // 16):
            for np_ in range(nw // 2):
                k_reads += ldmatrix_wavefronts(
                    [(w * nw * 8 + (l // 16) * 8 + l % 8) * row + ((l // 8) % 2) * 16 +
                     np_ * 16 * row + 32 * kk for l in range(32)])
    per_tile = 0  # per step of `sub_tiles` m16 tiles
    for w in range(cfg["warps"]):
        if vector_q:  # 16-byte copies of the step's query rows, row-contiguous lanes
            for v in range(cfg["sub_tiles"] * 16 * D // 8 // threads):
                e = [32 * w + l + v * threads for l in range(32)]
                per_tile += global_wavefronts([(x // (D // 8)) * 4096 + 16 * (x % (D // 8))
                                               for x in e])
                per_tile += shared_wavefronts([(x // (D // 8)) * row + 16 * (x % (D // 8))
                                               for x in e], 16)
        else:
            for e0 in range(0, cfg["sub_tiles"] * 16 * (D // 2), threads):
                st = [((e0 + 32 * w + l) // (D // 2)) * row + 4 * ((e0 + 32 * w + l) % (D // 2))
                      for l in range(32)]
                per_tile += shared_wavefronts(st, 4)
        for kk in range(cfg["sub_tiles"] * D // 16):
            per_tile += ldmatrix_wavefronts(
                [(l % 16) * row + (l // 16) * 16 + 32 * (kk % (D // 16)) for l in range(32)])
    k_reads *= 1 if k_in_registers else q_tiles * cfg["sub_tiles"]
    return total + k_reads + q_tiles * per_tile


# --- The roofline ------------------------------------------------------------------------------
def bound_issue(warp_instr_per_byte):
    return min(1.0, ISSUE_PER_CLK / (warp_instr_per_byte * BYTES_PER_CLK))


def bound_l1(wavefronts_per_byte):
    return min(1.0, L1_WAVES_PER_CLK / (wavefronts_per_byte * BYTES_PER_CLK))


def wave_efficiency(planned, launched):
    """A grid sized for `planned` CTAs per SM on `launched` resident ones runs in waves."""
    if launched >= planned:
        return 1.0
    if launched <= 0:
        return 0.0
    return planned / (launched * math.ceil(planned / launched))


def finish(row):
    row["modelled_hbm_fraction"] = round(
        min(row["bound_issue"], row["bound_latency"], row["bound_l1"]) *
        wave_efficiency(row["ctas_per_sm_planned"], row["ctas_per_sm_launched"]), 3)
    for k in ("bound_issue", "bound_latency", "bound_l1"):
        row[k] = round(row[k], 3)
    return row


class Kernels:
    """The parsed kernels, looked up by their short demangled names."""

    def __init__(self, work):
        self.raw = parse(work)
        names = sorted(self.raw)
        self.by_short = {}
        for n, d in zip(names, demangle(names)):
            self.by_short[short(d)] = self.raw[n]
        self.names = sorted(self.by_short)

    def get(self, name):
        return self.by_short.get(name)


def decode_kernel_name(T, D, GB, tc, fold, stream=False):
    mma = tc and T in ("bf16", "f16", "fp8_e4m3", "fp8_e5m2") and GB in (4, 8)
    kind = "decode_mma_kernel" if mma else "decode_split_kernel"
    flag = lambda b: "true" if b else "false"
    return f"{kind}<{T}, {D}, {GB}, {flag(fold)}, {flag(stream)}>", mma


def decode_row(ks, case, T, D, GB, tc=True, fold=False, stream=False):
    """A decode split kernel streaming long pieces (batch 64 x 32K tokens per KV head: a CTA's
    range spans thousands of tiles, so the per-piece work is left out)."""
    name, mma = decode_kernel_name(T, D, GB, tc, fold, stream)
    k, occ = ks.get(name), decode_occupancy(ks, T, D, GB, tc, fold, stream)
    if k is None or occ is None or not k.get("sass"):
        return None
    cfg = decode_mma_config(T, D) if mma else decode_config(T, D)
    planned, launched = occ
    loop = smallest_loop(k["sass"], r"\bLDGSTS\b", r"\bHMMA\b" if mma else r"\bBAR\.SYNC\b")
    warps_per_tile = 1 if mma else 4
    streams = cfg["warps"] if mma else 1
    tile_bytes = cfg["tile_bytes"]
    if loop is None:
        return None
    row = dict(case=case, kernel=name, ctas_per_sm_planned=planned, ctas_per_sm_launched=launched,
               spill_bytes=spill_bytes(k["sass"]), loop_spill_bytes=spill_bytes(
                   [(0, t) for t in loop]), registers=k.get("regs"))
    if mma:  # issue #34: row-contiguous copies take their rows' offsets with SHFL.IDX; the fp8
        # widening reads 8-byte halves
        cfg["row_contiguous"] = any(re.search(r"\bSHFL\.IDX\b", t) for t in loop)
        cfg["half_widen"] = any(re.search(r"\bLDS\.64\b", t) for t in loop)
    wipb = len(loop) * warps_per_tile / tile_bytes
    ahead = cfg["stages"] - 1 if cfg["stages"] > 1 else 0.5
    in_flight = launched * streams * tile_bytes * ahead
    waves = (decode_mma_wavefronts if mma else decode_split_wavefronts)(T, D, cfg)
    row.update(loop_instructions=len(loop), tile_bytes=tile_bytes,
               warp_instr_per_byte=round(wipb, 4), bytes_in_flight_per_sm=int(in_flight),
               l1_wavefronts_per_byte=round(waves / tile_bytes, 4),
               bound_issue=bound_issue(wipb),
               bound_latency=min(1.0, in_flight / (BYTES_PER_CLK * LATENCY_CLK)),
               bound_l1=bound_l1(waves / tile_bytes))
    return finish(row)


def loop_instructions(instrs, loop_markers):
    """Instructions per warp of a kernel whose loops (given by marker regexes, outermost first,
    with their trip counts) run `trip` times; everything else once."""
    found = []
    for markers, trip, exclude in loop_markers:
        if isinstance(markers, tuple):  # a loop given by its (first, last) address
            found.append((markers, trip))
            continue
        best = None
        for lo, hi in loops(instrs):
            body = [t for a, t in instrs if lo <= a <= hi]
            if all(any(re.search(m, t) for t in body) for m in markers) and \
                    not (exclude and any(re.search(exclude, t) for t in body)):
                if best is None or hi - lo < best[1] - best[0]:
                    best = (lo, hi)
        if best is None:
            return None
        found.append((best, trip))
    total = 0
    for a, _ in instrs:
        mult = 1
        for (lo, hi), trip in found:
            if lo <= a <= hi:
                mult *= trip
        total += mult
    return total


# The eviction case (bench/gpu/eviction.cu's BM_evict at batch 64, 32K tokens before the chunk):
# Llama-3.1-8B (8 KV heads, GQA 4, d 128, bf16), every head compressed to budget 0.25, a 4096-token
# chunk, SnapKV over a 32-query window from the prefill's LSE (the tensor-core scorer).
EVICT = dict(batch=64, heads=8, group=4, window=32, chunk=4096, held=8192, keep=9216, D=128,
             T="bf16")


def snapkv_row(ks, T="bf16", D=128, split=False):
    e = EVICT
    name = f"snapkv_mma_kernel<{T}, {D}, {'true' if split else 'false'}>"
    k = ks.get(name)
    if k is None or not k.get("sass"):
        return None
    sass = k["sass"]
    # Query tiles copied with cp.async a step ahead (one exposed L2 round trip a block; the
    # element-wise split rows are another kernel), or element-wise in the tile loop before its
    # mma (one L2 round trip a tile: the code before issue #34).
    prefetched = any(re.search(r"\bLDGSTS\b", t) for _, t in sass)
    cfg = snapkv_mma_config(D, prefetched)
    es = ELEM[T]
    c = occupancy(k["regs"], cfg["threads"], static_smem(k), 0)
    qr = (8 if split else 16) * cfg["sub_tiles"]  # queries per step
    q_tiles = math.ceil(e["window"] * e["group"] / qr)  # steps
    chunks = D * es // 16
    lpt = min(chunks, cfg["lpt"])
    stage_trip = cfg["keys"] // (cfg["threads"] // lpt)
    staged_in_loop = smallest_loop(sass, r"\bLDG\.E\.128\b") is not None and \
        not any(re.search(r"\bHMMA\b", t) for t in smallest_loop(sass, r"\bLDG\.E\.128\b"))
    # How the K block is staged: per token in a loop (its page-table entry, then its loads, then
    # the store: two round trips a token), or every address first, then every load at once (two
    # round trips a block).
    rounds = 2 * stage_trip if staged_in_loop else 2
    extra = []
    if staged_in_loop:
        extra.append(([r"\bLDG\.E\.128\b"], stage_trip, r"\bHMMA\b"))
    if not prefetched:  # the element-wise query fill inside the tile loop (unrolled twice)
        extra.append(([r"\bLDG\.E\.U16\b"], max(1, qr * (D // 2) // cfg["threads"] // 2),
                      r"\bHMMA\b"))
    # The step loop: one, or (issue #34) an unmasked one for blocks every window row sees whole
    # and a masked one for the last block or two of a head, weighted by the case's blocks.
    step_loops = sorted((hi - lo, lo, hi) for lo, hi in loops(sass)
                        if any(re.search(r"\bHMMA\b", t) for a, t in sass if lo <= a <= hi))
    n = e["held"] + e["chunk"]
    blocks = math.ceil(n / cfg["keys"])
    masked_blocks = sum(1 for b in range(blocks) if b * cfg["keys"] + cfg["keys"] - 1 >
                        e["held"] + e["chunk"] - e["window"])
    instr = 0.0
    for idx, (_, lo, hi) in enumerate(step_loops[:2]):
        share = 1.0 if len(step_loops) == 1 else (
            (blocks - masked_blocks) / blocks if idx == 0 else masked_blocks / blocks)
        cnt = loop_instructions(sass, extra + [((lo, hi), q_tiles, None)] + (
            [((l2, h2), 0, None) for _, l2, h2 in step_loops if (l2, h2) != (lo, hi)]))
        instr += share * cnt
    q_rounds = 1 if prefetched else q_tiles
    bytes_cta = cfg["keys"] * (D * es + 4)  # K rows in, a score out
    t_cta = rounds * LATENCY_CLK + q_rounds * LATENCY_L2_CLK + instr
    q_loop = smallest_loop(sass, r"\bHMMA\b") or []
    instr = int(round(instr))
    k_in_registers = sum(1 for t in q_loop if re.search(r"\bLDSM\b", t)) <= \
        cfg["sub_tiles"] * D // 16
    waves = snapkv_wavefronts(T, D, cfg, q_tiles, k_in_registers, prefetched)
    row = dict(case="snapkv_scorer", kernel=name, ctas_per_sm_planned=c, ctas_per_sm_launched=c,
               spill_bytes=spill_bytes(k["sass"]), registers=k.get("regs"),
               warp_instr_per_byte=round(instr * cfg["warps"] / bytes_cta, 4),
               bytes_in_flight_per_sm=int(c * bytes_cta * LATENCY_CLK / t_cta),  # Little
               l1_wavefronts_per_byte=round(waves / bytes_cta, 4),
               bound_issue=bound_issue(instr * cfg["warps"] / bytes_cta),
               bound_latency=min(1.0, c * bytes_cta / (t_cta * BYTES_PER_CLK)),
               bound_l1=bound_l1(waves / bytes_cta))
    return finish(row)


def compact_row(ks, snap):
    """select_compact_kernel per scan tile of 1024 candidates on each of the head's `splits` CTAs:
    the tile's keys (L2), its survivors' source page-table entries (L2), their bytes (HBM), the
    stores' destination entries (L2); instructions of the tile loop from the SASS."""
    e = EVICT
    T, D = e["T"], e["D"]
    name = f"select_compact_kernel<{T}, {D}>"
    k = ks.get(name)
    if k is None or not k.get("sass"):
        return None
    es = ELEM[T]
    splits = min(16, D * es // 16)
    threads = 256
    c = occupancy(k["regs"], threads, static_smem(k), 0)
    n = e["held"] + e["chunk"]
    moved_per_tile = 1024 * e["keep"] / n
    bytes_tile = moved_per_tile * 2 * (2 * D * es // splits)  # read + write of its byte range
    loop = smallest_loop(k["sass"], r"\bBAR\.SYNC\b", r"\bSTG\.E\.128\b")
    if loop is None:
        return None
    instr = len(loop)
    t_tile = LATENCY_CLK + 3 * LATENCY_L2_CLK + instr
    row = dict(case="compaction", kernel=name, ctas_per_sm_planned=c, ctas_per_sm_launched=c,
               spill_bytes=spill_bytes(k["sass"]), registers=k.get("regs"),
               warp_instr_per_byte=round(instr * threads / 32 / bytes_tile, 4),
               bound_issue=bound_issue(instr * threads / 32 / bytes_tile),
               bound_latency=min(1.0, c * bytes_tile / (t_tile * BYTES_PER_CLK)),
               bound_l1=1.0)
    return finish(row)


def pipeline_row(ks, snap, comp):
    """The eviction launch sequence of the case: reset, the scorer, three histogram passes, the
    compaction. Each kernel's time is its HBM bytes over its modelled fraction of 4.8 TB/s; the
    small kernels (reset, histogram passes) take at least one latency chain per wave of CTAs."""
    if snap is None or comp is None:
        return None
    e = EVICT
    D, es = e["D"], ELEM[e["T"]]
    heads = e["batch"] * e["heads"]
    n = e["held"] + e["chunk"]
    row_kv = 2 * D * es
    snap_bytes = heads * n * (D * es + 4)
    comp_bytes = heads * (2 * e["keep"] * row_kv + 4 * n)
    t = snap_bytes / (snap["modelled_hbm_fraction"] * HBM_BYTES_PER_S)
    t += comp_bytes / (comp["modelled_hbm_fraction"] * HBM_BYTES_PER_S)
    small_bytes = heads * (2048 * 4 + 16)  # the reset: histograms and states
    slices = math.ceil(n / 4096)
    hist = ks.get("select_histogram_kernel<void>(eviction_args")
    c = occupancy(hist["regs"], 256, static_smem(hist), 0) if hist else 4
    for p in range(3):
        pb = heads * n * (8 if p == 0 else 4)  # pass 0 reads scores, writes keys
        small_bytes += pb
        waves = math.ceil(heads * slices / (SMS * c))
        t += max(pb / HBM_BYTES_PER_S,
                 waves * (LATENCY_CLK + 2 * LATENCY_L2_CLK + 2000) / CLOCK_HZ)
    t += max(heads * (2048 * 4 + 16) / HBM_BYTES_PER_S, LATENCY_CLK / CLOCK_HZ)
    total = snap_bytes + comp_bytes + small_bytes
    frac = total / t / HBM_BYTES_PER_S
    return dict(case="eviction_pipeline", kernel="reset, snapkv_mma, 3 x histogram, compaction",
                modelled_hbm_fraction=round(frac, 3),
                bench_metric_fraction=round(heads * n * row_kv / t / HBM_BYTES_PER_S, 3),
                ctas_per_sm_planned=snap["ctas_per_sm_planned"],
                ctas_per_sm_launched=snap["ctas_per_sm_launched"],
                spill_bytes=snap["spill_bytes"] + comp["spill_bytes"],
                modelled_time_us=round(t * 1e6, 1))


def roofline(ks):
    rows = [
        decode_row(ks, "decode_tensor_core", "bf16", 128, 4),
        decode_row(ks, "decode_cuda_core_gqa1", "bf16", 128, 1),
        decode_row(ks, "decode_cuda_core_gqa2", "bf16", 128, 2),
    ]
    snap = snapkv_row(ks)
    comp = compact_row(ks, snap)
    rows += [snap, pipeline_row(ks, snap, comp)]
    extra = [
        decode_row(ks, "decode_tensor_core_fold", "bf16", 128, 4, fold=True),
        decode_row(ks, "decode_cuda_core_gqa1_fold", "bf16", 128, 1, fold=True),
        decode_row(ks, "decode_cuda_core_gqa2_fold", "bf16", 128, 2, fold=True),
        decode_row(ks, "decode_tensor_core_gqa8", "bf16", 128, 8),
        decode_row(ks, "decode_tensor_core_d64", "bf16", 64, 4),
        decode_row(ks, "decode_tensor_core_d256", "bf16", 256, 4),
        decode_row(ks, "decode_tensor_core_fp8_e4m3", "fp8_e4m3", 128, 4),
        decode_row(ks, "decode_cuda_core_gqa4", "bf16", 128, 4, tc=False),
        decode_row(ks, "decode_cuda_core_f32_gqa1", "float", 128, 1),
        decode_row(ks, "decode_tensor_core_stream", "bf16", 128, 4, stream=True),
        decode_row(ks, "decode_cuda_core_gqa1_stream", "bf16", 128, 1, stream=True),
        decode_row(ks, "decode_cuda_core_gqa2_stream", "bf16", 128, 2, stream=True),
        comp,
    ]
    return rows, [r for r in extra if r is not None]


def decode_occupancy(ks, T, D, GB, tc, fold, stream=False):
    """(planned, launched) CTAs per SM: the plan's (decode_device_limits: the lowest of the kernel
    kind's plain and folded-merge variants, each per-head and layer-stream) and the launched
    variant's, from the built resource usage; None if not built."""
    name, mma = decode_kernel_name(T, D, GB, tc, fold, stream)
    k = ks.get(name)
    if k is None or "regs" not in k:
        return None
    cfg = decode_mma_config(T, D) if mma else decode_config(T, D)
    variants = [ks.get(decode_kernel_name(T, D, GB, tc, f, st)[0])
                for f in (False, True) for st in (False, True)]
    if any(v is None or "regs" not in v for v in variants):
        return None
    planned = min(occupancy(v["regs"], cfg["threads"], static_smem(v), cfg["smem"])
                  for v in variants)
    return (planned, occupancy(k["regs"], cfg["threads"], static_smem(k), cfg["smem"]))


def occupancy_checks(ks):
    """Every built decode instance's folded-merge and layer-stream variants against the plan."""
    out = []
    for n in ks.names:
        m = re.match(r"decode_(split|mma)_kernel<(\w+), (\d+), (\d+), (true|false), (true|false)>$",
                     n)
        if m and (m.group(5) == "true" or m.group(6) == "true"):
            o = decode_occupancy(ks, m.group(2), int(m.group(3)), int(m.group(4)),
                                 m.group(1) == "mma", m.group(5) == "true", m.group(6) == "true")
            if o:
                out.append((n, o[0], o[1]))
    return out


def fmt(x):
    return "-" if x is None else (f"{x:.3f}" if isinstance(x, float) else str(x))


def limiting(r):
    """The bound that limits a case: the smallest below 1, or "none" (all at 1)."""
    if "bound_issue" not in r:
        return "-"
    b = min(("issue", r["bound_issue"]), ("latency", r["bound_latency"]), ("L1", r["bound_l1"]),
            key=lambda kv: kv[1])
    return b[0] if b[1] < 1 else "none"


def markdown(ks, rows, extra, header):
    print(header + "\n")
    cols = ["case (bound)", "kernel", "modelled fraction of HBM", "limited by", "issue", "latency",
            "L1", "warp instr / B", "bytes in flight / SM", "L1 wavefronts / B",
            "CTAs/SM planned", "launched", "spill B"]
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for r in rows + extra:
        if r is None:
            continue
        case = r["case"] + (f" (>= {BOUNDS[r['case']]})" if r["case"] in BOUNDS else "")
        print("| " + " | ".join([
            case, f"`{r['kernel']}`", fmt(r["modelled_hbm_fraction"]), limiting(r),
            fmt(r.get("bound_issue")), fmt(r.get("bound_latency")), fmt(r.get("bound_l1")),
            fmt(r.get("warp_instr_per_byte")), fmt(r.get("bytes_in_flight_per_sm")),
            fmt(r.get("l1_wavefronts_per_byte")), fmt(r["ctas_per_sm_planned"]),
            fmt(r["ctas_per_sm_launched"]), fmt(r["spill_bytes"])]) + " |")
    for r in rows:
        if r is not None and r["case"] == "eviction_pipeline":
            print(f"\n(eviction_pipeline: {r['modelled_time_us']} us modelled for the launch "
                  f"sequence; by the benchmark's metric, candidates' K+V bytes per second, "
                  f"{r['bench_metric_fraction']:.3f} of 4.8 TB/s.)")
    print("\n| kernel | registers | spill st (B) | stack (B) | static smem (B) | dynamic smem (B) | "
          "SASS per tile loop | KV bytes per tile | SASS instr per KV byte | warp instr per KV byte |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for n in ks.names:
        k = ks.get(n)
        dyn = loop = kvb = per = wper = "-"
        m = re.match(r"decode_(split|mma)_kernel<(\w+), (\d+), (\d+), (?:true|false), "
                     r"(?:true|false)>$", n)
        if m and k.get("sass"):
            T, D = m.group(2), int(m.group(3))
            mma = m.group(1) == "mma"
            cfg = decode_mma_config(T, D) if mma else decode_config(T, D)
            body = smallest_loop(k["sass"], r"\bLDGSTS\b", r"\bHMMA\b" if mma else r"\bBAR\.SYNC\b")
            dyn, kvb = str(cfg["smem"]), str(cfg["tile_bytes"])
            if body:
                l = len(body)
                loop, per = str(l), f"{l / cfg['tile_bytes']:.3f}"
                wper = f"{(1 if mma else 4) * l / cfg['tile_bytes']:.3f}"
            else:
                loop = per = wper = "n/a"
        print(f"| `{n}` | {k.get('regs', '?')} | {spill_bytes(k.get('sass', []))} | "
              f"{k.get('stack', '?')} | {static_smem(k)} | {dyn} | {loop} | {kvb} | {per} | {wper} |")


def check(rows, extra, occ):
    failures = []
    for r in extra:  # other variants: none may spill in its steady-state loop or lose occupancy
        if r.get("loop_spill_bytes", 0) > 0:
            failures.append(f"{r['case']}: {r['loop_spill_bytes']} bytes of spill stores in its "
                            f"loop ({r['kernel']})")
    for r in rows:
        if r is None:
            failures.append("a roofline case could not be modelled (kernel or its loop not found)")
            continue
        bound = BOUNDS.get(r["case"])
        if bound is not None and r["modelled_hbm_fraction"] < bound:
            failures.append(f"{r['case']}: modelled fraction {r['modelled_hbm_fraction']:.3f} "
                            f"below {bound} ({r['kernel']})")
        if r["spill_bytes"] > 0:
            failures.append(f"{r['case']}: {r['spill_bytes']} bytes of spill stores ({r['kernel']})")
        if r["ctas_per_sm_launched"] < r["ctas_per_sm_planned"]:
            failures.append(f"{r['case']}: {r['ctas_per_sm_launched']} CTAs per SM launched, "
                            f"{r['ctas_per_sm_planned']} planned ({r['kernel']})")
    for n, planned, launched in occ:
        if launched < planned:
            failures.append(f"{n}: {launched} CTAs per SM launched, {planned} planned "
                            "(decode_device_limits plans with the lowest of the variants)")
    return failures


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("work", help="directory of <file>.res and <file>.sass")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--header", default="")
    args = ap.parse_args()
    ks = Kernels(args.work)
    if not ks.names:
        print("kernel_stats: no kernels found in the SASS dumps", file=sys.stderr)
        return 2
    rows, extra = roofline(ks)
    occ = occupancy_checks(ks)
    if args.json:
        print(json.dumps({"roofline": [r for r in rows if r is not None] + extra,
                          "occupancy": [{"kernel": n, "ctas_per_sm_planned": p,
                                         "ctas_per_sm_launched": l} for n, p, l in occ]},
                         indent=1))
    elif not args.check:
        markdown(ks, rows, extra, args.header)
    if args.check:
        failures = check(rows, extra, occ)
        for f in failures:
            print("kernel_stats --check: FAIL " + f, file=sys.stderr)
        if not failures:
            print("kernel_stats --check: every roofline case at or above its bound, no spills, "
                  f"launched CTAs per SM >= planned for {len(occ)} folded-merge and layer-stream "
                  "variants",
                  file=sys.stderr)
        return 1 if failures else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
