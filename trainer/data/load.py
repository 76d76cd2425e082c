"""The data-set registry and ``load_dataset``: verify the sources, decode once, cache, split.

Lazy sources (:class:`ImageFolderSource`: ImageNet) skip the checksum and the decode-once cache and
decode their images per batch.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from common.registry import lookup

from ..paths import cache_root, data_root
from .base import SPLITS, Dataset, DatasetSource
from .cache import load_or_build
from .cifar import JpegTarImageSource
from .idx import IDX_FILES, IdxImageSource
from .imagefolder import ILSVRC2012_COUNTS, ImageFolderSource
from .imagefolder_index import IMAGENET_ENV
from .integrity import check_sources
from .text import CharTextSource, WordTextSource

_DIGITS = tuple(str(d) for d in range(10))
_FASHION = (
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
)
_CIFAR10 = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")

# mean/std: per-channel pixel statistics (in [0, 1]) of the whole official training set (60k/50k images),
# measured with numpy on the decoded arrays.
DATASETS: dict[str, DatasetSource | ImageFolderSource] = {
    "mnist": IdxImageSource(
        "mnist",
        folder="mnist",
        files=IDX_FILES,
        input_shape=(1, 28, 28),
        classes=_DIGITS,
        num_examples=(60000, 10000),
        num_per_class=None,
        num_val=5000,
        mean=(0.1307,),
        std=(0.3081,),
    ),
    "fashion-mnist": IdxImageSource(
        "fashion-mnist",
        folder="fashion-mnist",
        files=IDX_FILES,
        input_shape=(1, 28, 28),
        classes=_FASHION,
        num_examples=(60000, 10000),
        num_per_class=(6000, 1000),
        num_val=5000,
        mean=(0.2860,),
        std=(0.3530,),
    ),
    "cifar10": JpegTarImageSource(
        "cifar10",
        folder="cifar10",
        files=("cifar10_jpg.tar.xz",),
        input_shape=(3, 32, 32),
        classes=_CIFAR10,
        num_examples=(50000, 10000),
        num_per_class=(5000, 1000),
        num_val=5000,
        # Measured on this JPEG (q75) copy; the lossless original's are (0.4914, 0.4822, 0.4465) and
        # (0.2470, 0.2435, 0.2616): JPEG smooths the pixels, lowering the std.
        mean=(0.4913, 0.4821, 0.4465),
        std=(0.2452, 0.2428, 0.2606),
    ),
    "tinyshakespeare": CharTextSource("tinyshakespeare", folder="text", files=("tinyshakespeare.txt",)),
    "ptb": WordTextSource("ptb", folder="text", files=("ptb.train.txt", "ptb.valid.txt", "ptb.test.txt")),
    # ILSVRC-2012 from $THINWIRE_IMAGENET (default <data root>/imagenet), decoded per batch.
    "imagenet": ImageFolderSource(
        "imagenet",
        folder="imagenet",
        env_var=IMAGENET_ENV,
        expected_counts=ILSVRC2012_COUNTS,
        max_val=0,  # train on all 1,281,167 images as the papers do; "val" is empty
    ),
}


def cache_path(source: DatasetSource, digests: list[str]) -> Path:
    """``cache_root()/<name>/<name>-v<format>-<key>.npz``; the key hashes the sources' sha256."""
    key = hashlib.sha256("\n".join([source.name, *source.files, *digests]).encode()).hexdigest()[:16]
    return cache_root() / source.name / f"{source.name}-v{source.format_version}-{key}.npz"


def load_dataset(
    name: str,
    split: str,
    *,
    root: str | Path | None = None,
    seq_len: int = 64,
    limit: int | None = None,
    seed: int = 0,
) -> Dataset:
    """Load one split of a registered data set (see ``DATASETS``), decoding it once into the cache
    (ImageNet: decoding each batch when asked).

    ``root`` is the folder holding the data sets' folders (default: ``$THINWIRE_DATA`` or
    ``../shared/data``; ImageNet without ``root``: ``$THINWIRE_IMAGENET`` if set, see
    :mod:`trainer.data.imagefolder`). ``split`` is ``train``, ``val`` (carved from the official
    training set) or ``test``. ``seq_len`` is the window length of text data sets. ``limit`` keeps
    the first ``limit`` examples of the split's fixed order. ``seed`` seeds the augmentation of
    data sets that augment as they decode (ImageNet's train split); the others ignore it.
    """
    source = lookup(DATASETS, name, "data set")
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; allowed: {', '.join(SPLITS)}")
    if seq_len < 1:
        raise ValueError(f"seq_len must be >= 1, got {seq_len}")
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be None or >= 1, got {limit}")
    if isinstance(source, ImageFolderSource):
        return source.open_split(split, root=root, limit=limit, seed=seed)
    root = Path(root).expanduser().resolve() if root is not None else data_root()
    folder = root / source.folder
    digests = check_sources(name, root, source.folder, source.files)
    arrays = load_or_build(
        cache_path(source, digests),
        build=lambda: source.decode(folder),
        check=source.check_arrays,
    )
    return source.make_split(arrays, split, seq_len=seq_len, limit=limit)
