"""What the examples share: Fashion-MNIST from Debian's dataset-fashion-mnist
(/usr/share/datasets/fashion-mnist, or $DATA_DIR, read with gzip and numpy) and LeNet."""

import gzip
import os

import numpy as np
import torch
from torch import nn


def load(kind):
    """(images N x 1 x 28 x 28 in [0, 1], labels N) of "train" or "t10k"."""
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


def lenet():
    """LeNet-5 with ReLU and max pooling (d2l's, modernised), for 1 x 28 x 28 images."""
    return nn.Sequential(nn.Conv2d(1, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2, 2),
                         nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2, 2), nn.Flatten(),
                         nn.Linear(400, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(),
                         nn.Linear(84, 10))
