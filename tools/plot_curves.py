#!/usr/bin/env python3
"""Training curves from gpu_worker --metrics_out files (JSON lines), as the d2l book plots
them: per worker, training loss, training accuracy and test accuracy against the epoch, in
one figure (PNG or SVG by the output's extension).

    tools/plot_curves.py --out=curves.png /tmp/run/worker*.jsonl

Exit status: 0 with the figure written; 1 if a file cannot be read or has no epoch line;
2 for bad usage. Needs matplotlib (Debian's python3-matplotlib; tools/setup.sh installs it).
"""
import argparse
import json
import os
import sys


def read_epochs(path):
    """The epoch lines of one metrics file, in order (a later line for an epoch replaces an
    earlier one: a worker that went back writes it again)."""
    epochs = {}
    rank = None
    with open(path) as f:
        for number, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                event = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{number}: not JSON ({e.msg})")
            if event.get("event") != "epoch":
                continue
            rank = event.get("rank", rank)
            epochs[int(event["epoch"])] = event
    if not epochs:
        raise ValueError(f"{path}: no epoch line")
    return rank, [epochs[e] for e in sorted(epochs)]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="the figure: .png or .svg")
    parser.add_argument("--title", default="", help="a title above the plot")
    parser.add_argument("files", nargs="+", help="--metrics_out files (JSON lines)")
    args = parser.parse_args()
    ext = os.path.splitext(args.out)[1].lower()
    if ext not in (".png", ".svg"):
        print(f"plot_curves: --out must end in .png or .svg, got '{args.out}'", file=sys.stderr)
        return 2
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import MaxNLocator
    except ImportError:
        print("plot_curves: matplotlib is missing (apt-get install python3-matplotlib)",
              file=sys.stderr)
        return 1
    runs = []
    for path in args.files:
        try:
            runs.append((path,) + read_epochs(path))
        except (OSError, ValueError, KeyError) as e:
            print(f"plot_curves: {e}", file=sys.stderr)
            return 1

    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    styles = [("loss", "train loss", "-"), ("train_acc", "train acc", "--"),
              ("test_acc", "test acc", "-."), ("test_loss", "test loss", ":")]
    colors = ["C0", "C1", "C2", "C3"]
    for path, rank, epochs in runs:
        x = [e["epoch"] for e in epochs]
        who = f"rank {rank}" if rank is not None else os.path.basename(path)
        for (key, label, style), color in zip(styles, colors):
            y = [e.get(key, -1) for e in epochs]
            if key != "loss" and all(v < 0 for v in y):
                continue  # Not evaluated, or not kept (a regression has no accuracies).
            ax.plot(x, y, style, color=color, alpha=1.0 if rank in (0, None) else 0.55,
                    marker="o" if len(x) < 3 else None, label=f"{label} ({who})")
    ax.set_xlabel("epoch")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlim(left=min(min(e["epoch"] for e in r[2]) for r in runs) - 0.05)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="center right")
    if args.title:
        ax.set_title(args.title, fontsize=9)
    fig.tight_layout()
    try:
        fig.savefig(args.out, dpi=120)
    except OSError as e:
        print(f"plot_curves: cannot write '{args.out}': {e.strerror}", file=sys.stderr)
        return 1
    print(f"plot_curves: {len(runs)} worker(s), {max(len(r[2]) for r in runs)} epoch(s) -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
