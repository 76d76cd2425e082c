"""MNIST and Fashion-MNIST: gzip-compressed IDX files (http://yann.lecun.com/exdb/mnist/ format)."""

from __future__ import annotations

import gzip
import math
import struct
import zlib
from pathlib import Path

import numpy as np

from .base import Arrays, DataError
from .images import ImageSource

_IDX_UBYTE = 0x08
_FILES = {
    ("train", "images"): "train-images-idx3-ubyte.gz",
    ("train", "labels"): "train-labels-idx1-ubyte.gz",
    ("test", "images"): "t10k-images-idx3-ubyte.gz",
    ("test", "labels"): "t10k-labels-idx1-ubyte.gz",
}
IDX_FILES: tuple[str, ...] = tuple(_FILES.values())


def read_idx(path: Path, ndim: int) -> np.ndarray:
    """Read a gzip-compressed IDX file of unsigned bytes with ``ndim`` dimensions.

    Raises ``DataError`` on a gzip CRC error or truncation, a wrong magic number, or a length that
    does not match the dimensions in the header.
    """
    try:
        with gzip.open(path, "rb") as f:
            data = f.read()
    except (EOFError, OSError, zlib.error) as exc:  # gzip.BadGzipFile is an OSError
        raise DataError(
            f"{path} is not a complete gzip file ({type(exc).__name__}: {exc}); it is truncated or "
            "corrupt: restore it from ../shared/data"
        ) from exc
    header = 4 + 4 * ndim
    expected_magic = bytes((0, 0, _IDX_UBYTE, ndim))
    if data[:4] != expected_magic:
        raise DataError(
            f"{path}: IDX magic number is {data[:4].hex()}, expected {expected_magic.hex()} "
            f"(unsigned bytes, {ndim} dimensions)"
        )
    if len(data) < header:
        raise DataError(f"{path}: IDX header is truncated ({len(data)} bytes)")
    dims = struct.unpack(f">{ndim}I", data[4:header])
    if len(data) != header + math.prod(dims):
        raise DataError(
            f"{path}: IDX header says dimensions {dims} ({header + math.prod(dims)} bytes), "
            f"but the file holds {len(data)} bytes"
        )
    return np.frombuffer(data, dtype=np.uint8, offset=header).reshape(dims)


class IdxImageSource(ImageSource):
    """28x28 grey-scale images, labels 0-9, from the four standard IDX files (``files=IDX_FILES``)."""

    def decode(self, folder: Path) -> Arrays:
        arrays: Arrays = {}
        _, height, width = self.input_shape
        for split in ("train", "test"):
            images = read_idx(folder / _FILES[split, "images"], ndim=3)
            labels = read_idx(folder / _FILES[split, "labels"], ndim=1)
            expected = (self.num_examples[split], height, width)
            if images.shape != expected or labels.shape != expected[:1]:
                raise DataError(
                    f"{self.name} {split} in {folder}: expected images {expected} and labels "
                    f"{expected[:1]}, got {images.shape} and {labels.shape}"
                )
            arrays[f"{split}_images"] = images.reshape(-1, 1, height, width)
            arrays[f"{split}_labels"] = labels.astype(np.int64)
        arrays["classes"] = np.array(self.classes)
        self.check_arrays(arrays, where=str(folder))
        return arrays
