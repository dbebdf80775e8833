#!/usr/bin/python3
"""Puts our ResNet-18 step (gpu_benchmark's `result` lines) beside PyTorch eager's
(torch_resnet.md) per precision: the issue's targets in one table.

  compare.py GPU_BENCHMARK_OUTPUT TORCH_RESNET_MD

Our fp32 is compared with PyTorch fp32 (TF32 off), tf32 with tf32, bf16 and fp16 with
PyTorch's bf16 autocast; the floor (FLOPs over the matrix rate of that precision) comes
from torch_resnet.md.
"""
import re
import sys


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    ours = {}
    for line in open(sys.argv[1]):
        if line.startswith("result ") and "model=resnet18 " in line:
            kv = dict(f.split("=", 1) for f in line.split()[1:])
            ours[kv["math"]] = float(kv["step_ms"])
    torch = {}  # precision -> (step ms, floor ms)
    for line in open(sys.argv[2]):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 5 and re.match(r"^[0-9.]+$", cells[1]):
            torch[cells[0]] = (float(cells[1]), float(cells[3]))
    peer = {"fp32": "fp32", "tf32": "tf32", "bf16": "bf16 autocast", "fp16": "bf16 autocast"}
    print("| ours | ours ms | PyTorch eager | PyTorch ms | ours/PyTorch time (target <= 1) "
          "| floor ms | floor/ours |")
    print("|---|---|---|---|---|---|---|")
    for math in ("fp32", "tf32", "bf16", "fp16"):
        if math not in ours:
            continue
        name = peer[math]
        step, floor = torch.get(name, (float("nan"), float("nan")))
        print(f"| {math} | {ours[math]:.2f} | {name} | {step:.2f} | {ours[math] / step:.2f} | "
              f"{floor:.2f} | {floor / ours[math]:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
