#!/usr/bin/env python3
"""Time model of kvmm's decode attention on an H100 (and H200): predicted, never measured.

T = max(T_issue, T_dram) per launch, with
  T_issue = main-loop warp-instructions per 4 KiB of K+V (the SASS census, census.py,
            sm_90, bf16, D 128, the no-soft-cap path the benchmarks run)
            x (KV bytes / 4096) / (eta x R),
            R = 132 SMs x 4 schedulers x 1.98 GHz warp-instructions/s,
            eta = eta0 x min(1, CTAs / (CTAs per SM x 132)): the grid's fill of the
            machine (CTAs per SM from the census's registers and shared memory), times
            eta0, the fraction of issue slots a full machine of these warps achieves;
  T_dram  = KV bytes (each byte once per kv head: the emulator's traffic test) / the
            device copy rate measured in the same run (copy_GBps: bytes read + written
            per second, i.e. the DRAM rate a read-only kernel can reach).
eta0 is the one fitted constant (least squares on log time over the checked rows).
--check: every one of the 16 decode rows of the issue (paged at 16-token pages and
contiguous; batch 1 ctx 32k, batch 16 ctx 4k/32k, batch 64 ctx 1k/4k/32k, batch 256
ctx 1k/4k) within +-15%. --table prints the comparison as markdown.

Prefill (the G = 8 kernel, paged, 16-token pages, one request of `chunk` new tokens at
the end of a `ctx`-token context: the bench's prefill_paged rows): the same issue bound,
T_issue = sum over live CTAs of ceil(keys / 32) x 4 warps x the G8 loop's census count
/ (eta_p x R). A CTA holds 8 / group = 2 rows of the chunk (rows i, i+1) and walks the
union of their causal ranges, ctx - chunk + i + 2 keys, 32 per iteration (8 teams x 4
tokens). eta_p is fitted separately (one constant over the measured prefill rows:
the G = 8 loop runs 2 CTAs per SM, 8 warps, so its issue efficiency is its own); every
measured prefill row must be within +-15% too. --check also holds issue 37's acceptance
line: the tensor-core prefill with the split P (within 4 units of roundoff) predicted at
>= 250 TFLOP/s on chunk 2048 / ctx 8192 (tc_prefill_acceptance).

--measured-tc: GPU runs' rows of the tensor-core decode (docs/results/kernels-h200*.md):
its occupancy/latency and read-pattern limits, two hypotheses fitted on the first run's
16 rows (tc_gpu_table), every other row (other shapes, other runs) predicted beside its
measurement; --check then also asks the 16 fitted rows within +-15% under both.

  python3 bench/kernels/model.py --census kernels_census.json --measured bench.txt [--measured-tc gpu.txt ...]
      [--check] [--table]
"""
import argparse
import json
import math
import re
import sys

SMS, SCHEDULERS, CLOCK = 132, 4, 1.98e9
R = SMS * SCHEDULERS * CLOCK
REGS_PER_SM, SMEM_PER_SM, MAX_CTAS_PER_SM, THREADS = 65536, 228 * 1024, 32, 128
KV_HEADS, HEAD_DIM, ELEM = 8, 128, 2  # the bench's Llama-3-8B shapes
# The tensor-core decode's sector-map offsets after its ring (16 B x 128 threads): the instances
# that copy by it (every swapped one; tc_sector_map in tc_decode_common.cuh).
TC_SECT_SMEM = 16 * THREADS
CHECKED = {(1, 32768), (16, 4096), (16, 32768), (64, 1024), (64, 4096), (64, 32768), (256, 1024), (256, 4096)}


def kernel_facts(census, addr):
    key = f"sm_90 attention<BFloat,D128,G4,{addr}> nocap"
    k = census[key]
    regs, smem = k["res"]["regs"], k["res"]["smem"]
    per_sm = min(REGS_PER_SM // (regs * THREADS), SMEM_PER_SM // max(smem, 1), MAX_CTAS_PER_SM)
    # One warp-iteration of the main loop streams 32 lanes x 8 loads x 16 B = 4 KiB of K+V.
    bytes_per_iter = k["loop"]["LDG.128"] * 16 * 32
    return dict(loop=k["loop"]["instrs"], bytes_per_iter=bytes_per_iter, ctas_per_sm=per_sm, key=key)


def measured_rows(path):
    txt = open(path).read()
    copy = re.search(r"copy_GBps=([\d.]+)k", txt)
    copy = float(copy.group(1)) * 1e12 if copy else 3.0e12
    rows = []
    for m in re.finditer(r"^(decode_paged|decode_contiguous)/batch:(\d+)/ctx:(\d+)(?:/tpp:(\d+))?/manual_time\s+([\d.]+) us"
                         r".*?splits=(\d+)", txt, re.M):
        kind, b, ctx, tpp, us, splits = m.groups()
        if kind == "decode_paged" and tpp != "16":
            continue
        rows.append(dict(addr="PagedAddr" if kind == "decode_paged" else "ContiguousAddr", batch=int(b), ctx=int(ctx),
                         us=float(us), splits=int(splits)))
    return rows, copy


def prefill_facts(census):
    k = census["sm_90 attention<BFloat,D128,G8,PagedAddr> nocap"]
    regs, smem = k["res"]["regs"], k["res"]["smem"]
    per_sm = min(REGS_PER_SM // (regs * THREADS), SMEM_PER_SM // max(smem, 1), MAX_CTAS_PER_SM)
    return dict(loop=k["loop"]["instrs"], ctas_per_sm=per_sm)


def measured_prefill(path):
    txt = open(path).read()
    return [dict(chunk=int(c), ctx=int(x), us=float(us))
            for c, x, us in re.findall(r"^prefill_paged/chunk:(\d+)/ctx:(\d+)/manual_time\s+([\d.]+) us", txt, re.M)]


PREFILL_GROUP, PREFILL_ROWS_PER_CTA, PREFILL_TOKENS_PER_ITER, WARPS = 4, 2, 32, 4


def predict_prefill(row, pf, eta):
    """Issue-bound time (us) of the bench's prefill_paged shape, warp-instructions, CTAs."""
    chunk, ctx = row["chunk"], row["ctx"]
    instrs, ctas = 0, 0
    for i in range(0, chunk, PREFILL_ROWS_PER_CTA):
        keys = ctx - chunk + i + min(PREFILL_ROWS_PER_CTA, chunk - i)
        instrs += -(-keys // PREFILL_TOKENS_PER_ITER) * WARPS * pf["loop"] * KV_HEADS
        ctas += KV_HEADS
    fill = min(1.0, ctas / (pf["ctas_per_sm"] * SMS))
    return instrs / (eta * fill * R) * 1e6, instrs, ctas


def prefill_table(rows, pf, tolerance):
    """(markdown lines, failures, eta_p) of the prefill rows."""
    if not rows:
        return [], ["no prefill_paged rows"], 0.0
    eta = math.exp(sum(math.log(predict_prefill(r, pf, 1.0)[0] / r["us"]) for r in rows) / len(rows))
    lines = [f"Predicted H100 prefill times (model: bench/kernels/model.py; G = 8 paged loop {pf['loop']} "
             f"warp-instructions per warp-iteration of 8 tokens x K+V of one kv head; {pf['ctas_per_sm']} CTAs/SM; "
             f"eta_p = {eta:.3f} fitted on the {len(rows)} rows)",
             "",
             "| chunk | ctx | CTAs | warp-instructions | predicted us | measured us | predicted/measured | "
             "predicted TFLOP/s |",
             "|---|---|---|---|---|---|---|---|"]
    bad = []
    for r in rows:
        us, instrs, ctas = predict_prefill(r, pf, eta)
        keys = r["chunk"] * (r["ctx"] - r["chunk"]) + r["chunk"] * (r["chunk"] + 1) / 2
        tflops = 4.0 * keys * 32 * HEAD_DIM / (us * 1e-6) / 1e12
        ratio = us / r["us"]
        lines.append(f"| {r['chunk']} | {r['ctx']} | {ctas} | {instrs:.3g} | {us:.0f} | {r['us']:.0f} | {ratio:.2f} | "
                     f"{tflops:.1f} |")
        if abs(ratio - 1) > tolerance:
            bad.append(f"prefill chunk {r['chunk']} ctx {r['ctx']}: predicted {us:.0f} us, measured {r['us']:.0f} us")
    return lines, bad, eta


def tc_facts(census, addr):
    """The tensor-core decode (tc_decode.cuh) from its census: loop warp-instructions per
    warp-iteration (LDGSTS.128 x 16 B x 32 lanes of K+V of one kv head). The form the
    launcher runs at the bench's group of 4: swapped operands, 32-token warp tiles, 2 stages
    (its loop unrolled twice: 64 tokens per census span)."""
    k = census[f"sm_90 tc_decode<BFloat,D128,{addr},tile,swap,T32> nocap"]  # 16-token pages: one entry per sub-tile
    regs = k["res"]["regs"]
    # the ring (4 warps x 2 stages x K+V x 32 rows; Q in registers), dynamic, the sector map's
    # offsets (TC_SECT_SMEM), + the system reserve
    smem = 4 * 2 * 2 * 32 * HEAD_DIM * 2 + TC_SECT_SMEM + 1024
    per_sm = min(REGS_PER_SM // (regs * THREADS), SMEM_PER_SM // smem, MAX_CTAS_PER_SM)
    return dict(loop=k["loop"]["instrs"], bytes_per_iter=k["loop"]["LDGSTS.128"] * 16 * 32, ctas_per_sm=per_sm, regs=regs)


def tc_table(rows, census, copy, eta0):
    """Predicted times of the tensor-core decode on the checked shapes: the same issue
    bound, with eta = eta0 x min(1, warps per scheduler / 4) x the grid's fill (eta0 was
    fitted at 4 warps per scheduler; fewer resident warps hide less latency: an assumption,
    which only a GPU run can replace)."""
    facts = {a: tc_facts(census, a) for a in ("TcPagedAddr", "ContiguousAddr")}
    lines = [f"Predicted H100 times of the tensor-core decode (model, not measured; loop "
             f"{facts['TcPagedAddr']['loop']} paged / {facts['ContiguousAddr']['loop']} contiguous warp-instructions per "
             f"{facts['TcPagedAddr']['bytes_per_iter']} B of K+V = "
             f"{facts['TcPagedAddr']['loop'] / facts['TcPagedAddr']['bytes_per_iter']:.3f} / "
             f"{facts['ContiguousAddr']['loop'] / facts['ContiguousAddr']['bytes_per_iter']:.3f} per byte; "
             f"{facts['TcPagedAddr']['regs']} registers, {facts['TcPagedAddr']['ctas_per_sm']} CTAs/SM)",
             "",
             "| kernel | batch | ctx | splits | CTAs | eta | issue us / DRAM us | predicted us | "
             "old kernel measured us | predicted fraction of copy |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    out = {}
    for r in sorted(rows, key=lambda r: (r["addr"] != "PagedAddr", r["batch"], r["ctx"])):
        addr = "TcPagedAddr" if r["addr"] == "PagedAddr" else "ContiguousAddr"
        f = facts[addr]
        kv_bytes = r["batch"] * r["ctx"] * KV_HEADS * HEAD_DIM * ELEM * 2
        ctas = r["batch"] * KV_HEADS * r["splits"]
        eta = eta0 * min(1.0, f["ctas_per_sm"] / 4) * min(1.0, ctas / (f["ctas_per_sm"] * SMS))
        t_issue, t_dram = f["loop"] * kv_bytes / f["bytes_per_iter"] / (eta * R), kv_bytes / copy
        us = max(t_issue, t_dram) * 1e6
        frac = kv_bytes / (us * 1e-6) / copy
        out[(addr, r["batch"], r["ctx"])] = us
        name = "tc paged tpp 16" if addr == "TcPagedAddr" else "tc contiguous"
        lines.append(f"| {name} | {r['batch']} | {r['ctx']} | {r['splits']} | {ctas} | {eta:.2f} | "
                     f"{t_issue / t_dram:.2f} | {us:.0f} | {r['us']:.0f} | {frac:.2f} |")
    return lines, out


# The tensor-core prefill (tc_prefill.cuh, issue 37): 64-row Q tiles (16 tokens x the 4 q
# heads of a Llama group), 4 warps of 16 rows, 64-token KV tiles (x 2 for the rows and
# tokens at 2 m-tiles per warp). HMMA_CYCLES: issue
# interval of one mma.sync.m16n8k16 per scheduler on an H100 -- an assumption (2/3 of the
# 1,024 dense FLOP/clk of a Hopper tensor core for the legacy mma path, as published
# microbenchmarks report), never measured here; only a GPU run replaces it.
PF_TOKENS, PF_ROWS_PER_WARP, PF_TILE, HMMA_CYCLES = 16, 16, 64, 6
PF_ROWS = 64


def tc_prefill_facts(census, variant, mt=1):
    """Loop warp-instructions and HMMA per 64-token KV tile and warp (16-token pages: the
    `row` instance), registers and CTAs per SM of the tensor-core prefill: `loop` counts the
    whole loop (a boundary tile's path: the element-mask block and O's rescale included),
    `inner` the interior-tile path (census_interior.cu: the mask block and the rescale
    compiled out, the steady state of the lazy rescale, where no row's maximum passes its
    reference by more than kPfLazy; the whole loop if that census is absent)."""
    name = f"sm_90 tc_prefill<BFloat,D128,TcPagedAddr,row,{variant}{',M' + str(mt) if mt > 1 else ''}>"
    k = census[f"{name} nocap"]
    inner = census.get(f"{name} interior", k)
    regs = k["res"]["regs"]
    rows = PF_ROWS * mt  # the Q tile; at 2 m-tiles per warp it sits in shared memory
    smem = 2 * 2 * PF_TILE * HEAD_DIM * 2 + (rows * HEAD_DIM * 2 if mt > 1 else 0) + 4 * PF_TILE * 9 + 64 + 8 * rows + 40
    per_sm = min(REGS_PER_SM // (regs * THREADS), SMEM_PER_SM // (smem + 1024), MAX_CTAS_PER_SM)  # + the system reserve
    return dict(loop=k["loop"]["instrs"], inner=inner["loop"]["instrs"], hmma=k["loop"]["HMMA"],
                hmma_inner=inner["loop"]["HMMA"], ctas_per_sm=per_sm,
                regs=regs, stack=k["res"]["stack"], mt=mt)


def predict_tc_prefill(row, f, eta):
    """(us, warp-tiles, CTAs, issue us, tensor us) of the bench's prefill_paged shape: every
    warp walks the KV tiles up to its last row's causal end (tile skipping); tiles below its
    first row's end are interior (no element masked: f["inner"] instructions), the rest
    boundary tiles (f["loop"]), and so is each warp's first tile (no reference maximum yet:
    the rare path); T = max(issue at eta, the tensor pipe at HMMA_CYCLES per
    HMMA) over the machine's schedulers."""
    chunk, ctx = row["chunk"], row["ctx"]
    warp_tiles, boundary, ctas = 0, 0, 0
    tokens_per_warp = PF_ROWS_PER_WARP * f["mt"] // PREFILL_GROUP
    q_tokens = PF_TOKENS * f["mt"]
    for t0 in range(0, chunk, q_tokens):
        ntok = min(q_tokens, chunk - t0)
        for w in range(WARPS):
            last = min(ntok, (w + 1) * tokens_per_warp) - 1
            if last < w * tokens_per_warp:
                continue  # a warp without rows skips every tile
            tiles = -(-(ctx - chunk + t0 + last + 1) // PF_TILE)
            warp_tiles += tiles
            edge = tiles - (ctx - chunk + t0 + w * tokens_per_warp + 1) // PF_TILE
            # + the warp's first tile when it is interior: its rows start with no reference
            # maximum, so it takes the rare path (S twice, the maxima) like a boundary tile
            boundary += edge + (1 if tiles > edge else 0)
        ctas += 1
    warp_tiles *= KV_HEADS
    boundary *= KV_HEADS
    ctas *= KV_HEADS
    fill = min(1.0, ctas / (f["ctas_per_sm"] * SMS))
    t_issue = ((warp_tiles - boundary) * f["inner"] + boundary * f["loop"]) / (eta * fill * R)
    t_tensor = ((warp_tiles - boundary) * f["hmma_inner"] + boundary * f["hmma"]) * HMMA_CYCLES / (
        fill * SMS * SCHEDULERS * CLOCK)
    return max(t_issue, t_tensor) * 1e6, warp_tiles, ctas, t_issue * 1e6, t_tensor * 1e6


def tc_prefill_table(rows, census, eta_p, eta0):
    """Predicted times of the tensor-core prefill on the measured prefill shapes, at eta_p
    (fitted on today's prefill kernel, which runs the same 2 CTAs = 8 warps per SM) and,
    for sensitivity, at eta0 (fitted on the decode rows, 4 warps per scheduler)."""
    lines = []
    for variant, mt in (("splitP", 1), ("P", 1), ("splitP", 2), ("P", 2)):
        key = f"sm_90 tc_prefill<BFloat,D128,TcPagedAddr,row,{variant}{',M' + str(mt) if mt > 1 else ''}> nocap"
        if key not in census:
            continue
        f = tc_prefill_facts(census, variant, mt)
        spill = f"; {f['stack']} B stack frame: spills, not launched" if f["stack"] else ""
        spill += "; ptxas -O1 (TcPrefillRows::k32)" if mt > 1 else ""
        lines += [f"Predicted H100 times of the tensor-core prefill, {variant}, {16 * mt} rows per warp{spill} "
                  f"(model, not measured; loop {f['inner']} "
                  f"warp-instructions on interior tiles, {f['loop']} on boundary tiles, with {f['hmma_inner']} HMMA per "
                  f"64-token KV tile and warp ({f['hmma']} on boundary tiles); {f['regs']} registers, "
                  f"{f['ctas_per_sm']} CTAs/SM; HMMA every {HMMA_CYCLES} cycles per scheduler, assumed)",
                  "",
                  "| chunk | ctx | CTAs | warp-tiles | issue us at eta_p / tensor us | predicted us (eta_p) | "
                  "predicted TFLOP/s (eta_p) | TFLOP/s at eta0 | old kernel measured us |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            us, tiles, ctas, t_issue, t_tensor = predict_tc_prefill(r, f, eta_p)
            us0 = predict_tc_prefill(r, f, eta0)[0]
            flop = 4.0 * (r["chunk"] * (r["ctx"] - r["chunk"]) + r["chunk"] * (r["chunk"] + 1) / 2) * 32 * HEAD_DIM
            lines.append(f"| {r['chunk']} | {r['ctx']} | {ctas} | {tiles} | {t_issue:.0f} / {t_tensor:.0f} | {us:.0f} | "
                         f"{flop / (us * 1e-6) / 1e12:.0f} | {flop / (us0 * 1e-6) / 1e12:.0f} | {r['us']:.0f} |")
        lines.append("")
    return lines


def tc_prefill_acceptance(census, eta_p, target=250.0):
    """Issue 37's acceptance: a tensor-core prefill instance within 4 units of roundoff of the
    references (the split P; one rounded P is not) is predicted at >= `target` TFLOP/s on
    the bench's chunk-2048 / ctx-8192 shape at eta_p. Returns (a line, failures)."""
    best = None
    for mt in (1, 2):
        key = f"sm_90 tc_prefill<BFloat,D128,TcPagedAddr,row,splitP{',M' + str(mt) if mt > 1 else ''}> nocap"
        if key not in census:
            continue
        row = dict(chunk=2048, ctx=8192)
        us = predict_tc_prefill(row, tc_prefill_facts(census, "splitP", mt), eta_p)[0]
        flop = 4.0 * (row["chunk"] * (row["ctx"] - row["chunk"]) + row["chunk"] * (row["chunk"] + 1) / 2) * 32 * HEAD_DIM
        tflops = flop / (us * 1e-6) / 1e12
        if best is None or tflops > best[0]:
            best = (tflops, 16 * mt)
    if best is None:
        return "", ["no split-P tensor-core prefill in the census: issue 37's predicted 250 TFLOP/s is unchecked"]
    line = (f"tensor-core prefill, split P, chunk 2048 / ctx 8192: predicted {best[0]:.0f} TFLOP/s at {best[1]} rows "
            f"per warp (issue 37: >= {target:.0f})")
    return line, ([] if best[0] >= target else [f"{line}: below the target"])


def predict(row, facts, copy, eta0, issue_only=False):
    f = facts[row["addr"]]
    kv_bytes = row["batch"] * row["ctx"] * KV_HEADS * HEAD_DIM * ELEM * 2
    ctas = row["batch"] * KV_HEADS * row["splits"]
    fill = min(1.0, ctas / (f["ctas_per_sm"] * SMS))
    t_issue = f["loop"] * kv_bytes / f["bytes_per_iter"] / (eta0 * fill * R)
    t_dram = kv_bytes / copy  # copy_GBps counts bytes read + written: the DRAM rate
    return (t_issue if issue_only else max(t_issue, t_dram)) * 1e6, ctas, eta0 * fill, kv_bytes


def fit_eta0(rows, facts, copy):
    # T_issue is proportional to 1/eta0: the least-squares eta0 on log time is closed form
    # when every row is issue-bound (checked after the fit).
    logs = [math.log(predict(r, facts, copy, 1.0, issue_only=True)[0] / r["us"]) for r in rows]
    eta0 = math.exp(sum(logs) / len(logs))
    for r in rows:
        us, _, eta, kv_bytes = predict(r, facts, copy, eta0)
        if kv_bytes / copy * 1e6 >= us:
            sys.exit(f"model: b{r['batch']} ctx{r['ctx']} is DRAM-bound at the fitted eta0: the closed-form fit is invalid")
    return eta0


# The tensor-core decode on a GPU (issue 36; first measured on an H200, 2026-11-28,
# docs/results/kernels-h200-2026-11-28.txt): 0.62-0.66 of copy where the issue bound above
# predicts 1.00, with ONE CTA (4 warps) resident per SM (ncu: 6.25% warps active). Two limits
# the issue bound leaves out, per launch, wave by wave (CTAs per SM from registers and the
# ring's shared memory):
#   occupancy / latency: a warp's cp.async ring keeps about (stages - 1/2) tiles in flight
#     (stages - 1 ahead while it computes, one more while it waits), so an SM holding n
#     warps reads at most n x in-flight / L bytes per second (Little's law, L the loaded
#     latency of a K/V read);
#   pattern: the DRAM reaches e x copy for this kernel's reads; e = 1 for reads that come
#     in runs of at least TC_RUN_FULL contiguous bytes from one SM at a time.
# Plus T0 per launch (the launch, the first and last CTAs' fixed latency), twice with a
# separate merge launch (splits > 1, no in-kernel merge). Two hypotheses fit the same rows:
#   H1 (occupancy): e = 1, L fitted;  H2 (pattern): L = TC_L_PHYS (assumed), e fitted.
# Both are fitted on the 16 checked shapes of decode_paged_tc and decode_contiguous_tc (T0
# with them); every other row is a prediction, checked against a measurement where a GPU
# run has one. The pattern of a row is its run: the contiguous bytes of K (or V) one SM
# reads together. Token-major pages (NHD: [token][kv head][dim]) give a CTA of one kv head
# 256 B of every 2 KiB token row (the row's other heads read by other CTAs, on other SMs,
# at unrelated times): run 256. H2 as first written also let the heads-first grid order
# (_hf: a request's kv-head CTAs adjacent in launch order) restore e = 1; the second H200
# run measured _hf at 0.62-0.64, so H2 now charges e to every run under TC_RUN_FULL and
# restores it only where one SM reads whole runs: head-major pages (_hnd: a kv head's page
# tile of 16 tokens is 4 KiB in one piece), one kv head (_kv1: 256-B token rows back to
# back), heads across a CTA's warps (_hw: four adjacent heads' 1 KiB of each row). That
# rule (e = 1 at runs >= 1 KiB) is an assumption, not a result: the next GPU run of
# scripts/gpu_kernels.sh limiter tests it.
TC_L_PHYS = 0.8e-6  # loaded K/V read latency under H2: assumed (H200 ~4.8 TB/s x 0.8 us ~ 3.8 MB in flight)
TC_RUN_FULL = 1024  # H2: runs of at least this many bytes read by one SM reach e = 1 (assumed)
TC_ROW = KV_HEADS * HEAD_DIM * ELEM  # bytes of one token row of one layer's K (all kv heads)
TC_HEAD_ROW = HEAD_DIM * ELEM  # one kv head's part of it
# bench row -> (census instance (hw: of tc_decode_hw, heads across warps), stages, tokens per
# warp tile, run bytes, kv heads, heads per CTA)
TC_BENCH = {
    "decode_paged_tc": ("TcPagedAddr,tile,swap,T32", 2, 32, TC_HEAD_ROW, KV_HEADS, 1),
    "decode_paged_tcm": ("TcPagedAddr,tile,swap,T32", 2, 32, TC_HEAD_ROW, KV_HEADS, 1),
    "decode_contiguous_tc": ("ContiguousAddr,tile,swap,T32", 2, 32, TC_HEAD_ROW, KV_HEADS, 1),
    "decode_paged_tc3": ("TcPagedAddr,tile,S3,swap", 3, 16, TC_HEAD_ROW, KV_HEADS, 1),
    "decode_paged_tc4": ("TcPagedAddr,tile,S4,swap", 4, 16, TC_HEAD_ROW, KV_HEADS, 1),
    "decode_paged_tc_t16": ("TcPagedAddr,tile,swap", 2, 16, TC_HEAD_ROW, KV_HEADS, 1),
    "decode_paged_tc_hf": ("TcPagedAddr,tile,swap,T32", 2, 32, TC_HEAD_ROW, KV_HEADS, 1),
    "decode_paged_tc_t16hf": ("TcPagedAddr,tile,swap", 2, 16, TC_HEAD_ROW, KV_HEADS, 1),
    "decode_paged_tc_hnd": ("TcPagedAddr,tile,swap,T32", 2, 32, 16 * TC_HEAD_ROW, KV_HEADS, 1),
    "decode_contiguous_tc_hnd": ("ContiguousAddr,tile,swap,T32", 2, 32, 32 * TC_HEAD_ROW, KV_HEADS, 1),
    "decode_paged_tc_kv1": ("TcPagedAddr,tile,swap,T32", 2, 32, 16 * TC_HEAD_ROW, 1, 1),
    "decode_paged_tc_hw": ("hw:TcPagedAddr,tile,T32", 2, 32, 4 * TC_HEAD_ROW, KV_HEADS, 4),
    "decode_contiguous_tc_hw": ("hw:ContiguousAddr,tile,T32", 2, 32, 4 * TC_HEAD_ROW, KV_HEADS, 4),
}
TC_FIT = ("decode_paged_tc", "decode_contiguous_tc")
TC_NEW = ("decode_paged_tc_t16", "decode_paged_tc_hf", "decode_paged_tc_t16hf", "decode_paged_tc_hnd",
          "decode_contiguous_tc_hnd", "decode_paged_tc_kv1", "decode_paged_tc_hw", "decode_contiguous_tc_hw")


def tc_shape_facts(census, name):
    """Per bench row: loop instructions per K/V byte (the no-soft-cap census where it exists,
    else the shipped instance), CTAs per SM, bytes in flight per warp."""
    inst, stages, tile, run, kv_heads, heads = TC_BENCH[name]
    key = (f"sm_90 tc_decode_hw<BFloat,D128,{inst[3:]}>" if inst.startswith("hw:")
           else f"sm_90 tc_decode<BFloat,D128,{inst}>")
    k = census.get(key + " nocap") or census.get(key)
    if k is None:
        return None
    # the ring (4 warps, K and V), the sector map's offsets, the system reserve
    smem = 4 * stages * 2 * tile * HEAD_DIM * ELEM + TC_SECT_SMEM + 1024
    per_sm = min(REGS_PER_SM // (k["res"]["regs"] * THREADS), SMEM_PER_SM // smem, MAX_CTAS_PER_SM)
    tile_bytes = tile * HEAD_DIM * ELEM * 2  # K and V of one kv head
    return dict(per_byte=k["loop"]["instrs"] / (k["loop"]["LDGSTS.128"] * 16 * 32), per_sm=per_sm, smem=smem,
                inflight=(stages - 0.5) * tile_bytes, run=run, kv_heads=kv_heads, heads=heads, stages=stages,
                tile=tile)


def tc_rows(paths):
    """Measured tensor-core decode rows of GPU runs' bench_kernels output (16-token pages),
    and the first run's copy rate (the fit's). The fit's rows (TC_FIT) come from the first
    run; any other row from the last run that has it (the newest build of that kernel)."""
    rows, copy = {}, None
    for i, path in enumerate(paths):
        txt = open(path).read()
        m = re.search(r"copy_GBps=([\d.]+)k", txt)
        if i == 0 and m:
            copy = float(m.group(1)) * 1e12
        for m in re.finditer(
                r"^(decode_\w+?)/batch:(\d+)/ctx:(\d+)(?:/tpp:(\d+))?/manual_time\s+([\d.]+) us.*?splits=(\d+)",
                txt, re.M):
            name, b, ctx, tpp, us, splits = m.groups()
            if name in TC_BENCH and tpp in (None, "16") and (i == 0 or name not in TC_FIT):
                rows[(name, int(b), int(ctx))] = dict(name=name, batch=int(b), ctx=int(ctx), us=float(us),
                                                      splits=int(splits), run=i)
    return list(rows.values()), copy


def tc_splits(batch, ctx, cta_heads, sms=SMS, waves=2, min_keys=256):
    """The launchers' split count (choose_num_splits, src/kernels/check.cpp; heads across warps
    through tc_choose_num_splits: one CTA per 4 kv heads) at the bench's group of 4."""
    ctas, target = batch * cta_heads, sms * waves
    if ctas >= target:
        return 1
    return max(1, min(-(-target // ctas), max(1, ctx // min_keys), 1024))


def tc_kv_bytes(row, f):
    return row["batch"] * row["ctx"] * f["kv_heads"] * HEAD_DIM * ELEM * 2


def tc_predict(row, f, copy, lat, e, t0, by_run=False):
    """(us, waves) of one launch: waves of CTAs (per_sm x SMS at a time), each at the rate
    min(issue, in-flight / lat per warp, e x copy for the machine), plus t0 per launch.
    by_run: e applies only to runs under TC_RUN_FULL (H2)."""
    kv_bytes = tc_kv_bytes(row, f)
    ctas = row["batch"] * -(-f["kv_heads"] // f["heads"]) * row["splits"]
    per_cta = kv_bytes / ctas
    slots = f["per_sm"] * SMS
    eff = 1.0 if (by_run and f["run"] >= TC_RUN_FULL) else e
    issue_sm = SCHEDULERS * CLOCK / f["per_byte"]  # one warp-instruction per scheduler-cycle at most
    t, left, waves = t0 * (2 if row["splits"] > 1 and row["name"] != "decode_paged_tcm" else 1), ctas, 0
    while left > 0:
        n = min(left, slots)
        per_sm = n / SMS  # CTAs per SM in this wave (the tail wave: fewer)
        sm_rate = min(per_sm * 4 * f["inflight"] / lat, issue_sm * min(1.0, per_sm * 4 / SCHEDULERS))
        t += n * per_cta / min(SMS * sm_rate, eff * copy)
        left -= n
        waves += 1
    return t * 1e6, waves


def tc_fit(rows, facts, copy, free):
    """Least squares on log time over the fit rows: free = 'L' (H1: e = 1) or 'e' (H2: L =
    TC_L_PHYS), with T0; a grid search (two parameters, smooth, bounded)."""
    best = None
    for i in range(0, 121):
        x = (0.2e-6 * 1.04 ** i) if free == "L" else 0.40 + 0.005 * i
        if free == "e" and x > 1.0:
            break
        for t0 in [0.5e-6 * j for j in range(0, 41)]:
            lat, e = (x, 1.0) if free == "L" else (TC_L_PHYS, x)
            err = sum(math.log(tc_predict(r, facts[r["name"]], copy, lat, e, t0)[0] / r["us"]) ** 2 for r in rows)
            if best is None or err < best[0]:
                best = (err, lat, e, t0)
    return best[1:]


def tc_gpu_table(census, paths, tolerance):
    """(markdown lines, failures) of the tensor-core decode against GPU runs' rows (the fit on
    the first run's 16 rows; rows of later runs are predictions checked by their measurement)."""
    rows, copy = tc_rows(paths)
    facts = {n: tc_shape_facts(census, n) for n in TC_BENCH}
    fit = [r for r in rows if r["name"] in TC_FIT and (r["batch"], r["ctx"]) in CHECKED and r["run"] == 0]
    if len(fit) != 16 or copy is None or any(facts[n] is None for n in TC_FIT):
        return [], [f"tc: {len(fit)} of the 16 fit rows (decode_paged_tc, decode_contiguous_tc) in {paths[0]}"]
    h1 = tc_fit(fit, facts, copy, "L")
    h2 = tc_fit(fit, facts, copy, "e")
    f0 = facts["decode_paged_tc"]
    lines = [f"Tensor-core decode on the GPU of `{'`, `'.join(paths)}` (copy {copy / 1e9:.0f} GB/s, the first run's): "
             f"measured against the model "
             f"(bench/kernels/model.py). H1 occupancy: e = 1, L = {h1[0] * 1e6:.2f} us fitted, T0 = {h1[2] * 1e6:.1f} us per launch; "
             f"H2 pattern: L = {TC_L_PHYS * 1e6:.1f} us assumed, e = {h2[1]:.3f} fitted, T0 = {h2[2] * 1e6:.1f} us per launch, "
             f"e = 1 at runs of >= {TC_RUN_FULL} B (assumed) "
             f"(both fitted on the first run's 16 decode_paged_tc / decode_contiguous_tc rows; the others predicted). "
             f"Default shape: {f0['per_sm']} CTA(s) per SM ({f0['smem'] // 1024} KiB each), "
             f"{f0['inflight'] / 1024:.0f} KiB in flight per warp, {f0['per_byte']:.3f} loop instructions per byte. "
             f"run = contiguous bytes of K one SM reads together; a row without a measurement is a prediction only.",
             "",
             "| row | run B | batch | ctx | splits | CTAs/SM | waves | measured us | H1 us | H2 us | "
             "measured of copy | H1 of copy | H2 of copy |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    bad = []
    have = {(r["name"], r["batch"], r["ctx"]) for r in rows}
    pred_rows = list(rows)
    for n in TC_NEW:  # predictions for the new shapes where no measurement exists
        if facts[n] is None:
            continue
        scale = KV_HEADS // facts[n]["kv_heads"]  # one kv head: the batch x 8 (same bytes, same CTAs)
        for b, c in sorted(CHECKED):
            if (n, b * scale, c) not in have:
                pred_rows.append(dict(name=n, batch=b * scale, ctx=c, us=None,
                                      splits=tc_splits(b * scale, c, facts[n]["kv_heads"] // facts[n]["heads"] or 1)))
    order = list(TC_BENCH)
    for r in sorted(pred_rows, key=lambda r: (order.index(r["name"]), r["batch"], r["ctx"])):
        f = facts[r["name"]]
        if f is None:
            continue
        kv = tc_kv_bytes(r, f)
        u1, waves = tc_predict(r, f, copy, h1[0], h1[1], h1[2])
        u2, _ = tc_predict(r, f, copy, h2[0], h2[1], h2[2], by_run=True)
        meas = f"{r['us']:.0f}" if r["us"] is not None else "-"
        mfrac = f"{kv / (r['us'] * 1e-6) / copy:.2f}" if r["us"] is not None else "-"
        lines.append(f"| {r['name']} | {f['run']} | {r['batch']} | {r['ctx']} | {r['splits']} | {f['per_sm']} | {waves} | "
                     f"{meas} | {u1:.0f} | {u2:.0f} | {mfrac} | {kv / (u1 * 1e-6) / copy:.2f} | "
                     f"{kv / (u2 * 1e-6) / copy:.2f} |")
        if r["name"] in TC_FIT and r["us"] is not None and (r["batch"], r["ctx"]) in CHECKED and r["run"] == 0:
            for h, u in (("H1", u1), ("H2", u2)):
                if abs(u / r["us"] - 1) > tolerance:
                    bad.append(f"tc {h} {r['name']} b{r['batch']} ctx{r['ctx']}: predicted {u:.0f} us, measured "
                               f"{r['us']:.0f} us")
    return lines, bad


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--census", required=True)
    ap.add_argument("--measured", required=True)
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--table", action="store_true")
    ap.add_argument("--tolerance", type=float, default=0.15)
    ap.add_argument("--measured-tc", nargs="+",
                    help="GPU runs' bench_kernels output with the tensor-core decode rows (the fit on the first)")
    args = ap.parse_args()
    census = json.load(open(args.census))
    facts = {a: kernel_facts(census, a) for a in ("PagedAddr", "ContiguousAddr")}
    rows, copy = measured_rows(args.measured)
    checked = [r for r in rows if (r["batch"], r["ctx"]) in CHECKED]
    if len(checked) != 16:
        sys.exit(f"model: {len(checked)} of the 16 checked decode rows found in {args.measured}")
    eta0 = fit_eta0(checked, facts, copy)
    lines = [f"Predicted H100 decode times (model: bench/kernels/model.py; eta0 = {eta0:.3f} fitted on the 16 rows; "
             f"main loop {facts['PagedAddr']['loop']} paged / {facts['ContiguousAddr']['loop']} contiguous "
             f"warp-instructions per {facts['PagedAddr']['bytes_per_iter']} B of K+V; "
             f"{facts['PagedAddr']['ctas_per_sm']} CTAs/SM; copy {copy / 1e9:.0f} GB/s)",
             "",
             "| kernel | batch | ctx | splits | CTAs | eta | predicted us | measured us | predicted/measured | "
             "predicted fraction of copy |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    bad = []
    for r in sorted(checked, key=lambda r: (r["addr"] != "PagedAddr", r["batch"], r["ctx"])):
        us, ctas, eta, kv_bytes = predict(r, facts, copy, eta0)
        ratio = us / r["us"]
        frac = kv_bytes / (us * 1e-6) / copy
        name = "paged tpp 16" if r["addr"] == "PagedAddr" else "contiguous"
        lines.append(f"| {name} | {r['batch']} | {r['ctx']} | {r['splits']} | {ctas} | {eta:.2f} | {us:.0f} | "
                     f"{r['us']:.0f} | {ratio:.2f} | {frac:.2f} |")
        if abs(ratio - 1) > args.tolerance:
            bad.append(f"{name} b{r['batch']} ctx{r['ctx']}: predicted {us:.0f} us, measured {r['us']:.0f} us")
    p_lines, p_bad, eta_p = prefill_table(measured_prefill(args.measured), prefill_facts(census), args.tolerance)
    bad += p_bad
    tc_lines = []
    if any(k.startswith("sm_90 tc_decode") for k in census):
        tc_lines, _ = tc_table(checked, census, copy, eta0)
    pf_lines = tc_prefill_table(measured_prefill(args.measured), census, eta_p, eta0)
    acc_line, acc_bad = tc_prefill_acceptance(census, eta_p)
    bad += acc_bad
    gpu_lines = []
    if args.measured_tc:
        gpu_lines, g_bad = tc_gpu_table(census, args.measured_tc, args.tolerance)
        bad += g_bad
    if args.table or not args.check:
        print("\n".join(lines + [""] + p_lines + [""] + tc_lines + [""] + pf_lines + [""] + gpu_lines))
    if args.check:
        for b in bad:
            print("FAIL", b)
        ratios = [predict(r, facts, copy, eta0)[0] / r["us"] for r in checked]
        print(f"model: eta0 {eta0:.3f}, 16 decode rows, predicted/measured {min(ratios):.2f} .. {max(ratios):.2f}; "
              f"eta_p {eta_p:.3f} on the prefill rows; {len(bad)} outside +-{args.tolerance:.0%}")
        print(f"model: {acc_line}")
        sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
