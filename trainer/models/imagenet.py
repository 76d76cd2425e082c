"""ImageNet models: AlexNet (torchvision's one-GPU variant) and ResNet-50 (torchvision's v1.5)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .cifar import kaiming_init


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
        kaiming_init(self)
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
