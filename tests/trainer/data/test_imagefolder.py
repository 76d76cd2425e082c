"""Tests of the lazily decoded ImageNet data set on a tiny synthetic tree of JPEGs.

Every image encodes its class in its red channel (a constant ``RED[class]``) and its position in
green (left to right) and blue (top to bottom) gradients, so that labels, crops and flips can be
read back from the decoded pixels.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import trainer.data.imagefolder as imagefolder
from trainer.data import DATASETS, DataError, load_dataset
from trainer.data.imagefolder import IMAGENET_MEAN, IMAGENET_STD, ImageFolderDataset, random_resized_crop_box

# Created in this (unsorted) order; labels must follow the sorted order n01..., n04..., n09....
WNIDS = ("n09999999", "n01000000", "n04444444")
RED = {"n01000000": 30, "n04444444": 130, "n09999999": 230}
NUM_TRAIN, NUM_VAL = 4, 2  # per class
# (width, height) per image, cycled (val starts at the third): landscape, portrait, smaller than
# the crop, very wide.
SIZES = ((320, 240), (180, 300), (150, 120), (400, 60))


def _image(wnid: str, size: tuple[int, int]) -> Image.Image:
    width, height = size
    pixels = np.empty((height, width, 3), dtype=np.uint8)
    pixels[..., 0] = RED[wnid]
    pixels[..., 1] = np.linspace(0, 255, width, dtype=np.uint8)[None, :]
    pixels[..., 2] = np.linspace(0, 255, height, dtype=np.uint8)[:, None]
    return Image.fromarray(pixels)


def make_tree(root: Path) -> Path:
    for folder, count, first_size in (("train", NUM_TRAIN, 0), ("val", NUM_VAL, 2)):
        for wnid in WNIDS:
            (root / folder / wnid).mkdir(parents=True)
            for k in range(count):
                image = _image(wnid, SIZES[(first_size + k) % len(SIZES)])
                if k == 1:
                    image = image.convert("CMYK")  # ImageNet has a few CMYK JPEGs
                image.save(root / folder / wnid / f"{wnid}_{k}.JPEG", quality=95)
    (root / "train" / WNIDS[0] / "notes.txt").write_text("not an image")
    return root


@pytest.fixture
def tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = make_tree(tmp_path / "ilsvrc")
    monkeypatch.setenv("THINWIRE_IMAGENET", str(root))
    monkeypatch.setenv("THINWIRE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("THINWIRE_DECODE_THREADS", "2")
    monkeypatch.setattr(imagefolder, "_INDEXES", {})
    return root


def _pixels(x: torch.Tensor) -> torch.Tensor:
    """Undo the normalization: back to [0, 255]."""
    mean = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
    return (x * std + mean) * 255


def _all(dataset: ImageFolderDataset) -> tuple[torch.Tensor, torch.Tensor]:
    return dataset.get_batch(torch.arange(len(dataset)))


def test_splits_shapes_and_info(tree: Path) -> None:
    # The registered source trains on every training image, as the papers do: "val" is empty.
    full, empty = load_dataset("imagenet", "train"), load_dataset("imagenet", "val")
    assert (len(full), len(empty)) == (12, 0)
    # With a held-out slice: val = min(max_val, N // 10) = 1 of the 12 training images.
    registered = DATASETS["imagenet"]
    assert isinstance(registered, imagefolder.ImageFolderSource)
    source = imagefolder.ImageFolderSource(
        "imagenet", folder=registered.folder, env_var=registered.env_var, max_val=10_000
    )
    train, val, test = (source.open_split(split) for split in ("train", "val", "test"))
    assert (len(train), len(val), len(test)) == (11, 1, 6)
    for dataset in (train, val, test):
        assert dataset.info.name == "imagenet" and dataset.info.kind == "image"
        assert dataset.info.num_classes == 3 and dataset.info.input_shape == (3, 224, 224)
        x, y = _all(dataset)
        assert x.shape == (len(dataset), 3, 224, 224) and x.dtype == torch.float32 and x.is_contiguous()
        assert y.shape == (len(dataset),) and y.dtype == torch.int64
    assert torch.equal(_all(val)[0], _all(val)[0])  # val reads with the test transform
    train_files = {train.file(i) for i in range(len(train))}
    assert val.file(0) not in train_files
    assert train_files | {val.file(0)} == set((tree / "train").glob("*/*.JPEG"))
    assert {test.file(i) for i in range(len(test))} == set((tree / "val").glob("*/*.JPEG"))


@pytest.mark.parametrize("split", ["train", "test"])
def test_labels_follow_sorted_class_folders(tree: Path, split: str) -> None:
    dataset = load_dataset("imagenet", split)
    assert dataset.classes == tuple(sorted(WNIDS))
    x, y = _all(dataset)
    for i in range(len(dataset)):
        assert dataset.classes[int(y[i])] == dataset.file(i).parent.name
    # The label also matches the pixels: the red channel encodes the class (JPEG error: a few levels).
    red = _pixels(x)[:, 0].mean(dim=(1, 2))
    expected = torch.tensor([RED[dataset.classes[int(label)]] for label in y], dtype=torch.float32)
    torch.testing.assert_close(red, expected, atol=4.0, rtol=0)


def test_train_crops_depend_only_on_seed_example_and_draw(tree: Path) -> None:
    source = DATASETS["imagenet"]
    torch_state, numpy_state = torch.get_rng_state(), np.random.get_state()
    a, b, c = (source.open_split("train", seed=s) for s in (5, 5, 6))
    batch = torch.tensor([0, 3, 7])
    xa, ya = a.get_batch(batch)
    xb, yb = b.get_batch(batch)
    assert torch.equal(xa, xb) and torch.equal(ya, yb)
    assert not torch.allclose(xa, c.get_batch(batch)[0])  # another seed, other crops
    # Example 7's first crop is the same alone or in another batch, whatever thread decodes it.
    fresh = source.open_split("train", seed=5, num_threads=1)
    assert torch.equal(fresh.get_batch(torch.tensor([7]))[0][0], xa[2])
    # The next request of the same examples is the next draw: new crops; set_epoch(0) replays them.
    assert not torch.allclose(a.get_batch(batch)[0], xa)
    a.set_epoch(0)
    assert torch.equal(a.get_batch(batch)[0], xa)
    # The global RNGs were not touched.
    assert torch.equal(torch.get_rng_state(), torch_state)
    assert all(np.array_equal(p, q) for p, q in zip(np.random.get_state(), numpy_state))


def test_train_transform_crops_and_flips(tree: Path) -> None:
    dataset = load_dataset("imagenet", "train")
    green = torch.stack([_pixels(dataset.get_batch(torch.tensor([0]))[0])[0, 1] for _ in range(24)])
    # Green rises left to right in every image; a flipped crop has it falling.
    slope = green[:, :, -8:].mean(dim=(1, 2)) - green[:, :, :8].mean(dim=(1, 2))
    assert (slope > 0).any() and (slope < 0).any()
    assert len({round(float(s)) for s in slope}) > 12  # crops of different sizes and places


def test_random_resized_crop_box_stays_inside_with_valid_shape() -> None:
    rng = np.random.default_rng(0)
    for width, height in ((500, 375), (64, 64), (1000, 10), (10, 1000), (1, 1)):
        for _ in range(200):
            left, top, w, h = random_resized_crop_box(width, height, rng)
            assert left >= 0 and top >= 0 and w > 0 and h > 0
            assert left + w <= width and top + h <= height
            if (width, height) == (500, 375):
                assert 0.07 <= w * h / (width * height) <= 1.0
                assert 3 / 4 - 0.02 <= w / h <= 4 / 3 + 0.02


def test_test_split_is_torchvisions_resize_and_center_crop(tree: Path) -> None:
    transforms = pytest.importorskip("torchvision.transforms")
    first, second = load_dataset("imagenet", "test"), load_dataset("imagenet", "test")
    x = _all(first)[0]
    assert torch.equal(x, _all(second)[0]) and torch.equal(x, _all(first)[0])
    reference = transforms.Compose(
        [
            transforms.Resize(256),
            transforms.CenterCrop(224),
            transforms.ToTensor(),
            transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD),
        ]
    )
    for i in range(len(first)):
        with Image.open(first.file(i)) as image:
            expected = reference(image.convert("RGB"))
        torch.testing.assert_close(x[i], expected, atol=1e-6, rtol=0)


def test_limit_takes_the_first_examples_of_the_split(tree: Path) -> None:
    for split in ("train", "test"):
        full = load_dataset("imagenet", split)
        limited = load_dataset("imagenet", split, limit=4)
        assert len(limited) == 4
        assert [limited.file(i) for i in range(4)] == [full.file(i) for i in range(4)]
        assert len(load_dataset("imagenet", split, limit=1000)) == len(full)


def test_file_list_is_cached_and_rebuilt_when_a_folder_changes(
    tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert len(load_dataset("imagenet", "test")) == 6
    monkeypatch.setattr(imagefolder, "_INDEXES", {})  # as a new process: only the index file remains
    real_build = imagefolder.build_index

    def must_not_run(*args: object, **kwargs: object) -> None:
        raise AssertionError("the file list was rebuilt from a warm cache")

    monkeypatch.setattr(imagefolder, "build_index", must_not_run)
    assert len(load_dataset("imagenet", "test")) == 6
    monkeypatch.setattr(imagefolder, "build_index", real_build)
    _image(WNIDS[0], (300, 300)).save(tree / "val" / WNIDS[0] / "extra.JPEG")
    assert len(load_dataset("imagenet", "test")) == 7


def test_missing_folder_says_where_what_and_which_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("THINWIRE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("THINWIRE_IMAGENET", str(tmp_path / "nowhere"))
    with pytest.raises(DataError) as error:
        load_dataset("imagenet", "train")
    message = str(error.value)
    assert str(tmp_path / "nowhere") in message
    assert "train/<wnid>/*.JPEG" in message and "val/<wnid>/*.JPEG" in message
    assert "THINWIRE_IMAGENET" in message
    assert isinstance(error.value, ValueError)
    # An explicit root names the folder holding the data sets: <root>/imagenet.
    with pytest.raises(DataError, match=str(tmp_path / "elsewhere" / "imagenet")):
        load_dataset("imagenet", "test", root=tmp_path / "elsewhere")


def test_flat_val_folder_and_mismatched_classes_are_data_errors(tree: Path) -> None:
    extra = tree / "train" / "n05555555"
    extra.mkdir()
    _image(WNIDS[0], (64, 64)).save(extra / "a.JPEG")
    with pytest.raises(DataError, match=r"only in train/: \['n05555555'\]"):
        load_dataset("imagenet", "train")
    for file in extra.iterdir():
        file.unlink()
    extra.rmdir()
    for wnid in WNIDS:  # the raw ILSVRC-2012 val tarball: 50,000 JPEGs in one folder
        for file in (tree / "val" / wnid).iterdir():
            file.rename(tree / "val" / f"{wnid}-{file.name}")
        (tree / "val" / wnid).rmdir()
    with pytest.raises(DataError, match="holds images but no class folders"):
        load_dataset("imagenet", "test")


def test_corrupt_image_is_a_data_error_naming_the_file(tree: Path) -> None:
    dataset = load_dataset("imagenet", "test")
    dataset.file(0).write_bytes(b"\xff\xd8 not a jpeg")
    with pytest.raises(DataError, match=str(dataset.file(0))):
        dataset.get_batch(torch.tensor([0, 1]))
