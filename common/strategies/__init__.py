"""Sync strategies: what crosses the wire in a training step, plugged into ``trainer``.

- :class:`DataParallel`: every gradient averaged through a GradientSync (any compressor, optional
  error feedback);
- :class:`DGCDataParallel`: Deep Gradient Compression's step (momentum correction, masking,
  warm-up, local weight decay);
- :class:`SparseDataParallel`: one selector over the whole flattened gradient with error feedback
  (ExDyna's exclusive dynamic partitions, top-k, DGC's threshold, a hard threshold, CLT-k);
- :class:`DetachedEFDataParallel`: error feedback on the momentum update with a detached gradient
  point (DEF, DEF-A; Xu & Huang 2022), classic EF at mu = 0;
- :class:`TorchHookDataParallel`: PyTorch's own DDP comm hooks (fp16, bf16, PowerSGD), the peers.

A paper's own strategies live in its folder (MATCHA's ``gossip``: ``papers/matcha/gossip.py``;
sparse AxoNN's ``compact`` and ``pipeline``: ``papers/sparse_axonn/strategies/``), registered by
name in :mod:`common.methods`. What they build on is public here (:class:`SyncStrategy`,
:class:`MethodNeeds`, :func:`broadcast_module_state`).
"""

from .base import DataParallel, LossFn, MethodNeeds, SyncStrategy, broadcast_module_state
from .detached import DEFOptions, DetachedEFDataParallel, check_def_options
from .dgc import DGCDataParallel, DGCOptions, check_dgc_options
from .selectors import SELECTORS, Partitions
from .sparse import SparseDataParallel, SparseOptions, check_sparse_options
from .torch_hooks import TorchHookDataParallel, TorchHookOptions

__all__ = [
    "SELECTORS",
    "DEFOptions",
    "DGCDataParallel",
    "DGCOptions",
    "DataParallel",
    "DetachedEFDataParallel",
    "LossFn",
    "MethodNeeds",
    "Partitions",
    "SparseDataParallel",
    "SparseOptions",
    "SyncStrategy",
    "TorchHookDataParallel",
    "TorchHookOptions",
    "broadcast_module_state",
    "check_def_options",
    "check_dgc_options",
    "check_sparse_options",
]
