#!/usr/bin/env python3
"""Interleaved A/B of the manager benchmarks between two builds (issue 30: speed does not
regress). Runs rounds of [A, B] (order alternating per round) of manager_step and
manager_lookup (CPU time, median of 3 repetitions each) and the 10k-request arXiv replay
of kvmm-sim (user+sys CPU seconds), then prints a markdown table of medians over the
rounds and B/A. The machines are shared and noisy: compare the ratio, not the absolutes.

  bench/manager_ab.py A_DIR B_DIR [--rounds 5] [--replays 3] [--label-a X --label-b Y]

A_DIR/B_DIR hold manager_step, manager_lookup and kvmm-sim (copied out of build trees).
"""
import argparse, json, os, resource, statistics, subprocess, sys, time

BENCH = [
    ("manager_lookup", "BM_LookupCached128k/1$", "128k cached prompt: add + lookup + pinning allocate, full attention"),
    ("manager_lookup", "BM_LookupCached128k/2$", "the same, full + sliding window 4096"),
    ("manager_lookup", "BM_LookupCached128kScattered", "the same, hit pages scattered (every probe to the index)"),
    ("manager_lookup", "BM_RefusedAdmission128k", "refused admission of the 128k prompt"),
    ("manager_step", "BM_DecodeStep/0/", "decode step, 1,024 requests, caching off"),
    ("manager_step", "BM_DecodeStep/1/", "decode step, 1,024 requests, caching on"),
]
REPLAYS = [("ministral-8b", 55), ("gemma-2-27b", 80)]


def gbench(binary, flt):
    out = subprocess.run([binary, f"--benchmark_filter={flt}", "--benchmark_repetitions=3",
                          "--benchmark_report_aggregates_only=true", "--benchmark_format=json"],
                         check=True, capture_output=True, text=True).stdout
    for b in json.loads(out)["benchmarks"]:
        if b.get("aggregate_name") == "median":
            scale = {"us": 1.0, "ns": 1e-3, "ms": 1e3}[b["time_unit"]]
            return b["cpu_time"] * scale  # microseconds
    raise SystemExit(f"{binary} {flt}: no median")


def replay(sim, model, gib):
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sim, "--model", model, "--workload", "arxiv-qa", "--memory-gib", str(gib), "--requests",
                    "10000", "--seed", "1", "--policy", "kvmm", "--out", f"/tmp/manager_ab_{model}"],
                   check=True, capture_output=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--replays", type=int, default=3)
    ap.add_argument("--label-a", default="before")
    ap.add_argument("--label-b", default="after")
    o = ap.parse_args()
    res = {k: {"a": [], "b": []} for k in range(len(BENCH) + len(REPLAYS))}
    for rnd in range(o.rounds):
        order = ["a", "b"] if rnd % 2 == 0 else ["b", "a"]
        for side in order:
            d = getattr(o, side)
            for k, (binary, flt, _) in enumerate(BENCH):
                res[k][side].append(gbench(os.path.join(d, binary), flt))
        print(f"round {rnd + 1}/{o.rounds} done", file=sys.stderr)
    for rnd in range(o.replays):
        order = ["a", "b"] if rnd % 2 == 0 else ["b", "a"]
        for side in order:
            d = getattr(o, side)
            for j, (model, gib) in enumerate(REPLAYS):
                res[len(BENCH) + j][side].append(replay(os.path.join(d, "kvmm-sim"), model, gib))
    print(f"| benchmark | {o.label_a} | {o.label_b} | {o.label_b} / {o.label_a} |")
    print("| --- | ---: | ---: | ---: |")
    for k, (_, _, name) in enumerate(BENCH):
        a, b = statistics.median(res[k]["a"]), statistics.median(res[k]["b"])
        print(f"| {name} (CPU us, median of {o.rounds} rounds) | {a:.1f} | {b:.1f} | {b / a:.2f} |")
    for j, (model, gib) in enumerate(REPLAYS):
        r = res[len(BENCH) + j]
        a, b = statistics.median(r["a"]), statistics.median(r["b"])
        runs = lambda v: " / ".join(f"{x:.2f}" for x in v)
        print(f"| 10k-request arXiv replay, {model} {gib} GiB (CPU s: {runs(r['a'])} vs {runs(r['b'])}) "
              f"| {a:.2f} | {b:.2f} | {b / a:.2f} |")


if __name__ == "__main__":
    main()
