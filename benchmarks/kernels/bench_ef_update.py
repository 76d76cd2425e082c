"""Benchmark ``ef_update`` (fp32 u, v, g; momentum 0.9; k = 1e-3 N sent indices, int32).

Run from the repository root (``benchmarks/kernels/run_all.sh`` runs every kernel benchmark)::

    .venv/bin/python benchmarks/kernels/bench_ef_update.py            # GPU if present, else CPU

GPU: the fused Triton update (one dense pass + a k-sized masking pass) against the torch reference.
CPU: the reference against the unfused dense update alone, ``u.mul_(m).add_(g); v.add_(u)``
(no masking): the ratio is what the masking costs on top of the plain update.
Traffic (fused minimum): read u, v, g and write u, v: 20 bytes per element, plus the indices.
"""

from __future__ import annotations

import argparse
import math

import _common
import torch
from _common import Case, Timed, compare

from kernels.ef_update import ef_update

MOMENTUM = 0.9


def build(numel: int, device: torch.device, args: argparse.Namespace) -> list[Case]:
    gen = torch.Generator(device=device).manual_seed(0)
    u = torch.randn(numel, generator=gen, device=device)
    v = torch.randn(numel, generator=gen, device=device)
    # A small gradient keeps u and v bounded over thousands of timed calls.
    g = torch.randn(numel, generator=gen, device=device) * 1e-3
    k = max(1, math.ceil(1e-3 * numel))
    sent = torch.randint(numel, (k,), generator=gen, device=device, dtype=torch.int32)

    def dense() -> None:
        u.mul_(MOMENTUM).add_(g)
        v.add_(u)

    update = compare(
        device,
        lambda b: ef_update(u, v, g, MOMENTUM, sent, backend=b),
        Timed("u.mul_(m).add_(g); v.add_(u)", dense),
    )
    return [Case("ef_update", numel, "float32", 20 * numel + 4 * k, *update)]


def main() -> None:
    _common.main(__doc__, build)


if __name__ == "__main__":
    main()
