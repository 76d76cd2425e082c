"""Compressors and their registry.

>>> from common.compressors import build_compressor
>>> build_compressor("topk", density=0.01)
TopK(density=0.01)
"""

from __future__ import annotations

import inspect
from typing import Any

from ..checks import check_declared, declared_options
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


def compressor_options(compressor: str | type[Compressor]) -> dict[str, Any]:
    """The options of a compressor (a registry name or a class), in its constructor's order:
    name -> the declared type ``build_compressor`` checks a value against."""
    cls = lookup(COMPRESSORS, compressor, "compressor") if isinstance(compressor, str) else compressor
    return declared_options(cls)


def build_compressor(name: str, **options: Any) -> Compressor:
    """Build a registered compressor by name. Unknown names or options, missing ones, and values
    of the wrong type (``scaled: "no"``, ``bits: 4.0``) raise a ``ValueError`` naming the option
    and what it takes; ranges are the constructor's."""
    cls = lookup(COMPRESSORS, name, "compressor")
    declared = compressor_options(cls)
    unknown = sorted(set(options) - set(declared))
    if unknown:
        raise ValueError(
            f"unknown option(s) {', '.join(unknown)} for compressor {name!r}; "
            f"allowed: {', '.join(declared) or '(none)'}"
        )
    params = inspect.signature(cls).parameters
    required = [p for p in declared if params[p].default is inspect.Parameter.empty and p not in options]
    if required:
        raise ValueError(f"compressor {name!r} needs option(s) {', '.join(required)}")
    check_declared(f"compressor {name!r} option", options, declared)
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
    "compressor_options",
    "num_kept",
]
