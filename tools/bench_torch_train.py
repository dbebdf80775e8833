#!/usr/bin/python3
"""PyTorch peer of gpu_worker's end-to-end CPU training: the same d2l model on the same
Fashion-MNIST data, a plain loop a user would write (preloaded tensors, a fresh permutation per
epoch, the shuffled batch gathered by indexing, zero_grad, forward, cross-entropy, backward,
SGD step). Prints one "result k=v ..." line per process: the last epoch's training images/s
(evaluation excluded, as gpu_worker's epoch images/s) and the peak RSS.

--world_size=N > 1 runs PyTorch DDP with gloo: N processes on this host (each --batch_size
images per step, DistributedSampler-style interleaved shards of every epoch's permutation),
every rank printing its own result line; the job's images/s is the sum.

  /usr/bin/python3 tools/bench_torch_train.py --model=lenet --epochs=2 --threads=2
  LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu/openblas-openmp ...   # OpenMP OpenBLAS
"""
import argparse
import gzip
import os
import resource
import socket
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_torch_compute  # noqa: E402  (the d2l model definitions)


def load_idx(data_dir, train):
    prefix = "train" if train else "t10k"
    with gzip.open(os.path.join(data_dir, f"{prefix}-images-idx3-ubyte.gz")) as f:
        images = np.frombuffer(f.read(), np.uint8, offset=16)
    with gzip.open(os.path.join(data_dir, f"{prefix}-labels-idx1-ubyte.gz")) as f:
        labels = np.frombuffer(f.read(), np.uint8, offset=8)
    return images.reshape(-1, 1, 28, 28).astype(np.float32) / 255.0, labels.astype(np.int64)


def train(args):
    import torch
    from torch import nn

    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    net = bench_torch_compute.build_model(args.model)
    if world > 1:
        import torch.distributed as dist
        dist.init_process_group("gloo", rank=rank, world_size=world)
        net = nn.parallel.DistributedDataParallel(net)
    images, labels = load_idx(args.data_dir, train=True)
    images, labels = torch.from_numpy(images), torch.from_numpy(labels)
    loss_fn = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(net.parameters(), lr=args.lr)
    net.train()
    batch = args.batch_size
    g = torch.Generator()
    rate = 0.0
    for epoch in range(args.epochs):
        g.manual_seed(args.seed + epoch)
        order = torch.randperm(images.shape[0], generator=g)[rank::world]
        steps = order.numel() // batch
        if args.max_steps_per_epoch > 0:
            steps = min(steps, args.max_steps_per_epoch)
        start = time.perf_counter()
        for s in range(steps):
            idx = order[s * batch:(s + 1) * batch]
            x, y = images[idx], labels[idx]
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(net(x), y)
            loss.backward()
            optimizer.step()
        seconds = time.perf_counter() - start
        rate = steps * batch / seconds
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    print(f"result model={args.model} rank={rank} world_size={world} threads="
          f"{torch.get_num_threads()} images_per_s={rate:.1f} maxrss_mib={rss:.1f} "
          f"last_loss={loss.item():.4f}", flush=True)
    if world > 1:
        torch.distributed.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="mlp")
    p.add_argument("--batch_size", type=int, default=256, help="per process")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--max_steps_per_epoch", type=int, default=0)
    p.add_argument("--threads", type=int, default=0,
                   help="torch.set_num_threads per process; 0 leaves PyTorch's default")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--world_size", type=int, default=1, help="> 1: DDP gloo, N processes")
    p.add_argument("--data_dir", default="/usr/share/datasets/fashion-mnist")
    args = p.parse_args()
    if args.world_size <= 1 or "RANK" in os.environ:
        train(args)
        return 0
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
               WORLD_SIZE=str(args.world_size))
    procs = [subprocess.Popen([sys.executable] + sys.argv, env=dict(env, RANK=str(r)))
             for r in range(args.world_size)]
    return max(proc.wait() for proc in procs)


if __name__ == "__main__":
    sys.exit(main())
