"""The training batches through ``torch.utils.data.DataLoader``: worker processes, prefetching,
pinned memory (``data_workers`` in a run; the paper-scale input path).

The loop's own path decodes each step's batch in the training process (``dataset.get_batch``),
which is all a CPU-scale run needs. At paper scale (ImageNet JPEGs feeding a GPU) decoding must
run ahead of the step in other processes. :func:`epoch_loader` serves exactly the same batches: the
sampler is the loop's own list of an epoch's index batches (``trainer.data.sampling``, seeded by the
run), from the step the run is at, so a resumed run reads the batches it would have read; each
batch is the data set's ``get_batch`` of those indices, made in a worker. ImageNet's augmentation
draws depend on (seed, example, epoch) only (``trainer.data.imagefolder``), so they are the same in
any process. Batches arrive in order (``DataLoader`` keeps the sampler's order).

Only for ``sampling: epochs``: with ``draws`` an example may recur within an epoch, and its
augmentation draw is counted in the process that decodes it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import Tensor

from .base import Dataset


class _IndexBatches(torch.utils.data.Dataset[tuple[Tensor, Tensor]]):
    """A data set whose items are whole batches: ``__getitems__`` gets a batch's indices."""

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        return self.dataset.get_batch(torch.tensor([index]))

    def __getitems__(self, indices: list[int]) -> tuple[Tensor, Tensor]:
        return self.dataset.get_batch(torch.tensor(indices, dtype=torch.long))


def _as_is(batch: Any) -> Any:
    return batch


def _worker_threads(_: int) -> None:
    torch.set_num_threads(1)  # the training process keeps the cores' threads; a worker decodes


def epoch_loader(
    dataset: Dataset,
    batches: Sequence[Tensor],
    *,
    workers: int,
    pin_memory: bool = False,
    prefetch_factor: int = 2,
) -> Iterator[tuple[Tensor, Tensor]]:
    """``(x, y)`` of every index batch in ``batches``, in order, decoded by ``workers`` processes
    (0: in this process, through the same DataLoader), ``prefetch_factor`` batches ahead each."""
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 0:
        raise ValueError(f"workers must be an int >= 0, got {workers!r}")
    loader = torch.utils.data.DataLoader(
        _IndexBatches(dataset),
        batch_sampler=[b.tolist() for b in batches],
        num_workers=workers,
        collate_fn=_as_is,
        pin_memory=pin_memory,
        prefetch_factor=prefetch_factor if workers else None,
        worker_init_fn=_worker_threads if workers else None,
    )
    return iter(loader)
