#!/usr/bin/python3
"""Writes the PyTorch reference fixtures of worker/nn/pytorch_parity_test.cc.

For each model: the d2l network in PyTorch with fixed random weights, a small fixed random batch,
and PyTorch's logits, mean cross-entropy loss and parameter gradients, saved in the safetensors
format to worker/nn/testdata/<model>_fixture.safetensors:

  <state_dict name>   every entry of model.state_dict() (weights; BN buffers too, once a model
                      has them)
  input               [batch, 1, 28, 28]
  labels              [batch] (class indices, stored as F32)
  logits              [batch, 10]
  loss                [1]
  grad.<name>         d(mean loss)/d(parameter), for every parameter
  after.<name>        every buffer after the train-mode step (none for mlp and lenet)

The file is written with struct + json (no safetensors package), so it also tests that our reader
accepts a header written by independent code. Needs Debian's python3-torch (run it with
/usr/bin/python3); the C++ tests only read the files, they never need PyTorch.

The reference is computed in float64 from float32 weights and inputs, then stored as float32, so
the fixture carries no float32 rounding of PyTorch's own.

Usage: tools/make_fixtures.py [--out_dir=worker/nn/testdata] [model ...]

Adding a model (e.g. resnet18) is one builder function returning (network, input shape) plus an
entry in MODELS; nothing else changes. The forward runs in train mode, like TrainStep, so batch
norm uses batch statistics; the state_dict saved is the one before the step (num_batches_tracked,
an int64 in PyTorch, is stored as F32 like everything else).
"""
import argparse
import json
import os
import struct
import sys

import torch
from torch import nn

BATCH = 4
SEED = 1234


def build_mlp():
    net = nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 10))
    return net, (1, 28, 28)


def build_lenet():
    net = nn.Sequential(
        nn.Conv2d(1, 6, kernel_size=5, padding=2), nn.Sigmoid(),
        nn.AvgPool2d(kernel_size=2, stride=2),
        nn.Conv2d(6, 16, kernel_size=5), nn.Sigmoid(),
        nn.AvgPool2d(kernel_size=2, stride=2),
        nn.Flatten(),
        nn.Linear(16 * 5 * 5, 120), nn.Sigmoid(),
        nn.Linear(120, 84), nn.Sigmoid(),
        nn.Linear(84, 10))
    return net, (1, 28, 28)


# name -> builder returning (nn.Module named like our params(), per-sample input shape).
MODELS = {
    "mlp": build_mlp,
    "lenet": build_lenet,
}


def save_safetensors(path, tensors, metadata):
    """tensors: list of (name, float32 torch tensor). Written back to back, header space-padded
    to a multiple of 8, atomically (temp file + rename)."""
    header = {"__metadata__": metadata}
    offset = 0
    blobs = []
    for name, t in tensors:
        t = t.detach().to(torch.float32).contiguous().cpu()
        blob = struct.pack("<%df" % t.numel(), *t.flatten().tolist())
        header[name] = {"dtype": "F32", "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(blob)]}
        offset += len(blob)
        blobs.append(blob)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for blob in blobs:
            f.write(blob)
    os.replace(tmp, path)


def make_fixture(name, out_dir):
    torch.manual_seed(SEED)
    net, sample_shape = MODELS[name]()
    # Round the float32 initial weights once, then compute everything in float64.
    net = net.to(torch.float32).to(torch.float64)
    net.train()
    x = torch.randn(BATCH, *sample_shape, dtype=torch.float32).to(torch.float64)
    labels = torch.randint(0, 10, (BATCH,))
    # The weights and buffers the step starts from (a train-mode forward updates BN buffers).
    state = [(k, v.detach().clone()) for k, v in net.state_dict().items()]
    logits = net(x)
    loss = nn.functional.cross_entropy(logits, labels)  # Mean over the batch.
    loss.backward()

    params = dict(net.named_parameters())
    tensors = list(state)
    tensors += [("input", x), ("labels", labels.to(torch.float32)), ("logits", logits),
                ("loss", loss.reshape(1))]
    tensors += [("grad." + k, p.grad) for k, p in params.items()]
    # Buffers after the step (BN running statistics), for models that have them.
    tensors += [("after." + k, v) for k, v in net.state_dict().items() if k not in params]
    path = os.path.join(out_dir, "%s_fixture.safetensors" % name)
    save_safetensors(path, tensors, {"format": "pt", "model": name,
                                     "torch": torch.__version__, "seed": str(SEED)})
    print("%s: loss %.6f, %d bytes" % (os.path.normpath(path), loss.item(), os.path.getsize(path)))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    here = os.path.dirname(os.path.abspath(__file__))
    parser.add_argument("--out_dir", default=os.path.join(here, "..", "worker", "nn", "testdata"))
    parser.add_argument("models", nargs="*", default=sorted(MODELS))
    args = parser.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    for name in args.models:
        if name not in MODELS:
            sys.exit("unknown model %r (expected one of %s)" % (name, ", ".join(sorted(MODELS))))
        make_fixture(name, args.out_dir)


if __name__ == "__main__":
    main()
