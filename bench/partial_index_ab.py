#!/usr/bin/env python3
"""Interleaved A/B of bench/manager_partial_hits (the bookkeeping of hit_unit, issue 34 item
3) between two builds: rounds of [A, B] (order alternating per round), each benchmark's
CPU time the median of 3 repetitions, then a markdown table of the medians over the rounds
and B/A. The machines are shared and noisy: compare the ratio, not the absolutes.

  bench/partial_index_ab.py A_BINARY B_BINARY [--rounds 5] [--label-a X --label-b Y]
"""
import argparse, json, re, statistics, subprocess

ROWS = [
    ("BM_PartialIndexPrefill/0$", "prefill + free of an 8,232-token prompt, hit_unit off"),
    ("BM_PartialIndexPrefill/16$", "the same, hit_unit 16 (64-token pages)"),
    ("BM_PartialIndexPrefill/4$", "the same, hit_unit 4"),
    ("BM_PartialIndexPrefill/1$", "the same, hit_unit 1"),
    ("BM_PartialLookup/16/0$", "follower hitting 40 tokens into a cached page, unit 16, no siblings"),
    ("BM_PartialLookup/4/0$", "the same, unit 4"),
    ("BM_PartialLookup/1/0$", "the same, unit 1"),
    ("BM_PartialLookup/4/64$", "unit 4, 64 sibling pages after the same parent"),
    ("BM_PartialLookup/1/64$", "unit 1, 64 sibling pages after the same parent"),
]


def run(binary):
    out = subprocess.run([binary, "--benchmark_repetitions=3", "--benchmark_report_aggregates_only=true",
                          "--benchmark_format=json", "--benchmark_min_time=0.2"],
                         check=True, capture_output=True, text=True).stdout
    med = {}
    for b in json.loads(out)["benchmarks"]:
        if b.get("aggregate_name") == "median":
            scale = {"us": 1.0, "ns": 1e-3, "ms": 1e3}[b["time_unit"]]
            med[b["run_name"]] = b["cpu_time"] * scale  # microseconds
    return med


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--label-a", default="A")
    ap.add_argument("--label-b", default="B")
    args = ap.parse_args()
    got = {"a": [], "b": []}
    for k in range(args.rounds):
        for side in (("a", "b") if k % 2 == 0 else ("b", "a")):
            got[side].append(run(getattr(args, side)))
    print(f"| benchmark | what | {args.label_a} (us) | {args.label_b} (us) | B/A |")
    print("|---|---|---:|---:|---:|")
    for pat, what in ROWS:
        name = next(n for n in got["a"][0] if re.search(pat, n))
        a = statistics.median(r[name] for r in got["a"])
        b = statistics.median(r[name] for r in got["b"])
        print(f"| `{name}` | {what} | {a:.2f} | {b:.2f} | {b / a:.3f} |")


if __name__ == "__main__":
    main()
