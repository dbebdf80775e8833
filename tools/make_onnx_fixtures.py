#!/usr/bin/python3
"""Writes the ONNX fixtures of worker/graph/onnx_import_test.cc: for each model, the model as
PyTorch exports it for training and PyTorch's own loss and gradients of one step from the same
weights, so the C++ tests check the importer and the executor against PyTorch without PyTorch.

For each model <m> (in --out_dir, default worker/graph/testdata):
  <m>.onnx            torch.onnx.export(model, x, FILE, training=TrainingMode.TRAINING,
                      do_constant_folding=False): the initializers are the weights and batch-norm
                      running statistics, named as model.state_dict() names them.
  <m>_reference.safetensors (written with struct + json, no safetensors package):
    state.<name>      every state_dict entry the step starts from (num_batches_tracked as F32)
    input             [batch, 3, 32, 32]
    labels            [batch] class indices (as F32); or, for a regression fixture,
    targets           [batch, outputs] target values
    logits            [batch, classes]
    loss              [1]  mean cross-entropy
    grad.<name>       d(loss)/d(parameter) for every parameter
    after.<name>      every buffer after the train-mode step
    mse_loss, mse_grad.<name>   the same step with nn.MSELoss against one-hot targets
                      (branching only)

The models:
  vgg        VGG-style: Conv/BatchNorm/ReLU/MaxPool features, then Flatten, Linear, ReLU,
             Dropout(0.5), Linear (features.* and classifier.* as torchvision's VGG).
  resnet     torchvision's ResNet layout (conv1 7x7/2 + bn1 + relu + maxpool 3/2, layer1..4 of
             two BasicBlocks each with a 1x1 downsample where the shape changes,
             avgpool, fc), at widths 8, 16, 24, 32 so that the file stays small.
  pooling    AvgPool2d with ceil_mode and count_include_pad=False (ResNet-D's shortcut), with
             ceil_mode alone, MaxPool2d with ceil_mode, nn.LayerNorm over a feature map and
             over a Linear's features (exported with opset 17, as LayerNormalization).
  gated      A MobileNet/EfficientNet-style block: ReLU6 (Clip with constant bounds), a
             depthwise 3x3 and a grouped 1x1 convolution (group 8 and 2), a
             squeeze-and-excitation gate (Mul of [N, C, 1, 1] against [N, C, H, W]),
             LeakyReLU, Sub, Div and Mul by scalars, Add, HardSwish, GELU (exported as Erf
             and arithmetic), MaxPool with ceil_mode, x.mean((2, 3)) (ReduceMean) and a
             log_softmax head.
  elementwise  Element-wise ops users write by hand: GELU's tanh approximation (Pow of 3,
             Mul, Add, Tanh), a softplus written out as relu(z) + log(1 + exp(-|z|)) (Abs, Neg,
             Exp, Add of a scalar, Log), and z / sqrt(z ** 2 + 1) written as
             z * reciprocal(sqrt(z.pow(2) + 1)) (Pow of 2, Sqrt, Reciprocal).
  shuffle    A small ShuffleNetV2 (torchvision's blocks): x.chunk(2, dim=1) (Shape, Gather,
             Add, Div, Mul, Slice: the split point computed from the Shape at run time), the
             channel shuffle (Reshape to 5-D, Transpose, Reshape), depthwise convolutions, and
             a stem BatchNorm2d(eps=1e-3, momentum=0.01) as MobileNetV3's.
  dynamic    shuffle with x.view(x.size(0), -1) before its head, exported with a dynamic
             batch axis (dynamic_axes): every shape is computed from Shape at run time, the
             batch size among them.
  scaled     Tensors of the model as operands of Add, Sub, Mul: a normalising buffer (which
             the test marks as one: the file cannot say), a constant tensor, a positional
             embedding, a layer scale [C, 1, 1], a learned scalar, a bias added to a Linear;
             and a squeeze-and-excitation gate of a Linear, x.unsqueeze(-1).unsqueeze(-1).
  convnext   A small ConvNeXt in torchvision's layout: channels-last regions (permute, layer
             norm written out over the last axis, Linear, GELU, Linear, permute back) that the
             importer moves channels-first, a learned layer scale, LayerNorm2d stem and head.
  norms      GroupNorm (InstanceNormalization of a reshaped value, reshaped back to its
             input's Shape, then the unsqueezed weight and bias), PReLU per channel and shared,
             InstanceNorm2d(affine=True), AdaptiveMaxPool2d(1).
  functional  Functional ops: F.normalize over the channels (ReduceL2, Clip, Expand, Div),
             torch.maximum and torch.minimum (Max, Min), torch.sin and torch.cos, x.std over
             the channels (its divisor folded from ReduceProd of a Shape), F.glu (Split in
             equal halves), k-max pooling (TopK), a masked count clamped by an integer bound.
  shared     Tied weights: a Conv2d + BatchNorm2d applied twice and a square Linear applied
             twice (each initializer read by two nodes; the gradient is the sum of both uses').
  branching  An inception-style block (1x1, 1x1->3x3 and AvgPool2d(3, 1, padding=1)->1x1
             branches joined by torch.cat), tanh(z) + sigmoid(z), a residual Add, MaxPool,
             AdaptiveAvgPool2d(1), x.view(x.size(0), -1), Identity, a bias-free Linear
             (exported as Transpose + MatMul) and x @ w + b with bare parameters (MatMul + Add);
             7 classes.
  attention  A small vision transformer (8x8 patches, a class token, a positional embedding,
             two pre-norm blocks, the head on the class token) with timm's attention: a 5-D
             reshape and permute that move the batch off axis 0, unbind (Split), q @ k^T,
             softmax over the last axis, LayerNorm and Linear on [N, 17, 24] tokens, GELU.
  attention_dynamic  attention exported with a dynamic batch axis.
  mha        The same with nn.MultiheadAttention(batch_first=True): torch exports it
             sequence-first, the batch merged with the heads ([17, B * 3, 8]) and with the
             tokens ([17 * B, 24]).
  mha_dynamic  mha exported with a dynamic batch axis: bsz * num_heads computed from the
             run-time batch size.
  relpos     Patch tokens with a relative-position bias as Swin and BEiT add it (a learned
             table gathered by an int64 index buffer: a value without a batch) and the head on
             the tokens' mean.
  text*, tabular*  The text and tabular fixtures (token ids, feature vectors, several inputs,
             regression targets): described in tools/onnx_fixture_text_models.py.
With --resnet18 (not stored in the repository: about 45 MB) it also writes the full-width
resnet18 in torchvision's layout for a manual check, and with --torchvision=NAME,... the
models of torchvision.models of those names (10 classes, inputs 3x64x64; needs Debian's
python3-torchvision) as tv_<NAME>, e.g. --torchvision=shufflenet_v2_x0_5,mobilenet_v3_small.

Dropout: PyTorch draws its masks from its own generator, which the C++ side does not reproduce,
so the reference step runs with the Dropout modules in eval mode (the identity) and the test
loads the model with dropout off (GraphModelOptions::dropout = false). Everything else runs in
train mode (batch statistics). The reference is computed in float64 from the float32 weights
and inputs that the ONNX file holds, then stored as float32.

Needs Debian's python3-torch (run with /usr/bin/python3, not a pyenv python3).
Usage: tools/make_onnx_fixtures.py [--out_dir=DIR] [--resnet18] [--opset=N] [model ...]
The files outside the repository (the full resnet18, other opsets) are checked by
  bazel test //worker/graph:onnx_import_test --test_env=DPTRAIN_ONNX_FIXTURES=DIR
"""
import argparse
import copy
import os
import sys

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_fixtures import save_safetensors  # noqa: E402  (the same writer as the other fixtures)
from onnx_fixture_vit_models import RelPosViT, ViT  # noqa: E402  (the vision transformers)
from onnx_fixture_text_models import (  # noqa: E402  (the text and tabular models)
    TextClassifier,
    MaskedText,
    TextCNN,
    TextLSTM,
    TextBiGRU,
    TabularMixed,
    TabularRegression,
    TabularTwoInputs,
    TabularTextBag,
    TextTwoInputs,
    TextBag,
    TextPad,
    PackedLSTM,
    PackedGRU,
    TextBiLSTM,
)

BATCH = 4
SEED = 2027
DYNAMIC_TORCHVISION = False  # --dynamic_batch


class VGG(nn.Module):
    """torchvision's VGG layout (features, then classifier) at a small size."""

    def __init__(self, classes=10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(inplace=True),
            nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(inplace=True),
            nn.MaxPool2d(2, 2),
            nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(inplace=True),
            nn.MaxPool2d(2, 2))
        self.classifier = nn.Sequential(
            nn.Flatten(), nn.Linear(16 * 8 * 8, 32), nn.ReLU(inplace=True), nn.Dropout(0.5),
            nn.Linear(32, classes))

    def forward(self, x):
        return self.classifier(self.features(x))


class BasicBlock(nn.Module):
    """torchvision.models.resnet.BasicBlock."""

    def __init__(self, inplanes, planes, stride=1):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = None
        if stride != 1 or inplanes != planes:
            self.downsample = nn.Sequential(
                nn.Conv2d(inplanes, planes, 1, stride, bias=False), nn.BatchNorm2d(planes))

    def forward(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        return self.relu(out + identity)


class ResNet(nn.Module):
    """torchvision.models.resnet.ResNet with BasicBlocks [2, 2, 2, 2] at `widths`."""

    def __init__(self, widths, classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, widths[0], 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(widths[0])
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        inplanes = widths[0]
        for i, planes in enumerate(widths):
            stride = 1 if i == 0 else 2
            layer = nn.Sequential(BasicBlock(inplanes, planes, stride), BasicBlock(planes, planes))
            setattr(self, "layer%d" % (i + 1), layer)
            inplanes = planes
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(inplanes, classes)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))




class Branching(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.ReLU())
        self.b1 = nn.Conv2d(8, 4, 1)
        self.b2 = nn.Sequential(nn.Conv2d(8, 4, 1), nn.ReLU(), nn.Conv2d(4, 6, 3, padding=1))
        self.b3 = nn.Sequential(nn.AvgPool2d(3, stride=1, padding=1), nn.Conv2d(8, 2, 1))
        self.shortcut = nn.Conv2d(8, 12, 1, bias=False)
        self.pool = nn.MaxPool2d(2)
        self.gap = nn.AdaptiveAvgPool2d(1)
        self.idn = nn.Identity()
        self.fc = nn.Linear(12, 16, bias=False)
        self.w = nn.Parameter(torch.randn(16, 7) * 0.3)
        self.b = nn.Parameter(torch.randn(7) * 0.1)

    def forward(self, x):
        s = self.stem(x)
        z = torch.cat([self.b1(s), self.b2(s), self.b3(s)], dim=1)
        z = torch.tanh(z) + torch.sigmoid(z) + self.shortcut(s)
        g = self.gap(self.pool(z))
        g = self.idn(g.view(g.size(0), -1))
        h = torch.relu(self.fc(g))
        return h @ self.w + self.b


class Gated(nn.Module):
    """A MobileNet/EfficientNet-style block: ReLU6 (Clip), a depthwise 3x3 convolution and a
    grouped one, a squeeze-and-excitation gate (x * sigmoid(...) of [N, C, 1, 1]), LeakyReLU,
    and arithmetic with scalars and between activations (Sub, Div by a scalar, Mul by a
    scalar, Add)."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.BatchNorm2d(8),
                                  nn.ReLU6())
        self.depthwise = nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.grouped = nn.Conv2d(8, 8, 1, groups=2, bias=False)
        self.relu6 = nn.ReLU6()
        self.se1 = nn.Conv2d(8, 4, 1)
        self.se2 = nn.Conv2d(4, 8, 1)
        self.conv = nn.Conv2d(8, 8, 3, padding=1)
        self.leaky = nn.LeakyReLU(0.1)
        self.gap = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(8, 10)

    def forward(self, x):
        s = self.stem(x)
        s = self.grouped(self.relu6(self.depthwise(s)))
        g = torch.sigmoid(self.se2(torch.relu(self.se1(self.gap(s)))))
        s = s * g
        t = self.leaky(self.conv(s))
        z = (t - s) / 2.0 + 0.5 * s
        z = nn.functional.hardswish(z) + nn.functional.gelu(z)
        z = nn.functional.max_pool2d(z, 3, 2, ceil_mode=True)  # 16x16 -> 8x8 (floor: 7x7).
        # Log-probabilities, as PyTorch's MNIST example ends (with nll_loss): cross-entropy on
        # them is that nll_loss.
        return torch.log_softmax(self.fc(z.mean((2, 3))), dim=1)


class Pooling(nn.Module):
    """ResNet-D/Inception-style pooling and a LayerNorm head: AvgPool2d with ceil_mode and
    count_include_pad=False, with ceil_mode and padding, MaxPool with ceil_mode, then
    Linear + LayerNorm (exported as LayerNormalization: opset 17) + ReLU + Linear, and a
    LayerNorm over a whole [C, H, W] feature map."""

    def __init__(self, classes=10):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.pool1 = nn.AvgPool2d(3, 2, padding=1, ceil_mode=True, count_include_pad=False)
        self.pool2 = nn.AvgPool2d(2, 2, ceil_mode=True)
        self.pool3 = nn.MaxPool2d(2, 2, ceil_mode=True)
        self.norm_map = nn.LayerNorm([8, 5, 5])
        self.fc1 = nn.Linear(8 * 5 * 5, 24)
        self.norm = nn.LayerNorm(24)
        self.fc2 = nn.Linear(24, classes)

    def forward(self, x):
        z = torch.relu(self.conv(x))                      # 32x32
        z = self.pool3(self.pool2(self.pool1(z)))          # 17x17 -> 9x9 -> 5x5 (ceil)
        z = self.norm_map(z).flatten(1)
        return self.fc2(torch.relu(self.norm(self.fc1(z))))


class Shared(nn.Module):
    """Tied weights: one Conv2d (with its BatchNorm) applied twice, a square Linear applied
    twice; PyTorch's export reads each of their initializers from two nodes."""

    def __init__(self, classes=10):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.block = nn.Conv2d(8, 8, 3, padding=1)
        self.norm = nn.BatchNorm2d(8)
        self.square = nn.Linear(16, 16)
        self.head = nn.Linear(8 * 4 * 4, 16)
        self.out = nn.Linear(16, classes)

    def forward(self, x):
        z = torch.relu(self.stem(x))
        z = nn.functional.max_pool2d(torch.relu(self.norm(self.block(z))), 2)   # 16x16
        z = nn.functional.max_pool2d(torch.relu(self.norm(self.block(z))), 4)   # 4x4, same block
        z = torch.tanh(self.head(z.flatten(1)))
        z = torch.tanh(self.square(torch.tanh(self.square(z))))                  # applied twice
        return self.out(z)


class Elementwise(nn.Module):
    """GELU (tanh), a hand-written softplus and a hand-written x / sqrt(x^2 + 1): Pow, Tanh,
    Abs, Neg, Exp, Log, Sqrt, Reciprocal between a Conv2d and two Linears."""

    def __init__(self, classes=10):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.fc1 = nn.Linear(8 * 8 * 8, 24)
        self.fc2 = nn.Linear(24, classes)

    def forward(self, x):
        z = nn.functional.gelu(self.conv(x), approximate="tanh")
        z = nn.functional.max_pool2d(z, 4)                                  # 8x8
        z = torch.relu(z) + torch.log(1 + torch.exp(-torch.abs(z)))        # softplus
        h = self.fc1(z.flatten(1))
        h = h * torch.reciprocal(torch.sqrt(h.pow(2) + 1))
        return self.fc2(h)


def channel_shuffle(x, groups):
    """torchvision.models.shufflenetv2.channel_shuffle."""
    n, c, h, w = x.size()
    x = x.view(n, groups, c // groups, h, w)
    x = torch.transpose(x, 1, 2).contiguous()
    return x.view(n, -1, h, w)


class ShuffleBlock(nn.Module):
    """torchvision's ShuffleNetV2 InvertedResidual: stride 2 runs both branches on the whole
    input; stride 1 splits it with x.chunk(2, dim=1) and runs branch 2 on the second half."""

    def __init__(self, inp, oup, stride):
        super().__init__()
        self.stride = stride
        half = oup // 2
        if stride > 1:
            self.branch1 = nn.Sequential(
                nn.Conv2d(inp, inp, 3, stride, 1, groups=inp, bias=False), nn.BatchNorm2d(inp),
                nn.Conv2d(inp, half, 1, bias=False), nn.BatchNorm2d(half), nn.ReLU(inplace=True))
        branch_in = inp if stride > 1 else half
        self.branch2 = nn.Sequential(
            nn.Conv2d(branch_in, half, 1, bias=False), nn.BatchNorm2d(half), nn.ReLU(inplace=True),
            nn.Conv2d(half, half, 3, stride, 1, groups=half, bias=False), nn.BatchNorm2d(half),
            nn.Conv2d(half, half, 1, bias=False), nn.BatchNorm2d(half), nn.ReLU(inplace=True))

    def forward(self, x):
        if self.stride == 1:
            x1, x2 = x.chunk(2, dim=1)
            out = torch.cat((x1, self.branch2(x2)), dim=1)
        else:
            out = torch.cat((self.branch1(x), self.branch2(x)), dim=1)
        return channel_shuffle(out, 2)


class Shuffle(nn.Module):
    """A small ShuffleNetV2 with MobileNetV3's batch-norm settings in its stem."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Sequential(nn.Conv2d(3, 12, 3, 2, 1, bias=False),
                                   nn.BatchNorm2d(12, eps=1e-3, momentum=0.01),
                                   nn.ReLU(inplace=True))
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        self.stage = nn.Sequential(ShuffleBlock(12, 16, 2), ShuffleBlock(16, 16, 1))
        self.fc = nn.Linear(16, 10)

    def forward(self, x):
        x = self.stage(self.maxpool(self.conv1(x)))
        return self.fc(x.mean((2, 3)))


class Scaled(nn.Module):
    """Tensors of the model as operands of arithmetic: a normalising buffer (x - self.mean,
    kept fixed: the test names it as a buffer), a constant tensor of the forward code, a learned
    positional embedding (added), ConvNeXt's layer scale ([C, 1, 1] parameter, multiplied),
    ReZero's learned scalar, and a bias added to a bias-free Linear's output."""

    def __init__(self):
        super().__init__()
        self.register_buffer("mean", torch.tensor([0.1, -0.2, 0.3]).view(3, 1, 1))
        self.pos = nn.Parameter(torch.randn(1, 8, 16, 16) * 0.1)
        self.conv1 = nn.Conv2d(3, 8, 3, stride=2, padding=1)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.gamma = nn.Parameter(torch.rand(8, 1, 1) + 0.5)
        self.alpha = nn.Parameter(torch.tensor(0.3))
        self.se = nn.Linear(8, 8)
        self.fc = nn.Linear(8, 10, bias=False)
        self.bias = nn.Parameter(torch.randn(10) * 0.1)

    def forward(self, x):
        x = (x - self.mean) * torch.tensor([1.0, 2.0, 0.5]).view(3, 1, 1)
        h = torch.relu(self.conv1(x)) + self.pos
        h = h + self.alpha * (self.gamma * torch.relu(self.conv2(h)))
        # A squeeze-and-excitation gate written with a Linear and unsqueeze.
        g = torch.sigmoid(self.se(h.mean((2, 3)))).unsqueeze(-1).unsqueeze(-1)
        h = h * g
        return self.fc(h.mean((2, 3))) + self.bias


class LayerNorm2d(nn.LayerNorm):
    """torchvision.models.convnext.LayerNorm2d: a LayerNorm over each pixel's channels."""

    def forward(self, x):
        x = x.permute(0, 2, 3, 1)
        x = nn.functional.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
        return x.permute(0, 3, 1, 2)


class CNBlock(nn.Module):
    """torchvision's ConvNeXt block (without stochastic depth): depthwise 7x7, then channels
    last: LayerNorm, Linear, GELU, Linear; back channels first, a layer scale, the residual."""

    def __init__(self, dim):
        super().__init__()
        self.block = nn.Sequential(
            nn.Conv2d(dim, dim, 7, padding=3, groups=dim),
            Permute([0, 2, 3, 1]), nn.LayerNorm(dim, eps=1e-6), nn.Linear(dim, 4 * dim),
            nn.GELU(), nn.Linear(4 * dim, dim), Permute([0, 3, 1, 2]))
        self.layer_scale = nn.Parameter(torch.rand(dim, 1, 1) * 0.5 + 0.25)

    def forward(self, x):
        return self.layer_scale * self.block(x) + x


class Permute(nn.Module):
    def __init__(self, dims):
        super().__init__()
        self.dims = dims

    def forward(self, x):
        return torch.permute(x, self.dims)


class ConvNeXt(nn.Module):
    """A small ConvNeXt in torchvision's layout: a 4x4/4 stem with LayerNorm2d, a block, a
    LayerNorm2d + 2x2/2 downsampling, a block, average pooling and a LayerNorm2d head."""

    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Sequential(nn.Conv2d(3, 8, 4, stride=4), LayerNorm2d(8, eps=1e-6)), CNBlock(8),
            nn.Sequential(LayerNorm2d(8, eps=1e-6), nn.Conv2d(8, 16, 2, stride=2)), CNBlock(16))
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(LayerNorm2d(16, eps=1e-6), nn.Flatten(1),
                                        nn.Linear(16, 10))

    def forward(self, x):
        return self.classifier(self.avgpool(self.features(x)))


class Norms(nn.Module):
    """GroupNorm (exported as InstanceNormalization over [N, G, C/G * H * W], Reshape back to
    the Shape of its input, then the unsqueezed weight and bias), nn.PReLU per channel and
    shared, nn.InstanceNorm2d(affine=True), AdaptiveMaxPool2d(1)."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, stride=2, padding=1)
        self.gn = nn.GroupNorm(2, 8)
        self.prelu = nn.PReLU(8)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.inorm = nn.InstanceNorm2d(8, affine=True)
        self.prelu_shared = nn.PReLU()
        self.pool = nn.AdaptiveMaxPool2d(1)
        self.fc = nn.Linear(8, 10)
        with torch.no_grad():
            for m in (self.gn, self.inorm):
                m.weight.uniform_(0.5, 1.5)
                m.bias.normal_(0, 0.1)

    def forward(self, x):
        h = self.prelu(self.gn(self.conv1(x)))
        h = self.prelu_shared(self.inorm(self.conv2(h)))
        return self.fc(torch.flatten(self.pool(h), 1))


class Functional(nn.Module):
    """F.normalize, torch.maximum/minimum, sin and cos, x.std(dim), F.glu and an integer
    clamp."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, stride=2, padding=1)
        self.fc = nn.Linear(8, 10)

    def forward(self, x):
        h = self.conv(x)
        a = nn.functional.normalize(h, dim=1)
        b = torch.maximum(torch.minimum(a, 0.5 * torch.sin(h)), -0.5 * torch.cos(h))
        s = h.std(dim=1, keepdim=True)
        y = (b * s + a).mean((2, 3))
        g = nn.functional.glu(h, dim=1).mean((2, 3))  # Split in equal halves.
        k = h.flatten(2).topk(3, dim=-1).values.mean(-1)  # k-max pooling: TopK's values.
        y = torch.cat([y[:, :4] + g, y[:, 4:]], 1) + k
        count = (h.mean((2, 3)) != 0).sum(1, keepdim=True).clamp(min=1)  # Integers: 8 each.
        return self.fc(y / count.to(y.dtype))


class DynamicShuffle(Shuffle):
    """Shuffle with x.view(x.size(0), -1) before its head, exported with a dynamic batch axis:
    the shapes of the view, the chunks and the shuffles come from Shape at run time."""

    def __init__(self):
        super().__init__()
        self.pool = nn.AvgPool2d(2)
        self.fc = nn.Linear(16 * 2 * 2, 10)

    def forward(self, x):
        x = self.pool(self.stage(self.maxpool(self.conv1(x))))
        return self.fc(x.view(x.size(0), -1))


# name -> () -> (module, classes)
MODELS = {
    "text_bigru": lambda: (TextBiGRU(), 5),
    "text_bilstm": lambda: (TextBiLSTM(), 5),
    "text_lstm": lambda: (TextLSTM(), 5),
    "text_lstm_dynamic": lambda: (TextLSTM(), 5),
    "text_lstm_packed": lambda: (PackedLSTM(), 5),
    "text_bag": lambda: (TextBag(), 5),
    "tabular_mixed": lambda: (TabularMixed(), 5),
    "tabular_regression": lambda: (TabularRegression(), 3),
    "text_two_inputs": lambda: (TextTwoInputs(), 5),
    "tabular_two_inputs": lambda: (TabularTwoInputs(), 5),
    "tabular_text_bag": lambda: (TabularTextBag(), 5),
    "tabular_text_bag_dynamic": lambda: (TabularTextBag(), 5),
    "text_pad": lambda: (TextPad(), 5),
    "text_bag_dynamic": lambda: (TextBag(), 5),
    "text_gru_packed": lambda: (PackedGRU(), 5),
    "text_cnn": lambda: (TextCNN(), 5),
    "text_mask": lambda: (MaskedText(), 5),
    "text": lambda: (TextClassifier(), 5),
    "attention": lambda: (ViT(mha=False), 10),
    "attention_dynamic": lambda: (ViT(mha=False), 10),
    "mha": lambda: (ViT(mha=True), 10),
    "mha_dynamic": lambda: (ViT(mha=True), 10),
    "relpos": lambda: (RelPosViT(), 10),
    "vgg": lambda: (VGG(), 10),
    "resnet": lambda: (ResNet([8, 16, 24, 32]), 10),
    "branching": lambda: (Branching(), 7),
    "gated": lambda: (Gated(), 10),
    "pooling": lambda: (Pooling(), 10),
    "shared": lambda: (Shared(), 10),
    "elementwise": lambda: (Elementwise(), 10),
    "shuffle": lambda: (Shuffle(), 10),
    "dynamic": lambda: (DynamicShuffle(), 10),
    "scaled": lambda: (Scaled(), 10),
    "convnext": lambda: (ConvNeXt(), 10),
    "norms": lambda: (Norms(), 10),
    "functional": lambda: (Functional(), 10),
}

# Models whose input is token ids, not images: name -> (vocabulary, tokens per sample).
ID_INPUTS = {"text": (50, 12), "text_mask": (50, 12), "text_cnn": (50, 12),
             "text_lstm": (50, 12), "text_bigru": (50, 12), "text_bilstm": (50, 12),
             "text_lstm_dynamic": (50, 12), "text_lstm_packed": (50, 12),
             "text_gru_packed": (50, 12), "text_bag": (50, 12), "text_bag_dynamic": (50, 12),
             "text_pad": (50, 12)}
# Of those, models whose samples end in padding (id 0): sample i keeps 12 - 3 i real tokens,
# or, for packed sequences, the lengths given (unsorted: the export's sort is exercised).
PADDED = {"text_mask", "text_lstm_packed", "text_gru_packed", "text_pad"}
PADDED_LENGTHS = {"text_lstm_packed": [6, 12, 3, 9], "text_gru_packed": [9, 3, 12, 6]}
# Models whose ops need a later opset than the exporter's default (LayerNormalization: 17).
MIN_OPSET = {"pooling": 17, "attention": 17, "attention_dynamic": 17, "mha": 17,
             "mha_dynamic": 17, "relpos": 17, "text": 17, "text_mask": 17}
# Models of several inputs: their names (the reference's input is their columns side by side).
MULTI_INPUT = {"text_two_inputs": ["input_ids", "attention_mask"],
               "tabular_two_inputs": ["numeric", "codes"],
               "tabular_text_bag": ["ids", "extra"], "tabular_text_bag_dynamic": ["ids", "extra"]}
# Fixtures whose batch has target values (regression) rather than labels.
REGRESSION = {"tabular_regression"}
# Models exported with a dynamic batch axis (dynamic_axes={input: {0: "batch"}}).
DYNAMIC_BATCH = {"tabular_text_bag_dynamic", "dynamic", "attention_dynamic", "mha_dynamic", "text_lstm_dynamic",
                 "text_gru_packed", "text_bag_dynamic"}


def randomize_batch_norms(net):
    """Non-trivial affine parameters and running statistics, so every term is exercised."""
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.weight.uniform_(0.5, 1.5)
                m.bias.normal_(0, 0.1)
                m.running_mean.normal_(0, 0.1)
                m.running_var.uniform_(0.5, 1.5)


def reference_step(net, x, loss_fn):
    """One train-mode step in float64 (dropout off) with loss_fn(logits); returns (net64,
    logits, loss)."""
    net64 = copy.deepcopy(net).to(torch.float64)
    net64.train()
    for m in net64.modules():
        if isinstance(m, nn.Dropout):
            m.eval()
    xs = x if isinstance(x, tuple) else (x,)  # A model of several inputs gets them all.
    logits = net64(*(t.to(torch.float64) if t.is_floating_point() else t for t in xs))
    loss = loss_fn(logits)
    loss.backward()
    return net64, logits, loss


def float32_loss(net, x, loss_fn):
    """PyTorch's own float32 loss of the same train-mode step (dropout off): how far float32
    arithmetic alone takes a deep network's loss from the float64 reference, which the C++
    test allows its float model too."""
    net32 = copy.deepcopy(net)
    net32.train()
    for m in net32.modules():
        if isinstance(m, nn.Dropout):
            m.eval()
    with torch.no_grad():
        return loss_fn(net32(*(x if isinstance(x, tuple) else (x,))))


# Inputs of the --torchvision models: 64x64, but where a model needs more: Inception v3's
# stem needs at least 75x75, and AlexNet's and VGG's adaptive pooling exports only from a
# multiple of its output size (6x6, 7x7: 224x224 gives exactly that).
TORCHVISION_SIZE = {"inception_v3": 96, "alexnet": 224, "vgg11": 224, "vgg11_bn": 224,
                    "vit_b_16": 224, "vit_b_32": 224, "maxvit_t": 224}


def torchvision_model(name):
    """torchvision.models.<name> with 10 classes (GoogLeNet and Inception without their
    auxiliary heads, whose extra outputs a one-output graph cannot return; EfficientNet and
    ConvNeXt without stochastic depth, whose random drop torch 1.13 cannot export for
    training)."""
    import torchvision.models  # Only here: the repository's fixtures do not need it.
    kwargs = {"num_classes": 10}
    if name in ("googlenet", "inception_v3"):
        kwargs.update(aux_logits=False, init_weights=False)
    if name.startswith(("efficientnet", "convnext")):
        kwargs.update(stochastic_depth_prob=0.0)
    net = getattr(torchvision.models, name)(**kwargs)
    # Swin and MaxViT set their own rate: their StochasticDepth modules are turned off instead.
    from torchvision.ops import StochasticDepth
    for m in net.modules():
        if isinstance(m, StochasticDepth):
            m.p = 0.0
    return net, 10


def make_fixture(name, out_dir, opset):
    torch.manual_seed(SEED)
    size = 32
    if name == "resnet18":
        net, classes = ResNet([64, 128, 256, 512]), 10
    elif name.startswith("tv_"):
        (net, classes), size = torchvision_model(name[3:]), TORCHVISION_SIZE.get(name[3:], 64)
    else:
        net, classes = MODELS[name]()
    net = net.to(torch.float32)
    randomize_batch_norms(net)
    net.train()
    if name in ID_INPUTS:
        vocab, length = ID_INPUTS[name]
        x = torch.randint(0, vocab, (BATCH, length))
        if name in PADDED:
            x = torch.randint(1, vocab, (BATCH, length))
            for i in range(BATCH):
                x[i, PADDED_LENGTHS[name][i] if name in PADDED_LENGTHS else length - 3 * i:] = 0
    elif name == "tabular_mixed":  # Two category codes (floats), four continuous features.
        x = torch.cat([torch.randint(0, 7, (BATCH, 2)).float(), torch.randn(BATCH, 4)], 1)
    elif name == "tabular_regression":
        x = torch.randn(BATCH, 6)
    elif name == "text_two_inputs":  # input_ids and attention_mask (1: a token, 0: padding).
        lengths = torch.tensor([12, 7, 3, 10])
        mask = (torch.arange(12)[None, :] < lengths[:, None]).long()
        x = (torch.randint(1, 50, (BATCH, 12)) * mask, mask)
    elif name.startswith("tabular_text_bag"):  # Ids and float features.
        x = (torch.randint(0, 50, (BATCH, 12)), torch.randn(BATCH, 3))
    elif name == "tabular_two_inputs":  # Continuous features and category codes.
        x = (torch.randn(BATCH, 4), torch.stack([torch.randint(0, 10, (BATCH,)),
                                                 torch.randint(0, 7, (BATCH,))], 1))
    else:
        x = torch.randn(BATCH, 3, size, size, dtype=torch.float32)
    labels = torch.randint(0, classes, (BATCH,))
    # Regression: target values, one per output, scored by nn.MSELoss (and nn.L1Loss).
    targets = torch.randn(BATCH, classes) if name in REGRESSION else None

    # Exporting traces a train-mode forward pass, which moves the batch-norm running statistics
    # before the initializers are written: the reference starts from the module as exported
    # (the C++ test checks that its state equals the file's initializers).
    onnx_path = os.path.join(out_dir, "%s.onnx" % name)
    dynamic = name in DYNAMIC_BATCH or (name.startswith("tv_") and DYNAMIC_TORCHVISION)
    names = MULTI_INPUT.get(name, ["input"])
    torch.onnx.export(net, x, onnx_path, training=torch.onnx.TrainingMode.TRAINING,
                      do_constant_folding=False,
                      opset_version=opset if opset is not None else MIN_OPSET.get(name),
                      input_names=names,
                      dynamic_axes={n: {0: "batch"} for n in names} if dynamic else None)
    # The trace also counted a batch in num_batches_tracked, which the file does not hold (the
    # importer starts it at 0): start the reference from 0 too.
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.num_batches_tracked.zero_()

    state = [(k, v.detach().clone()) for k, v in net.state_dict().items()]
    if targets is None:
        loss_fn = lambda y: nn.functional.cross_entropy(y, labels)  # noqa: E731
        scored = [("labels", labels.to(torch.float32))]
    else:
        loss_fn = lambda y: nn.functional.mse_loss(y, targets.to(y.dtype))  # noqa: E731
        scored = [("targets", targets)]
    loss32 = float32_loss(net, x, loss_fn)
    net64, logits, loss = reference_step(net, x, loss_fn)
    params = dict(net64.named_parameters())
    tensors = [("state." + k, v) for k, v in state]
    # Several inputs: their columns side by side, as the importer takes them.
    joined = torch.cat([t.to(torch.float32) for t in x], 1) if isinstance(x, tuple) else x
    tensors += [("input", joined.to(torch.float32))] + scored + [
                ("logits", logits),
                ("loss", loss.reshape(1)), ("float32_loss", loss32.reshape(1))]
    tensors += [("grad." + k, p.grad) for k, p in params.items()]
    tensors += [("after." + k, v) for k, v in net64.state_dict().items() if k not in params]
    if name == "branching":
        one_hot = nn.functional.one_hot(labels, classes).to(torch.float64)
        net64, _, mse = reference_step(net, x, lambda y: nn.functional.mse_loss(y, one_hot))
        tensors += [("mse_loss", mse.reshape(1))]
        tensors += [("mse_grad." + k, p.grad) for k, p in net64.named_parameters()]
    if targets is not None:
        net64, _, l1 = reference_step(
            net, x, lambda y: nn.functional.l1_loss(y, targets.to(torch.float64)))
        tensors += [("l1_loss", l1.reshape(1))]
        tensors += [("l1_grad." + k, p.grad) for k, p in net64.named_parameters()]
        # Multi-label targets: probabilities, some exactly 0 or 1.
        probabilities = torch.rand(BATCH, classes)
        probabilities[0, 0], probabilities[1, 1] = 0.0, 1.0
        net64, _, bce = reference_step(
            net, x, lambda y: nn.functional.binary_cross_entropy_with_logits(
                y, probabilities.to(torch.float64)))
        tensors += [("bce_targets", probabilities), ("bce_loss", bce.reshape(1))]
        tensors += [("bce_grad." + k, p.grad) for k, p in net64.named_parameters()]
        # The outputs as classes: nn.CrossEntropyLoss(weight=w, label_smoothing=0.1).
        weights = torch.tensor([0.5, 2.0, 0.0][:classes], dtype=torch.float64)
        net64, _, weighted = reference_step(
            net, x, lambda y: nn.functional.cross_entropy(y, labels, weight=weights,
                                                          label_smoothing=0.1))
        tensors += [("class_labels", labels.to(torch.float32)), ("class_weights", weights),
                    ("weighted_loss", weighted.reshape(1))]
        tensors += [("weighted_grad." + k, p.grad) for k, p in net64.named_parameters()]
    ref_path = os.path.join(out_dir, "%s_reference.safetensors" % name)
    save_safetensors(ref_path, tensors, {"model": name, "torch": torch.__version__,
                                         "seed": str(SEED)})
    print("%s: loss %.6f; %d + %d bytes" % (name, loss.item(), os.path.getsize(onnx_path),
                                           os.path.getsize(ref_path)))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    here = os.path.dirname(os.path.abspath(__file__))
    parser.add_argument("--out_dir",
                        default=os.path.join(here, "..", "worker", "graph", "testdata"))
    parser.add_argument("--resnet18", action="store_true",
                        help="also write the full-width resnet18 (about 45 MB; not for the repo)")
    parser.add_argument("--opset", type=int, default=None,
                        help="ONNX opset to export (default: torch's, 14 for torch 1.13)")
    parser.add_argument("--torchvision", default="",
                        help="also write these torchvision.models (comma-separated names)")
    parser.add_argument("--dynamic_batch", action="store_true",
                        help="export the --torchvision models with a dynamic batch axis")
    parser.add_argument("models", nargs="*", default=None)
    args = parser.parse_args()
    global DYNAMIC_TORCHVISION
    DYNAMIC_TORCHVISION = args.dynamic_batch
    os.makedirs(args.out_dir, exist_ok=True)
    models = args.models if args.models or args.resnet18 or args.torchvision else sorted(MODELS)
    for name in models:
        if name not in MODELS:
            sys.exit("unknown model %r (expected one of %s)" % (name, ", ".join(sorted(MODELS))))
        make_fixture(name, args.out_dir, args.opset)
    if args.resnet18:
        make_fixture("resnet18", args.out_dir, args.opset)
    for name in filter(None, args.torchvision.split(",")):
        make_fixture("tv_" + name, args.out_dir, args.opset)


if __name__ == "__main__":
    main()
