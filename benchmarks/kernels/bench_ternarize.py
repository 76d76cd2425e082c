"""Benchmark ``ternarize`` (per-tensor scaler, fp32 input) and ``ternary_decode_accumulate`` (W = 4).

Run from the repository root (``benchmarks/kernels/run_all.sh`` runs every kernel benchmark)::

    .venv/bin/python benchmarks/kernels/bench_ternarize.py            # GPU if present, else CPU

The noise tensor is drawn once, outside the timing (both backends read it). On a GPU the fused
Philox path (``fused_rng=True``, no noise read) is timed as backend ``triton-philox``.
GPU: the Triton kernels against the torch reference. CPU: the reference against dense torch
expressions: ``torch.sign(g) * (noise * s < g.abs())`` (the same ternary values, unpacked, as
fp32) and ``(scalers[:, None] * values_W_N).sum(0)`` over W dense fp32 ternary payloads.
Traffic: ternarize reads g and the noise (4 + 4 bytes) and writes 1/4 byte per element; decode
reads W / 4 bytes and writes 4 bytes per element.
"""

from __future__ import annotations

import argparse

import _common
import torch
from _common import Case, Timed, compare

from kernels.ternarize import ternarize, ternary_decode_accumulate

NUM_WORKERS = 4


def build(numel: int, device: torch.device, args: argparse.Namespace) -> list[Case]:
    gen = torch.Generator(device=device).manual_seed(0)
    g = torch.randn(numel, generator=gen, device=device)
    noise = torch.rand(numel, generator=gen, device=device)
    scaler = g.abs().max()
    packed = torch.stack([ternarize(g, scaler, noise=noise, backend="reference")] * NUM_WORKERS)
    scalers = scaler.repeat(NUM_WORKERS)
    values_W_N = torch.randint(-1, 2, (NUM_WORKERS, numel), generator=gen, device=device).float()

    dense_ternarize = Timed("sign(g)*(noise*s<|g|) fp32", lambda: torch.sign(g) * (noise * scaler < g.abs()))
    philox = Timed(
        "triton-philox", lambda: ternarize(g, scaler, generator=gen, fused_rng=True, backend="triton")
    )
    quantize = compare(
        device, lambda b: ternarize(g, scaler, noise=noise, backend=b), dense_ternarize, gpu_variants=[philox]
    )
    dense_decode = Timed("(s[:,None]*values_W_N).sum(0)", lambda: (scalers[:, None] * values_W_N).sum(0))
    decode = compare(
        device, lambda b: ternary_decode_accumulate(packed, scalers, numel, backend=b), dense_decode
    )
    return [
        Case("ternarize", numel, "float32", 8 * numel + packed.shape[1], *quantize),
        Case(
            f"ternary_decode_accumulate/W{NUM_WORKERS}", numel, "float32", packed.numel() + 4 * numel, *decode
        ),
    ]


def main() -> None:
    _common.main(__doc__, build)


if __name__ == "__main__":
    main()
