#!/usr/bin/env python3
"""Charts for a kvmm-sim output directory (kvmm-sim --out DIR).

  plot.py DIR [--title TITLE] [--out PREFIX]

writes PREFIX-timeline.png (memory composition over the steps for every policy, in
the style of Jenga Fig. 16: used per group, wasted, cached, group-only free, free) and
PREFIX-summary.png (waste, batch size, output tokens per step, prefix hit rate at every
admission and at first admission, preemptions across policies). PREFIX defaults to
DIR/sim. Needs python3-matplotlib.
"""
import argparse
import csv
import os
import sys

try:
    import matplotlib
except ImportError:
    sys.exit("plot.py: needs matplotlib (Debian: python3-matplotlib; run it with /usr/bin/python3)")

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

POLICIES = ["kvmm", "paged-uniform", "max-page", "static-split", "unified-block"]
GROUP_COLORS = ["#1f77b4", "#2ca02c", "#9467bd", "#17becf", "#8c564b", "#bcbd22"]


def read_steps(path, max_points=1500):
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        return [], []
    stride = max(1, len(rows) // max_points)
    return rows[::stride], list(rows[0].keys())


def timeline(outdir, policies, title, png):
    fig, axes = plt.subplots(len(policies), 1, figsize=(9, 2.1 * len(policies)), squeeze=False)
    for ax, policy in zip(axes[:, 0], policies):
        rows, cols = read_steps(os.path.join(outdir, f"{policy}.steps.csv"))
        if not rows:
            ax.set_title(f"{policy}: no steps")
            continue
        cap = float(rows[0]["capacity"]) / 2**30
        groups = [c[: -len(".used")] for c in cols if c.endswith(".used")]
        x = [int(r["step"]) for r in rows]
        gib = lambda col: [float(r[col]) / 2**30 for r in rows]  # noqa: E731
        layers, labels, colors = [], [], []
        for i, g in enumerate(groups):
            layers.append(gib(f"{g}.used"))
            labels.append(f"used {g}")
            colors.append(GROUP_COLORS[i % len(GROUP_COLORS)])
        layers.append([sum(float(r[f"{g}.wasted"]) for g in groups) / 2**30 for r in rows])
        labels.append("wasted")
        colors.append("#d62728")
        layers.append([sum(float(r[f"{g}.cached"]) for g in groups) / 2**30 for r in rows])
        labels.append("cached (evictable)")
        colors.append("#7f7f7f")
        layers.append([sum(float(r[f"{g}.group_free"]) for g in groups) / 2**30 for r in rows])
        labels.append("free, one group only")
        colors.append("#ff7f0e")
        layers.append(gib("free"))
        labels.append("free")
        colors.append("#e8e8e8")
        ax.stackplot(x, layers, labels=labels, colors=colors, linewidth=0)
        ax.set_xlim(x[0], x[-1] if x[-1] > x[0] else x[0] + 1)
        ax.set_ylim(0, cap)
        ax.set_ylabel("GiB")
        ax.set_title(policy, fontsize=10, loc="left")
        ax.legend(loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=7, frameon=False)
    axes[-1, 0].set_xlabel("scheduler step")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


def summary(outdir, policies, title, png):
    with open(os.path.join(outdir, "summary.csv"), newline="") as f:
        rows = {r["policy"]: r for r in csv.DictReader(f)}
    policies = [p for p in policies if p in rows]
    metrics = [
        ("mean_wasted", "KV memory wasted (%)", 100.0),
        ("mean_running", "mean running batch", 1.0),
        ("output_tokens_per_step", "output tokens per step", 1.0),
        ("prefix_hit_rate", "prefix hit rate (%)", 100.0),
        ("first_admission_hit_rate", "first-admission hit rate (%)", 100.0),
        ("preemptions", "preemptions", 1.0),
    ]
    metrics = [m for m in metrics if m[0] in next(iter(rows.values()))]  # older summary.csv: no first-admission
    fig, axes = plt.subplots(1, len(metrics), figsize=(3.0 * len(metrics), 3.4))
    colors = ["#1f77b4" if p == "kvmm" else "#a0a0a0" for p in policies]
    for ax, (key, label, scale) in zip(axes, metrics):
        vals = [float(rows[p][key]) * scale for p in policies]
        bars = ax.bar(range(len(policies)), vals, color=colors)
        ax.set_xticks(range(len(policies)))
        ax.set_xticklabels(policies, rotation=45, ha="right", fontsize=8)
        ax.set_title(label, fontsize=9)
        for b, v in zip(bars, vals):
            ax.annotate(f"{v:.3g}", (b.get_x() + b.get_width() / 2, b.get_height()), ha="center",
                        va="bottom", fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir")
    ap.add_argument("--title", default="")
    ap.add_argument("--out", default=None, help="output prefix (default DIR/sim)")
    a = ap.parse_args()
    if not os.path.exists(os.path.join(a.dir, "summary.csv")):
        sys.exit(f"plot.py: {a.dir}/summary.csv not found (run kvmm-sim --out {a.dir} first)")
    prefix = a.out or os.path.join(a.dir, "sim")
    with open(os.path.join(a.dir, "summary.csv"), newline="") as f:
        present = [r["policy"] for r in csv.DictReader(f)]
    policies = [p for p in POLICIES if p in present] + [p for p in present if p not in POLICIES]
    timeline(a.dir, policies, a.title, prefix + "-timeline.png")
    summary(a.dir, policies, a.title, prefix + "-summary.png")
    print(prefix + "-timeline.png", prefix + "-summary.png")


if __name__ == "__main__":
    main()
