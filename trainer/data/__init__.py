"""Real data sets, offline: MNIST, Fashion-MNIST, CIFAR-10 (JPEG), Tiny Shakespeare, Penn Treebank.

    from trainer.data import load_dataset, epoch_batches
    train = load_dataset("mnist", "train")          # from $THINWIRE_DATA or ../shared/data
    for indices in epoch_batches(len(train), 64, rank=0, world_size=1, seed=0, epoch=0):
        x, y = train.get_batch(indices)

Sources are checked (sha256 against ../shared/data/README.md, then structure), decoded once and
cached under ``cache_root()`` (``$THINWIRE_CACHE`` or ``<repo>/.cache``); several processes may load
the same cold data set at once, and only one decodes it.
"""

from .base import SPLITS, DataError, Dataset, DatasetInfo, DatasetSource
from .images import ImageDataset
from .load import DATASETS, load_dataset
from .sampling import drawn_batch, epoch_batches
from .text import TextDataset

__all__ = [
    "DATASETS",
    "SPLITS",
    "DataError",
    "Dataset",
    "DatasetInfo",
    "DatasetSource",
    "ImageDataset",
    "TextDataset",
    "drawn_batch",
    "epoch_batches",
    "load_dataset",
]
