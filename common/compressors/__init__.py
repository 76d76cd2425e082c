"""Compressors and their registry.

>>> from common.compressors import build_compressor
>>> build_compressor("topk", density=0.01)
TopK(density=0.01)
"""

from __future__ import annotations

import inspect
from typing import Any

from ..registry import lookup
from .base import Compressor, CompressorRNG, Payload, check_density, num_kept
from .cast import BF16, FP16
from .dgc import DGC
from .identity import Identity
from .powersgd import PowerSGD
from .qsgd import QSGD
from .random_block import RandomBlock
from .randomk import RandomK
from .signsgd import SignSGD
from .terngrad import TernGrad
from .topk import TopK

COMPRESSORS: dict[str, type[Compressor]] = {
    "identity": Identity,
    "fp16": FP16,
    "bf16": BF16,
    "topk": TopK,
    "randomk": RandomK,
    "random_block": RandomBlock,
    "terngrad": TernGrad,
    "qsgd": QSGD,
    "dgc": DGC,
    "signsgd": SignSGD,
    "powersgd": PowerSGD,
}


def build_compressor(name: str, **options: Any) -> Compressor:
    """Build a registered compressor by name; unknown names or options raise a ``ValueError``."""
    cls = lookup(COMPRESSORS, name, "compressor")
    params = inspect.signature(cls.__init__).parameters
    allowed = [p for p in params if p != "self" and params[p].kind is not inspect.Parameter.VAR_KEYWORD]
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise ValueError(
            f"unknown option(s) {', '.join(unknown)} for compressor {name!r}; "
            f"allowed: {', '.join(allowed) or '(none)'}"
        )
    positional = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    required = [
        p
        for p in allowed
        if params[p].default is inspect.Parameter.empty
        and params[p].kind not in positional
        and p not in options
    ]
    if required:
        raise ValueError(f"compressor {name!r} needs option(s) {', '.join(required)}")
    return cls(**options)


__all__ = [
    "BF16",
    "COMPRESSORS",
    "DGC",
    "FP16",
    "QSGD",
    "Compressor",
    "CompressorRNG",
    "Identity",
    "Payload",
    "PowerSGD",
    "RandomBlock",
    "RandomK",
    "SignSGD",
    "TopK",
    "build_compressor",
    "check_density",
    "num_kept",
]
