"""gpu_worker's built-in networks (--model=mlp|lenet|resnet18) as PyTorch modules with the
same state_dict names, so that weights it saved (--save_model) load straight in:

    net = dptrain.models.resnet18()
    net.load_state_dict(dptrain.safetensors.load_file("resnet18.safetensors"))

All take 1 x 28 x 28 images and give 10 logits (d2l's networks; ResNet-18's first block is a
3x3 convolution without pooling, for 28 x 28 inputs)."""

import torch
from torch import nn


def mlp():
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 10))


def lenet():
    return nn.Sequential(nn.Conv2d(1, 6, 5, padding=2), nn.Sigmoid(), nn.AvgPool2d(2, 2),
                         nn.Conv2d(6, 16, 5), nn.Sigmoid(), nn.AvgPool2d(2, 2), nn.Flatten(),
                         nn.Linear(400, 120), nn.Sigmoid(), nn.Linear(120, 84), nn.Sigmoid(),
                         nn.Linear(84, 10))


class Residual(nn.Module):
    """d2l's residual block: two 3x3 convolutions with batch norm, and a 1x1 convolution on
    the shortcut where the shape changes."""

    def __init__(self, in_channels, out_channels, use_1x1conv=False, stride=1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, padding=1, stride=stride)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1)
        self.conv3 = (nn.Conv2d(in_channels, out_channels, 1, stride=stride)
                      if use_1x1conv else None)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.bn2 = nn.BatchNorm2d(out_channels)

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return torch.relu(y + (self.conv3(x) if self.conv3 is not None else x))


def resnet18():
    stages, channels = [], [64, 128, 256, 512]
    for s, out in enumerate(channels):
        first = Residual(channels[s - 1], out, True, 2) if s else Residual(out, out)
        stages.append(nn.Sequential(first, Residual(out, out)))
    return nn.Sequential(
        nn.Sequential(nn.Conv2d(1, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU()), *stages,
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, 10))
