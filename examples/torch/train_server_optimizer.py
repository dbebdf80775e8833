"""LeNet (ReLU, max pooling) on Fashion-MNIST through the parameter server's own optimizer
(dptrain.torch.ServerOptimizer): each step pushes this rank's gradients and trains on the
weights the shards computed, so the shards' --sync=bsp|ssp|async, schedules and checkpoints
apply, and a rank may run ahead of the others under SSP/async.

usage: deploy/local_cluster.sh --mode=ps --workers=2 --shard_optimizer=adam --lr=0.001 \\
         --sync=async --run -- python3 examples/torch/train_server_optimizer.py \\
         [--epochs=2] [--batch_size=128]

Under async each push lands on weights other ranks moved since this rank pulled. With SGD
and momentum LeNet sometimes stays on its first plateau (test accuracy at chance after 2
epochs in some runs of the test suite); the shards' Adam leaves it within the first epoch."""

import sys
import time

import torch
from torch import nn

from fashion_mnist import batches, lenet, load
import dptrain.torch as dpt

flags = {"epochs": 2, "batch_size": 128, "max_steps": 0}
for arg in sys.argv[1:]:
    key, _, value = arg.lstrip("-").partition("=")
    flags[key] = type(flags[key])(value)

dpt.init()
torch.manual_seed(0)
net = lenet()
optimizer = dpt.ServerOptimizer(net.named_parameters())  # The shards' rate, momentum, sync.
loss_fn = nn.CrossEntropyLoss()
train, test = load("train"), load("t10k")
batch_size = flags["batch_size"]

for epoch in range(flags["epochs"]):
    start, seen, total_loss = time.time(), 0, 0.0
    for step, (X, y) in enumerate(batches(train, batch_size, epoch, dpt.rank(), dpt.size())):
        if flags["max_steps"] and step == flags["max_steps"]:
            break
        optimizer.zero_grad()
        loss = loss_fn(net(X), y)
        loss.backward()
        optimizer.step()
        seen, total_loss = seen + len(y), total_loss + loss.item() * len(y)
    seconds = time.time() - start
    with torch.no_grad():
        accuracy = (net(test[0]).argmax(1) == test[1]).float().mean().item()
    print(f"epoch {epoch + 1}: loss {total_loss / seen:.4f}, test accuracy {accuracy:.4f}, "
          f"{seen / seconds:.0f} images/s, {optimizer.steps} steps", flush=True)
