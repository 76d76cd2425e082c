"""CIFAR-10 stored as JPEG files in one ``.tar.xz``: ``{train,test}/<class>/<n>.jpg``.

Class index = position of the class folder's name in sorted order (airplane, automobile, bird, cat,
deer, dog, frog, horse, ship, truck: the usual CIFAR-10 label order). Within a class, files are in
numeric order of their names.
"""

from __future__ import annotations

import bz2
import gzip
import io
import logging
import lzma
import tarfile
import zlib
from pathlib import Path, PurePosixPath

import numpy as np
from PIL import Image

from .base import Arrays, DataError
from .images import ImageSource

log = logging.getLogger(__name__)

_IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")
_SPLITS = ("train", "test")


def _file_order(name: str) -> tuple[int, int, str]:
    stem = PurePosixPath(name).stem
    return (0, int(stem), name) if stem.isdigit() else (1, 0, name)


def _decompressed(path: Path) -> bytes:
    # Decompressing the whole tarball into memory (~90 MB for CIFAR-10) and parsing it from there is
    # ~1.5x faster than tarfile's streaming "r|xz" mode (4.3 s vs 7.0 s here, 2 cores).
    if path.suffix == ".xz":
        return lzma.decompress(path.read_bytes())
    if path.suffix == ".gz":
        return gzip.decompress(path.read_bytes())
    if path.suffix == ".bz2":
        return bz2.decompress(path.read_bytes())
    return path.read_bytes()


def _decode_image(data: bytes, where: str, size: tuple[int, int]) -> np.ndarray:
    try:
        # formats=: skip probing every plug-in (measurably faster on 60k tiny files).
        with Image.open(io.BytesIO(data), formats=("JPEG", "PNG")) as image:
            image.load()  # decode now, so that a truncated file raises here
            rgb = np.asarray(image if image.mode == "RGB" else image.convert("RGB"), dtype=np.uint8)
    except (OSError, SyntaxError, ValueError) as exc:  # PIL.UnidentifiedImageError is an OSError
        raise DataError(f"{where}: not a decodable image ({exc})") from exc
    if rgb.shape[:2] != (size[1], size[0]):
        raise DataError(f"{where}: image is {rgb.shape[1]}x{rgb.shape[0]}, expected {size[0]}x{size[1]}")
    return rgb


def read_image_tar(path: Path, *, num_classes: int, size: tuple[int, int] = (32, 32)) -> Arrays:
    """Decode every ``{train,test}/<class>/<file>`` image of the tarball ``path``.

    Returns ``{train,test}_images`` uint8 [N,3,H,W], ``{train,test}_labels`` int64 [N] and ``classes``.
    Checks the layout (``num_classes`` class folders, the same in train and test), every image's size,
    and the compressed stream (xz CRC, truncation); does not check per-class counts.
    """
    found: dict[str, dict[str, list[tuple[str, np.ndarray]]]] = {split: {} for split in _SPLITS}
    try:
        with tarfile.open(fileobj=io.BytesIO(_decompressed(path)), mode="r:") as tar:
            for member in tar:
                parts = [p for p in PurePosixPath(member.name).parts if p not in (".", "/")]
                if (
                    not member.isfile()
                    or len(parts) < 3
                    or parts[-3] not in _SPLITS
                    or not parts[-1].lower().endswith(_IMAGE_SUFFIXES)
                ):
                    continue
                split, class_name, file = parts[-3:]
                stream = tar.extractfile(member)
                assert stream is not None
                image = _decode_image(stream.read(), f"{path}:{member.name}", size)
                found[split].setdefault(class_name, []).append((file, image))
    except (EOFError, OSError, lzma.LZMAError, tarfile.TarError, zlib.error) as exc:
        raise DataError(
            f"{path} is not a complete tar archive ({type(exc).__name__}: {exc}); it is truncated or "
            "corrupt: restore it from ../shared/data"
        ) from exc

    classes = sorted(found["train"])
    if len(classes) != num_classes or sorted(found["test"]) != classes:
        raise DataError(
            f"{path}: expected the same {num_classes} class folders under train/ and test/, found "
            f"train: {classes}, test: {sorted(found['test'])}"
        )
    arrays: Arrays = {"classes": np.array(classes)}
    for split in _SPLITS:
        images: list[np.ndarray] = []
        labels: list[int] = []
        for label, name in enumerate(classes):
            files = sorted(found[split][name], key=lambda item: _file_order(item[0]))
            images.extend(image for _, image in files)
            labels.extend([label] * len(files))
        arrays[f"{split}_images"] = np.ascontiguousarray(np.stack(images).transpose(0, 3, 1, 2))
        arrays[f"{split}_labels"] = np.array(labels, dtype=np.int64)
    return arrays


class JpegTarImageSource(ImageSource):
    """Images decoded once from ``files[0]``, a tarball laid out as ``{train,test}/<class>/<n>.jpg``."""

    def decode(self, folder: Path) -> Arrays:
        path = folder / self.files[0]
        log.info("decoding %s (once; the arrays are cached)", path)
        _, height, width = self.input_shape
        arrays = read_image_tar(path, num_classes=self.num_classes, size=(width, height))
        self.check_arrays(arrays, where=str(path))
        return arrays
