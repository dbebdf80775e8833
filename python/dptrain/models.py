"""gpu_worker's built-in networks (--model=mlp|lenet|resnet18) as PyTorch modules with the
same state_dict names, so that weights it saved (--save_model) load straight in:

    net = dptrain.models.resnet18()
    net.load_state_dict(dptrain.safetensors.load_file("resnet18.safetensors"))

Each is built for the data gpu_worker trained it on, as gpu_worker builds it
(worker/nn/architectures.h): `input` = (channels, height, width) of one image and `classes`;
the default, (1, 28, 28) and 10, is Fashion-MNIST's. For a CIFAR-10 run:
dptrain.models.lenet(input=(3, 32, 32), classes=10). d2l's networks: LeNet needs images of at
least 12 x 12; ResNet-18's first block is a 3x3 convolution without pooling."""

import torch
from torch import nn


FASHION_MNIST = (1, 28, 28)


def _check(name, input, classes):
    c, h, w = input
    if min(c, h, w) < 1 or classes < 2:
        raise ValueError(f"{name}: needs an input of at least 1x1x1 and 2 or more classes, got "
                         f"{input} and {classes} classes")
    return c, h, w


def mlp(input=FASHION_MNIST, classes=10):
    c, h, w = _check("mlp", input, classes)
    return nn.Sequential(nn.Flatten(), nn.Linear(c * h * w, 256), nn.ReLU(),
                         nn.Linear(256, classes))


def lenet(input=FASHION_MNIST, classes=10):
    c, h, w = _check("lenet", input, classes)
    if h < 12 or w < 12:
        raise ValueError(f"lenet needs images of at least 12x12, got {input}")
    flat = 16 * ((h // 2 - 4) // 2) * ((w // 2 - 4) // 2)
    return nn.Sequential(nn.Conv2d(c, 6, 5, padding=2), nn.Sigmoid(), nn.AvgPool2d(2, 2),
                         nn.Conv2d(6, 16, 5), nn.Sigmoid(), nn.AvgPool2d(2, 2), nn.Flatten(),
                         nn.Linear(flat, 120), nn.Sigmoid(), nn.Linear(120, 84), nn.Sigmoid(),
                         nn.Linear(84, classes))


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


def resnet18(input=FASHION_MNIST, classes=10):
    c, _, _ = _check("resnet18", input, classes)
    stages, channels = [], [64, 128, 256, 512]
    for s, out in enumerate(channels):
        first = Residual(channels[s - 1], out, True, 2) if s else Residual(out, out)
        stages.append(nn.Sequential(first, Residual(out, out)))
    return nn.Sequential(
        nn.Sequential(nn.Conv2d(c, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU()), *stages,
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, classes))
