"""A plain PyTorch training loop (d2l style): LeNet (ReLU, max pooling) on Fashion-MNIST, as a dptrain worker.
train_fashion_mnist_single.py is the same script for one process; `diff` shows the 5 lines.
Each rank trains on its share of every epoch; the global batch is WORLD_SIZE x batch_size.

usage: deploy/local_cluster.sh --mode=allreduce|ps|master --workers=2 --run -- \
         python3 examples/torch/train_fashion_mnist.py [--epochs=2] [--batch_size=128]
Data: Debian's dataset-fashion-mnist (/usr/share/datasets/fashion-mnist) or $DATA_DIR."""

import gzip
import os
import sys
import time

import numpy as np
import torch
from torch import nn
import dptrain.torch as dpt

flags = {"epochs": 2, "batch_size": 128, "lr": 0.05, "max_steps": 0}
for arg in sys.argv[1:]:
    key, _, value = arg.lstrip("-").partition("=")
    flags[key] = type(flags[key])(value)


def load(kind):
    root = os.environ.get("DATA_DIR", "/usr/share/datasets/fashion-mnist")
    with gzip.open(f"{root}/{kind}-images-idx3-ubyte.gz") as f:
        images = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 1, 28, 28)
    with gzip.open(f"{root}/{kind}-labels-idx1-ubyte.gz") as f:
        labels = np.frombuffer(f.read(), np.uint8, offset=8)
    return torch.tensor(images, dtype=torch.float32) / 255, torch.tensor(labels, dtype=torch.long)


def batches(data, batch_size, epoch, rank=0, world=1):
    """Shuffled mini-batches of this rank's share of `data` (the same order on every rank)."""
    order = torch.randperm(len(data[0]), generator=torch.Generator().manual_seed(epoch))
    mine = order[rank::world]
    for i in range(0, len(mine) - batch_size + 1, batch_size):
        yield data[0][mine[i:i + batch_size]], data[1][mine[i:i + batch_size]]


dpt.init()
torch.manual_seed(0)
net = nn.Sequential(nn.Conv2d(1, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2, 2),
                    nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2, 2), nn.Flatten(),
                    nn.Linear(400, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(),
                    nn.Linear(84, 10))
optimizer = torch.optim.SGD(net.parameters(), lr=flags["lr"], momentum=0.9)
optimizer = dpt.DistributedOptimizer(optimizer, named_parameters=net.named_parameters())
dpt.broadcast_parameters(net.state_dict(), root_rank=0)
loss_fn = nn.CrossEntropyLoss()
train, test = load("train"), load("t10k")
batch_size = flags["batch_size"]

for epoch in range(flags["epochs"]):
    start, seen, total_loss = time.time(), 0, 0.0
    net.train()
    for step, (X, y) in enumerate(batches(train, batch_size, epoch, dpt.rank(), dpt.size())):
        if flags["max_steps"] and step == flags["max_steps"]:
            break
        optimizer.zero_grad()
        loss = loss_fn(net(X), y)
        loss.backward()
        optimizer.step()
        seen, total_loss = seen + len(y), total_loss + loss.item() * len(y)
    seconds = time.time() - start
    net.eval()
    with torch.no_grad():
        accuracy = (net(test[0]).argmax(1) == test[1]).float().mean().item()
    print(f"epoch {epoch + 1}: loss {total_loss / seen:.4f}, test accuracy {accuracy:.4f}, "
          f"{seen / seconds:.0f} images/s", flush=True)
