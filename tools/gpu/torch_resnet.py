#!/usr/bin/python3
"""PyTorch's d2l ResNet-18 (1x28x28, batch 256) training step on this GPU: the reference
our CUDA backend must match or beat (issue: CUDA backend), and the step's floor.

Times forward + CrossEntropyLoss + backward + SGD step with CUDA events (median over
--steps after --warmup; cudnn.benchmark on, as our backend searches algorithms too) in fp32 (TF32 off), TF32, and bf16 autocast (and torch.compile of
fp32 with --compile). The floor: the step's FLOPs (3 x the forward's conv and linear
multiply-adds x 2, counted with hooks) over the matrix rate measured here (an 8192^3 matmul
in the same precision). Writes a Markdown table to --out and prints it.

usage: torch_resnet.py [--out=FILE] [--steps=50] [--warmup=10] [--compile] [--device=cuda]
"""
import argparse
import statistics
import sys
import time

import torch
from torch import nn


def resnet18():
    """d2l's ResNet-18 for 1-channel 28x28 input, as worker/nn/architectures.cc builds it."""
    class Residual(nn.Module):
        def __init__(self, cin, cout, use_1x1conv=False, stride=1):
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, padding=1, stride=stride)
            self.conv2 = nn.Conv2d(cout, cout, 3, padding=1)
            self.conv3 = nn.Conv2d(cin, cout, 1, stride=stride) if use_1x1conv else None
            self.bn1 = nn.BatchNorm2d(cout)
            self.bn2 = nn.BatchNorm2d(cout)

        def forward(self, x):
            y = torch.relu(self.bn1(self.conv1(x)))
            y = self.bn2(self.conv2(y))
            return torch.relu(y + (self.conv3(x) if self.conv3 is not None else x))

    def stage(cin, cout, first):
        blocks = [Residual(cin, cout, use_1x1conv=not first, stride=1 if first else 2),
                  Residual(cout, cout)]
        return nn.Sequential(*blocks)

    return nn.Sequential(
        nn.Sequential(nn.Conv2d(1, 64, 3, stride=1, padding=1), nn.BatchNorm2d(64), nn.ReLU()),
        stage(64, 64, True), stage(64, 128, False), stage(128, 256, False),
        stage(256, 512, False), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, 10))


def forward_flops(model, x):
    total = 0

    def hook(m, inp, out):
        nonlocal total
        if isinstance(m, nn.Conv2d):
            k = m.kernel_size[0] * m.kernel_size[1] * m.in_channels // m.groups
            total += 2 * out.numel() * k
        elif isinstance(m, nn.Linear):
            total += 2 * out.numel() * m.in_features

    handles = [m.register_forward_hook(hook) for m in model.modules()
               if isinstance(m, (nn.Conv2d, nn.Linear))]
    with torch.no_grad():
        model(x)
    for h in handles:
        h.remove()
    return total


def time_it(fn, steps, warmup, device):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(steps):
        if device == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) / 1e3)
        else:
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
    return statistics.median(times)


def matmul_rate(dtype, device, n):
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    s = time_it(lambda: a @ b, 10, 3, device)
    return 2 * n ** 3 / s


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="torch_resnet.md")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--compile", action="store_true")
    p.add_argument("--device", default="cuda")
    a = p.parse_args()
    if a.device == "cuda" and not torch.cuda.is_available():
        print("torch_resnet: no CUDA device here", file=sys.stderr)
        return 2
    dev = a.device
    # Our backend times cuDNN's algorithms once per shape (cudnnFind*); PyTorch gets the same
    # privilege (its fastest eager setting for fixed shapes), done during the warm-up steps.
    torch.backends.cudnn.benchmark = True
    torch.manual_seed(0)
    x = torch.randn(a.batch, 1, 28, 28, device=dev)
    y = torch.randint(0, 10, (a.batch,), device=dev)
    flops = 3 * forward_flops(resnet18().to(dev), x)
    n = 8192 if dev == "cuda" else 512
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    rate = {"fp32": matmul_rate(torch.float32, dev, n)}
    if dev == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        rate["tf32"] = matmul_rate(torch.float32, dev, n)
        rate["bf16"] = matmul_rate(torch.bfloat16, dev, n)
    rows = []
    variants = [("fp32", False, None, False), ("tf32", True, None, False),
                ("bf16 autocast", True, torch.bfloat16, False)]
    if a.compile:
        variants.append(("fp32, torch.compile", False, None, True))
    for name, tf32, amp, compiled in variants:
        if dev != "cuda" and (tf32 or amp is not None):
            continue
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
        model = resnet18().to(dev)
        if compiled:
            model = torch.compile(model)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        loss_fn = nn.CrossEntropyLoss()

        def step():
            opt.zero_grad(set_to_none=True)
            with torch.autocast(dev, dtype=amp, enabled=amp is not None):
                loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()

        s = time_it(step, a.steps, a.warmup, dev)
        r = rate["bf16" if amp is not None else ("tf32" if tf32 else "fp32")]
        rows.append(f"| {name} | {s * 1e3:.2f} | {a.batch / s:.0f} | {flops / r * 1e3:.2f} | "
                    f"{flops / r / s:.2f} |")
    name = torch.cuda.get_device_name() if dev == "cuda" else "cpu"
    text = "\n".join(
        [f"PyTorch {torch.__version__} on {name}: d2l ResNet-18, batch {a.batch}, step = forward"
         f" + loss + backward + SGD, median of {a.steps} (CUDA events). Step FLOPs "
         f"{flops / 1e9:.1f} G; matrix rate measured here (TFLOP/s): " +
         ", ".join(f"{k} {v / 1e12:.0f}" for k, v in rate.items()), "",
         "| precision | step ms | images/s | floor ms (FLOPs / matrix rate) | floor / step |",
         "|---|---|---|---|---|"] + rows) + "\n"
    with open(a.out, "w") as f:
        f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
