"""Image classification data sets held as uint8 in memory, normalized per batch.

Split rule (same for every image data set): ``val`` is the first ``num_val`` examples of a fixed
pseudo-random order of the official training set and ``train`` is the rest; ``test`` is the official
test set. Each split is kept in a fixed pseudo-random order, so ``limit=n`` takes a class-mixed subset
(CIFAR's JPEG copy is stored grouped by class).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import numpy as np
import torch

from .base import Arrays, DataError, DatasetInfo, DatasetSource

# Seeds of the fixed orders; changing them changes every train/val split, so don't.
_TRAIN_ORDER_SEED = 20240601
_TEST_ORDER_SEED = 20240602
_U64 = np.uint64


def fixed_order(n: int, seed: int) -> np.ndarray:
    """A permutation of ``range(n)`` that depends only on ``(n, seed)``.

    Sorts the splitmix64 hashes of ``seed * 2**32 + i``: plain 64-bit integer arithmetic, so it is the
    same on every machine and every numpy/torch version (unlike a library RNG stream), and the hash is
    a bijection, so there are no ties.
    """
    z = np.arange(n, dtype=_U64) + _U64(seed % 2**32) * _U64(2**32)
    z = z + _U64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> _U64(30))) * _U64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> _U64(27))) * _U64(0x94D049BB133111EB)
    z = z ^ (z >> _U64(31))
    return np.argsort(z, kind="stable")


class ImageDataset:
    """One split of an image data set: ``get_batch(indices) -> (x float32 [B,C,H,W], y int64 [B])``.

    ``x`` is ``(pixel / 255 - mean) / std`` per channel. ``images`` (uint8) and ``labels`` are the raw
    split, in its fixed order; ``classes`` names the labels.
    """

    def __init__(
        self,
        info: DatasetInfo,
        images: torch.Tensor,
        labels: torch.Tensor,
        *,
        mean: tuple[float, ...],
        std: tuple[float, ...],
        classes: tuple[str, ...],
    ) -> None:
        assert images.dtype == torch.uint8 and images.dim() == 4
        assert labels.dtype == torch.int64 and labels.shape == images.shape[:1]
        self._info = info
        self.images = images
        self.labels = labels
        self.mean = mean
        self.std = std
        self.classes = classes
        self._mean = torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1)
        self._std = torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1)

    @property
    def info(self) -> DatasetInfo:
        return self._info

    def __len__(self) -> int:
        return self.labels.shape[0]

    def get_batch(self, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        indices = torch.as_tensor(indices, dtype=torch.long)
        x = self.images[indices].to(torch.float32).div_(255.0).sub_(self._mean).div_(self._std)
        return x, self.labels[indices]

    def __repr__(self) -> str:
        return f"ImageDataset({self.info.name!r}, {len(self)} examples)"


class ImageSource(DatasetSource):
    """An image data set with an official train/test split; subclasses implement ``decode``.

    ``decode`` returns ``{train,test}_images`` uint8 [N,C,H,W], ``{train,test}_labels`` int64 [N] and
    ``classes`` (str [num_classes]).
    """

    kind: Literal["image", "text"] = "image"

    def __init__(
        self,
        name: str,
        *,
        folder: str,
        files: tuple[str, ...],
        input_shape: tuple[int, int, int],
        classes: tuple[str, ...],
        num_examples: tuple[int, int],
        num_per_class: tuple[int, int] | None,
        num_val: int,
        mean: tuple[float, ...],
        std: tuple[float, ...],
    ) -> None:
        self.name = name
        self.folder = folder
        self.files = files
        self.input_shape = input_shape
        self.classes = classes
        self.num_examples = dict(zip(("train", "test"), num_examples))
        self.num_per_class = dict(zip(("train", "test"), num_per_class)) if num_per_class else None
        self.num_val = num_val
        self.mean = mean
        self.std = std
        self.num_classes = len(classes)

    def check_arrays(self, arrays: Arrays, where: str = "the cache") -> None:
        classes = arrays.get("classes")
        if classes is None or classes.shape != (self.num_classes,):
            raise DataError(f"{self.name}: expected {self.num_classes} class names in {where}")
        if tuple(classes.tolist()) != self.classes:
            raise DataError(
                f"{self.name}: expected classes {self.classes} in {where}, got {classes.tolist()}"
            )
        for split in ("train", "test"):
            images, labels = arrays.get(f"{split}_images"), arrays.get(f"{split}_labels")
            if images is None or labels is None:
                raise DataError(f"{self.name}: no {split} images/labels in {where}")
            if images.dtype != np.uint8 or images.shape[1:] != self.input_shape:
                raise DataError(
                    f"{self.name} {split} images in {where}: expected uint8 [N, {self.input_shape}], "
                    f"got {images.dtype} {images.shape}"
                )
            if labels.dtype != np.int64 or labels.shape != images.shape[:1]:
                raise DataError(f"{self.name} {split} labels in {where}: expected int64 [{len(images)}]")
            if len(labels) and (labels.min() < 0 or labels.max() >= self.num_classes):
                raise DataError(f"{self.name} {split} labels in {where}: outside [0, {self.num_classes})")
            if self.num_per_class is not None:
                counts = np.bincount(labels, minlength=self.num_classes).tolist()
                if any(c != self.num_per_class[split] for c in counts):
                    raise DataError(
                        f"{self.name} {split} in {where}: expected {self.num_per_class[split]} images "
                        f"per class, got {dict(zip(classes.tolist(), counts))}"
                    )
            if len(labels) != self.num_examples[split]:
                raise DataError(
                    f"{self.name} {split} in {where}: expected {self.num_examples[split]} images, "
                    f"got {len(labels)}"
                )

    def make_split(self, arrays: Arrays, split: str, *, seq_len: int, limit: int | None) -> ImageDataset:
        source = "test" if split == "test" else "train"
        images, labels = arrays[f"{source}_images"], arrays[f"{source}_labels"]
        if split == "test":
            order = fixed_order(len(labels), _TEST_ORDER_SEED)
        else:
            order = fixed_order(len(labels), _TRAIN_ORDER_SEED)
            order = order[: self.num_val] if split == "val" else order[self.num_val :]
        if limit is not None:
            order = order[:limit]
        info = DatasetInfo(
            name=self.name, kind="image", num_classes=self.num_classes, input_shape=self.input_shape
        )
        return ImageDataset(
            info,
            torch.from_numpy(np.ascontiguousarray(images[order])),
            torch.from_numpy(labels[order]),
            mean=self.mean,
            std=self.std,
            classes=tuple(str(c) for c in arrays["classes"].tolist()),
        )

    def decode(self, folder: Path) -> Arrays:
        raise NotImplementedError
