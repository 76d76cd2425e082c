"""The file list of an ImageNet-style folder tree (``<root>/{train,val}/<wnid>/*.JPEG``): the scan
that builds it, the check of a cached copy, and the fingerprint that keys the cache
(:mod:`trainer.data.imagefolder` reads the images).
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from pathlib import Path

import numpy as np

from .base import Arrays, DataError

log = logging.getLogger(__name__)

IMAGENET_ENV = "THINWIRE_IMAGENET"

_IMAGE_SUFFIXES = (".jpeg", ".jpg", ".png")
# Split name in the index -> folder under the root.
SPLIT_FOLDERS = {"train": "train", "test": "val"}


def layout_help(root: Path, origin: str) -> str:
    return (
        f"expected the ILSVRC-2012 images as {root}/train/<wnid>/*.JPEG (1000 class folders) and "
        f"{root}/val/<wnid>/*.JPEG (the validation images sorted into the same class folders); "
        f"looked in {root} ({origin}); set {IMAGENET_ENV} to the folder that holds train/ and val/"
    )


def _list_split(folder: Path) -> dict[str, list[str]]:
    """Class folder name -> sorted image file names, for one split folder."""
    found: dict[str, list[str]] = {}
    with os.scandir(folder) as entries:
        class_dirs = sorted(e.name for e in entries if e.is_dir() and not e.name.startswith("."))
    for name in class_dirs:
        with os.scandir(folder / name) as entries:
            found[name] = sorted(
                e.name
                for e in entries
                if not e.name.startswith(".") and e.name.lower().endswith(_IMAGE_SUFFIXES) and e.is_file()
            )
    return found


def _loose_images(folder: Path) -> int:
    with os.scandir(folder) as entries:
        return sum(1 for e in entries if e.name.lower().endswith(_IMAGE_SUFFIXES) and e.is_file())


def build_index(root: Path, *, origin: str = "") -> Arrays:
    """Scan ``root/{train,val}/<wnid>/`` into ``classes``, ``{train,test}_names`` (file names as
    bytes) and ``{train,test}_labels`` (int64), everything in sorted order."""
    start = time.perf_counter()
    listings = {split: _list_split(root / folder) for split, folder in SPLIT_FOLDERS.items()}
    classes = sorted(listings["train"])
    if not classes:
        raise DataError(f"imagenet: no class folders in {root / 'train'}; {layout_help(root, origin)}")
    if not listings["test"] and _loose_images(root / "val"):
        raise DataError(
            f"imagenet: {root / 'val'} holds images but no class folders: sort the validation images "
            f"into one folder per wnid, as train/ (e.g. with the ILSVRC-2012 validation ground truth "
            f"and the usual valprep.sh); {layout_help(root, origin)}"
        )
    if sorted(listings["test"]) != classes:
        only_train = sorted(set(classes) - set(listings["test"]))
        only_val = sorted(set(listings["test"]) - set(classes))
        raise DataError(
            f"imagenet: train/ and val/ in {root} have different class folders: only in train/: "
            f"{only_train[:5]}{' ...' if len(only_train) > 5 else ''} ({len(only_train)}), only in "
            f"val/: {only_val[:5]}{' ...' if len(only_val) > 5 else ''} ({len(only_val)})"
        )
    arrays: Arrays = {"classes": np.array(classes, dtype=np.str_)}
    for split, listing in listings.items():
        empty = [name for name in classes if not listing[name]]
        if empty:
            raise DataError(
                f"imagenet: {len(empty)} class folder(s) of {root / SPLIT_FOLDERS[split]} hold no "
                f"{'/'.join(_IMAGE_SUFFIXES)} images: {empty[:5]}{' ...' if len(empty) > 5 else ''}"
            )
        names = [os.fsencode(file) for name in classes for file in listing[name]]
        arrays[f"{split}_names"] = np.array(names, dtype=np.bytes_)
        arrays[f"{split}_labels"] = np.repeat(
            np.arange(len(classes), dtype=np.int64), [len(listing[name]) for name in classes]
        )
    log.info(
        "indexed %s: %d classes, %d train / %d val images in %.1f s",
        root,
        len(classes),
        len(arrays["train_labels"]),
        len(arrays["test_labels"]),
        time.perf_counter() - start,
    )
    return arrays


def check_index(arrays: Arrays) -> None:
    """Raise ``DataError`` unless ``arrays`` has the structure ``build_index`` produces."""
    classes = arrays.get("classes")
    if classes is None or classes.ndim != 1 or classes.dtype.kind != "U" or len(classes) == 0:
        raise DataError("imagenet index: no class names")
    for split in SPLIT_FOLDERS:
        names, labels = arrays.get(f"{split}_names"), arrays.get(f"{split}_labels")
        if names is None or labels is None or names.dtype.kind != "S" or labels.dtype != np.int64:
            raise DataError(f"imagenet index: no {split} file names / int64 labels")
        if names.shape != labels.shape or names.ndim != 1:
            raise DataError(f"imagenet index: {split} names and labels differ in shape")
        if len(labels) and (labels.min() < 0 or labels.max() >= len(classes)):
            raise DataError(f"imagenet index: {split} labels outside [0, {len(classes)})")


def fingerprint(root: Path) -> str:
    """Hash of the root path and the mtime of every split and class folder: a folder's mtime
    changes when an entry is added, removed or renamed in it."""
    digest = hashlib.sha256(str(root).encode())
    for folder in SPLIT_FOLDERS.values():
        split_dir = root / folder
        digest.update(f"\n{folder}:{split_dir.stat().st_mtime_ns}".encode())
        with os.scandir(split_dir) as entries:
            for entry in sorted(entries, key=lambda e: e.name):
                if entry.is_dir():
                    digest.update(f"\n{entry.name}:{entry.stat().st_mtime_ns}".encode())
    return digest.hexdigest()[:16]
