"""What a run computes its forward and backward in: bf16, fp16 or fp32, from what it asks for
(``RunConfig.precision``) and what the device has."""

from __future__ import annotations

import functools
import platform
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import torch

from common.config import RunConfig

# A new autocast context per call: the loop builds one factory per run and enters it per forward.
AutocastFactory = Callable[[], AbstractContextManager[Any]]


def cpu_has_bf16() -> bool:
    """Whether this CPU computes bf16 in hardware (AMX or AVX512-BF16 on x86; other architectures
    are assumed to). On an x86 CPU without them oneDNN emulates bf16: the suite's airbench step was
    10x slower in bf16 than in fp32 on an AVX2-only AMD EPYC (3.6 s against 0.33 s for 256 CIFAR
    images, one thread, 2026-12-02), and its LSTM has no bf16 kernel at all."""
    if platform.machine().lower() not in ("x86_64", "amd64", "i386", "i686"):
        return True
    return bool(torch.cpu._is_amx_tile_supported() or torch.cpu._is_avx512_bf16_supported())


def compute_precision(config: RunConfig, device: torch.device) -> str:
    """What a run computes its forward and backward in: ``"bf16"`` where it asks for it
    (``precision: bf16``) and the device has bf16 arithmetic (a GPU, or :func:`cpu_has_bf16`),
    ``"fp16"`` where it asks for fp16 (with a loss scale; emulated, and slow, on a CPU), ``"fp32"``
    otherwise. A CPU without bf16 units runs a bf16 recipe in fp32 (faster there, and closer to
    exact); ``run.json`` and the run's tags record which (``compute_precision``)."""
    if config.precision == "fp16":
        return "fp16"
    if config.precision != "bf16" or (device.type == "cpu" and not cpu_has_bf16()):
        return "fp32"
    return "bf16"


def autocast_factory(precision: str, device: torch.device) -> AutocastFactory:
    """The autocast context of ``precision`` (:func:`compute_precision`'s answer) on ``device``,
    one new context per call (disabled for fp32)."""
    dtype = torch.float16 if precision == "fp16" else torch.bfloat16
    return functools.partial(torch.autocast, device.type, dtype=dtype, enabled=precision != "fp32")


def autocast(config: RunConfig, device: torch.device) -> Any:
    """The compute-precision context of a forward (and its backward): :func:`compute_precision`."""
    return autocast_factory(compute_precision(config, device), device)()
