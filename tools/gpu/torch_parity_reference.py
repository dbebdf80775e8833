#!/usr/bin/env python3
"""PyTorch's gradient error at the point gpu_parity_test's ResNetPrecision test wrote
(DPTRAIN_PARITY_FIXTURE_DIR: resnet18.safetensors, images.f32, labels.u8, ours.txt): d2l's
ResNet-18 (dptrain.models, the same state_dict names) on the same weights and batch, one
training step's parameter gradients in float64 on the CPU as the reference, then on the GPU
in strict fp32, TF32, and bf16/fp16 autocast (fp16 with GradScaler's scale of 1024, as the
test's), each as ||g - g64|| / ||g64||. Prints a table beside ours (the test's ours.txt).

usage: torch_parity_reference.py DIR   (PYTHONPATH with the repo's python/ folder)"""

import sys

import numpy as np
import torch
from torch import nn

import dptrain.models
import dptrain.safetensors


def gradient(state, images, labels, device, dtype=torch.float32, autocast=None, scale=1.0):
    net = dptrain.models.resnet18().to(device, dtype)
    net.load_state_dict(state)
    net.train()
    x = images.to(device, dtype)
    y = labels.to(device)
    if autocast is None:
        loss = nn.functional.cross_entropy(net(x), y)
    else:
        with torch.autocast(device_type="cuda", dtype=autocast):
            loss = nn.functional.cross_entropy(net(x), y)
    (loss * scale).backward()
    return torch.cat([p.grad.detach().double().cpu().reshape(-1) / scale
                      for p in net.parameters()])


def main():
    folder = sys.argv[1]
    state = dptrain.safetensors.load_file(f"{folder}/resnet18.safetensors")
    images = torch.from_numpy(np.fromfile(f"{folder}/images.f32", dtype=np.float32).copy())
    labels = torch.from_numpy(np.fromfile(f"{folder}/labels.u8", dtype=np.uint8).copy()).long()
    images = images.reshape(labels.numel(), 1, 28, 28)
    ref = gradient({k: v.double() for k, v in state.items()}, images, labels, "cpu",
                   torch.float64)

    def error(g):
        return float((g - ref).norm() / ref.norm())

    cuda = torch.cuda.is_available()  # Without one (a dry run) only the CPU row is filled.
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    errors = {}
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    errors["fp32"] = error(gradient(state, images, labels, "cuda")) if cuda else float("nan")
    errors["cpu32"] = error(gradient(state, images, labels, "cpu"))
    torch.backends.cudnn.allow_tf32 = True
    torch.backends.cuda.matmul.allow_tf32 = True
    errors["tf32"] = error(gradient(state, images, labels, "cuda")) if cuda else float("nan")
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    if cuda:
        errors["bf16"] = error(gradient(state, images, labels, "cuda", autocast=torch.bfloat16))
        errors["fp16"] = error(gradient(state, images, labels, "cuda", autocast=torch.float16,
                                        scale=1024.0))
    else:
        errors["bf16"] = errors["fp16"] = float("nan")
    ours = {}
    for line in open(f"{folder}/ours.txt"):
        math, deterministic, err = line.split()
        ours[(math, deterministic == "1")] = float(err)
    print(f"ResNet-18 parameter gradients, batch {labels.numel()}, one step from the same "
          f"weights: ||g - g64|| / ||g64||; PyTorch {torch.__version__} on "
          f"{torch.cuda.get_device_name(0) if cuda else 'no GPU'} (cuDNN deterministic)\n")
    print("| math | ours (timed algorithms) | ours (deterministic) | PyTorch | ours det / PyTorch |")
    print("|---|---|---|---|---|")
    print(f"| CPU fp32 | | | {errors['cpu32']:.3g} | |")
    for math in ("fp32", "tf32", "bf16", "fp16"):
        timed, det = ours.get((math, False), float("nan")), ours.get((math, True), float("nan"))
        ratio = det / errors[math] if errors[math] > 0 else float("nan")
        print(f"| {math} | {timed:.3g} | {det:.3g} | {errors[math]:.3g} | {ratio:.2f} |")


if __name__ == "__main__":
    main()
