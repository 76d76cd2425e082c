"""Models shared by several papers, behind one plain-dict registry.

Every model is a plain ``nn.Module`` whose ``forward`` returns a logits tensor: ``[B, num_classes]``
for the image models (input ``[B, C, H, W]``; the MLP also takes it and flattens), ``[B, T, V]`` for
the language models (input int64 token ids ``[B, T]``). Nothing here picks a device: move the model
with ``.to(device)``. Parameters are initialised from torch's global RNG, so callers seed with
``torch.manual_seed`` before ``build_model`` and the same seed gives identical parameters.

>>> model = build_model("lenet5")  # MNIST: 1 x 28 x 28, 10 classes
>>> count_parameters(model)
61706
"""

from __future__ import annotations

import functools
import inspect
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from common.registry import lookup

__all__ = ["MODELS", "build_model", "count_parameters"]

# ----------------------------------------------------------------------------------------- images


class MLP(nn.Module):
    """Flatten -> (Linear -> ReLU) per hidden size -> Linear to ``num_classes``."""

    def __init__(
        self,
        *,
        num_classes: int,
        in_channels: int,
        image_size: int,
        hidden_sizes: Sequence[int] = (512, 256),
    ) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Flatten()]
        width = in_channels * image_size * image_size
        for hidden in hidden_sizes:
            layers += [nn.Linear(width, hidden), nn.ReLU()]
            width = hidden
        layers.append(nn.Linear(width, num_classes))
        self.layers = nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        return self.layers(x)


class LeNet5(nn.Module):
    """LeCun et al. 1998 LeNet-5 in its usual modern form.

    conv 6@5x5 -> max-pool 2 -> conv 16@5x5 -> max-pool 2 -> fc 120 -> fc 84 -> fc ``num_classes``,
    ReLU between layers. The first conv pads by 2 on 28x28 inputs so that both MNIST (1x28x28) and
    CIFAR (3x32x32) reach the 16x5x5 map of the paper. Deviations from the paper: ReLU instead of
    scaled tanh, max-pooling instead of trainable subsampling, full C3 connectivity, and a linear
    output layer instead of RBF units.
    """

    def __init__(self, *, num_classes: int, in_channels: int, image_size: int) -> None:
        super().__init__()
        padding = 2 if image_size == 28 else 0
        side = ((image_size + 2 * padding - 4) // 2 - 4) // 2
        if side < 1:
            raise ValueError(f"lenet5 needs image_size >= 28 (32 without padding), got {image_size}")
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 6, kernel_size=5, padding=padding),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(6, 16, kernel_size=5),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(16 * side * side, 120),
            nn.ReLU(),
            nn.Linear(120, 84),
            nn.ReLU(),
            nn.Linear(84, num_classes),
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(self.features(x))


def _kaiming_init(module: nn.Module) -> None:
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
        _kaiming_init(self)

    def forward(self, x: Tensor) -> Tensor:
        out = self.blocks(self.stem(x))
        return self.fc(out.mean(dim=(2, 3)))


def _resnet20(*, num_classes: int, in_channels: int) -> CifarResNet:
    """CIFAR ResNet-20 (``CifarResNet`` with depth 20)."""
    return CifarResNet(num_classes=num_classes, in_channels=in_channels, depth=20)


def _resnet110(*, num_classes: int, in_channels: int) -> CifarResNet:
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
        _kaiming_init(self)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(torch.flatten(self.features(x), 1))


class _AirbenchBatchNorm(nn.BatchNorm2d):
    """airbench's BatchNorm: scale frozen at 1 (only the shift trains), eps 1e-12, and running
    statistics that follow the batch quickly (torch momentum 0.4: airbench's 0.6 in the other
    convention), so a short run evaluates with statistics of its last steps."""

    def __init__(self, channels: int, eps: float = 1e-12) -> None:
        super().__init__(channels, eps=eps, momentum=0.4)
        self.weight.requires_grad_(False)


class _AirbenchConv(nn.Conv2d):
    """3x3 'same' conv without bias, identity-initialised on its first ``in_channels`` outputs (an
    implicit residual, airbench's ``Conv``)."""

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__(in_channels, out_channels, kernel_size=3, padding="same", bias=False)

    def reset_parameters(self) -> None:
        super().reset_parameters()
        with torch.no_grad():
            nn.init.dirac_(self.weight[: self.weight.shape[1]])


class _AirbenchGroup(nn.Module):
    """conv -> max-pool 2 -> BN -> GELU -> conv -> BN -> GELU."""

    def __init__(self, in_channels: int, out_channels: int, bn_eps: float = 1e-12) -> None:
        super().__init__()
        self.conv1 = _AirbenchConv(in_channels, out_channels)
        self.norm1 = _AirbenchBatchNorm(out_channels, bn_eps)
        self.conv2 = _AirbenchConv(out_channels, out_channels)
        self.norm2 = _AirbenchBatchNorm(out_channels, bn_eps)

    def forward(self, x: Tensor) -> Tensor:
        x = F.gelu(self.norm1(F.max_pool2d(self.conv1(x), 2)))
        return F.gelu(self.norm2(self.conv2(x)))


class AirbenchNet(nn.Module):
    """The CIFAR-10 network of Keller Jordan's airbench (airbench94.py), in fp32 for CPUs.

    2x2 patch-whitening conv (2 x 3 x 2 x 2 = 24 channels, frozen, set from the training images'
    patch covariance by :meth:`init_from_data`) -> GELU -> three groups of (conv, pool, BN, GELU,
    conv, BN, GELU) of ``width``, ``4 width``, ``4 width`` channels -> max-pool 3 -> linear without
    bias, scaled by 1/9. ``width`` 64 is airbench's (1,97M parameters); the suite uses a narrower
    one for 2 CPU cores. ``bn_eps`` is airbench's 1e-12 by default; on MNIST, whose background is
    one constant value, a channel's batch variance can come near 0 at small per-rank batches (64
    and below, measured: a first-step gradient of 3e11) and 1e-5 (torch's default) keeps it finite. Differences from airbench: fp32 (not fp16), no channels_last by default,
    and the whitening is optional (``whiten=False``: a plain trainable 2x2 conv stem).
    Trainable parameters: the conv weights, the BN shifts and the classifier.
    """

    def __init__(
        self,
        *,
        num_classes: int,
        in_channels: int,
        image_size: int,
        width: int = 64,
        whiten: bool = True,
        bn_eps: float = 1e-12,
    ) -> None:
        super().__init__()
        if isinstance(width, bool) or not isinstance(width, int) or width < 1:
            raise ValueError(f"airbench width must be a positive integer, got {width!r}")
        if isinstance(bn_eps, bool) or not isinstance(bn_eps, int | float) or not 0 < bn_eps < 1:
            raise ValueError(f"airbench bn_eps must be a number in (0, 1), got {bn_eps!r}")
        if image_size < 24:
            raise ValueError(
                f"airbench needs image_size >= 24 (three 2x poolings and a 3x3), got {image_size}"
            )
        stem = 2 * in_channels * 2 * 2
        self.whiten = nn.Conv2d(in_channels, stem, kernel_size=2, padding=0, bias=True)
        self.whitened = False
        if whiten:
            self.whiten.weight.requires_grad_(False)
        self.groups = nn.Sequential(
            _AirbenchGroup(stem, width, bn_eps),
            _AirbenchGroup(width, 4 * width, bn_eps),
            _AirbenchGroup(4 * width, 4 * width, bn_eps),
        )
        self.fc = nn.Linear(4 * width, num_classes, bias=False)
        self.use_whitening = whiten

    @torch.no_grad()
    def init_from_data(self, images: Tensor, eps: float = 5e-4) -> None:
        """Set the frozen whitening filters from normalized training images [N, C, H, W]: the
        eigenvectors of the 2x2-patch covariance scaled by 1/sqrt(eigenvalue + eps), and their
        negatives (airbench's ``init_whitening_conv``). Deterministic: every rank computes the same
        filters from the same images. A no-op when ``whiten=False``."""
        if not self.use_whitening:
            return
        c, (h, w) = images.shape[1], self.whiten.weight.shape[2:]
        patches = images.unfold(2, h, 1).unfold(3, w, 1).transpose(1, 3).reshape(-1, c, h, w).double()
        flat = patches.flatten(1)
        covariance = flat.T @ flat / flat.shape[0]
        eigenvalues, eigenvectors = torch.linalg.eigh(covariance)
        eigenvalues, eigenvectors = eigenvalues.flip(0), eigenvectors.T.flip(0)
        filters = (eigenvectors / torch.sqrt(eigenvalues + eps)[:, None]).reshape(c * h * w, c, h, w)
        self.whiten.weight.copy_(torch.cat((filters, -filters)).float())
        self.whitened = True

    def forward(self, x: Tensor) -> Tensor:
        x = self.groups(F.gelu(self.whiten(x)))
        x = F.max_pool2d(x, 3)
        return self.fc(torch.flatten(x, 1)) / 9.0


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


class AlexNet(nn.Module):
    """ImageNet AlexNet, the one-GPU variant (Krizhevsky 2014, "One weird trick"), as torchvision's.

    conv 64@11x11/4 (pad 2) -> max-pool 3/2 -> conv 192@5x5 -> max-pool 3/2 -> conv 384@3x3 ->
    conv 256@3x3 -> conv 256@3x3 -> max-pool 3/2 -> adaptive average pool to 6x6 -> dropout ->
    fc 4096 -> dropout -> fc 4096 -> fc ``num_classes``, ReLU after every layer but the last; no LRN.
    Module and parameter names are torchvision's ``alexnet`` (``features.0.weight`` ...
    ``classifier.6.bias``; the logits layer is ``classifier.6``), so its state dicts load here.
    Init: torch's defaults, as torchvision. 61,100,840 parameters with 1000 classes, 57,044,810 with
    10 (``count_parameters``).

    ``dropout`` is the drop probability (torchvision: 0.5; TernGrad's AlexNet script keeps 0.8, i.e.
    ``dropout: 0.2``). Deviation from TernGrad, whose ``alexnet`` is the original two-tower network
    with LRN (Krizhevsky et al. 2012; 48+48 conv1 filters, grouped convs).

    Inputs must be at least 63x63 (the last max-pool needs a 3x3 map); ImageNet crops are 224x224.
    """

    MIN_IMAGE_SIZE = 63

    def __init__(self, *, num_classes: int, in_channels: int, image_size: int, dropout: float = 0.5) -> None:
        super().__init__()
        if image_size < self.MIN_IMAGE_SIZE:
            raise ValueError(
                f"alexnet needs image_size >= {self.MIN_IMAGE_SIZE} (ImageNet crops are 224), got {image_size}"
            )
        if not 0 <= dropout < 1:
            raise ValueError(f"alexnet dropout must be in [0, 1), got {dropout}")
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 64, kernel_size=11, stride=4, padding=2),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(kernel_size=3, stride=2),
            nn.Conv2d(64, 192, kernel_size=5, padding=2),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(kernel_size=3, stride=2),
            nn.Conv2d(192, 384, kernel_size=3, padding=1),
            nn.ReLU(inplace=True),
            nn.Conv2d(384, 256, kernel_size=3, padding=1),
            nn.ReLU(inplace=True),
            nn.Conv2d(256, 256, kernel_size=3, padding=1),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(kernel_size=3, stride=2),
        )
        self.avgpool = nn.AdaptiveAvgPool2d((6, 6))
        self.classifier = nn.Sequential(
            nn.Dropout(p=dropout),
            nn.Linear(256 * 6 * 6, 4096),
            nn.ReLU(inplace=True),
            nn.Dropout(p=dropout),
            nn.Linear(4096, 4096),
            nn.ReLU(inplace=True),
            nn.Linear(4096, num_classes),
        )

    def forward(self, x: Tensor) -> Tensor:
        if min(x.shape[-2:]) < self.MIN_IMAGE_SIZE:
            raise ValueError(
                f"alexnet needs inputs of at least {self.MIN_IMAGE_SIZE}x{self.MIN_IMAGE_SIZE} "
                f"(ImageNet crops are 224x224), got {tuple(x.shape[-2:])}"
            )
        x = self.avgpool(self.features(x))
        return self.classifier(torch.flatten(x, 1))


class _Bottleneck(nn.Module):
    """torchvision's ResNet v1.5 bottleneck: 1x1 -> 3x3 (carries the stride) -> 1x1 (4x channels).

    The shortcut is the identity, or a strided 1x1 conv + BN (``downsample``) where the shape changes.
    """

    expansion = 4

    def __init__(self, in_planes: int, planes: int, stride: int) -> None:
        super().__init__()
        out_planes = planes * self.expansion
        self.conv1 = nn.Conv2d(in_planes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, out_planes, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out_planes)
        self.relu = nn.ReLU(inplace=True)
        self.downsample: nn.Module | None = None
        if stride != 1 or in_planes != out_planes:
            self.downsample = nn.Sequential(
                nn.Conv2d(in_planes, out_planes, 1, stride=stride, bias=False), nn.BatchNorm2d(out_planes)
            )

    def forward(self, x: Tensor) -> Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + identity)


class ResNet50(nn.Module):
    """ImageNet ResNet-50 (He et al. 2016) in torchvision's v1.5 form, DGC's ImageNet model.

    conv 64@7x7/2 -> BN -> ReLU -> max-pool 3/2 -> 4 stages of [3, 4, 6, 3] bottleneck blocks
    (widths 64, 128, 256, 512, outputs 4x that; stages 2-4 start with stride 2, on the 3x3 conv:
    "v1.5") -> global average pool -> fc ``num_classes``. Module and parameter names are
    torchvision's ``resnet50`` (``conv1``, ``bn1``, ``layer1`` ... ``layer4``, ``fc``), so its state
    dicts load here; so are the init (convs He normal fan-out, BN to identity, fc torch's default)
    and the order in which it draws from the RNG: the same seed gives torchvision's parameters.
    25,557,032 parameters with 1000 classes, 23,528,522 with 10 (``count_parameters``).

    ``zero_init_residual`` zeroes the last BN's weight (gamma) in every block, so that each residual
    branch starts at zero and every block at the identity (Goyal et al. 2017); DGC's ImageNet config
    turns it on, torchvision's default is off.

    Inputs must be at least 32x32, the network's total stride (ImageNet crops are 224x224, which
    reach a 7x7 map before pooling). Smaller inputs would still run, as 1x1 maps through the last
    stages, but are taken for a mistake.
    """

    MIN_IMAGE_SIZE = 32

    def __init__(
        self, *, num_classes: int, in_channels: int, image_size: int, zero_init_residual: bool = False
    ) -> None:
        super().__init__()
        if image_size < self.MIN_IMAGE_SIZE:
            raise ValueError(
                f"resnet50 needs image_size >= {self.MIN_IMAGE_SIZE} (ImageNet crops are 224), got {image_size}"
            )
        self.conv1 = nn.Conv2d(in_channels, 64, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        in_planes = 64
        stages: list[nn.Sequential] = []
        for planes, num_blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
            blocks: list[nn.Module] = []
            for i in range(num_blocks):
                blocks.append(_Bottleneck(in_planes, planes, stride if i == 0 else 1))
                in_planes = planes * _Bottleneck.expansion
            stages.append(nn.Sequential(*blocks))
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(in_planes, num_classes)
        _kaiming_init(self)
        if zero_init_residual:
            for m in self.modules():
                if isinstance(m, _Bottleneck):
                    nn.init.zeros_(m.bn3.weight)

    def forward(self, x: Tensor) -> Tensor:
        if min(x.shape[-2:]) < self.MIN_IMAGE_SIZE:
            raise ValueError(
                f"resnet50 needs inputs of at least {self.MIN_IMAGE_SIZE}x{self.MIN_IMAGE_SIZE} "
                f"(ImageNet crops are 224x224), got {tuple(x.shape[-2:])}"
            )
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


# -------------------------------------------------------------------------------------- language


class LSTMLanguageModel(nn.Module):
    """Word-level LSTM language model (as PyTorch's word_language_model example, Zaremba et al. 2014).

    embedding -> dropout -> LSTM(``num_layers``, dropout between layers) -> dropout -> linear to the
    vocabulary. ``tie_weights`` shares the embedding and output matrices (Press & Wolf 2017; needs
    ``embed_dim == hidden_dim``).

    Stateless: the hidden state starts at zero on every forward and is not returned, so consecutive
    batches are independent sequences (no hidden state carried across truncated-BPTT windows).
    """

    def __init__(
        self,
        *,
        vocab_size: int,
        embed_dim: int = 200,
        hidden_dim: int = 200,
        num_layers: int = 2,
        dropout: float = 0.2,
        tie_weights: bool = False,
    ) -> None:
        super().__init__()
        if tie_weights and embed_dim != hidden_dim:
            raise ValueError(
                f"lstm_lm tie_weights needs embed_dim == hidden_dim, got {embed_dim} and {hidden_dim}"
            )
        self.embedding = nn.Embedding(vocab_size, embed_dim)
        # nn.LSTM warns when given inter-layer dropout with a single layer, where it does nothing.
        inter_layer_dropout = dropout if num_layers > 1 else 0.0
        self.lstm = nn.LSTM(
            embed_dim, hidden_dim, num_layers=num_layers, dropout=inter_layer_dropout, batch_first=True
        )
        self.dropout = nn.Dropout(dropout)
        self.decoder = nn.Linear(hidden_dim, vocab_size)
        # The word_language_model example's init: U(-0.1, 0.1) embeddings and output, zero output bias.
        nn.init.uniform_(self.embedding.weight, -0.1, 0.1)
        nn.init.uniform_(self.decoder.weight, -0.1, 0.1)
        nn.init.zeros_(self.decoder.bias)
        if tie_weights:
            self.decoder.weight = self.embedding.weight

    def forward(self, x: Tensor) -> Tensor:
        embedded = self.dropout(self.embedding(x))
        if embedded.device.type == "cpu" and _bf16_autocast_cpu() and not bf16_lstm_supported():
            # oneDNN has no bf16 LSTM on this CPU (no AVX512-BF16 or AMX: "could not create a
            # primitive descriptor for the LSTM forward propagation primitive"): the recurrence runs
            # in fp32 here, everything around it in bf16 as elsewhere.
            with torch.autocast("cpu", enabled=False):
                hidden, _ = self.lstm(embedded.float())
        else:
            hidden, _ = self.lstm(embedded)
        return self.decoder(self.dropout(hidden))


def _bf16_autocast_cpu() -> bool:
    return torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16


@functools.cache
def bf16_lstm_supported() -> bool:
    """Whether this CPU runs ``nn.LSTM`` under bf16 autocast (oneDNN's bf16 RNN needs AVX512-BF16 or
    AMX; on an AVX2-only CPU it fails). Probed once with a 2-unit LSTM, the global RNG untouched."""
    with torch.random.fork_rng(devices=[]), torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        try:
            nn.LSTM(2, 2, batch_first=True)(torch.zeros(1, 1, 2))
        except RuntimeError:
            return False
    return True


class GPT2LanguageModel(nn.Module):
    """A small GPT-2 (Radford et al. 2019) from ``transformers.GPT2LMHeadModel``, randomly initialised.

    ``forward(input_ids [B, T])`` returns the logits ``[B, T, V]`` as a plain tensor (no cache, no
    loss). ``dropout`` sets the embedding, attention and residual dropout. Nothing is downloaded:
    only a config is built, never ``from_pretrained``. The output matrix is tied to the token
    embedding, as in GPT-2, unless ``tied=False`` (a pipeline puts the two on different stages:
    ``strategy: pipeline``, sparse AxoNN's ``GPT2Stage``). ``self.gpt2`` is the
    ``transformers.GPT2LMHeadModel``; its parameter names (``transformer.h.0.attn.c_attn.weight``)
    are the ones mask files and pipeline stages use.
    """

    def __init__(
        self,
        *,
        vocab_size: int,
        n_layer: int = 2,
        n_head: int = 2,
        n_embd: int = 128,
        n_positions: int = 256,
        dropout: float = 0.1,
        tied: bool = True,
    ) -> None:
        super().__init__()
        if not isinstance(tied, bool):
            raise ValueError(f"gpt2_small tied must be true or false, got {tied!r}")
        if n_embd % n_head != 0:
            raise ValueError(f"gpt2_small n_embd ({n_embd}) must be divisible by n_head ({n_head})")
        # Imported here: importing transformers takes seconds, and only this model needs it.
        from transformers import GPT2Config, GPT2LMHeadModel

        config = GPT2Config(
            vocab_size=vocab_size,
            n_positions=n_positions,
            n_embd=n_embd,
            n_layer=n_layer,
            n_head=n_head,
            resid_pdrop=dropout,
            embd_pdrop=dropout,
            attn_pdrop=dropout,
            use_cache=False,
            # GPT-2's special-token id (50256) lies outside a small vocabulary and makes transformers
            # warn; these models never generate, so they need no BOS/EOS token.
            bos_token_id=None,
            eos_token_id=None,
            tie_word_embeddings=tied,
        )
        self.n_positions = n_positions
        self.gpt2 = GPT2LMHeadModel(config)

    def forward(self, x: Tensor) -> Tensor:
        if x.shape[-1] > self.n_positions:
            raise ValueError(f"sequence length {x.shape[-1]} exceeds n_positions={self.n_positions}")
        logits = self.gpt2(input_ids=x, use_cache=False).logits
        assert logits is not None
        return logits


# -------------------------------------------------------------------------------------- registry

MODELS: dict[str, Callable[..., nn.Module]] = {
    "mlp": MLP,
    "lenet5": LeNet5,
    "resnet20": _resnet20,
    "resnet110": _resnet110,
    "vgg_small": VGGSmall,
    "vgg16_bn": VGG16BN,
    "airbench": AirbenchNet,
    "cifar10_alexnet": CifarAlexNet,
    "alexnet": AlexNet,
    "resnet50": ResNet50,
    "lstm_lm": LSTMLanguageModel,
    "gpt2_small": GPT2LanguageModel,
}

_COMMON_ARGS = ("num_classes", "in_channels", "image_size", "vocab_size")


def build_model(
    name: str,
    *,
    num_classes: int = 10,
    in_channels: int = 1,
    image_size: int = 28,
    vocab_size: int | None = None,
    **kwargs: Any,
) -> nn.Module:
    """Build the model registered as ``name``.

    ``num_classes``, ``in_channels`` and ``image_size`` go to the image models, ``vocab_size`` to the
    language models (required there); ``kwargs`` are the model's own options (e.g. ``hidden_sizes``,
    ``width``, ``hidden_dim``, ``n_layer``). Unknown names or options raise ``ValueError`` listing
    the valid ones; a ``vocab_size`` given to an image model is ignored with a warning.
    """
    builder = lookup(MODELS, name, "model")
    accepted = inspect.signature(builder).parameters
    options = sorted(p for p in accepted if p not in _COMMON_ARGS)
    unknown = sorted(set(kwargs) - set(options))
    if unknown:
        raise ValueError(
            f"unknown option(s) for model {name!r}: {', '.join(unknown)}; "
            f"allowed: {', '.join(options) or '(none)'}"
        )
    common: dict[str, Any] = {
        "num_classes": num_classes,
        "in_channels": in_channels,
        "image_size": image_size,
        "vocab_size": vocab_size,
    }
    if "vocab_size" in accepted:
        if vocab_size is None:
            raise ValueError(f"model {name!r} is a language model and needs vocab_size")
    elif vocab_size is not None:
        warnings.warn(f"vocab_size={vocab_size} is ignored by model {name!r}", stacklevel=2)
    return builder(**{k: v for k, v in common.items() if k in accepted}, **kwargs)


def count_parameters(model: nn.Module) -> int:
    """Number of scalar parameters; a tensor shared by several modules (tied weights) counts once."""
    return sum(p.numel() for p in model.parameters())
