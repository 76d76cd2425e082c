"""A NaN or inf gradient stops the run, naming the tensor, without a host read on a GPU.

A check is one device flag, whether the fp32 sum of a flat bucket is finite (a NaN or inf
propagates into it), handed to ``torch._assert_async`` (the training loop records per-tensor norms
instead: ``RunState.add_gradient_check``). On a CPU the assertion is a plain check, and the error path (only) looks at the tensors to name the first
one that is not finite; on a GPU nothing waits: the device raises at its next synchronisation,
with the message written here (the tensors' names known on the host), as torchtitan's checks do.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import torch
from torch import Tensor

_CHECKED_BY_CALLER = [0]  # a count, not a thread-local: DDP's hooks may run on autograd's threads


@contextmanager
def checked_by_caller() -> Iterator[None]:
    """Inside, a GradientSync does not stop at a non-finite bucket: its caller (the training loop)
    records gradients itself and stops every rank together at its next log step, where a raise in
    one rank's hook would leave the others waiting in the collective."""
    _CHECKED_BY_CALLER[0] += 1
    try:
        yield
    finally:
        _CHECKED_BY_CALLER[0] -= 1


def caller_checks() -> bool:
    """Whether a :func:`checked_by_caller` block is open."""
    return _CHECKED_BY_CALLER[0] > 0


class NonFiniteGradient(FloatingPointError):
    """A gradient held a NaN or inf (a restart would fail the same way: not retried)."""


class NonFiniteMetric(FloatingPointError):
    """A run's last evaluation gave a NaN or inf (raised once its outputs are written; a restart
    would end the same way: not retried)."""


def flat_finite(flat: Tensor) -> Tensor:
    """Whether every entry of ``flat`` is finite, in one pass: the fp32 sum of a bucket is not
    finite exactly when an entry is not (an fp32 sum of gradients does not overflow)."""
    return flat.sum(dtype=torch.float32).isfinite()


def tensors_finite(tensors: Sequence[Tensor]) -> Tensor:
    """:func:`flat_finite` of tensors that are not one flat bucket: the fp32 sum of their sums (a
    reduction each, no copy of them)."""
    return torch.stack([t.sum(dtype=torch.float32) for t in tensors]).sum().isfinite()


def assert_finite(
    flag: Tensor, names: Sequence[str], tensors: Sequence[Tensor] | Callable[[], Sequence[Tensor]], where: str
) -> None:
    """Stop with :class:`NonFiniteGradient` unless ``flag`` (from :func:`flat_finite`) is true.

    ``where`` says when (e.g. "at step 12"). On a GPU the assertion is asynchronous and names
    the tensors the flag covers; on a CPU the error names the first tensor that is not finite
    (``tensors`` may be a callable that makes them: called on the error path only)."""
    if flag.device.type != "cpu":
        shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
        torch._assert_async(flag, f"non-finite gradient {where} in one of: {shown}")
        return
    try:
        torch._assert_async(flag)
    except RuntimeError:
        raise NonFiniteGradient(describe(names, tensors() if callable(tensors) else tensors, where)) from None


def describe(names: Sequence[str], tensors: Sequence[Tensor], where: str) -> str:
    """What is not finite, read on the host (the error path only)."""
    for name, tensor in zip(names, tensors, strict=True):
        bad = ~torch.isfinite(tensor.detach())
        if bad.any():
            first = tensor.detach().reshape(-1)[bad.reshape(-1)][0].item()
            return (
                f"gradient of {name} is not finite {where}: {int(bad.sum())} of {tensor.numel()} entries "
                f"(the first is {first}); lower lr, clip gradients (grad_clip_norm), or look for a NaN "
                f"or inf in the data or the loss"
            )
    return f"a gradient is not finite {where} (among {', '.join(names)})"
