"""The DataLoader path (``data_workers``): the loop's batches, decoded in worker processes."""

from __future__ import annotations

import pytest
import torch

from tests.trainer.data.test_imagefolder import tree  # noqa: F401  (the fixture: a small ILSVRC-like folder)
from trainer.checks import checked_config
from trainer.data import epoch_batches, load_dataset
from trainer.data.loader import epoch_loader


def _batches(n: int, batch: int, epoch: int) -> list[torch.Tensor]:
    return epoch_batches(n, batch, rank=0, world_size=1, seed=3, epoch=epoch)


@pytest.mark.parametrize("workers", [0, 2])
def test_the_loader_serves_the_in_process_batches_in_order(workers):
    mnist = load_dataset("mnist", "train", limit=640)
    batches = _batches(len(mnist), 64, epoch=1)
    loaded = list(epoch_loader(mnist, batches[3:], workers=workers))
    assert len(loaded) == len(batches) - 3
    for (x, y), indices in zip(loaded, batches[3:], strict=True):
        ex, ey = mnist.get_batch(indices)
        assert torch.equal(x, ex) and torch.equal(y, ey)


def test_imagenet_augmentation_is_the_same_in_a_worker(tree):  # noqa: F811
    """Random resized crops and flips drawn by (seed, example, epoch): a forked worker decodes the
    same pixels as the training process (and its decode threads are its own)."""
    train_set = load_dataset("imagenet", "train")
    batches = _batches(len(train_set), 4, epoch=2)
    train_set.set_epoch(2)
    expected = [train_set.get_batch(b) for b in batches]
    train_set.set_epoch(2)
    loaded = list(epoch_loader(train_set, batches, workers=2))
    for (x, y), (ex, ey) in zip(loaded, expected, strict=True):
        assert torch.equal(x, ex) and torch.equal(y, ey)


def test_a_bad_worker_count_or_drawn_batches_are_rejected():
    with pytest.raises(ValueError, match="workers must be an int >= 0, got -1"):
        epoch_loader(load_dataset("mnist", "test", limit=8), [], workers=-1)
    base = {"dataset": "mnist", "model": "mlp"}
    with pytest.raises(ValueError, match="data_workers must be null or an integer >= 0, got -2"):
        checked_config({**base, "data_workers": -2})
    with pytest.raises(ValueError, match="data_workers 1 needs sampling: epochs"):
        checked_config({**base, "data_workers": 1, "sampling": "draws"})
    assert checked_config({**base, "data_workers": 2}).fingerprint() == checked_config(base).fingerprint()
