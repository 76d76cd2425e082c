"""Sparse AxoNN's sync strategies, known to the library by name only (``common.methods.STRATEGIES``
imports them when a run names them):

- :class:`CompactDataParallel` (``strategy: compact``): all-reduce and AdamW over the unpruned
  entries of a pruned model only (Singh & Bhatele 2023);
- :class:`PipelineDataParallel` (``strategy: pipeline``): (sparse) AxoNN's pipeline x data
  parallelism: each rank trains one stage of a GPT-2, the stages' gradients all-reduced over the
  replicas (compactly when pruned).
"""

from .compact import CompactDataParallel, CompactOptions, check_compact_options
from .pipeline import PipelineDataParallel, PipelineOptions, check_pipeline_options

__all__ = [
    "CompactDataParallel",
    "CompactOptions",
    "PipelineDataParallel",
    "PipelineOptions",
    "check_compact_options",
    "check_pipeline_options",
]
