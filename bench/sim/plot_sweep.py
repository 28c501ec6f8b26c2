#!/usr/bin/env python3
"""Chart of the Jenga Fig. 17-style sweep (scripts/sim-sweep.sh writes the CSV).

  plot_sweep.py SWEEP.csv [--out PNG]

one column per model: the first-admission prefix hit rate (top) and the steps to finish
(bottom) against the number of articles, one line per engine (kvmm with each
--boundaries mode, paged-uniform, unified-block). Needs python3-matplotlib.
"""
import argparse
import csv
import sys

try:
    import matplotlib
except ImportError:
    sys.exit("plot_sweep.py: needs matplotlib (Debian: python3-matplotlib; run it with /usr/bin/python3)")

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

STYLE = {
    "kvmm-none": ("#1f77b4", "-", "o"),
    "kvmm-hinted": ("#1f77b4", "--", "s"),
    "kvmm-learned": ("#1f77b4", ":", "^"),
    "kvmm-both": ("#1f77b4", "-.", "D"),
    "paged-uniform": ("#d62728", "-", "x"),
    "unified-block": ("#7f7f7f", "-", "+"),
    "vllm-0.33": ("#ff7f0e", "-", "v"),
    "vllm-0.33-tuned": ("#ff7f0e", "--", "<"),
    "trtllm-v2": ("#2ca02c", "-", ">"),
    "sglang": ("#9467bd", "-", "*"),
}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv")
    ap.add_argument("--out", default="arxiv-sweep.png")
    a = ap.parse_args()
    with open(a.csv, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        sys.exit(f"plot_sweep.py: {a.csv} has no rows")
    models = list(dict.fromkeys(r["model"] for r in rows))
    fig, axes = plt.subplots(2, len(models), figsize=(5.2 * len(models), 6.4), squeeze=False)
    for col, model in enumerate(models):
        mine = [r for r in rows if r["model"] == model]
        for engine in dict.fromkeys(r["engine"] for r in mine):
            pts = sorted((int(r["articles"]), r) for r in mine if r["engine"] == engine)
            x = [n for n, _ in pts]
            color, line, marker = STYLE.get(engine, ("#2ca02c", "-", "."))
            kw = dict(color=color, linestyle=line, marker=marker, label=engine)
            axes[0, col].plot(x, [100 * float(r["first_admission_hit_rate"]) for _, r in pts], **kw)
            axes[1, col].plot(x, [int(r["steps"]) for _, r in pts], **kw)
        axes[0, col].set_title(f"{model}, {mine[0]['memory_gib']} GiB", fontsize=10)
        axes[0, col].set_ylabel("first-admission hit rate (%)")
        axes[0, col].set_ylim(0, 100)
        axes[1, col].set_ylabel("steps to finish")
        axes[1, col].set_xlabel("articles (4 questions each, round robin)")
        axes[0, col].grid(alpha=0.3)
        axes[1, col].grid(alpha=0.3)
    axes[0, 0].legend(fontsize=8)
    fig.suptitle("kvmm-sim arxiv-sweep (Jenga Fig. 17 style)")
    fig.tight_layout()
    fig.savefig(a.out, dpi=110)
    plt.close(fig)
    print(a.out)


if __name__ == "__main__":
    main()
