"""Stochastic ternarization fused with 2-bit packing (TernGrad, Wen et al. 2017, eq. 5).

``ternarize`` turns a gradient and its scaler(s) ``s`` into packed 2-bit codes, four per byte
(``0 -> 0, +1 -> 1, -1 -> 2``; byte layout in ``kernels.pack_bits``). The decoded value
``s * code`` is unbiased for ``|g| <= s`` and clipped to ``±s`` beyond (TernGrad's implicit clipping
when ``s = c * std``). ``ternary_decode_accumulate`` sums the decoded payloads of W workers in fp32.

Randomness: an explicit ``noise`` tensor (uniform [0, 1), the input's shape) or a ``generator``;
never the global RNG. With the same noise, the Triton kernel and the reference give identical bytes.
``fused_rng=True`` lets the Triton kernel draw Philox numbers in registers from a seed taken from
the generator (fewer bytes read, not bit-exact with the reference), and on CPU tensors runs the
compiled C kernel (``kernels._native``: a counter-hash noise, quantized and packed in one pass: 12.8 ms
against ``torch.rand`` + the reference's ternarize 239 ms for 11.2M entries on one core); the reference ignores the flag.
Scalers must be >= 0. A zero scaler decodes to zeros (every nonzero entry is clipped to ±0).
"""

from __future__ import annotations

import torch

from kernels import _native
from kernels._buckets import check_bucket_size, num_buckets
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
from kernels.ternarize import reference

__all__ = ["scale_values", "ternarize", "ternary_decode_accumulate", "ternary_values"]


def _scalers_per_bucket(
    scalers: torch.Tensor, num_rows: int, numel: int, bucket_size: int | None, *, flat: bool = False
) -> torch.Tensor:
    """``[num_rows, B]`` fp32 contiguous scalers, checked against the bucket count (``flat``: any
    shape will do, as for the native decoder, which reads them flat)."""
    check_floating(scalers, "scaler")
    expected = 1 if bucket_size is None else num_buckets(numel, bucket_size)
    if scalers.numel() != num_rows * expected:
        what = "per tensor" if bucket_size is None else f"per bucket of {bucket_size}"
        raise ValueError(
            f"{numel} elements with scalers {what} need {expected} scaler(s) per row ({num_rows} rows), "
            f"got a tensor of shape {tuple(scalers.shape)}"
        )
    if flat and scalers.dtype == torch.float32 and scalers.is_contiguous():
        return scalers
    return scalers.reshape(num_rows, expected).to(torch.float32).contiguous()


def _effective_bucket_size(numel: int, bucket_size: int | None) -> int:
    if bucket_size is None:
        return max(numel, 1)
    check_bucket_size(bucket_size)
    return bucket_size


def ternarize(
    g: torch.Tensor,
    scaler: torch.Tensor | float,
    *,
    bucket_size: int | None = None,
    noise: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
    fused_rng: bool = False,
    backend: NativeBackend = "auto",
) -> torch.Tensor:
    """Stochastically ternarize ``g`` (read flat) into ``ceil(numel / 4)`` packed bytes.

    ``scaler``: one value (``bucket_size=None``) or one per bucket of ``bucket_size`` consecutive
    elements (``ceil(numel / bucket_size)`` values). Pass exactly one of ``noise`` / ``generator``;
    ``fused_rng`` needs ``generator``.
    """
    check_floating(g, "g")
    check_numel(g.numel(), "g")
    numel = g.numel()
    size = _effective_bucket_size(numel, bucket_size)
    if isinstance(scaler, torch.Tensor):
        check_same_device(g=g, scaler=scaler)
    scaler_t = torch.as_tensor(scaler, device=g.device)
    if not scaler_t.is_floating_point():
        scaler_t = scaler_t.to(torch.float32)
    scaler_B = _scalers_per_bucket(scaler_t, 1, numel, bucket_size).reshape(-1)
    g_N = g.reshape(-1).contiguous()
    if fused_rng and noise is not None:
        raise ValueError("fused_rng=True draws its own numbers from generator; do not pass noise")
    if use_native(backend, g.device, fused_rng=fused_rng):
        keys = _native.draw_keys(generator)
        return _native.ternarize(g_N.to(torch.float32), scaler_B.contiguous(), size, keys)
    triton_path = use_triton(backend, g.device)
    if fused_rng and triton_path:
        from kernels.ternarize import triton as triton_impl

        return triton_impl.ternarize(g_N, scaler_B, size, None, philox_seed(generator, g.device))
    noise_N = uniform_noise(g, noise, generator)
    check_same_device(g=g, noise=noise_N)
    if triton_path:
        from kernels.ternarize import triton as triton_impl

        return triton_impl.ternarize(g_N, scaler_B, size, noise_N.contiguous(), None)
    if use_native_given_noise(backend, g_N, scaler_B, noise_N):
        return _native.ternarize(g_N, scaler_B.contiguous(), size, noise_N.contiguous())
    return reference.ternarize(g_N, scaler_B, size, noise_N)


def ternary_decode_accumulate(
    packed: torch.Tensor,
    scalers: torch.Tensor,
    numel: int,
    *,
    bucket_size: int | None = None,
    backend: NativeBackend = "auto",
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """fp32 ``sum_w scalers_w * code_w`` over W ternary payloads: ``[numel]``.

    ``packed``: ``[W, ceil(numel / 4)]`` uint8 (a 1-D payload counts as W = 1). ``scalers``: ``[W]``
    (per tensor) or ``[W, ceil(numel / bucket_size)]`` (per bucket, with ``bucket_size``).
    Accumulated in worker order in fp32, the same in every backend (on CPU tensors ``"auto"`` runs
    the compiled kernel, ``kernels._native``, where it builds). ``out``: a contiguous fp32 tensor of
    ``numel`` entries (any shape) on packed's device, written and returned.
    """
    if backend == "auto" and plain_sizes(numel, bucket_size):
        size = max(numel, 1) if bucket_size is None else bucket_size
        decoded = _native.decode_fast(
            "tw_ternary_decode",
            packed,
            scalers,
            numel,
            num_packed_bytes(numel, 2),
            1 if bucket_size is None else num_buckets(numel, size),
            size,
            out=out,
        )
        if decoded is not None:  # else the checked path below: the other backends, or an error
            return decoded
    if packed.dtype != torch.uint8 or packed.dim() not in (1, 2):
        raise ValueError(
            f"packed must be uint8 [W, bytes] or [bytes], got {packed.dtype} {tuple(packed.shape)}"
        )
    check_numel(numel, "output")
    num_workers = packed.shape[0] if packed.dim() == 2 else 1
    if packed.shape[-1] != num_packed_bytes(numel, 2):
        raise ValueError(
            f"{numel} ternary codes need {num_packed_bytes(numel, 2)} bytes per worker, "
            f"got {packed.shape[-1]}"
        )
    device = check_same_device(packed=packed, scalers=scalers)
    size = _effective_bucket_size(numel, bucket_size)
    if out is not None:
        check_out(out, numel, device)
    if use_native(backend, device):
        scalers_B = _scalers_per_bucket(scalers, num_workers, numel, bucket_size, flat=True)
        return _native.ternary_decode(packed.contiguous(), scalers_B, numel, size, out=out)
    scalers_W_B = _scalers_per_bucket(scalers, num_workers, numel, bucket_size)
    packed_W_M = (packed if packed.dim() == 2 else packed.reshape(1, -1)).contiguous()
    if use_triton(backend, device):
        from kernels.ternarize import triton as triton_impl

        decoded = triton_impl.ternary_decode_accumulate(packed_W_M, scalers_W_B, numel, size)
    else:
        decoded = reference.ternary_decode_accumulate(packed_W_M, scalers_W_B, numel, size)
    return decoded if out is None else out.copy_(decoded.view(out.shape))


def _check_plain_backend(backend: str) -> None:
    if backend not in ("auto", "reference", "native"):
        raise ValueError(
            f"backend must be 'auto', 'reference' or 'native' (no Triton kernel), got {backend!r}"
        )


def ternary_values(packed: torch.Tensor, numel: int, *, backend: NativeBackend = "auto") -> torch.Tensor:
    """int8 values ``[numel]`` {-1, 0, +1} of one payload's packed codes (1-D, ``ceil(numel / 4)``
    bytes; the unused code 3 as 0): what TernGrad's integer all-reduce sums. On CPU ``"auto"``
    takes one compiled pass (``kernels._native``) for the reference's unpack and subtraction."""
    _check_plain_backend(backend)
    check_numel(numel, "output")
    if packed.dtype != torch.uint8 or packed.dim() != 1 or packed.numel() != num_packed_bytes(numel, 2):
        raise ValueError(
            f"{numel} ternary codes need uint8 [{num_packed_bytes(numel, 2)}], "
            f"got {packed.dtype} {tuple(packed.shape)}"
        )
    if use_native(backend, packed.device):
        out = torch.empty(numel, dtype=torch.int8)
        return _native.ternary_values(packed.contiguous(), numel, out)
    return reference.ternary_values(packed, numel)


def scale_values(
    values: torch.Tensor,
    scaler: torch.Tensor | float,
    *,
    backend: NativeBackend = "auto",
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """fp32 ``values * scaler`` in ``values``' shape: a sum of :func:`ternary_values` over ranks that
    shared ``scaler`` (int8 or int16 on the compiled path, ``"auto"`` on CPU; any integer dtype
    with the reference), the cast then the product as torch rounds them. ``out``: a contiguous
    fp32 tensor of as many entries on values' device, written and returned."""
    _check_plain_backend(backend)
    if values.dtype.is_floating_point or values.dtype == torch.bool:
        raise ValueError(f"values must be an integer tensor (a code sum), got {values.dtype}")
    if out is not None:
        check_out(out, values.numel(), values.device)
    s = torch.as_tensor(scaler, dtype=torch.float32).to(values.device).reshape(())
    if values.dtype in (torch.int8, torch.int16) and use_native(backend, values.device):
        into = torch.empty(values.shape, dtype=torch.float32) if out is None else out
        return _native.scale_values(values.contiguous(), float(s), into)
    if backend == "native":
        raise ValueError(f"backend='native' takes int8 or int16 values, got {values.dtype}")
    decoded = reference.scale_values(values, s)
    return decoded if out is None else out.copy_(decoded.view(out.shape))
