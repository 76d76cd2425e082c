"""Sync strategies: what crosses the wire in a training step, plugged into ``common.train``.

- :class:`DataParallel`: every gradient averaged through a GradientSync (any compressor, optional
  error feedback);
- :class:`DGCDataParallel`: Deep Gradient Compression's step (momentum correction, masking,
  warm-up, local weight decay);
- :class:`DetachedEFDataParallel`: error feedback on the momentum update with a detached gradient
  point (DEF, DEF-A; Xu & Huang 2022), classic EF at mu = 0.
"""

from .base import DataParallel, LossFn, SyncStrategy
from .detached import DEF_OPTIONS, DetachedEFDataParallel, check_def_options
from .dgc import DGC_OPTIONS, DGCDataParallel, check_dgc_options

__all__ = [
    "DEF_OPTIONS",
    "DGC_OPTIONS",
    "DGCDataParallel",
    "DataParallel",
    "DetachedEFDataParallel",
    "LossFn",
    "SyncStrategy",
    "check_def_options",
    "check_dgc_options",
]
