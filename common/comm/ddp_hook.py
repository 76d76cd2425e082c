"""Any thinwire compressor as a PyTorch DDP communication hook, in one line.

Example (gloo or NCCL; ``model`` already wrapped in ``DistributedDataParallel``)::

    from common.comm import install_ddp_hook
    from common.compressors import build_compressor

    sync = install_ddp_hook(model, build_compressor("topk", density=0.01), error_feedback=True)
    ...  # train as usual; sync.stats holds bits sent, calls and seconds per phase

Each parameter's gradient is compressed on its own (``compress_per_tensor=True``, the thinwire
loop's semantics), the payloads of one DDP bucket sent together.

The hook and the explicit ``GradientSync.sync`` path run the same :meth:`GradientSync.reduce_flat`
on a flat bucket, so they agree (a test checks it). Residuals are keyed by parameter name, not by
bucket index: DDP rebuilds its buckets after the first iteration, which would otherwise scramble
the residual memory (the reason PowerSGD's hook waits a few iterations before compressing).
"""

# No ``from __future__ import annotations`` here: DDP checks the hook's annotations at run time
# (``bucket`` must be annotated ``dist.GradBucket``, the result ``torch.futures.Future[torch.Tensor]``).
import inspect
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from ..compressors import Compressor, build_compressor, compressor_options
from .sync import GradientSync

#: ``install_ddp_hook``'s own keywords; any other keyword is an option of the compressor it builds.
HOOK_KEYWORDS = ("error_feedback", "compress_per_tensor", "transport", "seed", "group", "stats", "fused")
_SYNC_KEYWORDS = HOOK_KEYWORDS[2:]  # passed on to GradientSync


def compressed_allreduce_hook(
    state: GradientSync, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """DDP comm hook: average ``bucket`` over ranks through ``state`` (a :class:`GradientSync`)."""
    params = bucket.parameters()
    try:
        names = [state.param_names[id(p)] for p in params]
    except KeyError:
        raise ValueError(
            "GradientSync does not know the bucket's parameters: call sync.name_parameters(model.module) "
            "before registering the hook (install_ddp_hook does this)"
        ) from None
    sizes = [p.numel() for p in params]
    buffer = bucket.buffer()
    if bucket.is_last():
        state.stats.steps += 1
    # Linear compressors all-reduce in the background, so DDP overlaps it with the backward pass.
    return state.reduce_flat_async(names, buffer, sizes).then(lambda fut: fut.value().view_as(buffer))


def install_ddp_hook(
    model: DistributedDataParallel,
    compressor: Compressor | str,
    *,
    error_feedback: bool = False,
    compress_per_tensor: bool = True,
    **options: Any,
) -> GradientSync:
    """Register ``compressor`` (an instance, or a registry name built with ``options``) on ``model``.

    ``compress_per_tensor`` (the default) compresses each parameter's gradient of a DDP bucket on
    its own and sends the bucket's payloads in one collective: the thinwire loop's semantics, where
    every method is per tensor (one random block, one TernGrad scaler, one top-k per layer).
    ``False`` compresses each bucket as one flat tensor. ``error_feedback`` is off by default, as
    in :class:`GradientSync` and the run configs. Remaining ``options`` that are not compressor
    options go to :class:`GradientSync` (``transport``, ``seed``, ``group``, ``stats``, ``fused``:
    each bucket compressed in a fixed number of launches with no host read, by default on CUDA);
    a keyword that is neither the hook's nor the compressor's is refused, the error listing both.
    Returns the :class:`GradientSync`, whose ``stats`` and ``state_dict()`` (residuals, generator states)
    the caller may checkpoint.
    """
    _require_ddp(model, "install_ddp_hook", "GradientSync(compressor).sync_gradients(model) after backward()")
    sync_options = {k: options.pop(k) for k in list(options) if k in _SYNC_KEYWORDS}
    _check_compressor_keywords(compressor, options)
    if isinstance(compressor, str):
        compressor = build_compressor(compressor, **options)
    sync = GradientSync(
        compressor, error_feedback=error_feedback, compress_per_tensor=compress_per_tensor, **sync_options
    )
    sync.name_parameters(model.module)
    model.register_comm_hook(sync, compressed_allreduce_hook)
    return sync


def _check_compressor_keywords(compressor: Compressor | str, options: dict[str, Any]) -> None:
    """Refuse what is neither the hook's keyword nor one of the compressor's options (a typo such
    as ``error_feedbak``: the error lists both sets), and options beside a built instance."""
    if "bucket_numel" in options:
        raise ValueError(
            "bucket_numel is DDP's through the hook: set DistributedDataParallel(bucket_cap_mb=...) instead"
        )
    if isinstance(compressor, str):
        allowed, named, built = list(compressor_options(compressor)), f"compressor {compressor!r}", False
    else:  # by name only: a user's compressor class need not be annotated
        variadic = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
        params = inspect.signature(type(compressor)).parameters.items()
        allowed = [n for n, p in params if p.kind not in variadic]
        named, built = f"compressor {type(compressor).__name__}", True
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise ValueError(
            f"unknown keyword(s) {', '.join(unknown)} for install_ddp_hook: its own are "
            f"{', '.join(HOOK_KEYWORDS)}; {named} takes {', '.join(allowed) or 'no options'}"
            + (" (when it is built, not here)" if built else "")
        )
    if built and options:
        raise ValueError(
            f"options {sorted(options)} given with a compressor instance; build it with them instead"
        )


def method_hook(state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP comm hook of a method that reduces a bucket itself (``state.reduce_bucket_async(names,
    flat, sizes)``, a future of the mean, e.g. DGC's per-tensor routes; ``state.param_names``:
    id -> name); counts the step at the last bucket in ``state.stats``."""
    params = bucket.parameters()
    names = [state.param_names[id(p)] for p in params]
    buffer = bucket.buffer()
    mean = state.reduce_bucket_async(names, buffer, [p.numel() for p in params])
    if bucket.is_last():
        state.stats.steps += 1
    return mean.then(lambda done: done.value().view_as(buffer))


def install_method_hook(model: DistributedDataParallel, method: Any) -> None:
    """Register ``method`` (a strategy with ``reduce_bucket_async``) as ``model``'s comm hook."""
    _require_ddp(model, "a method's hook", "strategy.optimizer(model, ...)")
    model.register_comm_hook(method, method_hook)


def _require_ddp(model: Any, what: str, without: str) -> None:
    if not isinstance(model, DistributedDataParallel):
        raise TypeError(
            f"{what} needs the DistributedDataParallel wrapper, got {type(model).__name__}: wrap the "
            f"model first (model = DistributedDataParallel(model)), or, without DDP, use {without}"
        )
