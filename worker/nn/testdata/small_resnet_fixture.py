"""Writes small_resnet_fixture.safetensors: a small d2l-style ResNet in PyTorch, one train-mode
step and one eval-mode forward, for resnet_test's PyTorch parity check (which needs no PyTorch).

The network is what BuildResNet({{2, 9, 9}, {4, 8}, 2, 10}) builds: the stem
Sequential(Conv2d(2, 4, 3, padding=1), BatchNorm2d(4), ReLU()), then resnet_block(4, 4, 2,
first_block=True), resnet_block(4, 8, 2) with d2l's Residual, AdaptiveAvgPool2d((1, 1)), Flatten,
Linear(8, 10); 9x9 input, so the stride-2 stage sees odd sizes. Batch-norm weights, biases and
running statistics are randomised so that every term of the batch-norm math is exercised.

Tensors (float32; computed in float64 from float32-rounded weights and inputs):
  <state_dict name>   weights and buffers before the step (num_batches_tracked as F32)
  input [3, 2, 9, 9], labels [3] (class indices as F32), logits [3, 10], loss [1]
  grad.<name>         d(mean cross-entropy)/d(parameter)
  after.<name>        buffers after the train-mode step
  eval_logits [3, 10] eval-mode forward of the same input after the step

Usage (Debian's python3-torch): /usr/bin/python3 worker/nn/testdata/small_resnet_fixture.py
"""
import json
import os
import struct

import torch
from torch import nn

from resnet18_names import resnet_block


def small_resnet():
    b1 = nn.Sequential(nn.Conv2d(2, 4, kernel_size=3, stride=1, padding=1), nn.BatchNorm2d(4),
                       nn.ReLU())
    b2 = nn.Sequential(*resnet_block(4, 4, 2, first_block=True))
    b3 = nn.Sequential(*resnet_block(4, 8, 2))
    return nn.Sequential(b1, b2, b3, nn.AdaptiveAvgPool2d((1, 1)), nn.Flatten(), nn.Linear(8, 10))


def save_safetensors(path, tensors):
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name, t in tensors:
        t = t.detach().to(torch.float32).contiguous()
        blob = struct.pack("<%df" % t.numel(), *t.flatten().tolist())
        header[name] = {"dtype": "F32", "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(blob)]}
        offset += len(blob)
        blobs.append(blob)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def main():
    torch.manual_seed(2024)
    net = small_resnet()
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.5, 0.5)
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 2.0)
                m.num_batches_tracked.fill_(3)
    net = net.to(torch.float32).to(torch.float64)
    x = torch.randn(3, 2, 9, 9, dtype=torch.float32).to(torch.float64)
    labels = torch.tensor([4, 0, 7])
    state = [(k, v.detach().clone()) for k, v in net.state_dict().items()]
    net.train()
    logits = net(x)
    loss = nn.functional.cross_entropy(logits, labels)
    loss.backward()
    params = dict(net.named_parameters())
    net.eval()
    with torch.no_grad():
        eval_logits = net(x)
    tensors = state + [("input", x), ("labels", labels.to(torch.float32)), ("logits", logits),
                       ("loss", loss.reshape(1))]
    tensors += [("grad." + k, p.grad) for k, p in params.items()]
    tensors += [("after." + k, v) for k, v in net.state_dict().items() if k not in params]
    tensors.append(("eval_logits", eval_logits))
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                        "small_resnet_fixture.safetensors")
    save_safetensors(path, tensors)
    print("%s: loss %.6f, %d bytes" % (path, loss.item(), os.path.getsize(path)))


if __name__ == "__main__":
    main()
