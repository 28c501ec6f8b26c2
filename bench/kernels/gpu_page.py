#!/usr/bin/env python3
"""Writes the results page of one run of scripts/gpu_kernels.sh (a GPU session's $OUT folder:
summary.md, bench.txt, sdpa.txt) as markdown on stdout: the run's own summary as printed
(tables of bench_table.py and model.py), then the tensor-core kernels' predictions of
docs/results/kernels-predicted.md beside the measured rows of the same shapes, then the raw
benchmark lines. Nothing is edited by hand; the page names its command, device and commit.

  python3 bench/kernels/gpu_page.py RUN_DIR --commit C --date D --device NAME \
      [--predicted docs/results/kernels-predicted.md] > docs/results/kernels-h200.md

Decode is compared as fractions of the copy rate measured in each run (the prediction's run
and this one may be different cards); prefill as TFLOP/s (compute-bound: the H100 and H200
have the same tensor-core rate)."""
import argparse
import os
import re

KV_PER_TOKEN = 8 * 128 * 2 * 2  # the bench's decode shapes (bench_table.py)
Q_HEADS, HEAD_DIM = 32, 128

# Prediction table title fragment -> bench name, for the prefill forms of the census.
PREFILL_FORMS = [
    ("splitP, 16 rows per warp", "prefill_paged_tc"),
    ("P, 16 rows per warp", "prefill_paged_tc1"),
    ("splitP, 32 rows per warp", "prefill_paged_tc32"),
    ("P, 32 rows per warp", "prefill_paged_tc32_1"),
]
DECODE_FORMS = [("tc paged tpp 16", "decode_paged_tc", "/tpp:16"), ("tc contiguous", "decode_contiguous_tc", "")]


def measured(bench_txt):
    """{(name, args): us} and the copy rate in B/s of one bench_kernels output."""
    rows = {}
    for m in re.finditer(r"^(decode_\w+|prefill_paged\w*)/(\S+?)/manual_time\s+([\d.]+) us", bench_txt, re.M):
        rows[(m.group(1), m.group(2))] = float(m.group(3))
    c = re.search(r"copy_GBps=([\d.]+)(k?)", bench_txt)
    copy = float(c.group(1)) * (1e3 if c.group(2) else 1) * 1e9 if c else None
    return rows, copy


def tables(md):
    """(title, [row cells]) of every markdown table preceded by a 'Predicted' line."""
    out, title, rows = [], None, []
    for line in md.splitlines() + [""]:
        if line.startswith("Predicted"):
            title, rows = line, []
        elif title and line.startswith("|") and not line.startswith("|---") and not line.startswith("| kernel") \
                and not line.startswith("| chunk"):
            rows.append([c.strip() for c in line.strip("|").split("|")])
        elif title and rows and not line.startswith("|"):
            out.append((title, rows))
            title, rows = None, []
    return out


def comparison(pred_md, rows, copy):
    print("| kernel | shape | predicted | measured | measured / predicted |")
    print("|---|---|---|---|---|")
    for title, trs in tables(pred_md):
        if "tensor-core decode" in title:
            for r in trs:
                for label, name, suffix in DECODE_FORMS:
                    if r[0] != label:
                        continue
                    args = f"batch:{r[1]}/ctx:{r[2]}{suffix}"
                    us = rows.get((name, args))
                    if us is None or copy is None:
                        continue
                    frac = int(r[1]) * int(r[2]) * KV_PER_TOKEN / (us * 1e-6) / copy
                    pf = float(r[9])
                    print(f"| {name} | {args} | {pf:.2f} of copy | {frac:.2f} of copy | {frac / pf:.2f} |")
        elif "tensor-core prefill" in title:
            name = next((n for frag, n in PREFILL_FORMS if f"prefill, {frag}" in title), None)
            if name is None:
                continue
            for r in trs:
                args = f"chunk:{r[0]}/ctx:{r[1]}"
                us = rows.get((name, args))
                if us is None:
                    continue
                c, k = int(r[0]), int(r[1])
                keys = c * (k - c) + c * (c + 1) / 2
                tf = 4.0 * keys * Q_HEADS * HEAD_DIM / (us * 1e-6) / 1e12
                pt = float(r[6])
                print(f"| {name} | {args} | {pt:.0f} TFLOP/s | {tf:.1f} TFLOP/s | {tf / pt:.2f} |")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("run")
    ap.add_argument("--commit", required=True)
    ap.add_argument("--date", required=True)
    ap.add_argument("--device", required=True)
    ap.add_argument("--predicted", default="docs/results/kernels-predicted.md")
    ap.add_argument("--mode", default="all", help="the gpu_kernels.sh mode the run used")
    ap.add_argument("--title", default="", help="words after the date in the page's title")
    a = ap.parse_args()
    summary = open(os.path.join(a.run, "summary.md")).read()
    bench_txt = open(os.path.join(a.run, "bench.txt")).read()
    rows, copy = measured(bench_txt)
    print(f"# Kernel measurements on an {a.device} ({a.date}{', ' + a.title if a.title else ''})\n")
    print(f"Measured, not predicted: one run of `scripts/gpu_kernels.sh {a.mode}` on {a.device}, kvmm at")
    print(f"`{a.commit}` (sm_90 Release build on that machine), medians of CUDA-event times.")
    print(f"Page written by `python3 bench/kernels/gpu_page.py RUN --commit {a.commit} --date {a.date}`")
    print(f"`--device '{a.device}' --mode {a.mode}` from the run's files (summary.md, bench.txt). The summary's first")
    print("line names the commit that git reported on the device machine, whose copy of .git can lag")
    print("the tree sent; the commit above is the tree that ran.\n")
    print("## The run's summary, as printed\n")
    print(summary.rstrip())
    print("\n## Predicted (docs/results/kernels-predicted.md) against measured, same shapes\n")
    print(f"Decode as fractions of the copy rate of each run (this run: {copy / 1e9:.0f} GB/s read + written);")
    print("prefill in TFLOP/s at the prediction's eta_p.\n")
    comparison(open(a.predicted).read(), rows, copy)
    print("\n## Raw benchmark lines\n\n```")
    for line in bench_txt.splitlines():
        if "/manual_time" in line:
            print(line.rstrip())
    print("```")


if __name__ == "__main__":
    main()
