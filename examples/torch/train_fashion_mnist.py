"""A plain PyTorch training loop (d2l style): LeNet (ReLU, max pooling) on Fashion-MNIST,
as a dptrain worker.
train_fashion_mnist_single.py is the same script for one process; `diff` shows the 5 lines.
Each rank trains on its share of every epoch; the global batch is WORLD_SIZE x batch_size.

usage: deploy/local_cluster.sh --mode=allreduce|ps|master --workers=2 --run -- \
         python3 examples/torch/train_fashion_mnist.py [--epochs=2] [--batch_size=128]
Data: Debian's dataset-fashion-mnist (/usr/share/datasets/fashion-mnist) or $DATA_DIR."""

import sys
import time

import torch
from torch import nn

from fashion_mnist import batches, lenet, load
import dptrain.torch as dpt

flags = {"epochs": 2, "batch_size": 128, "lr": 0.05, "max_steps": 0}
for arg in sys.argv[1:]:
    key, _, value = arg.lstrip("-").partition("=")
    flags[key] = type(flags[key])(value)

dpt.init()
torch.manual_seed(0)
net = lenet()
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
