#!/usr/bin/python3
"""PyTorch's end-to-end reference for `gpu_worker` on the same GPU: the d2l training loop
(ResNet-18 for 1x28x28, Xavier-uniform init, SGD lr 0.1, batch 256, Fashion-MNIST), with the
whole data set resident on the GPU (x[perm[i:i+256]]) and the 10k test images evaluated after
every epoch; cudnn.benchmark on. --precision=bf16 trains under bf16 autocast.

Writes one JSON line per epoch and a final one to --metrics_out, in gpu_worker's
--metrics_out format (event, epoch, loss, train_acc, test_acc, images_per_s: training
images over training seconds, seconds: the epoch with its evaluation), so that
tools/gpu/e2e_table.py reads both alike.

usage: torch_e2e.py --data_dir=DIR --metrics_out=FILE [--precision=fp32|bf16] [--epochs=10]
"""
import argparse
import gzip
import json
import os
import sys
import time

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_resnet import resnet18  # noqa: E402  (the same network, one definition)


def read_idx(path, offset):
    with gzip.open(path, "rb") as f:
        return f.read()[offset:]


def load(data_dir, split, device):
    images = read_idx(os.path.join(data_dir, f"{split}-images-idx3-ubyte.gz"), 16)
    labels = read_idx(os.path.join(data_dir, f"{split}-labels-idx1-ubyte.gz"), 8)
    x = torch.frombuffer(bytearray(images), dtype=torch.uint8).view(-1, 1, 28, 28)
    y = torch.frombuffer(bytearray(labels), dtype=torch.uint8).long()
    return x.to(device).float().div_(255), y.to(device)


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data_dir", required=True)
    p.add_argument("--metrics_out", required=True)
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--lr", type=float, default=0.1)
    args = p.parse_args()
    if not torch.cuda.is_available():
        sys.exit("torch_e2e: no CUDA device")
    device = torch.device("cuda")
    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32, as gpu_worker's default.
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)
    x_train, y_train = load(args.data_dir, "train", device)
    x_test, y_test = load(args.data_dir, "t10k", device)
    model = resnet18().to(device)
    for m in model.modules():
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            nn.init.xavier_uniform_(m.weight)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    loss_fn = nn.CrossEntropyLoss()
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=args.precision == "bf16")
    n = x_train.shape[0]
    out = open(args.metrics_out, "w")
    total_train_s, total_images, start = 0.0, 0, time.perf_counter()
    for epoch in range(1, args.epochs + 1):
        model.train()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        perm = torch.randperm(n, device=device)
        loss_sum = torch.zeros((), device=device)
        correct = torch.zeros((), device=device, dtype=torch.long)
        for i in range(0, n, args.batch):
            idx = perm[i:i + args.batch]
            xb, yb = x_train[idx], y_train[idx]
            with autocast:
                logits = model(xb)
                loss = loss_fn(logits, yb)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            loss_sum += loss.detach() * xb.shape[0]
            correct += (logits.argmax(1) == yb).sum()
        torch.cuda.synchronize()
        train_s = time.perf_counter() - t0
        model.eval()
        test_correct = 0
        with torch.no_grad(), autocast:
            for i in range(0, x_test.shape[0], args.batch):
                test_correct += (model(x_test[i:i + args.batch]).argmax(1) ==
                                 y_test[i:i + args.batch]).sum().item()
        seconds = time.perf_counter() - t0
        total_train_s += train_s
        total_images += n
        record = {"event": "epoch", "epoch": epoch, "loss": loss_sum.item() / n,
                  "train_acc": correct.item() / n, "test_acc": test_correct / x_test.shape[0],
                  "images_per_s": n / train_s, "seconds": seconds}
        print(json.dumps(record), file=out, flush=True)
        print(f"torch {args.precision} epoch {epoch}: loss {record['loss']:.4f} "
              f"test_acc {record['test_acc']:.4f} images/s {record['images_per_s']:.0f} "
              f"time {seconds:.2f}s", flush=True)
    print(json.dumps({"event": "final", "epochs": args.epochs, "test_acc": record["test_acc"],
                      "images_per_s": total_images / total_train_s,
                      "seconds": time.perf_counter() - start,
                      "max_memory_reserved": torch.cuda.max_memory_reserved()}),
          file=out, flush=True)


if __name__ == "__main__":
    main()
