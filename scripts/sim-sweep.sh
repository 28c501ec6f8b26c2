#!/usr/bin/env bash
# The prefix-caching sweep of Jenga Fig. 17 on kvmm-sim: the arxiv-sweep workload (N
# articles, 4 questions on each asked in round robin, so a question hits only if the cache
# kept all N articles) for N from 1 until the KV cache no longer holds them, on
# Gemma-2-27B (80 GiB) and Ministral-8B (55 GiB): kvmm with --boundaries none, hinted and
# learned against paged-uniform (vLLM 0.6) and unified-block (vLLM v1), then against today's
# engines (vllm-0.33, vllm-0.33-tuned, trtllm-v2, sglang; a second table per model). Writes
# OUT/sweep.csv, renders docs/results/sim/arxiv-sweep.png and prints markdown tables.
# About a minute on 2 cores.
#   scripts/sim-sweep.sh [BUILD_DIR] [OUT_DIR]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
source "$root/scripts/deps.sh"
kvmm_install_deps python3-matplotlib  # plot_sweep.py's chart
build=${1:-$root/build}
out=${2:-/tmp/kvmm-sim-sweep}
sim=$build/bench/sim/kvmm-sim
png=$root/docs/results/sim
py=/usr/bin/python3
[ -x "$py" ] || py=python3
[ -x "$sim" ] || { echo "sim-sweep.sh: $sim not found (build the kvmm-sim target)" >&2; exit 1; }
mkdir -p "$out" "$png"
questions=4

# model memory_gib N...: N past the point where the articles stop fitting (about 3 articles
# of 55k-110k tokens on Gemma-2-27B at 80 GiB, about 5 on Ministral-8B at 55 GiB).
models=(
  "gemma-2-27b 80 1 2 3 4 5 6 8"
  "ministral-8b 55 1 2 3 4 5 6 8 10 12"
)

csv=$out/sweep.csv
echo "model,memory_gib,articles,requests,engine,steps,finished,first_admission_hit_rate,prefix_hit_rate,prefill_tokens,mean_wasted,preemptions" > "$csv"
append() {  # $1 = run dir, $2 = model, $3 = GiB, $4 = N, $5 = requests, $6 = kvmm's label
  "$py" - "$@" >> "$csv" <<'PY'
import csv, sys
d, model, gib, n, req, label = sys.argv[1:7]
for r in csv.DictReader(open(d + "/summary.csv")):
    engine = label if r["policy"] == "kvmm" else r["policy"]
    print(",".join([model, gib, n, req, engine, r["steps"], r["finished"], r["first_admission_hit_rate"],
                    r["prefix_hit_rate"], r["prefill_tokens"], r["mean_wasted"], r["preemptions"]]))
PY
}

for spec in "${models[@]}"; do
  read -r model gib ns <<<"$spec"
  for n in $ns; do
    req=$((questions * n))
    for mode in none hinted learned current; do
      policies=kvmm
      [ "$mode" = none ] && policies=kvmm,paged-uniform,unified-block
      [ "$mode" = current ] && policies=vllm-0.33,vllm-0.33-tuned,trtllm-v2,sglang
      dir=$out/$model-$n-$mode
      boundaries=$mode
      [ "$mode" = current ] && boundaries=learned  # (no kvmm run: the flag is unused)
      "$sim" --model "$model" --workload arxiv-sweep --articles "$n" --requests "$req" --memory-gib "$gib" \
        --seed 1 --policy "$policies" --boundaries "$boundaries" --out "$dir" > "$dir.log"
      append "$dir" "$model" "$gib" "$n" "$req" "kvmm-$mode"
    done
  done
done

"$py" "$root/bench/sim/plot_sweep.py" "$csv" --out "$png/arxiv-sweep.png"
echo "kvmm-sim --workload arxiv-sweep --articles N --requests $questions*N --seed 1 (kvmm --boundaries none|hinted|learned)"
"$py" - "$csv" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
engines = ["kvmm-none", "kvmm-hinted", "kvmm-learned", "paged-uniform", "unified-block"]
current = ["kvmm-learned", "vllm-0.33", "vllm-0.33-tuned", "trtllm-v2", "sglang"]
for model in dict.fromkeys(r["model"] for r in rows):
    mine = [r for r in rows if r["model"] == model]
    for cols, what in ((engines, ""), (current, " against today's engines")):
        print(f"\n#### {model}, {mine[0]['memory_gib']} GiB: first-admission hit % (steps){what}\n")
        print("| articles | " + " | ".join(cols) + " |")
        print("|---:|" + "---:|" * len(cols))
        for n in dict.fromkeys(r["articles"] for r in mine):
            cell = {r["engine"]: r for r in mine if r["articles"] == n}
            print(f"| {n} | " + " | ".join(
                f"{100 * float(cell[e]['first_admission_hit_rate']):.1f} ({cell[e]['steps']})" if e in cell else "-"
                for e in cols) + " |")
PY
