#!/usr/bin/env bash
# Hits finer than a page in kvmm-sim (issue 34 item 3): kvmm's default against the same
# manager with KVCacheManagerOptions::hit_unit at 4 and 1 tokens (--hit-unit) on the
# workloads of docs/results/sim.md whose models qualify (full attention and sliding
# windows of one page size: Gemma-2, Ministral, Gemma-3), and prints the markdown table
# of docs/results/sim.md ("Hits finer than a page").
#   scripts/sim-hit-unit.sh [BUILD_DIR] [OUT_DIR]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
out=${2:-/tmp/kvmm-sim-hit-unit}
sim=$build/bench/sim/kvmm-sim
py=/usr/bin/python3
[ -x "$py" ] || py=python3
mkdir -p "$out"

# name|label|model workload memory_gib requests [options]
runs=(
  "gemma2-arxiv|Gemma-2-27B, arXiv-QA|gemma-2-27b arxiv-qa 80 300"
  "gemma2-arxiv-q400|Gemma-2-27B, arXiv-QA, 400-1,000-token questions|gemma-2-27b arxiv-qa 80 300 --question-tokens 400-1000"
  "ministral-arxiv|Ministral-8B, arXiv-QA|ministral-8b arxiv-qa 55 300"
  "gemma3-chat|Gemma-3-27B, chat (rate 0.2)|gemma-3-27b chat 40 1000 --rate 0.2"
  "gemma3-agentic|Gemma-3-27B, agentic (rate 0.05)|gemma-3-27b agentic 40 1000 --rate 0.05"
  "gemma3-multiturn|Gemma-3-27B, multi-turn (2 GiB, rate 2)|gemma-3-27b multi-turn 2 2000 --rate 2"
)
units=(0 4 1)

for spec in "${runs[@]}"; do
  IFS='|' read -r name label args <<<"$spec"
  read -r model workload gib n rest <<<"$args"
  read -r -a extra <<<"${rest:-}"
  for u in "${units[@]}"; do
    "$sim" --model "$model" --workload "$workload" --memory-gib "$gib" --requests "$n" --seed 1 \
      ${extra[@]+"${extra[@]}"} --policy kvmm --hit-unit "$u" --out "$out/$name-u$u" > "$out/$name-u$u.log"
  done
done

"$py" - "$out" "${units[*]}" "${runs[@]}" <<'PY'
import csv, json, sys
out, units, specs = sys.argv[1], sys.argv[2].split(), sys.argv[3:]
def row(d):
    r = next(csv.DictReader(open(f"{out}/{d}/summary.csv")))
    return float(r["first_admission_hit_rate"]) * 100, int(r["steps"]), int(r["prefill_tokens"])
head = " | ".join(f"hit_unit {u}: hit %, steps, prefill" if u != "0" else "default (pages): hit %, steps, prefill" for u in units)
print(f"| workload | {head} | steps, hit_unit 1 / default |")
print("| --- |" + " --- |" * len(units) + " ---: |")
for spec in specs:
    name, label, _ = spec.split("|")
    cells = [row(f"{name}-u{u}") for u in units]
    text = " | ".join(f"{h:.2f}, {s:,}, {p:,}" for h, s, p in cells)
    print(f"| {label} | {text} | {cells[-1][1] / cells[0][1]:.3f} |")
PY
