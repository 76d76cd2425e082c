"""Types shared by every data set: the error, the info record, the dataset protocol, the source base."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

import numpy as np
import torch

SPLITS: tuple[str, ...] = ("train", "val", "test")

Arrays = dict[str, np.ndarray]


class DataError(ValueError):
    """Missing, corrupt or unexpected data. The message says where we looked, what we expected and
    how to fix it."""


@dataclass(frozen=True)
class DatasetInfo:
    """What a model needs to know about a data set.

    Images set ``num_classes`` and ``input_shape`` (C, H, W); text sets ``vocab_size``.
    """

    name: str
    kind: Literal["image", "text"]
    num_classes: int | None = None
    vocab_size: int | None = None
    input_shape: tuple[int, int, int] | None = None


class Dataset(Protocol):
    """What :func:`trainer.data.load_dataset` returns: index it by batches of example indices."""

    @property
    def info(self) -> DatasetInfo: ...

    def __len__(self) -> int: ...

    def get_batch(self, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]: ...


class DatasetSource:
    """One entry of :data:`trainer.data.DATASETS`: which files to read and how to turn them into a split.

    ``decode`` reads the verified source files into plain arrays (cached on disk by the caller);
    ``make_split`` builds the dataset object of one split from those arrays.
    """

    name: str
    kind: Literal["image", "text"]
    folder: str
    files: tuple[str, ...]
    # Bump when decode's output changes, so that old cache files are not reused.
    format_version: int = 1

    def decode(self, folder: Path) -> Arrays:
        raise NotImplementedError

    def check_arrays(self, arrays: Arrays) -> None:
        """Raise ``DataError`` if cached arrays do not have the structure ``decode`` produces."""
        raise NotImplementedError

    def make_split(self, arrays: Arrays, split: str, *, seq_len: int, limit: int | None) -> Dataset:
        raise NotImplementedError
