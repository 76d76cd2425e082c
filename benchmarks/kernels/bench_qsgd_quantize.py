"""Benchmark ``qsgd_quantize`` (4 bits, l2 norm, buckets of 512, fp32) and
``qsgd_dequantize_accumulate`` (W = 4).

Run from the repository root (``benchmarks/kernels/run_all.sh`` runs every kernel benchmark)::

    .venv/bin/python benchmarks/kernels/bench_qsgd_quantize.py        # GPU if present, else CPU
    .venv/bin/python benchmarks/kernels/bench_qsgd_quantize.py --bits 8 --norm max

The noise tensor is drawn once, outside the timing. On a GPU the fused Philox path is timed as
``triton-philox``. GPU: the Triton path (torch bucket norms + fused quantize-and-pack kernel)
against the torch reference. CPU: the reference against dense torch expressions doing the same
arithmetic without packing: ``floor(|v_B_D| / norm_B * s + noise)`` and ``(levels_W_B_D *
units_W_B).sum(0)`` on W dense fp32 level payloads.
Traffic (minimal): quantize reads v and the noise (8 bytes) and writes bits / 8 bytes per element
plus 4 per bucket; dequantize reads W * bits / 8 bytes and writes 4 per element.
"""

from __future__ import annotations

import argparse

import _common
import torch
from _common import Case, Timed, compare

from kernels.qsgd_quantize import num_levels, qsgd_dequantize_accumulate, qsgd_quantize

NUM_WORKERS = 4


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bits", type=int, default=4, choices=[2, 4, 8])
    parser.add_argument("--norm", default="l2", choices=["l2", "max"])
    parser.add_argument("--bucket-size", type=int, default=512)


def build(numel: int, device: torch.device, args: argparse.Namespace) -> list[Case]:
    bits, norm, bucket_size = args.bits, args.norm, args.bucket_size
    s = num_levels(bits)
    gen = torch.Generator(device=device).manual_seed(0)
    v = torch.randn(numel, generator=gen, device=device)
    noise = torch.rand(numel, generator=gen, device=device)
    kw = {"bits": bits, "bucket_size": bucket_size}
    packed, norms = qsgd_quantize(v, norm=norm, noise=noise, backend="reference", **kw)
    packed_W = torch.stack([packed] * NUM_WORKERS)
    norms_W = torch.stack([norms] * NUM_WORKERS)
    v_B_D, noise_B_D = v.view(-1, bucket_size), noise.view(-1, bucket_size)
    levels_W_B_D = torch.randint(-s, s + 1, (NUM_WORKERS, *v_B_D.shape), generator=gen, device=device).float()
    units_W_B = norms_W / s

    def dense_quantize() -> torch.Tensor:
        norm_B = v_B_D.norm(dim=1, keepdim=True) if norm == "l2" else v_B_D.abs().amax(dim=1, keepdim=True)
        return torch.floor(v_B_D.abs() / norm_B * s + noise_B_D)

    philox = Timed(
        "triton-philox",
        lambda: qsgd_quantize(v, norm=norm, generator=gen, fused_rng=True, backend="triton", **kw),
    )
    quantize = compare(
        device,
        lambda b: qsgd_quantize(v, norm=norm, noise=noise, backend=b, **kw),
        Timed("floor(|v|/norm_B*s+noise) fp32", dense_quantize),
        gpu_variants=[philox],
    )
    decode = compare(
        device,
        lambda b: qsgd_dequantize_accumulate(packed_W, norms_W, numel, backend=b, **kw),
        Timed("(levels_W_B_D*units_W_B).sum(0)", lambda: (levels_W_B_D * units_W_B[:, :, None]).sum(0)),
    )
    dtype = f"float32/{bits}bit/{norm}"
    return [
        Case("qsgd_quantize", numel, dtype, 8 * numel + packed.numel() + 4 * norms.numel(), *quantize),
        Case(
            f"qsgd_dequantize_accumulate/W{NUM_WORKERS}",
            numel,
            dtype,
            packed_W.numel() + norms_W.numel() * 4 + 4 * numel,
            *decode,
        ),
    ]


def main() -> None:
    _common.main(__doc__, build, add_args)


if __name__ == "__main__":
    main()
