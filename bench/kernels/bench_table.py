#!/usr/bin/env python3
"""Summarises bench_kernels output as a markdown table in decimal units: decode KV TB/s
(1 TB = 1e12 B) and its fraction of the device copy measured in the same run (copy_GBps:
bytes read + written per second), prefill TFLOP/s. Computed from the microseconds and the
shapes, so it reads today's output and older runs alike.

  python3 bench/kernels/bench_table.py bench.txt
"""
import re
import sys

KV_PER_TOKEN = 8 * 128 * 2 * 2  # kv heads x head dim x bf16 x (K and V): the bench's shapes
Q_HEADS, HEAD_DIM = 32, 128


def main():
    txt = open(sys.argv[1]).read()
    m = re.search(r"copy_GBps=([\d.]+)(k?)", txt)
    copy = float(m.group(1)) * (1e3 if m.group(2) else 1) * 1e9 if m else None
    print(f"device copy (read + written): {copy / 1e9:.0f} GB/s" if copy else "device copy: not found")
    print()
    print("| benchmark | us | KV TB/s or TFLOP/s | fraction of copy |")
    print("|---|---|---|---|")
    n = 0
    for m in re.finditer(r"^(decode_\w+|prefill_paged\w*)/(\S+?)/manual_time\s+([\d.]+) us", txt, re.M):
        kind, args, us = m.group(1), dict(kv.split(":") for kv in m.group(2).split("/")), float(m.group(3))
        n += 1
        if kind.startswith("decode"):
            tbs = int(args["batch"]) * int(args["ctx"]) * KV_PER_TOKEN / (us * 1e-6) / 1e12
            frac = f"{tbs * 1e12 / copy:.2f}" if copy else "-"
            print(f"| {kind} {m.group(2)} | {us:.1f} | {tbs:.2f} TB/s | {frac} |")
        else:
            c, k = int(args["chunk"]), int(args["ctx"])
            keys = c * (k - c) + c * (c + 1) / 2
            print(f"| {kind} {m.group(2)} | {us:.0f} | {4.0 * keys * Q_HEADS * HEAD_DIM / (us * 1e-6) / 1e12:.1f} TFLOP/s | - |")
    if n == 0:
        sys.exit("bench_table: no benchmark rows found")


if __name__ == "__main__":
    main()
