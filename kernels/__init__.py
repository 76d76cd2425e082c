"""Fused GPU kernels for gradient compression, each beside a pure-torch reference.

One folder per op: ``reference.py`` (pure torch, any device, the specification), ``triton.py`` (the
kernel, imported lazily on first use) and ``__init__.py`` (the public function, which checks its
arguments and dispatches on ``backend="auto" | "reference" | "triton"``; see ``kernels._dispatch``).
Randomness comes only from explicit noise tensors or generators, never the global RNG. The
stochastic quantizers' ``fused_rng`` path (noise drawn inside the kernel), their decoders,
``threshold_select`` and ``ef_update`` also have compiled CPU loops, ``_native.c``, built with the C
compiler on first use (``kernels._native``, ``backend="native"``; ``"auto"`` takes them on CPU
tensors; all but ``fused_rng`` give the reference's values bit for bit).

| op folder          | public functions                                                  | paper       |
|--------------------|-------------------------------------------------------------------|-------------|
| ``pack_bits``      | ``pack_bits``, ``unpack_bits``                                    | all         |
| ``ternarize``      | ``ternarize``, ``ternary_decode_accumulate``, ``ternary_values``, ``scale_values`` | TernGrad |
| ``qsgd_quantize``  | ``qsgd_quantize``, ``qsgd_dequantize``, ``qsgd_dequantize_accumulate`` | QSGD   |
| ``threshold_select`` | ``threshold_select``, ``estimate_threshold``                    | DGC, ExDyna |
| ``ef_update``      | ``ef_update``, ``ef_mask``                                        | DGC         |
| ``masked_compact`` | ``masked_compact``, ``masked_scatter``, ``mask_to_indices``       | sparse AxoNN |
"""

from kernels._dispatch import BACKENDS, Backend
from kernels.ef_update import ef_mask, ef_update
from kernels.masked_compact import mask_to_indices, masked_compact, masked_scatter
from kernels.pack_bits import pack_bits, unpack_bits
from kernels.qsgd_quantize import qsgd_dequantize, qsgd_dequantize_accumulate, qsgd_quantize
from kernels.ternarize import scale_values, ternarize, ternary_decode_accumulate, ternary_values
from kernels.threshold_select import estimate_threshold, threshold_select

__all__ = [
    "BACKENDS",
    "Backend",
    "ef_mask",
    "ef_update",
    "estimate_threshold",
    "mask_to_indices",
    "masked_compact",
    "masked_scatter",
    "pack_bits",
    "qsgd_dequantize",
    "qsgd_dequantize_accumulate",
    "qsgd_quantize",
    "scale_values",
    "ternarize",
    "ternary_decode_accumulate",
    "ternary_values",
    "threshold_select",
    "unpack_bits",
]
