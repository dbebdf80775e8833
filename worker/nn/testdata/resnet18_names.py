"""Prints the state_dict keys and shapes of d2l's ResNet-18 for 1x28x28 Fashion-MNIST.

The network is d2l's "modified" ResNet-18 (first block: 3x3 conv, stride 1, no max-pool), built
as a plain nn.Sequential so that its state_dict names are what worker/nn produces. The output is
checked in as resnet18_state_dict.txt, which resnet_test compares against (without PyTorch):

    python3 worker/nn/testdata/resnet18_names.py > worker/nn/testdata/resnet18_state_dict.txt
"""
import torch
from torch import nn
from torch.nn import functional as F


class Residual(nn.Module):  # d2l.Residual, verbatim.
    def __init__(self, input_channels, num_channels, use_1x1conv=False, strides=1):
        super().__init__()
        self.conv1 = nn.Conv2d(input_channels, num_channels, kernel_size=3, padding=1,
                               stride=strides)
        self.conv2 = nn.Conv2d(num_channels, num_channels, kernel_size=3, padding=1)
        if use_1x1conv:
            self.conv3 = nn.Conv2d(input_channels, num_channels, kernel_size=1, stride=strides)
        else:
            self.conv3 = None
        self.bn1 = nn.BatchNorm2d(num_channels)
        self.bn2 = nn.BatchNorm2d(num_channels)

    def forward(self, X):
        Y = F.relu(self.bn1(self.conv1(X)))
        Y = self.bn2(self.conv2(Y))
        if self.conv3:
            X = self.conv3(X)
        Y += X
        return F.relu(Y)


def resnet_block(input_channels, num_channels, num_residuals, first_block=False):
    blk = []
    for i in range(num_residuals):
        if i == 0 and not first_block:
            blk.append(Residual(input_channels, num_channels, use_1x1conv=True, strides=2))
        else:
            blk.append(Residual(num_channels, num_channels))
    return blk


def resnet18():
    b1 = nn.Sequential(nn.Conv2d(1, 64, kernel_size=3, stride=1, padding=1),
                       nn.BatchNorm2d(64), nn.ReLU())
    b2 = nn.Sequential(*resnet_block(64, 64, 2, first_block=True))
    b3 = nn.Sequential(*resnet_block(64, 128, 2))
    b4 = nn.Sequential(*resnet_block(128, 256, 2))
    b5 = nn.Sequential(*resnet_block(256, 512, 2))
    return nn.Sequential(b1, b2, b3, b4, b5, nn.AdaptiveAvgPool2d((1, 1)), nn.Flatten(),
                         nn.Linear(512, 10))


def main():
    net = resnet18()
    params = {name for name, _ in net.named_parameters()}
    num_params = 0
    # One line per state_dict entry: "param|buffer <name> <dim0>x<dim1>..." ("scalar" for 0-d).
    for name, tensor in net.state_dict().items():
        kind = "param" if name in params else "buffer"
        shape = "x".join(str(d) for d in tensor.shape) or "scalar"
        print(kind, name, shape)
        if kind == "param":
            num_params += tensor.numel()
    out = net(torch.zeros(2, 1, 28, 28))
    assert out.shape == (2, 10), out.shape
    print("total_params", num_params)


if __name__ == "__main__":
    main()
