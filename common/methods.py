"""Every sync strategy a run can name (``strategy:``), by the name it declares.

A new strategy is one class with ``name``, ``needs``, ``ignores``, ``check_options`` and
``from_config`` (:class:`~common.strategies.base.SyncStrategy`) and one entry here: the run's
validation and the loop read only its declarations.

A paper's own strategy is an entry ``"module:attribute"``: the library never imports a paper, it
knows the paper's strategy by name only and imports it when a run asks for that name (as
torchtitan's core knows its experiments).
"""

from __future__ import annotations

import importlib

from .gossip import GossipStrategy
from .strategies import (
    DataParallel,
    DetachedEFDataParallel,
    DGCDataParallel,
    SparseDataParallel,
    SyncStrategy,
    TorchHookDataParallel,
)

#: name -> the strategy class, or ``"module:attribute"`` of a paper's, imported when asked for.
STRATEGIES: dict[str, type[SyncStrategy] | str] = {
    DataParallel.name: DataParallel,
    DGCDataParallel.name: DGCDataParallel,
    DetachedEFDataParallel.name: DetachedEFDataParallel,
    SparseDataParallel.name: SparseDataParallel,
    GossipStrategy.name: GossipStrategy,
    "compact": "papers.sparse_axonn.strategies.compact:CompactDataParallel",
    TorchHookDataParallel.name: TorchHookDataParallel,
    "pipeline": "papers.sparse_axonn.strategies.pipeline:PipelineDataParallel",
}


def strategy_class(name: str) -> type[SyncStrategy]:
    """The strategy class ``name`` (a ValueError lists the valid names); a paper's is imported now."""
    try:
        entry = STRATEGIES[name]
    except KeyError:
        raise ValueError(f"unknown strategy {name!r}; valid: {', '.join(STRATEGIES)}") from None
    if not isinstance(entry, str):
        return entry
    module, _, attribute = entry.partition(":")
    try:
        cls = getattr(importlib.import_module(module), attribute)
    except (ImportError, AttributeError) as error:
        raise ImportError(f"strategy {name!r} is {entry}, which cannot be imported: {error}") from error
    if not (isinstance(cls, type) and issubclass(cls, SyncStrategy) and cls.name == name):
        raise TypeError(f"strategy {name!r} is {entry}: not a SyncStrategy named {name!r}")
    return cls
