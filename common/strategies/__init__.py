"""Sync strategies: what crosses the wire in a training step, plugged into ``common.train``.

- :class:`DataParallel`: every gradient averaged through a GradientSync (any compressor, optional
  error feedback);
- :class:`DGCDataParallel`: Deep Gradient Compression's step (momentum correction, masking,
  warm-up, local weight decay);
- :class:`SparseDataParallel`: one selector over the whole flattened gradient with error feedback
  (ExDyna's exclusive dynamic partitions, top-k, DGC's threshold, a hard threshold, CLT-k);
- :class:`DetachedEFDataParallel`: error feedback on the momentum update with a detached gradient
  point (DEF, DEF-A; Xu & Huang 2022), classic EF at mu = 0;
- :class:`CompactDataParallel`: sparse AxoNN's all-reduce and AdamW over the unpruned entries of a
  pruned model only (Singh & Bhatele 2023);
- :class:`TorchHookDataParallel`: PyTorch's own DDP comm hooks (fp16, bf16, PowerSGD), the peers;
- :class:`PipelineDataParallel`: (sparse) AxoNN's pipeline x data parallelism: each rank trains one
  stage of a GPT-2, the stages' gradients all-reduced over the replicas (compactly when pruned).
"""

from .base import DataParallel, LossFn, MethodNeeds, SyncStrategy
from .compact import CompactDataParallel, CompactOptions, check_compact_options
from .detached import DEFOptions, DetachedEFDataParallel, check_def_options
from .dgc import DGCDataParallel, DGCOptions, check_dgc_options
from .pipeline import PipelineDataParallel, PipelineOptions, check_pipeline_options
from .sparse import SELECTORS, Partitions, SparseDataParallel, SparseOptions, check_sparse_options
from .torch_hooks import TorchHookDataParallel, TorchHookOptions

__all__ = [
    "SELECTORS",
    "CompactDataParallel",
    "CompactOptions",
    "DEFOptions",
    "DGCDataParallel",
    "DGCOptions",
    "DataParallel",
    "DetachedEFDataParallel",
    "LossFn",
    "MethodNeeds",
    "Partitions",
    "PipelineDataParallel",
    "PipelineOptions",
    "SparseDataParallel",
    "SparseOptions",
    "SyncStrategy",
    "TorchHookDataParallel",
    "TorchHookOptions",
    "check_compact_options",
    "check_def_options",
    "check_dgc_options",
    "check_pipeline_options",
    "check_sparse_options",
]
