#!/usr/bin/env python3
"""The summary of docs/results/sim.md against today's engines (issue 34), from the run
directories of scripts/sim-table.sh: per workload, kvmm's default (and hinted) first-admission
hit rate and steps, the current baseline with the most first-admission hits and the one with
the fewest steps (each named, with its hits and steps), and kvmm's steps against the fewest.
  sim_summary_current.py LABELS_JSON BASELINES RUN_DIR...   (RUN_DIR = OUT/NAME-engine)
"""
import csv
import json
import sys


def main():
    labels = json.loads(sys.argv[1])
    current = sys.argv[2].split()
    print("| model, workload | kvmm: first-admission hit % (hinted) | kvmm: steps (hinted) "
          "| most hits among current baselines: hit %, steps | fewest steps among current baselines: steps, hit % "
          "| kvmm steps / fewest | waste %: kvmm / fewest-steps baseline |")
    print("| --- | ---: | ---: | --- | --- | ---: | --- |")
    for d in sys.argv[3:]:
        name = d.rsplit("/", 1)[1][: -len("-engine")]
        rows = {r["policy"]: r for r in csv.DictReader(open(d + "/summary.csv"))}
        hinted = next(iter(csv.DictReader(open(f"{d}-hinted/summary.csv"))))
        k = rows["kvmm"]
        pct = lambda r, key, n: f"{float(r[key]) * 100:.{n}f}"
        base = [rows[p] for p in current if p in rows]
        most = max(base, key=lambda r: (round(float(r["first_admission_hit_rate"]), 3), -int(r["steps"])))
        fewest = min(base, key=lambda r: (int(r["steps"]), -float(r["first_admission_hit_rate"])))
        print(f"| {labels.get(name, name)} | {pct(k, 'first_admission_hit_rate', 1)} "
              f"({pct(hinted, 'first_admission_hit_rate', 1)}) | {int(k['steps']):,} ({int(hinted['steps']):,}) "
              f"| {most['policy']}: {pct(most, 'first_admission_hit_rate', 1)}, {int(most['steps']):,} "
              f"| {fewest['policy']}: {int(fewest['steps']):,}, {pct(fewest, 'first_admission_hit_rate', 1)} "
              f"| {int(k['steps']) / int(fewest['steps']):.2f} "
              f"| {pct(k, 'mean_wasted', 3)} / {pct(fewest, 'mean_wasted', 3)} |")


if __name__ == "__main__":
    main()
