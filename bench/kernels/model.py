#!/usr/bin/env python3
"""Time model of kvmm's decode attention on an H100: predicted, never measured.

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
measured prefill row must be within +-15% too.

  python3 bench/kernels/model.py --census kernels_census.json --measured bench.txt [--check] [--table]
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
    # the ring (4 warps x 2 stages x K+V x 32 rows; Q in registers), dynamic, + the system reserve
    smem = 4 * 2 * 2 * 32 * HEAD_DIM * 2 + 1024
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


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--census", required=True)
    ap.add_argument("--measured", required=True)
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--table", action="store_true")
    ap.add_argument("--tolerance", type=float, default=0.15)
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
    if args.table or not args.check:
        print("\n".join(lines + [""] + p_lines + [""] + tc_lines + [""] + pf_lines))
    if args.check:
        for b in bad:
            print("FAIL", b)
        ratios = [predict(r, facts, copy, eta0)[0] / r["us"] for r in checked]
        print(f"model: eta0 {eta0:.3f}, 16 decode rows, predicted/measured {min(ratios):.2f} .. {max(ratios):.2f}; "
              f"eta_p {eta_p:.3f} on the prefill rows; {len(bad)} outside +-{args.tolerance:.0%}")
        sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
