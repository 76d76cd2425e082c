"""Count what a block of code dispatches to ATen: the GPU hot path's tests run on CPU.

A launch on a GPU is a dispatched op here (plus what Triton launches itself, counted by
``kernel_calls``), and a host read of a device value is one of :data:`HOST_READS`. Counting them
on CPU tensors says what the same code does on a GPU without one.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

#: Ops that read a device value on the host, or whose output shape depends on the data (which on
#: a GPU means waiting for it): none may run inside a training step's hot path. (``_assert_async``
#: is not one: on a GPU it checks on the device, and only a failure surfaces later.)
HOST_READS = frozenset(
    {
        "aten._local_scalar_dense",
        "aten.item",
        "aten.nonzero",
        "aten.nonzero_static",
        "aten.unique",
        "aten._unique",
        "aten._unique2",
        "aten.unique_dim",
        "aten.unique_consecutive",
        "aten.masked_select",
        "aten.is_nonzero",
        "aten.equal",
        "aten.allclose",
    }
)
#: Boolean-mask indexing reads the mask's count: ``aten.index.Tensor`` with a bool index.
_MASK_INDEXING = ("aten.index.Tensor", "aten.index_put.default", "aten.index_put_.default")


class OpCounter(TorchDispatchMode):
    """Counts every ATen op dispatched inside the block (``counts``: op name -> calls) and lists
    the host reads (``host_reads``), boolean-mask indexing included."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter[str] = Counter()
        self.host_reads: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = str(func.overloadpacket and func.name()).replace("::", ".")
        packet = name.rsplit(".", 1)[0] if name.count(".") > 1 else name
        self.counts[name] += 1
        if name in HOST_READS or packet in HOST_READS:
            self.host_reads.append(name)
        elif name in _MASK_INDEXING and _has_bool_index(args):
            self.host_reads.append(f"{name} (boolean mask)")
        return func(*args, **(kwargs or {}))

    @property
    def total(self) -> int:
        return sum(self.counts.values())


def _has_bool_index(args: Any) -> bool:
    indices = args[1] if len(args) > 1 else None
    if isinstance(indices, list | tuple):
        return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in indices)
    return False


@contextmanager
def counting_ops() -> Iterator[OpCounter]:
    counter = OpCounter()
    with counter:
        yield counter


def count_ops(fn: Callable[[], Any]) -> OpCounter:
    """Run ``fn()`` once under an :class:`OpCounter` and return it."""
    with counting_ops() as counter:
        fn()
    return counter
