"""ImageNet (ILSVRC-2012) read lazily from its JPEG folders, decoded per batch.

    export THINWIRE_IMAGENET=/data/imagenet     # holds train/<wnid>/*.JPEG and val/<wnid>/*.JPEG
    train = load_dataset("imagenet", "train")   # x: float32 [B, 3, 224, 224], y: int64 [B]

Layout: ``<root>/train/<wnid>/*.JPEG`` and ``<root>/val/<wnid>/*.JPEG``, the validation images
sorted into the same class folders as the training ones (the usual "valprep" layout of
torchvision's ``ImageFolder``). ``root`` is the ``root`` argument of ``load_dataset`` plus
``imagenet/`` if given, else ``$THINWIRE_IMAGENET``, else ``<data_root()>/imagenet``.

Nothing is decoded ahead: 1.28M JPEGs do not fit the decode-once npz cache of the other data sets.
Only the file list is cached (``cache_root()/imagenet/``, keyed by the root path and the mtimes of
every split and class folder, so adding or removing images rebuilds it); a process reads it once.

Labels: the class folders' names (wnids) in sorted order, as ``ImageFolder``. Splits, in a fixed
pseudo-random order each (``limit=n`` takes a class-mixed subset, as for the other image sets):

- ``train``: the ``train/`` folder minus the ``val`` examples;
- ``val``: the first ``min(10000, N // 10)`` examples of a fixed pseudo-random order of the ``N``
  images of ``train/`` (10,000 for ILSVRC-2012: 0.8% of it, about 10 per class), held out of
  ``train``, read with the test transform;
- ``test``: the official validation set, ``val/`` (50,000 images), on which papers report.

Transforms (torchvision's standard ImageNet recipe, reimplemented so that the randomness comes from
an explicit generator): ``train`` takes a random resized crop (area 8-100%, aspect ratio 3/4-4/3,
bilinear to 224x224) and a horizontal flip with probability 1/2; ``val``/``test`` resize the
shorter side to 256 and take the central 224x224. Then ``(pixel / 255 - mean) / std`` with the
usual ImageNet mean/std.

Randomness: the k-th time example ``i`` is requested, its crop and flip come from
``numpy.random.default_rng([seed, i, k])``: independent of the batch it is in, of the rank that
asks, of the decoding threads, and never from a global RNG. ``set_epoch(e)`` sets k = e for every
example (call it at the start of each epoch so that a resumed run repeats the crops of an
uninterrupted one); without it, k counts the requests, which is the epoch number when each example
is drawn once per epoch.

Decoding runs in a small thread pool (Pillow releases the GIL while decoding and resizing):
``$THINWIRE_DECODE_THREADS`` threads per dataset object, default ``min(4, cpu_count)``. At paper
scale this CPU decoding is the likely bottleneck (about 100-200 images/s per thread).
"""

from __future__ import annotations

import logging
import math
import os
import weakref
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from PIL import Image

from ..paths import cache_root, data_root
from .base import Arrays, DataError, DatasetInfo
from .cache import load_or_build
from .imagefolder_index import SPLIT_FOLDERS, build_index, check_index, fingerprint, layout_help
from .images import _TEST_ORDER_SEED, _TRAIN_ORDER_SEED, fixed_order

log = logging.getLogger(__name__)

DECODE_THREADS_ENV = "THINWIRE_DECODE_THREADS"
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

# ILSVRC-2012: classes, training images, validation images. Other counts only log a warning, so
# that subsets (and the tests' tiny trees) load.
ILSVRC2012_COUNTS = (1000, 1_281_167, 50_000)
# In-process memo of index files already read: cache path -> arrays.
_INDEXES: dict[Path, Arrays] = {}


# ----------------------------------------------------------------------------------- transforms


def random_resized_crop_box(
    width: int,
    height: int,
    rng: np.random.Generator,
    scale: tuple[float, float] = (0.08, 1.0),
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
) -> tuple[int, int, int, int]:
    """``(left, top, crop_width, crop_height)``: torchvision's ``RandomResizedCrop.get_params``.

    Ten tries at an area fraction uniform in ``scale`` and a log-uniform aspect ratio in ``ratio``;
    if none fits, the central crop with the ratio clamped to ``ratio``.
    """
    area = width * height
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target_area = area * rng.uniform(scale[0], scale[1])
        aspect = math.exp(rng.uniform(log_ratio[0], log_ratio[1]))
        w = round(math.sqrt(target_area * aspect))
        h = round(math.sqrt(target_area / aspect))
        if 0 < w <= width and 0 < h <= height:
            top = int(rng.integers(0, height - h + 1))
            left = int(rng.integers(0, width - w + 1))
            return left, top, w, h
    in_ratio = width / height
    if in_ratio < min(ratio):
        w, h = width, round(width / min(ratio))
    elif in_ratio > max(ratio):
        w, h = round(height * max(ratio)), height
    else:
        w, h = width, height
    return (width - w) // 2, (height - h) // 2, w, h


def _train_transform(image: Image.Image, size: int, rng: np.random.Generator) -> Image.Image:
    left, top, w, h = random_resized_crop_box(image.width, image.height, rng)
    # Crop, then resize (not resize(box=...), which filters across the box's edges): as torchvision.
    out = image.crop((left, top, left + w, top + h)).resize((size, size), Image.Resampling.BILINEAR)
    if rng.random() < 0.5:
        out = out.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return out


def _test_transform(image: Image.Image, size: int, resize: int) -> Image.Image:
    # torchvision Resize(resize): shorter side -> resize, longer side truncated; CenterCrop(size).
    w, h = image.size
    if w <= h:
        new_w, new_h = resize, int(resize * h / w)
    else:
        new_w, new_h = int(resize * w / h), resize
    image = image.resize((new_w, new_h), Image.Resampling.BILINEAR)
    top, left = round((new_h - size) / 2), round((new_w - size) / 2)
    return image.crop((left, top, left + size, top + size))


def _decode_threads() -> int:
    value = os.environ.get(DECODE_THREADS_ENV, "").strip()
    if not value:
        return min(4, os.cpu_count() or 1)
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"{DECODE_THREADS_ENV} must be a positive integer, got {value!r}")
    return int(value)


# -------------------------------------------------------------------------------------- dataset


class ImageFolderDataset:
    """One split of a folder of JPEGs: ``get_batch(indices) -> (x float32 [B,3,S,S], y int64 [B])``.

    ``files[i]`` and ``labels[i]`` are example ``i`` (the split's fixed order); ``classes`` names
    the labels. ``augment`` selects the train transform (random resized crop + flip) over the test
    one (resize + center crop); see the module docstring for the randomness.
    """

    def __init__(
        self,
        info: DatasetInfo,
        *,
        folder: Path,
        classes: tuple[str, ...],
        names: np.ndarray,
        labels: np.ndarray,
        augment: bool,
        seed: int,
        mean: tuple[float, ...],
        std: tuple[float, ...],
        resize: int,
        num_threads: int,
    ) -> None:
        assert info.input_shape is not None and names.shape == labels.shape
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ValueError(f"seed must be a non-negative int, got {seed!r}")
        self._info = info
        self.folder = folder
        self.classes = classes
        self.labels = torch.from_numpy(np.ascontiguousarray(labels))
        self.augment = augment
        self.seed = seed
        self.size = info.input_shape[-1]
        self.resize = resize
        self._names = names
        self._draws = np.zeros(len(labels), dtype=np.int64)
        self._mean = torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1)
        self._std = torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1)
        self._num_threads = num_threads
        self._pool: ThreadPoolExecutor | None = None
        self._pool_pid = os.getpid()

    @property
    def info(self) -> DatasetInfo:
        return self._info

    def __len__(self) -> int:
        return len(self._names)

    def file(self, index: int) -> Path:
        label = int(self.labels[index])
        return self.folder / self.classes[label] / os.fsdecode(bytes(self._names[index]))

    def set_epoch(self, epoch: int) -> None:
        """Make the next request of every example use draw ``epoch`` (see the module docstring)."""
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        self._draws.fill(epoch)

    def _load(self, index: int, draw: int) -> np.ndarray:
        path = self.file(index)
        try:
            with Image.open(path) as raw:
                image = raw.convert("RGB")  # also decodes; CMYK and grayscale JPEGs become RGB
        except (OSError, SyntaxError, ValueError) as exc:  # PIL.UnidentifiedImageError is an OSError
            raise DataError(f"{path}: not a decodable image ({exc})") from exc
        if self.augment:
            image = _train_transform(image, self.size, np.random.default_rng([self.seed, index, draw]))
        else:
            image = _test_transform(image, self.size, self.resize)
        return np.asarray(image, dtype=np.uint8)

    def get_batch(self, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        indices = torch.as_tensor(indices, dtype=torch.long)
        positions = [int(i) for i in indices.reshape(-1)]
        draws = []
        for i in positions:  # in order, so that an index repeated in one batch gets its next draw
            draws.append(int(self._draws[i]))
            self._draws[i] += 1
        if not positions:
            return torch.zeros(0, 3, self.size, self.size), self.labels[indices]
        if self._pool is None or self._pool_pid != os.getpid():  # a forked DataLoader worker: no threads
            self._pool = ThreadPoolExecutor(self._num_threads, thread_name_prefix=f"{self.info.name}-decode")
            self._pool_pid = os.getpid()
            weakref.finalize(self, self._pool.shutdown, wait=False)
        images = list(self._pool.map(self._load, positions, draws))
        x = torch.from_numpy(np.stack(images)).permute(0, 3, 1, 2).contiguous()
        x = x.to(torch.float32).div_(255.0).sub_(self._mean).div_(self._std)
        return x, self.labels[indices]

    def __repr__(self) -> str:
        kind = "train transform" if self.augment else "test transform"
        return f"ImageFolderDataset({self.info.name!r}, {len(self)} examples, {kind}, {self.folder})"


class ImageFolderSource:
    """A registry entry for images read lazily from ``<root>/{train,val}/<class>/``.

    Unlike :class:`~trainer.data.base.DatasetSource` there is nothing to verify against a checksum
    or decode ahead; ``load_dataset`` calls :meth:`open_split`.
    """

    kind: Literal["image", "text"] = "image"

    def __init__(
        self,
        name: str,
        *,
        folder: str,
        env_var: str,
        image_size: int = 224,
        resize: int = 256,
        max_val: int = 10_000,
        mean: tuple[float, ...] = IMAGENET_MEAN,
        std: tuple[float, ...] = IMAGENET_STD,
        expected_counts: tuple[int, int, int] | None = None,
    ) -> None:
        self.name = name
        self.folder = folder
        self.env_var = env_var
        self.image_size = image_size
        self.resize = resize
        self.max_val = max_val
        self.mean = mean
        self.std = std
        self.expected_counts = expected_counts

    def locate(self, root: str | Path | None = None) -> tuple[Path, str]:
        """The data set's folder and where that choice came from (for error messages)."""
        if root is not None:
            return Path(root).expanduser().resolve() / self.folder, "the root argument"
        env = os.environ.get(self.env_var)
        if env:
            return Path(env).expanduser().resolve(), f"${self.env_var}"
        return data_root() / self.folder, f"the default, <data root>/{self.folder}; ${self.env_var} is unset"

    def index(self, root: Path, origin: str = "") -> Arrays:
        """The file list of ``root``, built once (across processes) and cached; memoized per process."""
        missing = [p for p in (root, root / "train", root / "val") if not p.is_dir()]
        if missing:
            raise DataError(f"{self.name}: no folder {missing[0]}; {layout_help(root, origin)}")
        path = cache_root() / self.name / f"{self.name}-index-v1-{fingerprint(root)}.npz"
        if path not in _INDEXES:
            _INDEXES[path] = load_or_build(
                path, build=lambda: build_index(root, origin=origin), check=check_index
            )
            self._check_counts(_INDEXES[path], root)
        return _INDEXES[path]

    def _check_counts(self, arrays: Arrays, root: Path) -> None:
        found = (len(arrays["classes"]), len(arrays["train_labels"]), len(arrays["test_labels"]))
        if self.expected_counts is not None and found != self.expected_counts:
            log.warning(
                "%s in %s: %d classes, %d train and %d val images; the full data set has %d, %d and %d",
                self.name,
                root,
                *found,
                *self.expected_counts,
            )

    def open_split(
        self,
        split: str,
        *,
        root: str | Path | None = None,
        limit: int | None = None,
        seed: int = 0,
        num_threads: int | None = None,
    ) -> ImageFolderDataset:
        """One split (``train``, ``val`` or ``test``; see the module docstring for what each holds).

        ``limit`` keeps the first ``limit`` examples of the split's fixed order; ``seed`` seeds the
        train split's crops and flips; ``num_threads`` decoding threads (default
        ``$THINWIRE_DECODE_THREADS`` or ``min(4, cpu_count)``).
        """
        folder, origin = self.locate(root)
        arrays = self.index(folder, origin)
        source = "test" if split == "test" else "train"
        names, labels = arrays[f"{source}_names"], arrays[f"{source}_labels"]
        if split == "test":
            order = fixed_order(len(labels), _TEST_ORDER_SEED)
        else:
            order = fixed_order(len(labels), _TRAIN_ORDER_SEED)
            num_val = min(self.max_val, len(labels) // 10)
            order = order[:num_val] if split == "val" else order[num_val:]
        if limit is not None:
            order = order[:limit]
        info = DatasetInfo(
            name=self.name,
            kind="image",
            num_classes=len(arrays["classes"]),
            input_shape=(3, self.image_size, self.image_size),
        )
        return ImageFolderDataset(
            info,
            folder=folder / SPLIT_FOLDERS[source],
            classes=tuple(str(c) for c in arrays["classes"].tolist()),
            names=names[order],
            labels=labels[order],
            augment=split == "train",
            seed=seed,
            mean=self.mean,
            std=self.std,
            resize=self.resize,
            num_threads=num_threads or _decode_threads(),
        )
