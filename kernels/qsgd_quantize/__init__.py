"""Bucketed stochastic QSGD quantization fused with fixed-width packing (Alistarh et al. 2017).

``qsgd_quantize`` cuts v (read flat) into buckets of ``bucket_size`` elements, takes each bucket's
l2 or max norm ``n_b`` and rounds ``|v| * s / n_b`` stochastically to one of ``s + 1`` levels
(``s = 2**(bits-1) - 1``), unbiased: ``E[decode] = v``. Codes are ``sign << (bits-1) | level``,
packed ``8 // bits`` per byte (layout: ``kernels.pack_bits``). Bits on the wire per tensor:
``8 * ceil(numel * bits / 8) + 32 * ceil(numel / bucket_size)``. Not linear: payloads are decoded
and summed (``qsgd_dequantize_accumulate``), not all-reduced.

Randomness: explicit ``noise`` (uniform [0, 1), v's shape) or ``generator``; never the global RNG.
With the same noise both backends give identical bytes and norms. ``fused_rng=True`` lets the Triton
kernel draw Philox numbers in registers from a seed taken from the generator (not bit-exact with the
reference), and on CPU tensors runs the compiled C kernel (``kernels._native``: a counter-hash noise,
quantized and packed in one pass); the reference ignores the flag.
"""

from __future__ import annotations

import torch

from kernels import _native
from kernels._buckets import Norm, check_bucket_size, num_buckets
from kernels._dispatch import (
    NativeBackend,
    check_floating,
    check_numel,
    check_out,
    check_same_device,
    philox_seed,
    plain_sizes,
    uniform_noise,
    use_native,
    use_native_given_noise,
    use_triton,
)
from kernels.pack_bits.reference import num_packed_bytes
from kernels.qsgd_quantize import reference
from kernels.qsgd_quantize.reference import ALLOWED_BITS, bucket_norms, level_scales, level_units, num_levels

__all__ = [
    "ALLOWED_BITS",
    "Norm",
    "num_levels",
    "qsgd_dequantize",
    "qsgd_dequantize_accumulate",
    "qsgd_quantize",
]

DEFAULT_BUCKET_SIZE = 512


def qsgd_quantize(
    v: torch.Tensor,
    *,
    bits: int = 4,
    bucket_size: int = DEFAULT_BUCKET_SIZE,
    norm: Norm = "l2",
    noise: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
    fused_rng: bool = False,
    backend: NativeBackend = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize ``v`` to ``(packed uint8 [ceil(numel * bits / 8)], norms fp32 [num_buckets])``.

    ``norm``: ``"l2"`` (the paper's) or ``"max"`` (lower variance in practice). Pass exactly one of
    ``noise`` / ``generator``; ``fused_rng`` needs ``generator``.
    """
    num_levels(bits)
    check_bucket_size(bucket_size)
    check_floating(v, "v")
    check_numel(v.numel(), "v")
    v_N = v.reshape(-1).contiguous()
    if fused_rng and noise is not None:
        raise ValueError("fused_rng=True draws its own numbers from generator; do not pass noise")
    if use_native(backend, v.device, fused_rng=fused_rng):
        keys = _native.draw_keys(generator)
        norms_B = bucket_norms(v_N, bucket_size, norm)
        scales_B = level_scales(norms_B, bits).contiguous()
        return _native.qsgd_quantize(v_N.to(torch.float32), scales_B, bits, bucket_size, keys), norms_B
    triton_path = use_triton(backend, v.device)
    if fused_rng and triton_path:
        seed = philox_seed(generator, v.device)
        noise_N = None
    else:
        noise_N = uniform_noise(v, noise, generator)
        check_same_device(v=v, noise=noise_N)
    if not triton_path:
        assert noise_N is not None
        if use_native_given_noise(backend, v_N, noise_N):
            norms_B = bucket_norms(v_N, bucket_size, norm)
            scales_B = level_scales(norms_B, bits).contiguous()
            return _native.qsgd_quantize(v_N, scales_B, bits, bucket_size, noise_N.contiguous()), norms_B
        return reference.qsgd_quantize(v_N, bits, bucket_size, norm, noise_N)
    from kernels.qsgd_quantize import triton as triton_impl

    norms_B = bucket_norms(v_N, bucket_size, norm)
    scales_B = level_scales(norms_B, bits).contiguous()
    if noise_N is not None:
        packed_M = triton_impl.qsgd_quantize(v_N, scales_B, bits, bucket_size, noise_N.contiguous(), None)
    else:
        packed_M = triton_impl.qsgd_quantize(v_N, scales_B, bits, bucket_size, None, seed)
    return packed_M, norms_B


def qsgd_dequantize_accumulate(
    packed: torch.Tensor,
    norms: torch.Tensor,
    numel: int,
    *,
    bits: int = 4,
    bucket_size: int = DEFAULT_BUCKET_SIZE,
    backend: NativeBackend = "auto",
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """fp32 sum of W decoded payloads: ``packed [W, bytes]``, ``norms [W, num_buckets]`` -> ``[numel]``.

    Accumulated in worker order in fp32, the same in both backends. A 1-D payload counts as W = 1.
    ``out``: a contiguous fp32 tensor of ``numel`` entries (any shape) on packed's device, written
    and returned (no fresh tensor: GradientSync decodes into the gradient bucket).
    """
    if (
        backend == "auto"
        and type(bits) is int
        and bits in ALLOWED_BITS
        and bucket_size is not None
        and plain_sizes(numel, bucket_size)
    ):
        decoded = _native.decode_fast(
            "tw_qsgd_decode",
            packed,
            norms,
            numel,
            num_packed_bytes(numel, bits),
            num_buckets(numel, bucket_size),
            bucket_size,
            bits,
            out=out,
        )
        if decoded is not None:  # else the checked path below: the other backends, or an error
            return decoded
    num_levels(bits)
    check_bucket_size(bucket_size)
    check_numel(numel, "output")
    if packed.dtype != torch.uint8 or packed.dim() not in (1, 2):
        raise ValueError(
            f"packed must be uint8 [W, bytes] or [bytes], got {packed.dtype} {tuple(packed.shape)}"
        )
    num_workers = packed.shape[0] if packed.dim() == 2 else 1
    if packed.shape[-1] != num_packed_bytes(numel, bits):
        raise ValueError(
            f"{numel} codes of {bits} bits need {num_packed_bytes(numel, bits)} bytes per worker, "
            f"got {packed.shape[-1]}"
        )
    check_floating(norms, "norms")
    device = check_same_device(packed=packed, norms=norms)
    expected = num_buckets(numel, bucket_size)
    if norms.numel() != num_workers * expected:
        raise ValueError(
            f"{numel} elements in buckets of {bucket_size} need {expected} norms per worker "
            f"({num_workers} workers), got a tensor of shape {tuple(norms.shape)}"
        )
    if out is not None:
        check_out(out, numel, device)
    if use_native(backend, device):
        if norms.dtype != torch.float32 or not norms.is_contiguous():
            norms = norms.to(torch.float32).contiguous()
        return _native.qsgd_decode(packed.contiguous(), norms, numel, bits, bucket_size, out=out)
    packed_W_M = (packed if packed.dim() == 2 else packed.reshape(1, -1)).contiguous()
    norms_W_B = norms.reshape(num_workers, expected).to(torch.float32)
    if use_triton(backend, device):
        from kernels.qsgd_quantize import triton as triton_impl

        units_W_B = level_units(norms_W_B, bits).contiguous()
        decoded = triton_impl.qsgd_dequantize_accumulate(packed_W_M, units_W_B, numel, bits, bucket_size)
    else:
        decoded = reference.qsgd_dequantize_accumulate(packed_W_M, norms_W_B, numel, bits, bucket_size)
    return decoded if out is None else out.copy_(decoded.view(out.shape))


def qsgd_dequantize(
    packed: torch.Tensor,
    norms: torch.Tensor,
    numel: int,
    *,
    bits: int = 4,
    bucket_size: int = DEFAULT_BUCKET_SIZE,
    backend: NativeBackend = "auto",
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Decode one payload (1-D ``packed``, ``norms [num_buckets]``) to fp32 ``[numel]`` (into ``out``
    as :func:`qsgd_dequantize_accumulate`); reshape as needed."""
    if packed.dim() != 1:
        raise ValueError(f"packed must be 1-D (one payload), got shape {tuple(packed.shape)}")
    return qsgd_dequantize_accumulate(
        packed, norms, numel, bits=bits, bucket_size=bucket_size, backend=backend, out=out
    )
