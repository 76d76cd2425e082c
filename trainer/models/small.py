"""Small image models for MNIST-size inputs: an MLP and LeNet-5 (both take CIFAR's 3x32x32 too)."""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor, nn


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
