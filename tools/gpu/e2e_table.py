#!/usr/bin/python3
"""The end-to-end table of tools/gpu/check.sh: PyTorch's d2l loop (tools/gpu/torch_e2e.py)
beside gpu_worker, in fp32 and bf16, from their --metrics_out JSON lines and the GPU memory
that nvidia-smi sampled during each run (MiB, one number per line; the first line is the
reading before the run started).

Steady figures are medians over the epochs after the first (which holds cuDNN's algorithm
search and warm-up).

usage: e2e_table.py DIR   (DIR holds e2e_{torch,ours}_{fp32,bf16}.jsonl and .mem)
"""
import json
import os
import statistics
import sys


def read_run(base):
    epochs, final = [], {}
    try:
        with open(base + ".jsonl") as f:
            for line in f:
                r = json.loads(line)
                if r.get("event") == "epoch":
                    epochs.append(r)
                elif r.get("event") == "final":
                    final = r
    except (OSError, ValueError):
        return None
    if not epochs:
        return None
    steady = epochs[1:] or epochs
    peak = None
    try:
        with open(base + ".mem") as f:
            samples = [float(x) for x in f.read().split() if x.strip()]
        if len(samples) >= 2:
            peak = max(samples[1:]) - samples[0]
    except (OSError, ValueError):
        pass
    return {
        "images_per_s": statistics.median(e["images_per_s"] for e in steady),
        "seconds": statistics.median(e["seconds"] for e in steady),
        "test_acc": epochs[-1]["test_acc"],
        "epochs": len(epochs),
        "peak_mib": peak,
        "complete": bool(final),
    }


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    d = sys.argv[1]
    runs = {f"{who}_{p}": read_run(os.path.join(d, f"e2e_{who}_{p}"))
            for who in ("torch", "ours") for p in ("fp32", "bf16")}
    rows = [("training images/s (steady epoch)", "images_per_s", "{:,.0f}", True),
            ("seconds per epoch incl. eval", "seconds", "{:.2f}", False),
            ("test accuracy after the last epoch", "test_acc", "{:.4f}", None),
            ("peak GPU memory, MiB (nvidia-smi)", "peak_mib", "{:,.0f}", False)]
    print("| | PyTorch eager fp32 | ours fp32 | ours vs PyTorch | PyTorch bf16 autocast | "
          "ours bf16 | ours vs PyTorch |")
    print("|---|---|---|---|---|---|---|")
    for title, key, fmt, higher_better in rows:
        cells = [title]
        for p in ("fp32", "bf16"):
            t, o = runs[f"torch_{p}"], runs[f"ours_{p}"]
            tv = t[key] if t else None
            ov = o[key] if o else None
            cells.append(fmt.format(tv) if tv is not None else "not run")
            cells.append(fmt.format(ov) if ov is not None else "not run")
            if tv and ov and higher_better is not None:
                ratio = ov / tv if higher_better else tv / ov
                cells.append(f"{ratio:.2f}x" + (" faster" if ratio >= 1 else ""))
            else:
                cells.append("")
        print("| " + " | ".join(cells) + " |")
    epochs = {k: (v["epochs"] if v else 0) for k, v in runs.items()}
    print()
    print("epochs run: " + ", ".join(f"{k} {v}" for k, v in epochs.items()) +
          ". Ratios: > 1 means ours is better (more images/s, fewer seconds, less memory).")


if __name__ == "__main__":
    main()
