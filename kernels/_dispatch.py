"""Backend choice and argument checks shared by every op in ``kernels/``.

Every public kernel function takes ``backend="reference" | "triton" | "auto"``:

- ``"reference"``: the pure-torch implementation (any device).
- ``"auto"`` (default): the Triton kernel when the tensors are on CUDA and ``triton`` imports,
  the reference otherwise.
- ``"triton"``: the Triton kernel on CUDA; on other devices only when ``TRITON_INTERPRET=1`` (the
  Triton interpreter, used by the tests on CPU). Anything else is a ``RuntimeError``: an explicit
  request for a kernel that cannot run is not silently served by the reference.

TernGrad's and QSGD's ops, ``threshold_select`` and ``ef_update`` also take ``"native"``, their
compiled C loops on CPU tensors (``kernels._native``): the quantizers' ``fused_rng`` path (noise
drawn in the loop), and the decoders, the selection and the update (the reference's values bit for
bit). ``"auto"`` picks them on CPU tensors whenever they build.

``TRITON_INTERPRET`` is read by ``@triton.jit`` when a kernel is *defined*, so it must be set before
the first Triton call; the ``triton.py`` modules are imported lazily, on that first call.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from typing import Literal

import torch

from kernels import _native

Backend = Literal["reference", "triton", "auto"]
#: The ops with a compiled CPU kernel (``kernels._native``) also take ``"native"``.
NativeBackend = Literal["reference", "triton", "auto", "native"]
BACKENDS: tuple[str, ...] = ("reference", "triton", "auto")

# Kernels index with int32 offsets; the last program's offsets run up to one block past numel, so
# leave room for the largest block (2**16) below 2**31.
MAX_NUMEL = 2**31 - 2**16


@functools.cache
def triton_available() -> bool:
    """Whether the ``triton`` package can be imported (checked once per process)."""
    if importlib.util.find_spec("triton") is None:
        return False
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def interpreter_enabled() -> bool:
    """Whether ``TRITON_INTERPRET=1`` is set (Triton kernels then run on CPU tensors)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def use_native(backend: str, device: torch.device, *, fused_rng: bool | None = None) -> bool:
    """Whether an op runs its compiled CPU kernel (``kernels._native``).

    ``fused_rng``: a quantizer's flag (its native kernel is the ``fused_rng`` path, which draws its own
    noise); None for the deterministic ops (decoders, selection, update: bit-exact with the reference). ``"native"`` asks for
    the kernel explicitly (CPU tensors only; an error where it cannot run); ``"auto"`` takes it on
    CPU tensors when it builds here.
    """
    if backend == "native":
        if fused_rng is False:
            raise ValueError(
                "backend='native' is the fused_rng path (it draws its own noise); pass fused_rng=True"
            )
        if device.type != "cpu":
            raise ValueError(f"backend='native' runs on CPU tensors, got {device}")
        if not _native.available():
            raise RuntimeError(
                f"backend='native' needs the compiled CPU kernels: {_native.unavailable_reason()}"
            )
        return True
    if backend == "auto":
        return fused_rng is not False and device.type == "cpu" and _native.available()
    check_backend(backend)
    return False


def use_native_given_noise(backend: str, *tensors: torch.Tensor) -> bool:
    """Whether a quantizer given its noise (``torch.rand``'s numbers: the default, not ``fused_rng``)
    runs its compiled CPU kernel: ``"auto"``, fp32 CPU tensors, the kernels built. Bit for bit the
    reference's codes, in one pass where the reference makes one per op."""
    return (
        backend == "auto"
        and all(t.device.type == "cpu" and t.dtype == torch.float32 for t in tensors)
        and _native.available()
    )


def check_backend(backend: str) -> None:
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {list(BACKENDS)}, got {backend!r}")


def use_triton(backend: str, device: torch.device) -> bool:
    """Resolve ``backend`` for tensors on ``device``: True to run the Triton kernel."""
    check_backend(backend)
    if backend == "reference":
        return False
    native = device.type == "cuda" and triton_available()
    if backend == "auto":
        return native
    if native or (interpreter_enabled() and triton_available()):
        return True
    raise RuntimeError(
        f"backend='triton' needs CUDA tensors and the triton package, or TRITON_INTERPRET=1 set before "
        f"the first kernel call (got device {device}, triton importable: {triton_available()}); "
        f"use backend='auto' to fall back to the reference"
    )


def check_same_device(**tensors: torch.Tensor) -> torch.device:
    """All tensors on one device (a Triton launch with mixed devices fails obscurely)."""
    values = iter(tensors.values())
    first = next(values).device
    for t in values:  # a plain loop: a decoder's per-call checks are a few microseconds in all
        if t.device != first:
            raise ValueError(
                f"all tensors must be on one device, got { ({k: v.device for k, v in tensors.items()}) }"
            )
    return first


def plain_sizes(numel: int, bucket_size: int | None) -> bool:
    """Whether a decoder's sizes are plain ints in range (``bucket_size`` None: one bucket), so that
    its fast path may compute byte and bucket counts from them; else its checked path names the error."""
    return (
        type(numel) is int
        and 0 <= numel <= MAX_NUMEL
        and (bucket_size is None or (type(bucket_size) is int and bucket_size > 0))
    )


def check_out(out: torch.Tensor, numel: int, device: torch.device) -> None:
    """A decoder's ``out``: a contiguous fp32 tensor of ``numel`` entries (any shape) on ``device``."""
    if out.dtype != torch.float32 or not out.is_contiguous() or out.numel() != numel or out.device != device:
        raise ValueError(
            f"out must be a contiguous float32 tensor of {numel} entries on {device}, got "
            f"{'' if out.is_contiguous() else 'a non-contiguous '}{out.dtype} of shape {tuple(out.shape)} "
            f"on {out.device}"
        )


def check_numel(numel: int, name: str = "tensor") -> None:
    if numel > MAX_NUMEL:
        raise ValueError(f"{name} has {numel} elements; kernels index with int32 (at most {MAX_NUMEL})")


def check_floating(x: torch.Tensor, name: str) -> None:
    if x.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"{name} must be float32, float16 or bfloat16, got {x.dtype}")


def check_index_dtype(indices: torch.Tensor, name: str) -> None:
    if indices.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"{name} must be int32 or int64, got {indices.dtype}")
    if indices.dim() != 1:
        raise ValueError(f"{name} must be 1-D, got shape {tuple(indices.shape)}")


def uniform_noise(
    like: torch.Tensor, noise: torch.Tensor | None, generator: torch.Generator | None
) -> torch.Tensor:
    """The flat fp32 uniform [0, 1) numbers that drive a stochastic op.

    Exactly one of ``noise`` (same shape as ``like``) and ``generator`` must be given: the global RNG
    is never used. With a generator the numbers are ``torch.rand``'s on ``like``'s device (the
    generator must live on that device), so both backends see the same numbers; on a CPU the compiled
    engine makes them (:func:`rand`).
    """
    if (noise is None) == (generator is None):
        raise ValueError("pass exactly one of noise (a uniform [0, 1) tensor) and generator")
    if noise is not None:
        if noise.shape != like.shape:
            raise ValueError(
                f"noise must have the input's shape {tuple(like.shape)}, got {tuple(noise.shape)}"
            )
        check_floating(noise, "noise")
        return noise.reshape(-1).to(torch.float32)
    assert generator is not None
    return rand(like.numel(), generator, like.device)


def rand(numel: int, generator: torch.Generator, device: torch.device | None = None) -> torch.Tensor:
    """``torch.rand(numel, generator=generator, device=device)`` (fp32): the same numbers and the same
    generator state after. A CPU generator's numbers come from ``kernels._native.torch_rand`` where it
    builds (the Mersenne Twister in one compiled loop instead of torch's serial kernel)."""
    device = generator.device if device is None else torch.device(device)
    if device.type == "cpu" and generator.device.type == "cpu" and _native.available():
        return _native.torch_rand(numel, generator)
    return torch.rand(numel, generator=generator, device=device, dtype=torch.float32)


def philox_seed(generator: torch.Generator | None, device: torch.device) -> torch.Tensor:
    """A one-element int64 seed tensor for in-kernel ``tl.rand``, drawn from ``generator``.

    The seed stays on the device (the kernel loads it), so drawing it costs no host synchronisation.
    """
    if generator is None:
        raise ValueError("fused_rng=True draws its seed from a generator; pass generator=")
    return torch.randint(0, 2**31 - 1, (1,), generator=generator, device=device, dtype=torch.int64)
