#!/usr/bin/python3
"""PyTorch peer of //tests/bench:compute_benchmark: steady-state training images/s and peak RSS.

Same models (the d2l definitions), same batch, same step: zero_grad, forward, cross-entropy,
backward, then optimizer.step() of plain SGD (no momentum, no weight decay). Each
(model, threads) point runs in its own process (torch.set_num_threads(t) there); the parent
never imports torch, so its memory does not leak into the child's ru_maxrss. The child's
OpenBLAS and OpenMP pools get t threads too (OPENBLAS_NUM_THREADS, OMP_NUM_THREADS), so that t
threads means t threads of math on both sides.

  /usr/bin/python3 tools/bench_torch_compute.py --models=mlp,lenet --threads=1,2 --csv=torch.csv
"""
import argparse
import os
import resource
import statistics
import subprocess
import sys
import time

COLUMNS = ["model", "threads", "batch", "warmup", "steps", "step_ms", "train_ms", "sgd_ms",
           "images_per_s", "maxrss_mib", "params", "last_loss", "best_images_per_s"]
UNKNOWN_MODEL_EXIT = 3


def build_model(name, c=1, h=28, w=28):
    """The models as gpu_worker builds them for a CxHxW input and 10 classes."""
    from torch import nn

    if name == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(c * h * w, 256), nn.ReLU(),
                             nn.Linear(256, 10))
    if name == "lenet":
        return nn.Sequential(
            nn.Conv2d(c, 6, kernel_size=5, padding=2), nn.Sigmoid(),
            nn.AvgPool2d(kernel_size=2, stride=2),
            nn.Conv2d(6, 16, kernel_size=5), nn.Sigmoid(),
            nn.AvgPool2d(kernel_size=2, stride=2),
            nn.Flatten(),
            nn.Linear(16 * ((h // 2 - 4) // 2) * ((w // 2 - 4) // 2), 120), nn.Sigmoid(),
            nn.Linear(120, 84), nn.Sigmoid(),
            nn.Linear(84, 10))
    if name == "resnet18":
        return resnet18(c)
    return None


def resnet18(c=1):
    """d2l's ResNet-18 for small inputs (the multi-GPU chapter's version), c channels in."""
    from torch import nn
    from torch.nn import functional as F

    class Residual(nn.Module):
        def __init__(self, in_channels, out_channels, use_1x1conv=False, strides=1):
            super().__init__()
            self.conv1 = nn.Conv2d(in_channels, out_channels, kernel_size=3, padding=1,
                                   stride=strides)
            self.conv2 = nn.Conv2d(out_channels, out_channels, kernel_size=3, padding=1)
            self.conv3 = (nn.Conv2d(in_channels, out_channels, kernel_size=1, stride=strides)
                          if use_1x1conv else None)
            self.bn1 = nn.BatchNorm2d(out_channels)
            self.bn2 = nn.BatchNorm2d(out_channels)

        def forward(self, x):
            y = F.relu(self.bn1(self.conv1(x)))
            y = self.bn2(self.conv2(y))
            if self.conv3 is not None:
                x = self.conv3(x)
            return F.relu(y + x)

    def stage(in_channels, out_channels, residuals, first_block=False):
        blocks = []
        for i in range(residuals):
            if i == 0 and not first_block:
                blocks.append(Residual(in_channels, out_channels, use_1x1conv=True, strides=2))
            else:
                blocks.append(Residual(out_channels, out_channels))
        return nn.Sequential(*blocks)

    return nn.Sequential(
        nn.Sequential(nn.Conv2d(c, 64, kernel_size=3, stride=1, padding=1),
                      nn.BatchNorm2d(64), nn.ReLU()),
        stage(64, 64, 2, first_block=True), stage(64, 128, 2), stage(128, 256, 2),
        stage(256, 512, 2),
        nn.AdaptiveAvgPool2d((1, 1)), nn.Flatten(), nn.Linear(512, 10))


def run_one(args, name, threads):
    """The child: one (model, threads) point; prints a "result k=v ..." line."""
    import torch
    from torch import nn

    if threads > 0:  # 0: --default_env, PyTorch's own choice.
        torch.set_num_threads(threads)
    torch.manual_seed(args.seed)
    c, h, w = (int(x) for x in args.input.split("x"))
    net = build_model(name, c, h, w)
    if net is None:
        print(f"skip model={name} reason=unknown model '{name}'", flush=True)
        return UNKNOWN_MODEL_EXIT
    resnet = name == "resnet18"
    warmup = args.resnet18_warmup if resnet else args.warmup
    steps = max(1, args.resnet18_steps if resnet else args.steps)
    batch = args.batch_size
    images = torch.rand(batch, c, h, w)
    labels = torch.randint(0, 10, (batch,))
    net.train()
    loss_fn = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(net.parameters(), lr=args.lr)
    step_s, train_s, sgd_s = [], [], []
    loss = None
    for i in range(warmup + steps):
        t0 = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(net(images), labels)
        loss.backward()
        t1 = time.perf_counter()
        optimizer.step()
        t2 = time.perf_counter()
        if i >= warmup:
            train_s.append(t1 - t0)
            sgd_s.append(t2 - t1)
            step_s.append(t2 - t0)
    step = statistics.median(step_s)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    params = sum(p.numel() for p in net.parameters())
    print(f"result model={name} threads={torch.get_num_threads()} batch={batch} warmup={warmup} steps={steps} "
          f"step_ms={1e3 * step:.3f} train_ms={1e3 * statistics.median(train_s):.3f} "
          f"sgd_ms={1e3 * statistics.median(sgd_s):.3f} images_per_s={batch / step:.1f} "
          f"maxrss_mib={rss:.1f} params={params} last_loss={loss.item():.4f} "
          f"best_images_per_s={batch / min(step_s):.1f}", flush=True)
    return 0


def run_all(args):
    models = [m for m in args.models.split(",") if m]
    threads = [t for t in args.threads.split(",") if t]
    csv = None
    if args.csv:
        fresh = not os.path.exists(args.csv)
        csv = open(args.csv, "a")
        if fresh:
            csv.write(",".join(COLUMNS) + "\n")
    print("PyTorch: zero_grad + forward + backward + SGD step, batch "
          f"{args.batch_size}, median step\n")
    print("| model | threads | step ms | train ms | sgd ms | images/s | peak MiB |")
    print("|---|---|---|---|---|---|---|")
    notes, failures = [], 0
    for model in models:
        for t in threads:
            cmd = [sys.executable, os.path.abspath(__file__), f"--one={model}:{t}",
                   f"--batch_size={args.batch_size}", f"--input={args.input}",
                   f"--warmup={args.warmup}",
                   f"--steps={args.steps}", f"--resnet18_warmup={args.resnet18_warmup}",
                   f"--resnet18_steps={args.resnet18_steps}", f"--lr={args.lr}",
                   f"--seed={args.seed}"]
            # Debian's torch does its dense products in OpenBLAS (BLAS_INFO=generic), whose
            # pthread pool torch.set_num_threads does not reach: without this a "1 thread"
            # point ran every GEMM on 2 threads (mlp: 3.3 ms per step vs 3.6-4.1 ms on one).
            env = dict(os.environ, OPENBLAS_NUM_THREADS=str(t), OMP_NUM_THREADS=str(t))
            if args.default_env:  # What a user gets without tuning anything.
                env, cmd[2] = dict(os.environ), f"--one={model}:0"
            proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, env=env)
            if proc.returncode == UNKNOWN_MODEL_EXIT:
                notes.append(f"skipped {model}: {proc.stdout.strip()}")
                break
            lines = [l for l in proc.stdout.splitlines() if l.startswith("result ")]
            if proc.returncode != 0 or not lines:
                notes.append(f"{model} threads {t}: child failed (exit {proc.returncode})")
                failures += 1
                continue
            kv = dict(f.split("=", 1) for f in lines[-1].split()[1:])
            print(f"| {kv['model']} | {kv['threads']} | {kv['step_ms']} | {kv['train_ms']} | "
                  f"{kv['sgd_ms']} | {kv['images_per_s']} | {kv['maxrss_mib']} |", flush=True)
            if csv:
                csv.write(",".join(kv[c] for c in COLUMNS) + "\n")
                csv.flush()
    for note in notes:
        print(f"\nNote: {note}")
    return 1 if failures else 0


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="mlp,lenet,resnet18")
    p.add_argument("--threads", default="1,2", help="torch.set_num_threads values")
    p.add_argument("--batch_size", type=int, default=256)
    p.add_argument("--input", default="1x28x28", help="one image's CxHxW (3x32x32: CIFAR)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--resnet18_warmup", type=int, default=1)
    p.add_argument("--resnet18_steps", type=int, default=3)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--csv", default="", help="append one CSV row per point (header if new)")
    p.add_argument("--default_env", action="store_true",
                   help="leave the thread settings alone: no set_num_threads, no *_NUM_THREADS")
    p.add_argument("--one", default="", help="internal: model:threads in this process")
    args = p.parse_args()
    if args.one:
        name, threads = args.one.split(":")
        return run_one(args, name, int(threads))
    return run_all(args)


if __name__ == "__main__":
    sys.exit(main())
