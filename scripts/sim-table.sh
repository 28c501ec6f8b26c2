#!/usr/bin/env bash
# Regenerates the kvmm-sim results of docs/results/sim.md: runs every policy on the
# model/workload pairs (with each engine's own prefix caching, then with caching off),
# renders the charts into docs/results/sim/ and prints the markdown tables. With caching,
# kvmm runs again with --boundaries none (Jenga's rule, kvmm before issue 17) and hinted
# (rows "kvmm --boundaries ..."); the plain kvmm row is the default, learned.
#   scripts/sim-table.sh [BUILD_DIR] [OUT_DIR]
# KVMM_SIM_RUNS="name ..." (the names of the runs below) runs only those, and the summaries
# print only their rows: for regenerating the rows one change moves (the others reproduce).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
source "$root/scripts/deps.sh"
kvmm_install_deps python3-matplotlib  # plot.py's charts
build=${1:-$root/build}
out=${2:-/tmp/kvmm-sim-table}
sim=$build/bench/sim/kvmm-sim
png=$root/docs/results/sim
py=/usr/bin/python3
[ -x "$py" ] || py=python3
mkdir -p "$out" "$png"

# name model workload memory_gib requests [layout and other options]
# Llama-3.2-Vision runs twice: with 4-token cross-attention pages (an image is k x 1601
# encoder tokens; self-attention keeps 16-token pages), and with the preset's 16 tokens.
# The chat sessions arrive at 0.2 per step: all at step 0, a follow-up turn would queue
# behind every first turn and find its history evicted under any policy.
runs=(
  "llama-vision-mmmu llama-3.2-11b-vision mmmu-pro 50 2000 --group-tokens-per-page cross=4"
  "llama-vision-mmmu-16 llama-3.2-11b-vision mmmu-pro 50 2000"
  "gemma2-arxiv gemma-2-27b arxiv-qa 80 300"
  "ministral-arxiv ministral-8b arxiv-qa 55 300"
  "jamba-sharegpt jamba-1.5-mini sharegpt 4 2000"
  "spec-sharegpt spec-70b-1b sharegpt 40 2000"
  "gemma3-chat gemma-3-27b chat 40 1000 --rate 0.2"
  # Issue 34: arXiv-QA with longer questions (Jenga's are 16-64 tokens), and agentic
  # tool-call loops (sessions arrive at 0.05 per step, each call after its parent).
  "gemma2-arxiv-q65 gemma-2-27b arxiv-qa 80 300 --question-tokens 65-128"
  "gemma2-arxiv-q100 gemma-2-27b arxiv-qa 80 300 --question-tokens 100-400"
  "gemma2-arxiv-q400 gemma-2-27b arxiv-qa 80 300 --question-tokens 400-1000"
  "ministral-arxiv-q65 ministral-8b arxiv-qa 55 300 --question-tokens 65-128"
  "ministral-arxiv-q100 ministral-8b arxiv-qa 55 300 --question-tokens 100-400"
  "ministral-arxiv-q400 ministral-8b arxiv-qa 55 300 --question-tokens 400-1000"
  "gemma3-agentic gemma-3-27b agentic 40 1000 --rate 0.05"
)
if [ -n "${KVMM_SIM_RUNS:-}" ]; then
  kept=()
  for spec in "${runs[@]}"; do
    read -r name _ <<<"$spec"
    case " $KVMM_SIM_RUNS " in *" $name "*) kept+=("$spec") ;; esac
  done
  [ ${#kept[@]} -gt 0 ] || { echo "KVMM_SIM_RUNS=$KVMM_SIM_RUNS names no run" >&2; exit 2; }
  runs=("${kept[@]}")
fi
# The baselines of the first summary (the engines of 2025) and of the second (today's).
historical="paged-uniform max-page static-split unified-block"
current="vllm-0.33 vllm-0.33-tuned trtllm-v2 sglang"
modes=(none hinted)  # kvmm's --boundaries runs besides the default (learned, the manager's)

table() {  # $1 = run dir, then the dirs of kvmm's --boundaries runs as MODE=DIR
  "$py" - "$@" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1] + "/summary.csv")))
for extra in sys.argv[2:]:
    mode, d = extra.split("=", 1)
    for r in csv.DictReader(open(d + "/summary.csv")):
        r["policy"] = f"{r['policy']} --boundaries {mode}"
        rows.insert(sum(x["policy"].startswith("kvmm") for x in rows), r)  # after the kvmm rows
print("| policy | steps | finished | mean batch | out tokens/step | preemptions | prefix hit % | first-admission hit % | prefill tokens | waste % (mean) | waste % (peak) | one-group free % | cached % |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for r in rows:
    f = lambda k, s=100.0, d=2: f"{float(r[k]) * s:.{d}f}"
    print(f"| {r['policy']} | {r['steps']} | {r['finished']} | {f('mean_running', 1)} | {f('output_tokens_per_step', 1)} "
          f"| {r['preemptions']} | {f('prefix_hit_rate', d=1)} | {f('first_admission_hit_rate', d=1)} "
          f"| {int(r['prefill_tokens']):,} | {f('mean_wasted', d=3)} | {f('peak_wasted', d=3)} "
          f"| {f('mean_group_free')} | {f('mean_cached')} |")
PY
}

for spec in "${runs[@]}"; do
  read -r name model workload gib n layout <<<"$spec"
  read -r -a layout_flags <<<"${layout:-}"
  for mode in engine nocache; do
    flags=(${layout_flags[@]+"${layout_flags[@]}"})
    [ "$mode" = nocache ] && flags+=(--no-prefix-caching)
    dir=$out/$name-$mode
    cmd="kvmm-sim --model $model --workload $workload --memory-gib $gib --requests $n --seed 1${flags[*]:+ ${flags[*]}}"
    "$sim" --model "$model" --workload "$workload" --memory-gib "$gib" --requests "$n" --seed 1 \
      ${flags[@]+"${flags[@]}"} --out "$dir" > "$dir.log"
    if [ "$mode" = engine ]; then
      "$py" "$root/bench/sim/plot.py" "$dir" --title "$model, $workload, $gib GiB${layout:+, $layout}" --out "$png/$name" > /dev/null
    fi
    echo
    label="each engine's own prefix caching"
    [ "$mode" = nocache ] && label="prefix caching off in every policy"
    echo "#### $model, $workload, $gib GiB, $n requests${layout:+ ($layout)}: $label"
    echo
    extra=()
    if [ "$mode" = engine ]; then
      for b in "${modes[@]}"; do
        "$sim" --model "$model" --workload "$workload" --memory-gib "$gib" --requests "$n" --seed 1 \
          ${flags[@]+"${flags[@]}"} --policy kvmm --boundaries "$b" --out "$dir-$b" > "$dir-$b.log"
        extra+=("$b=$dir-$b")
      done
      cmd="$cmd (kvmm also with --policy kvmm --boundaries ${modes[*]})"
    fi
    echo "\`$cmd\`"
    echo
    table "$dir" ${extra[@]+"${extra[@]}"}
  done
done

# The summary at the top of docs/results/sim.md, from the same runs (caching on): kvmm's
# waste and first-admission hits (default, then --boundaries none / hinted), the baseline
# of 2025 with the least waste, paged-uniform (vLLM 0.6), and steps against the fewest of
# any baseline of 2025.
echo
echo "#### Summary (caching on; generated from the runs above)"
echo
names=()
for spec in "${runs[@]}"; do read -r name _ <<<"$spec"; names+=("$out/$name-engine"); done
labels=$(cat <<'JSON'
{"llama-vision-mmmu": "Llama-3.2-11B-Vision, MMMU-pro, 4-token cross-attention pages",
          "llama-vision-mmmu-16": "the same, the preset's 16-token pages everywhere",
          "gemma2-arxiv": "Gemma-2-27B, arXiv-QA", "ministral-arxiv": "Ministral-8B, arXiv-QA",
          "jamba-sharegpt": "Jamba-1.5-Mini, ShareGPT", "spec-sharegpt": "Llama-3.1-70B + 3.2-1B draft, ShareGPT",
          "gemma3-chat": "Gemma-3-27B, chat (rate 0.2)",
          "gemma2-arxiv-q65": "Gemma-2-27B, arXiv-QA, 65-128-token questions",
          "gemma2-arxiv-q100": "Gemma-2-27B, arXiv-QA, 100-400-token questions",
          "gemma2-arxiv-q400": "Gemma-2-27B, arXiv-QA, 400-1,000-token questions",
          "ministral-arxiv-q65": "Ministral-8B, arXiv-QA, 65-128-token questions",
          "ministral-arxiv-q100": "Ministral-8B, arXiv-QA, 100-400-token questions",
          "ministral-arxiv-q400": "Ministral-8B, arXiv-QA, 400-1,000-token questions",
          "gemma3-agentic": "Gemma-3-27B, agentic tool-call loops (rate 0.05)"}
JSON
)
KVMM_LABELS="$labels" KVMM_BASELINES="$historical" "$py" - "${names[@]}" <<'PY'
import csv, json, os, sys
labels = {"llama-vision-mmmu": "Llama-3.2-11B-Vision, MMMU-pro, 4-token cross-attention pages",
          "llama-vision-mmmu-16": "the same, the preset's 16-token pages everywhere",
          "gemma2-arxiv": "Gemma-2-27B, arXiv-QA", "ministral-arxiv": "Ministral-8B, arXiv-QA",
          "jamba-sharegpt": "Jamba-1.5-Mini, ShareGPT", "spec-sharegpt": "Llama-3.1-70B + 3.2-1B draft, ShareGPT",
          "gemma3-chat": "Gemma-3-27B, chat (rate 0.2)"}
labels.update(json.loads(os.environ["KVMM_LABELS"]))
historical = os.environ["KVMM_BASELINES"].split()
print("| model, workload | kvmm waste % (peak) | first-admission hit %: kvmm (none / hinted) "
      "| least-waste baseline: waste % (first-admission hit %) | paged-uniform (vLLM 0.6): waste % (first-admission hit %) "
      "| steps: kvmm (none / hinted) / fewest baseline |")
print("| --- | ---: | ---: | --- | ---: | --- |")
for d in sys.argv[1:]:
    name = d.rsplit("/", 1)[1][: -len("-engine")]
    rows = {r["policy"]: r for r in csv.DictReader(open(d + "/summary.csv"))}
    modes = [next(iter(csv.DictReader(open(f"{d}-{m}/summary.csv")))) for m in ("none", "hinted")]
    k = rows["kvmm"]
    pct = lambda r, key, n: f"{float(r[key]) * 100:.{n}f}"
    base = [r for p, r in rows.items() if p in historical]
    least = min(base, key=lambda r: float(r["mean_wasted"]))
    fewest = min(base, key=lambda r: int(r["steps"]))
    pu = rows["paged-uniform"]
    print(f"| {labels.get(name, name)} | {pct(k, 'mean_wasted', 3)} ({pct(k, 'peak_wasted', 3)}) "
          f"| {pct(k, 'first_admission_hit_rate', 1)} ({pct(modes[0], 'first_admission_hit_rate', 1)} / "
          f"{pct(modes[1], 'first_admission_hit_rate', 1)}) "
          f"| {pct(least, 'mean_wasted', 3)} {least['policy']} ({pct(least, 'first_admission_hit_rate', 1)}) "
          f"| {pct(pu, 'mean_wasted', 1)} ({pct(pu, 'first_admission_hit_rate', 1)}) "
          f"| {int(k['steps']):,} ({int(modes[0]['steps']):,} / {int(modes[1]['steps']):,}) / "
          f"{int(fewest['steps']):,} {fewest['policy']} |")
PY

# The same runs against today's engines (issue 34): kvmm's default and hinted first-admission
# hits and steps against the current baseline with the most hits and the one with the
# fewest steps, each named (bench/sim/sim_summary_current.py).
echo
echo "#### Summary against today's engines (caching on; the same runs)"
echo
"$py" "$root/bench/sim/sim_summary_current.py" "$labels" "$current" "${names[@]}"
