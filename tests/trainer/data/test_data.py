"""Tests of trainer.data: real MNIST/Fashion-MNIST/PTB/Tiny Shakespeare from ../shared/data, CIFAR-10's
decoder on a synthetic tarball, the decode-once cache, integrity errors and epoch_batches.

Every test points THINWIRE_CACHE at a temporary folder; the real-data ones share one per session so
that each data set is decoded once per run.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import multiprocessing
import os
import shutil
import tarfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

import trainer.data.idx
import trainer.data.integrity
from trainer.data import DATASETS, DataError, ImageDataset, TextDataset, epoch_batches, load_dataset
from trainer.data.cifar import JpegTarImageSource, read_image_tar
from trainer.data.integrity import KNOWN_SHA256
from trainer.paths import data_root

REAL_ROOT = data_root()
MNIST_TRAIN_COUNTS = [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]
MNIST_TEST_COUNTS = [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]
READ_IDX = trainer.data.idx.read_idx
CIFAR_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")


def needs_real(folder: str) -> pytest.MarkDecorator:
    return pytest.mark.skipif(
        not (REAL_ROOT / folder).is_dir(), reason=f"real data not found in {REAL_ROOT / folder}"
    )


@pytest.fixture(scope="session")
def shared_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("thinwire-cache")


@pytest.fixture
def real_data(shared_cache: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Real data root, with a cache shared by the real-data tests of this session."""
    monkeypatch.setenv("THINWIRE_CACHE", str(shared_cache))
    monkeypatch.setenv("THINWIRE_DATA", str(REAL_ROOT))
    monkeypatch.delenv("THINWIRE_SKIP_CHECKSUM", raising=False)
    return REAL_ROOT


@pytest.fixture
def cold_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "cache"
    monkeypatch.setenv("THINWIRE_CACHE", str(cache))
    monkeypatch.delenv("THINWIRE_SKIP_CHECKSUM", raising=False)
    return cache


def row_hashes(images: torch.Tensor | np.ndarray) -> list[bytes]:
    array = np.ascontiguousarray(images).reshape(len(images), -1)
    return sorted(hashlib.sha1(row.tobytes()).digest() for row in array)


def all_batches(dataset: ImageDataset, batch_size: int = 4096) -> tuple[torch.Tensor, torch.Tensor]:
    xs, ys = zip(*(dataset.get_batch(i) for i in torch.arange(len(dataset)).split(batch_size)))
    return torch.cat(xs), torch.cat(ys)


# ---------------------------------------------------------------- real MNIST / Fashion-MNIST


@needs_real("mnist")
def test_mnist_test_split_shapes_dtypes_and_label_counts(real_data: Path) -> None:
    test = load_dataset("mnist", "test")
    assert isinstance(test, ImageDataset)
    assert test.info.name == "mnist" and test.info.kind == "image"
    assert test.info.num_classes == 10 and test.info.input_shape == (1, 28, 28)
    assert len(test) == 10000
    x, y = all_batches(test)
    assert x.dtype == torch.float32 and x.shape == (10000, 1, 28, 28)
    assert y.dtype == torch.int64 and y.shape == (10000,)
    assert torch.bincount(y, minlength=10).tolist() == MNIST_TEST_COUNTS
    # Normalized with the training set's mean/std: roughly zero mean, unit std on the test set too.
    assert abs(x.mean().item()) < 0.02 and abs(x.std().item() - 1) < 0.02


@needs_real("mnist")
def test_mnist_train_and_val_partition_the_training_set(real_data: Path) -> None:
    train, val = load_dataset("mnist", "train"), load_dataset("mnist", "val")
    assert isinstance(train, ImageDataset) and isinstance(val, ImageDataset)
    assert (len(train), len(val)) == (55000, 5000)
    counts = torch.bincount(torch.cat([train.labels, val.labels]), minlength=10).tolist()
    assert counts == MNIST_TRAIN_COUNTS
    # As multisets of rows, train + val is exactly the official training file (read here directly).
    with gzip.open(real_data / "mnist" / "train-images-idx3-ubyte.gz") as f:
        source = np.frombuffer(f.read(), dtype=np.uint8, offset=16).reshape(60000, -1)
    assert row_hashes(torch.cat([train.images, val.images])) == row_hashes(source)
    # The val split is a fixed subset: pinned here so that a change on any machine is caught.
    assert val.labels[:20].tolist() == [5, 7, 3, 2, 1, 9, 7, 2, 6, 3, 1, 1, 7, 0, 3, 2, 0, 4, 3, 1]


@needs_real("mnist")
def test_mnist_is_identical_across_calls_and_cold_caches(
    real_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = load_dataset("mnist", "val")
    again = load_dataset("mnist", "val")
    monkeypatch.setenv("THINWIRE_CACHE", str(tmp_path / "fresh"))
    fresh = load_dataset("mnist", "val")
    for other in (again, fresh):
        assert isinstance(first, ImageDataset) and isinstance(other, ImageDataset)
        assert torch.equal(first.images, other.images) and torch.equal(first.labels, other.labels)


@needs_real("mnist")
def test_second_load_comes_from_the_cache(cold_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = load_dataset("mnist", "test", root=REAL_ROOT)
    cached = list((cold_cache / "mnist").glob("mnist-*.npz"))
    assert len(cached) == 1

    def must_not_run(*args: object, **kwargs: object) -> None:
        raise AssertionError("the source was read again")

    # Neither decoded nor even re-hashed: the digest is remembered by (path, size, mtime).
    monkeypatch.setattr(trainer.data.idx, "read_idx", must_not_run)
    monkeypatch.setattr(trainer.data.integrity, "_hash_file", must_not_run)
    second = load_dataset("mnist", "test", root=REAL_ROOT)
    assert isinstance(first, ImageDataset) and isinstance(second, ImageDataset)
    assert torch.equal(first.images, second.images) and torch.equal(first.labels, second.labels)


@needs_real("mnist")
def test_corrupt_or_truncated_cache_is_rebuilt(
    cold_cache: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    reference = load_dataset("mnist", "test", root=REAL_ROOT)
    assert isinstance(reference, ImageDataset)
    (cached,) = (cold_cache / "mnist").glob("mnist-*.npz")
    decodes = []

    def counted_read_idx(path: Path, ndim: int) -> np.ndarray:
        decodes.append(path)
        return READ_IDX(path, ndim)

    monkeypatch.setattr(trainer.data.idx, "read_idx", counted_read_idx)
    for damage in ("flip", "truncate"):
        data = bytearray(cached.read_bytes())
        if damage == "flip":
            data[len(data) // 2] ^= 0xFF  # inside the train images: caught by the zip CRC
        else:
            del data[len(data) // 3 :]
        cached.write_bytes(bytes(data))
        caplog.clear()
        rebuilt = load_dataset("mnist", "test", root=REAL_ROOT)
        assert isinstance(rebuilt, ImageDataset)
        assert "rebuilding" in caplog.text
        assert torch.equal(rebuilt.images, reference.images)
    assert len(decodes) == 2 * 4  # rebuilt from the source each time (four IDX files)


@needs_real("fashion-mnist")
def test_fashion_mnist_loads_balanced(real_data: Path) -> None:
    train, val, test = (load_dataset("fashion-mnist", s) for s in ("train", "val", "test"))
    assert (
        isinstance(train, ImageDataset) and isinstance(val, ImageDataset) and isinstance(test, ImageDataset)
    )
    assert torch.bincount(torch.cat([train.labels, val.labels])).tolist() == [6000] * 10
    assert torch.bincount(test.labels).tolist() == [1000] * 10
    assert test.classes[0] == "T-shirt/top" and test.classes[9] == "Ankle boot"
    x, y = test.get_batch(torch.tensor([0, 5, 9]))
    assert x.shape == (3, 1, 28, 28) and x.dtype == torch.float32 and y.dtype == torch.int64


@needs_real("mnist")
def test_limit_takes_the_first_examples_of_the_split(real_data: Path) -> None:
    full, small = load_dataset("mnist", "train"), load_dataset("mnist", "train", limit=100)
    assert isinstance(full, ImageDataset) and isinstance(small, ImageDataset)
    assert len(small) == 100
    assert torch.equal(small.images, full.images[:100])
    assert len(torch.unique(small.labels)) == 10  # fixed shuffled order: a class-mixed subset


# ---------------------------------------------------------------- text


@needs_real("text")
def test_ptb_vocab_and_shift_by_one(real_data: Path) -> None:
    splits = {s: load_dataset("ptb", s, seq_len=35) for s in ("train", "val", "test")}
    for d in splits.values():
        assert isinstance(d, TextDataset)
        assert d.info.kind == "text" and d.info.vocab_size == 10000  # Mikolov's 10k, incl. <eos>, <unk>
    train, val, test = splits["train"], splits["val"], splits["test"]
    assert isinstance(train, TextDataset) and isinstance(val, TextDataset) and isinstance(test, TextDataset)
    assert train.vocab == val.vocab == test.vocab and {"<eos>", "<unk>"} <= set(train.vocab)
    assert [d.tokens.numel() for d in (train, val, test)] == [929589, 73760, 82430]
    assert len(train) == (929589 - 1) // 35
    x, y = train.get_batch(torch.tensor([0, 1, 7]))
    assert x.shape == y.shape == (3, 35) and x.dtype == y.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])
    assert y[0, -1] == x[1, 0]  # windows 0 and 1 are contiguous
    first_line = (real_data / "text" / "ptb.train.txt").read_text().split("\n")[0].split()
    assert [train.vocab[i] for i in x[0, : len(first_line) + 1]] == [*first_line, "<eos>"]


@needs_real("text")
def test_tinyshakespeare_characters_split_90_5_5(real_data: Path) -> None:
    text = (real_data / "text" / "tinyshakespeare.txt").read_bytes().decode()
    train, val, test = (load_dataset("tinyshakespeare", s, seq_len=64) for s in ("train", "val", "test"))
    assert isinstance(train, TextDataset) and isinstance(val, TextDataset) and isinstance(test, TextDataset)
    # 65 characters (all present in the train split) + <unk>.
    assert train.info.vocab_size == val.info.vocab_size == test.info.vocab_size == 66
    assert train.vocab == val.vocab == test.vocab
    assert [d.tokens.numel() for d in (train, val, test)] == [1003854, 55770, 55770]
    assert sum(d.tokens.numel() for d in (train, val, test)) == len(text) == 1115394
    x, y = val.get_batch(torch.tensor([0, 2]))
    assert "".join(val.vocab[i] for i in x[0]) == text[1003854 : 1003854 + 64]
    assert torch.equal(x[:, 1:], y[:, :-1])
    assert len(test) == (55770 - 1) // 64
    assert len(load_dataset("tinyshakespeare", "val", limit=10)) == 10
    with pytest.raises(IndexError):
        val.get_batch(torch.tensor([len(val)]))


# ---------------------------------------------------------------- CIFAR-10 (synthetic tarball)


def write_jpeg_tar(
    path: Path, num_per_class: dict[str, int], classes: tuple[str, ...] = CIFAR_CLASSES
) -> None:
    """A tarball in CIFAR-10's JPEG layout; image (split, c, n) is a flat colour 20*c + n."""
    with tarfile.open(path, "w:xz") as tar:
        readme = b"not an image"
        info = tarfile.TarInfo("README.md")
        info.size = len(readme)
        tar.addfile(info, io.BytesIO(readme))
        for split, count in num_per_class.items():
            for c, name in enumerate(classes):
                for n in reversed(range(count)):  # stored out of order: the decoder sorts
                    buffer = io.BytesIO()
                    Image.new("RGB", (32, 32), (20 * c + n, 100, 255 - 20 * c)).save(buffer, "JPEG")
                    info = tarfile.TarInfo(f"{split}/{name}/{n}.jpg")
                    info.size = buffer.tell()
                    buffer.seek(0)
                    tar.addfile(info, buffer)


def test_image_tar_decoding_order_and_classes(tmp_path: Path) -> None:
    path = tmp_path / "tiny.tar.xz"
    write_jpeg_tar(path, {"train": 11, "test": 2})  # 11: file "10.jpg" must sort after "9.jpg"
    arrays = read_image_tar(path, num_classes=10)
    assert tuple(arrays["classes"].tolist()) == CIFAR_CLASSES  # sorted folder names
    images, labels = arrays["train_images"], arrays["train_labels"]
    assert images.shape == (110, 3, 32, 32) and images.dtype == np.uint8
    assert labels.tolist() == [c for c in range(10) for _ in range(11)]
    assert arrays["test_images"].shape == (20, 3, 32, 32)
    red = images[:, 0].reshape(110, -1).mean(axis=1)
    expected = [20 * c + n for c in range(10) for n in range(11)]
    np.testing.assert_allclose(red, expected, atol=3)  # JPEG is lossy, a flat colour nearly exact


def test_cifar_count_mismatch_and_bad_layout_are_data_errors(
    tmp_path: Path, cold_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("THINWIRE_DATA", str(tmp_path))
    (tmp_path / "cifar10").mkdir()
    tarball = tmp_path / "cifar10" / "cifar10_jpg.tar.xz"
    write_jpeg_tar(tarball, {"train": 2, "test": 1})
    with pytest.raises(DataError, match="sha256 mismatch"):
        load_dataset("cifar10", "test")
    monkeypatch.setenv("THINWIRE_SKIP_CHECKSUM", "1")
    with pytest.raises(DataError, match="expected 5000 images per class"):
        load_dataset("cifar10", "test")
    write_jpeg_tar(tarball, {"train": 2, "test": 1}, classes=CIFAR_CLASSES[:9])
    with pytest.raises(DataError, match="10 class folders"):
        read_image_tar(tarball, num_classes=10)
    tarball.write_bytes(tarball.read_bytes()[:-200])
    with pytest.raises(DataError, match="truncated or corrupt"):
        read_image_tar(tarball, num_classes=10)
    assert not list(cold_cache.glob("cifar10/*.npz"))  # nothing bad was cached


def small_cifar(num_per_class: tuple[int, int]) -> JpegTarImageSource:
    """CIFAR-10's registry entry, expecting a tiny tarball."""
    real = DATASETS["cifar10"]
    assert isinstance(real, JpegTarImageSource)
    return JpegTarImageSource(
        "cifar10",
        folder=real.folder,
        files=real.files,
        input_shape=real.input_shape,
        classes=real.classes,
        num_examples=(10 * num_per_class[0], 10 * num_per_class[1]),
        num_per_class=num_per_class,
        num_val=10,
        mean=real.mean,
        std=real.std,
    )


def test_cifar_layout_through_load_dataset(
    tmp_path: Path, cold_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("THINWIRE_SKIP_CHECKSUM", "1")
    (tmp_path / "cifar10").mkdir()
    write_jpeg_tar(tmp_path / "cifar10" / "cifar10_jpg.tar.xz", {"train": 4, "test": 2})
    monkeypatch.setitem(DATASETS, "cifar10", small_cifar((4, 2)))
    train, val, test = (load_dataset("cifar10", s, root=tmp_path) for s in ("train", "val", "test"))
    assert (
        isinstance(train, ImageDataset) and isinstance(val, ImageDataset) and isinstance(test, ImageDataset)
    )
    assert (len(train), len(val), len(test)) == (30, 10, 20)
    assert test.info.input_shape == (3, 32, 32) and test.info.num_classes == 10
    x, y = test.get_batch(torch.arange(20))
    assert (
        x.shape == (20, 3, 32, 32)
        and x.dtype == torch.float32
        and sorted(y.tolist()) == sorted([c for c in range(10) for _ in range(2)])
    )
    # Normalization: blue channel of class c is 255 - 20c before JPEG.
    mean, std = test.mean[2], test.std[2]
    blue = x[:, 2].mean(dim=(1, 2)) * std + mean
    torch.testing.assert_close(blue, (255 - 20 * y).float() / 255, atol=3 / 255, rtol=0)


def counting_cifar(num_per_class: tuple[int, int], log_path: Path) -> JpegTarImageSource:
    """``small_cifar`` whose decode appends a line to ``log_path`` and takes at least a second."""
    source = small_cifar(num_per_class)
    decode = source.decode

    def logged_decode(folder: Path) -> dict[str, np.ndarray]:
        with log_path.open("a") as f:
            f.write(f"{os.getpid()} {threading.get_ident()}\n")
        time.sleep(1.0)  # keep the others waiting on the lock
        return decode(folder)

    source.decode = logged_decode
    return source


def _load_in_child(root: str, cache: str, log_path: str, barrier: Any, results: Any) -> None:
    os.environ.update(THINWIRE_DATA=root, THINWIRE_CACHE=cache, THINWIRE_SKIP_CHECKSUM="1")
    DATASETS["cifar10"] = counting_cifar((3, 1), Path(log_path))
    barrier.wait()
    dataset = load_dataset("cifar10", "train")
    assert isinstance(dataset, ImageDataset)
    results.put(hashlib.sha256(dataset.images.numpy().tobytes()).hexdigest())


def test_concurrent_cold_loads_decode_once(
    tmp_path: Path, cold_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Threads, for speed: flock excludes separate open()s of the lock file even within one process,
    # so this exercises the same lock as torchrun's ranks (the process version below is marked slow).
    monkeypatch.setenv("THINWIRE_SKIP_CHECKSUM", "1")
    (tmp_path / "cifar10").mkdir()
    write_jpeg_tar(tmp_path / "cifar10" / "cifar10_jpg.tar.xz", {"train": 3, "test": 1})
    log_path = tmp_path / "decodes.log"
    monkeypatch.setitem(DATASETS, "cifar10", counting_cifar((3, 1), log_path))
    barrier = threading.Barrier(4)

    def load(_: int) -> bytes:
        barrier.wait()
        dataset = load_dataset("cifar10", "train", root=tmp_path)
        assert isinstance(dataset, ImageDataset)
        return dataset.images.numpy().tobytes()

    with ThreadPoolExecutor(4) as pool:
        images = list(pool.map(load, range(4)))
    assert len(log_path.read_text().splitlines()) == 1  # one decoder; the others read its file
    assert len(set(images)) == 1
    assert len(list(cold_cache.glob("cifar10/*.npz"))) == 1


@pytest.mark.slow
def test_concurrent_cold_loads_in_processes_decode_once(tmp_path: Path) -> None:
    (tmp_path / "cifar10").mkdir()
    write_jpeg_tar(tmp_path / "cifar10" / "cifar10_jpg.tar.xz", {"train": 3, "test": 1})
    log_path = tmp_path / "decodes.log"
    context = multiprocessing.get_context("spawn")  # like torchrun: fresh interpreters
    barrier, results = context.Barrier(4), context.Queue()
    args = (str(tmp_path), str(tmp_path / "cache"), str(log_path), barrier, results)
    workers = [context.Process(target=_load_in_child, args=args) for _ in range(4)]
    for w in workers:
        w.start()
    digests = [results.get(timeout=120) for _ in workers]
    for w in workers:
        w.join(timeout=60)
        assert w.exitcode == 0
    assert len(log_path.read_text().splitlines()) == 1
    assert len(set(digests)) == 1


@pytest.mark.slow
@needs_real("cifar10")
def test_real_cifar10_full_decode(real_data: Path) -> None:
    train, val, test = (load_dataset("cifar10", s) for s in ("train", "val", "test"))
    assert (
        isinstance(train, ImageDataset) and isinstance(val, ImageDataset) and isinstance(test, ImageDataset)
    )
    assert (len(train), len(val), len(test)) == (45000, 5000, 10000)
    assert torch.bincount(torch.cat([train.labels, val.labels])).tolist() == [5000] * 10
    assert torch.bincount(test.labels).tolist() == [1000] * 10
    assert test.classes == CIFAR_CLASSES
    x, _ = all_batches(test)
    assert abs(x.mean().item()) < 0.05 and abs(x.std().item() - 1) < 0.05


# ---------------------------------------------------------------- epoch_batches


def test_epoch_batches_disjoint_equal_count_deterministic() -> None:
    kwargs = {"seed": 3, "epoch": 0}
    shards = [epoch_batches(103, 8, rank=r, world_size=4, **kwargs) for r in range(4)]
    assert {len(s) for s in shards} == {103 // 4 // 8}
    assert all(b.dtype == torch.int64 and b.shape == (8,) for s in shards for b in s)
    flat = torch.cat([b for s in shards for b in s])
    assert len(torch.unique(flat)) == len(flat) and int(flat.max()) < 103
    again = epoch_batches(103, 8, rank=2, world_size=4, **kwargs)
    assert all(torch.equal(a, b) for a, b in zip(again, shards[2]))
    next_epoch = epoch_batches(103, 8, rank=2, world_size=4, seed=3, epoch=1)
    assert not torch.equal(torch.cat(next_epoch), torch.cat(shards[2]))
    other_seed = epoch_batches(103, 8, rank=2, world_size=4, seed=4, epoch=0)
    assert not torch.equal(torch.cat(other_seed), torch.cat(shards[2]))
    # One rank covers its whole share: with world_size 1 every full batch is distinct indices.
    single = torch.cat(epoch_batches(100, 10, rank=0, world_size=1, seed=0, epoch=5))
    assert sorted(single.tolist()) == list(range(100))
    numpy_ints = epoch_batches(np.int64(100), np.int64(10), rank=0, world_size=1, seed=0, epoch=5)
    assert torch.equal(torch.cat(numpy_ints), single)
    # Fewer examples than one full batch per rank: no batches, on every rank alike.
    assert [epoch_batches(10, 8, rank=r, world_size=2, seed=0, epoch=0) for r in range(2)] == [[], []]


def test_epoch_batches_leaves_the_global_rng_alone() -> None:
    torch.manual_seed(123)
    state = torch.random.get_rng_state()
    epoch_batches(1000, 10, rank=1, world_size=2, seed=0, epoch=3)
    assert torch.equal(torch.random.get_rng_state(), state)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"batch_size": 0}, "batch_size must be >= 1, got 0"),
        ({"rank": 2}, r"rank must be in \[0, world_size=2\), got 2"),
        ({"rank": -1}, "got -1"),
        ({"world_size": 0, "rank": 0}, "world_size must be >= 1, got 0"),
        ({"batch_size": 2.5}, "batch_size must be an int, got 2.5"),
    ],
)
def test_epoch_batches_rejects_bad_values(kwargs: dict[str, object], message: str) -> None:
    args: dict[str, object] = {
        "num_examples": 100,
        "batch_size": 4,
        "rank": 0,
        "world_size": 2,
        "seed": 0,
        "epoch": 0,
    }
    args.update(kwargs)
    with pytest.raises(ValueError, match=message):
        epoch_batches(**args)


# ---------------------------------------------------------------- errors


def test_unknown_data_set_lists_valid_names() -> None:
    with pytest.raises(ValueError, match="cifar10, fashion-mnist, imagenet, mnist, ptb, tinyshakespeare"):
        load_dataset("imagenet21k", "train")


def test_unknown_split_lists_allowed() -> None:
    with pytest.raises(ValueError, match="unknown split 'valid'; allowed: train, val, test"):
        load_dataset("mnist", "valid")


def test_missing_folder_says_where_and_what(
    tmp_path: Path, cold_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("THINWIRE_DATA", str(tmp_path / "nowhere"))
    with pytest.raises(DataError) as error:
        load_dataset("mnist", "train")
    message = str(error.value)
    assert str(tmp_path / "nowhere" / "mnist") in message
    assert "train-images-idx3-ubyte.gz" in message and "t10k-labels-idx1-ubyte.gz" in message
    assert "THINWIRE_DATA" in message
    assert isinstance(error.value, ValueError)


def test_missing_file_is_named(tmp_path: Path, cold_cache: Path) -> None:
    (tmp_path / "text").mkdir()
    (tmp_path / "text" / "ptb.train.txt").write_text("a b\n")
    with pytest.raises(DataError, match=r"missing ptb\.valid\.txt, ptb\.test\.txt in .*THINWIRE_DATA"):
        load_dataset("ptb", "train", root=tmp_path)


def copy_mnist(tmp_path: Path) -> Path:
    folder = tmp_path / "mnist"
    shutil.copytree(REAL_ROOT / "mnist", folder)
    for file in folder.iterdir():
        file.chmod(0o644)
    return folder


@needs_real("mnist")
def test_truncated_gzip_is_rejected_even_without_checksum(
    tmp_path: Path, cold_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    labels = copy_mnist(tmp_path) / "t10k-labels-idx1-ubyte.gz"
    labels.write_bytes(labels.read_bytes()[:-100])
    with pytest.raises(DataError, match="sha256 mismatch"):
        load_dataset("mnist", "test", root=tmp_path)
    monkeypatch.setenv("THINWIRE_SKIP_CHECKSUM", "1")
    with pytest.raises(DataError, match=r"t10k-labels-idx1-ubyte\.gz is not a complete gzip file"):
        load_dataset("mnist", "test", root=tmp_path)
    assert not list(cold_cache.glob("mnist/*.npz"))


@needs_real("mnist")
def test_byte_flip_fails_the_checksum(
    tmp_path: Path, cold_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    labels = copy_mnist(tmp_path) / "t10k-labels-idx1-ubyte.gz"
    data = bytearray(labels.read_bytes())
    data[2000] ^= 0x01
    labels.write_bytes(bytes(data))
    with pytest.raises(DataError) as error:
        load_dataset("mnist", "test", root=tmp_path)
    message = str(error.value)
    assert str(labels) in message and "THINWIRE_SKIP_CHECKSUM=1" in message
    assert KNOWN_SHA256["mnist/t10k-labels-idx1-ubyte.gz"] in message
    assert hashlib.sha256(bytes(data)).hexdigest() in message
    # Skipping the checksum does not let it through: gzip's CRC (or the IDX structure) catches it.
    monkeypatch.setenv("THINWIRE_SKIP_CHECKSUM", "1")
    with pytest.raises(DataError):
        load_dataset("mnist", "test", root=tmp_path)


@pytest.mark.parametrize(
    ("header", "payload", "message"),
    [
        (bytes((0, 0, 8, 3)) + (2).to_bytes(4, "big") * 3, bytes(8), "magic number"),
        (bytes((0, 0, 8, 1)) + (5).to_bytes(4, "big"), bytes(4), r"dimensions \(5,\)"),
    ],
)
def test_idx_structure_is_checked(tmp_path: Path, header: bytes, payload: bytes, message: str) -> None:
    path = tmp_path / "bad-idx1-ubyte.gz"
    path.write_bytes(gzip.compress(header + payload))
    with pytest.raises(DataError, match=message):
        trainer.data.idx.read_idx(path, ndim=1)


def test_xz_crc_error_is_a_data_error(tmp_path: Path) -> None:
    path = tmp_path / "x.tar.xz"
    write_jpeg_tar(path, {"train": 1, "test": 1})
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(DataError, match="LZMAError|truncated or corrupt"):
        read_image_tar(path, num_classes=10)
