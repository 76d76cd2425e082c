"""Benchmark ``masked_compact`` (fp32 -> fp16) and ``masked_scatter`` (fp16 -> fp32), mask density 0.5.

Run from the repository root (``benchmarks/kernels/run_all.sh`` runs every kernel benchmark)::

    .venv/bin/python benchmarks/kernels/bench_masked_compact.py       # GPU if present, else CPU
    .venv/bin/python benchmarks/kernels/bench_masked_compact.py --mask-density 0.1

The mask is static: its int32 indices are computed once, outside the timing (as a training loop
does). GPU: the Triton kernels against the torch reference. CPU: the reference against boolean
indexing with the dense mask, ``x[mask].half()`` and ``out[mask] = compact.float()``.
Traffic: K int32 indices, K fp32 values and K fp16 values (10 bytes per kept entry) each way.
"""

from __future__ import annotations

import argparse

import _common
import torch
from _common import Case, Timed, compare

from kernels.masked_compact import mask_to_indices, masked_compact, masked_scatter


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--mask-density", type=float, default=0.5)


def build(numel: int, device: torch.device, args: argparse.Namespace) -> list[Case]:
    gen = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(numel, generator=gen, device=device)
    mask = torch.rand(numel, generator=gen, device=device) < args.mask_density
    indices = mask_to_indices(mask)
    compact = masked_compact(x, indices, torch.float16, backend="reference")
    out = torch.zeros_like(x)

    def dense_scatter() -> None:
        out[mask] = compact.float()

    gather = compare(
        device,
        lambda b: masked_compact(x, indices, torch.float16, backend=b),
        Timed("x[mask].half()", lambda: x[mask].half()),
    )
    scatter = compare(
        device,
        lambda b: masked_scatter(compact, indices, out, backend=b),
        Timed("out[mask]=compact.float()", dense_scatter),
    )
    traffic = 10 * indices.numel()
    return [
        Case("masked_compact", numel, "float32->float16", traffic, *gather),
        Case("masked_scatter", numel, "float16->float32", traffic, *scatter),
    ]


def main() -> None:
    _common.main(__doc__, build, add_args)


if __name__ == "__main__":
    main()
