"""Benchmark ``pack_bits`` / ``unpack_bits``.

Run from the repository root (``benchmarks/kernels/run_all.sh`` runs every kernel benchmark)::

    .venv/bin/python benchmarks/kernels/bench_pack_bits.py            # GPU if present, else CPU
    .venv/bin/python benchmarks/kernels/bench_pack_bits.py --bits 1 2 4 8 --no-csv

GPU: the Triton kernels against the torch reference. CPU: the reference against the dense
expressions ``(codes.view(-1, P).to(int32) << shifts).sum(1)`` (pack) and
``(packed.view(-1, 1).to(int32) >> shifts) & mask`` (unpack): the same work, written plainly.
Traffic: N code bytes + N * bits / 8 packed bytes, each touched once.
"""

from __future__ import annotations

import argparse

import _common
import torch
from _common import Case, Timed, compare

from kernels.pack_bits import pack_bits, unpack_bits


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bits", type=int, nargs="+", default=[2, 4], help="code widths")


def cases_for_width(numel: int, bits: int, device: torch.device) -> list[Case]:
    gen = torch.Generator(device=device).manual_seed(0)
    codes = torch.randint(0, 2**bits, (numel,), generator=gen, device=device, dtype=torch.uint8)
    packed = pack_bits(codes, bits, backend="reference")
    per_byte, mask = 8 // bits, 2**bits - 1
    shifts = torch.arange(0, 8, bits, device=device, dtype=torch.int32)
    traffic, dtype = numel + packed.numel(), f"uint8/{bits}bit"
    dense_pack = Timed(
        "(codes.to(int32)<<shifts).sum(1)",
        lambda: (codes.view(-1, per_byte).to(torch.int32) << shifts).sum(1),
    )
    dense_unpack = Timed(
        "(packed.to(int32)>>shifts)&mask", lambda: (packed.view(-1, 1).to(torch.int32) >> shifts) & mask
    )
    pack = compare(device, lambda b: pack_bits(codes, bits, backend=b), dense_pack)
    unpack = compare(device, lambda b: unpack_bits(packed, bits, numel, backend=b), dense_unpack)
    return [
        Case("pack_bits", numel, dtype, traffic, *pack),
        Case("unpack_bits", numel, dtype, traffic, *unpack),
    ]


def build(numel: int, device: torch.device, args: argparse.Namespace) -> list[Case]:
    return [case for bits in args.bits for case in cases_for_width(numel, bits, device)]


def main() -> None:
    _common.main(__doc__, build, add_args)


if __name__ == "__main__":
    main()
