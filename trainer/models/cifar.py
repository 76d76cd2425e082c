"""CIFAR-size image models: He et al.'s CIFAR ResNets, a small VGG, the DEF paper's VGG-16-BN and
TensorFlow's CIFAR-10 tutorial CNN (TernGrad's ``cifar10_alexnet``)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def kaiming_init(module: nn.Module) -> None:
    """He et al. 2015 init for convs (fan-out, as torchvision); BatchNorm to identity."""
    for m in module.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
        elif isinstance(m, nn.BatchNorm2d):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)


class _BasicBlock(nn.Module):
    """Two 3x3 conv-BN layers; option-A shortcut (He et al. 2016, Sec. 4.2).

    Where the block halves the resolution and doubles the channels, the shortcut subsamples the input
    by 2 and zero-pads the new channels, so it adds no parameters.
    """

    def __init__(self, in_planes: int, planes: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.stride = stride
        self.pad_channels = planes - in_planes
        assert self.pad_channels >= 0 and self.pad_channels % 2 == 0

    def shortcut(self, x: Tensor) -> Tensor:
        if self.stride == 1 and self.pad_channels == 0:
            return x
        x = x[:, :, :: self.stride, :: self.stride]
        half = self.pad_channels // 2
        return F.pad(x, (0, 0, 0, 0, half, half))

    def forward(self, x: Tensor) -> Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class CifarResNet(nn.Module):
    """He et al. 2016 CIFAR ResNet (Sec. 4.2): ``depth`` = 6n+2 layers, option-A shortcuts.

    conv 16@3x3 -> 3 stages of n basic blocks (16, 32, 64 channels; stages 2 and 3 start with
    stride 2) -> global average pool -> fc. Registered as ``resnet20`` (n = 3: 269,722 parameters
    with 10 classes; the paper's Table 6: 0.27M) and ``resnet110`` (n = 18: 1,727,962 parameters;
    the paper: 1.7M), counted with ``count_parameters``. Any input size works (global pooling);
    CIFAR's is 32x32.
    """

    def __init__(self, *, num_classes: int, in_channels: int, depth: int = 20) -> None:
        super().__init__()
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 8 or (depth - 2) % 6 != 0:
            raise ValueError(
                f"CIFAR ResNet depth must be 6n+2 with n >= 1 (8, 14, 20, 32, 44, 56, 110, ...), got {depth!r}"
            )
        n = (depth - 2) // 6
        self.depth = depth
        self.stem = nn.Sequential(
            nn.Conv2d(in_channels, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU()
        )
        blocks: list[nn.Module] = []
        in_planes = 16
        for planes, first_stride in ((16, 1), (32, 2), (64, 2)):
            for i in range(n):
                blocks.append(_BasicBlock(in_planes, planes, first_stride if i == 0 else 1))
                in_planes = planes
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(64, num_classes)
        kaiming_init(self)

    def forward(self, x: Tensor) -> Tensor:
        out = self.blocks(self.stem(x))
        return self.fc(out.mean(dim=(2, 3)))


def resnet20(*, num_classes: int, in_channels: int) -> CifarResNet:
    """CIFAR ResNet-20 (``CifarResNet`` with depth 20)."""
    return CifarResNet(num_classes=num_classes, in_channels=in_channels, depth=20)


def resnet110(*, num_classes: int, in_channels: int) -> CifarResNet:
    """CIFAR ResNet-110 (``CifarResNet`` with depth 110), DGC's CIFAR-10 model."""
    return CifarResNet(num_classes=num_classes, in_channels=in_channels, depth=110)


class VGGSmall(nn.Module):
    """A small VGG-style CNN for 32x32 inputs, with BatchNorm.

    conv 64 - conv 64 - pool - conv 128 - conv 128 - pool - conv 256 - pool - fc, every conv 3x3 and
    followed by BatchNorm and ReLU. ``width`` multiplies every channel count (0.125 gives 8-8-16-16-32
    for smoke tests).
    """

    def __init__(self, *, num_classes: int, in_channels: int, image_size: int, width: float = 1.0) -> None:
        super().__init__()
        if width <= 0:
            raise ValueError(f"vgg_small width must be > 0, got {width}")
        if image_size < 8:
            raise ValueError(f"vgg_small needs image_size >= 8 (three 2x poolings), got {image_size}")
        layers: list[nn.Module] = []
        channels = in_channels
        for spec in (64, 64, "pool", 128, 128, "pool", 256, "pool"):
            if spec == "pool":
                layers.append(nn.MaxPool2d(2))
                continue
            assert isinstance(spec, int)
            out = max(1, round(spec * width))
            layers += [nn.Conv2d(channels, out, 3, padding=1, bias=False), nn.BatchNorm2d(out), nn.ReLU()]
            channels = out
        self.features = nn.Sequential(*layers)
        side = image_size // 8
        self.fc = nn.Linear(channels * side * side, num_classes)
        kaiming_init(self)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(torch.flatten(self.features(x), 1))


class VGG16BN(nn.Module):
    """VGG-16 with BatchNorm for 32x32 inputs, the DEF paper's CIFAR-10 model (Xu & Huang 2022;
    their ``models/vgg.py``: 13 conv 3x3 + BN + ReLU in five stages of 64-128-256-512-512 channels,
    each closed by a 2x2 max pool, then dropout - fc 512 - ReLU - dropout - fc 512 - ReLU - fc).
    15.25M parameters for 10 classes."""

    STAGES = ((64, 64), (128, 128), (256, 256, 256), (512, 512, 512), (512, 512, 512))

    def __init__(self, *, num_classes: int, in_channels: int, image_size: int, dropout: float = 0.5) -> None:
        super().__init__()
        if image_size != 32:
            raise ValueError(
                f"vgg16_bn is the CIFAR model (five 2x poolings of 32x32), got image_size {image_size}"
            )
        layers: list[nn.Module] = []
        channels = in_channels
        for stage in self.STAGES:
            for out in stage:
                layers += [nn.Conv2d(channels, out, 3, padding=1), nn.BatchNorm2d(out), nn.ReLU(inplace=True)]
                channels = out
            layers.append(nn.MaxPool2d(2))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(
            nn.Dropout(dropout),
            nn.Linear(512, 512),
            nn.ReLU(inplace=True),
            nn.Dropout(dropout),
            nn.Linear(512, 512),
            nn.ReLU(inplace=True),
            nn.Linear(512, num_classes),
        )
        for module in self.modules():  # the authors' initialisation: He normal (fan-out) convs
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
                assert module.bias is not None
                nn.init.zeros_(module.bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(torch.flatten(self.features(x), 1))


class _MaxPoolSame(nn.Module):
    """Max-pooling with TensorFlow's ``padding='SAME'``: output side ``ceil(n / stride)``.

    TF pads the extra row/column after the input (bottom/right) when the total padding is odd;
    ``nn.MaxPool2d(padding=1)`` pads both sides, which shifts the pooling windows by one pixel.
    """

    def __init__(self, kernel_size: int, stride: int) -> None:
        super().__init__()
        self.kernel_size = kernel_size
        self.stride = stride

    def _pads(self, n: int) -> tuple[int, int]:
        out = (n + self.stride - 1) // self.stride
        total = max((out - 1) * self.stride + self.kernel_size - n, 0)
        return total // 2, total - total // 2

    def forward(self, x: Tensor) -> Tensor:
        top, bottom = self._pads(x.shape[-2])
        left, right = self._pads(x.shape[-1])
        x = F.pad(x, (left, right, top, bottom), value=float("-inf"))
        return F.max_pool2d(x, self.kernel_size, self.stride)


class CifarAlexNet(nn.Module):
    """TensorFlow's CIFAR-10 tutorial CNN, which TernGrad calls ``cifar10_alexnet``.

    As ``wenwei202/terngrad`` ``inception/slim/models.py::cifar10_alexnet`` (the TF tutorial's
    ``cifar10.inference``): conv1 64@5x5 -> max-pool 3/2 -> LRN -> conv2 64@5x5 -> LRN -> max-pool 3/2
    -> fc3 384 -> fc4 192 -> logits, ReLU after every conv and fc but the last; convs and pools use
    TF's ``SAME`` padding, so a side of n becomes ``ceil(ceil(n / 2) / 2)``: 24x24 crops (the
    paper's) reach a 6x6x64 map, 32x32 images an 8x8x64 one. No dropout (the TF model takes a
    ``dropout_keep_prob`` it never uses). LRN: depth radius 4, bias 1, alpha 0.001/9, beta 0.75 (TF's
    ``alpha`` is per element; torch's ``LocalResponseNorm`` divides ``alpha`` by ``size = 9``).

    Init as TF: truncated normal (cut at 2 std) with std 0.05 (convs), 0.04 (fc3, fc4), 1/192
    (logits); biases 0 (conv1, logits) or 0.1 (conv2, fc3, fc4). The TF script applies weight decay
    0.004 only to fc3 and fc4; ``RunConfig.weight_decay`` applies to every parameter.

    Layer names (``conv1``, ``conv2``, ``fc3``, ``fc4``, ``logits``) follow the TF scopes, so that
    TernGrad's ``fp32_layers`` can name them (e.g. ``[logits]``, the TF code's ``--quantize_logits``
    off). Parameters, 10 classes: 1,068,298 at 24x24, 1,756,426 at 32x32 (``count_parameters``).
    """

    def __init__(self, *, num_classes: int, in_channels: int, image_size: int) -> None:
        super().__init__()
        side = (image_size + 3) // 4  # two SAME pools with stride 2: ceil(ceil(n / 2) / 2)
        self.conv1 = nn.Conv2d(in_channels, 64, 5, padding=2)
        self.pool1 = _MaxPoolSame(3, 2)
        self.lrn1 = nn.LocalResponseNorm(9, alpha=0.001, beta=0.75, k=1.0)
        self.conv2 = nn.Conv2d(64, 64, 5, padding=2)
        self.lrn2 = nn.LocalResponseNorm(9, alpha=0.001, beta=0.75, k=1.0)
        self.pool2 = _MaxPoolSame(3, 2)
        self.fc3 = nn.Linear(64 * side * side, 384)
        self.fc4 = nn.Linear(384, 192)
        self.logits = nn.Linear(192, num_classes)
        for layer, std, bias in (
            (self.conv1, 0.05, 0.0),
            (self.conv2, 0.05, 0.1),
            (self.fc3, 0.04, 0.1),
            (self.fc4, 0.04, 0.1),
            (self.logits, 1 / 192, 0.0),
        ):
            assert layer.bias is not None
            nn.init.trunc_normal_(layer.weight, std=std, a=-2 * std, b=2 * std)
            nn.init.constant_(layer.bias, bias)

    def forward(self, x: Tensor) -> Tensor:
        x = self.lrn1(self.pool1(F.relu(self.conv1(x))))
        x = self.pool2(self.lrn2(F.relu(self.conv2(x))))
        x = F.relu(self.fc3(torch.flatten(x, 1)))
        return self.logits(F.relu(self.fc4(x)))
