"""PyTorch's own DDP communication hooks as a run strategy: the peers thinwire's methods are
measured against, on the same harness, data, seeds and network.

``strategy: torch_hook`` wraps the model in ``DistributedDataParallel`` and registers one of
``torch.distributed.algorithms.ddp_comm_hooks``' hooks, unchanged:

- ``fp16`` / ``bf16``: ``fp16_compress_hook`` / ``bf16_compress_hook`` (each bucket cast, divided by
  the world size, all-reduced in half precision, cast back);
- ``powersgd`` / ``batched_powersgd``: ``powerSGD_hook`` / ``batched_powerSGD_hook`` (Vogels et al.
  2019, with its error feedback and warm start; ``rank`` is its ``matrix_approximation_rank``,
  ``start_iter`` its ``start_powerSGD_iter`` of plain all-reduces first, which it needs to be >= 2
  with error feedback, ``min_compression_rate`` its own).

What each rank hands to the collectives is counted per bucket into ``stats``: the half-precision
bucket (16 bits an entry); for PowerSGD the entries its own counters add up for the bucket (the
uncompressed tensors, the P's and the Q's, 32 bits each; ``PowerSGDState.total_numel_after_
compression``), as one entry of the bucket's collectives (3 all-reduces for ``powerSGD_hook``, 2 for
the batched one, 1 in the plain iterations).

Buckets: the PowerSGD hooks run with one bucket (``bucket_cap_mb=1024``): on gloo, ``powerSGD_hook``
with DDP's default buckets aborted ("Received data size doesn't match expected size", issue 20).
Resume: the hooks' state is keyed by DDP's bucket index, and DDP rebuilds its buckets after the
first step, so a restored PowerSGD memory would be laid out wrongly: after a restart the hook starts
afresh (its plain iterations, then a new random Q; logged as a warning) and the run is not bit-exact
to an uninterrupted one, unlike thinwire's ``powersgd`` (state keyed by parameter name).
"""

# No ``from __future__ import annotations``: DDP checks a comm hook's annotations at run time.
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch
import torch.distributed as dist
from torch import Tensor, nn

from ..comm.collectives import get_world_size
from ..comm.stats import CommStats
from ..options import Options
from .base import LossFn, MethodNeeds, SyncStrategy, broadcast_module_state

if TYPE_CHECKING:
    from ..config import RunConfig

log = logging.getLogger(__name__)

HOOKS = ("fp16", "bf16", "powersgd", "batched_powersgd")
_OWN = "it averages gradients through PyTorch's own DDP comm hook (strategy_options.hook)"
_COLLECTIVES = {"powersgd": 3, "batched_powersgd": 2}  # all-reduces per bucket once compressing


@dataclass(frozen=True)
class TorchHookOptions(Options):
    """``strategy_options`` of ``strategy: torch_hook``."""

    kind: ClassVar[str] = "torch_hook"
    hook: str = "fp16"
    rank: int = 1  # PowerSGD's matrix_approximation_rank
    start_iter: int = 2  # PowerSGD's start_powerSGD_iter (>= 2: its error feedback needs it)
    min_compression_rate: float = 2.0

    def __post_init__(self) -> None:
        if self.hook not in HOOKS:
            raise ValueError(f"unknown torch_hook hook {self.hook!r}; valid: {', '.join(HOOKS)}")
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 1:
            raise ValueError(f"torch_hook rank must be an integer >= 1, got {self.rank!r}")
        if isinstance(self.start_iter, bool) or not isinstance(self.start_iter, int) or self.start_iter < 2:
            raise ValueError(
                f"torch_hook start_iter must be an integer >= 2 (PowerSGD's error feedback starts after "
                f"DDP has rebuilt its buckets), got {self.start_iter!r}"
            )
        rate = self.min_compression_rate
        if isinstance(rate, bool) or not isinstance(rate, int | float) or not rate >= 1:
            raise ValueError(f"torch_hook min_compression_rate must be a number >= 1, got {rate!r}")


def _counting_hook(state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """``state``: (the strategy, the hook, the hook's own state). Calls the hook unchanged and counts
    what it hands to the collectives for this bucket (module docstring)."""
    strategy, hook, hook_state = state
    numel = bucket.buffer().numel()
    half = strategy.options.hook in ("fp16", "bf16")
    before = 0 if half else hook_state.total_numel_after_compression
    future = hook(hook_state, bucket)
    stats: CommStats = strategy.stats
    if get_world_size() == 1:  # nothing is sent, nothing counted (CommStats)
        return future
    if half:  # the bucket in half precision, one all-reduce
        stats.add_call("all_reduce", 16 * numel)
    elif hook_state.total_numel_after_compression == before:  # PowerSGD's plain iterations
        stats.add_call("all_reduce", 32 * numel)
    else:
        stats.add_call("all_reduce", 32 * (hook_state.total_numel_after_compression - before))
        stats.calls["all_reduce"] += _COLLECTIVES[strategy.options.hook] - 1
    stats.dense_bits += 32 * numel
    return future


class TorchHookDataParallel(SyncStrategy):
    """Data parallelism through PyTorch's own DDP comm hook (module docstring). In a user's loop
    this is just ``DistributedDataParallel`` plus ``register_comm_hook``; the strategy exists so that
    runs, pipelines and the leaderboard can name PyTorch's hooks beside thinwire's methods."""

    name = "torch_hook"
    needs = MethodNeeds(compressor=False, own_exchange=_OWN.removeprefix("it "), memory="own",
                        own_memory="PowerSGD's error feedback, in its hook state")  # fmt: skip
    ignores = (
        ("transport", "auto", _OWN),
        ("bucket_numel", None, _OWN + ", whose buckets are DDP's"),
        ("compress_per_tensor", False, _OWN),
    )

    def __init__(
        self,
        compressor: None = None,
        *,
        options: "TorchHookOptions | Mapping[str, Any] | None" = None,
        seed: int = 0,
    ) -> None:
        """``compressor``: none (the hook is in the options). ``seed`` is kept, not used: PyTorch's
        PowerSGD hook draws from its own ``PowerSGDState.random_seed`` (0), as torch's default."""
        super().__init__()
        self.check_compressor(compressor)
        self.options = TorchHookOptions.from_mapping(options)
        self.seed = seed
        self.ddp: nn.parallel.DistributedDataParallel | None = None
        self.hook_state: Any = None
        self._resumed = False

    @classmethod
    def check_options(cls, options: dict[str, Any], world_size: int) -> Options:
        return TorchHookOptions.from_mapping(options)

    @classmethod
    def from_config(cls, config: "RunConfig", options: Options | None = None) -> "TorchHookDataParallel":
        return cls(
            options=TorchHookOptions.from_mapping(config.strategy_options if options is None else options),
            seed=config.seed,
        )

    def setup(self, model: nn.Module) -> None:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
        from torch.nn.parallel import DistributedDataParallel

        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("strategy torch_hook wraps the model in DistributedDataParallel: start it under "
                               "torchrun (a process group is needed, even of one rank)")  # fmt: skip
        hook_name = self.options.hook
        if hook_name in ("fp16", "bf16"):
            hook: Any = (
                default_hooks.fp16_compress_hook if hook_name == "fp16" else default_hooks.bf16_compress_hook
            )
            self.hook_state = None
            self.ddp = DistributedDataParallel(model)
        else:
            hook = (
                powerSGD_hook.powerSGD_hook
                if hook_name == "powersgd"
                else powerSGD_hook.batched_powerSGD_hook
            )
            self.hook_state = powerSGD_hook.PowerSGDState(
                process_group=None,
                matrix_approximation_rank=self.options.rank,
                start_powerSGD_iter=self.options.start_iter,
                min_compression_rate=self.options.min_compression_rate,
            )
            self.ddp = DistributedDataParallel(model, bucket_cap_mb=1024)
        self.ddp.register_comm_hook((self, hook, self.hook_state), _counting_hook)

    def forward_backward(self, model: nn.Module, x: Tensor, y: Tensor, loss_fn: LossFn) -> Tensor:
        if self.ddp is None:
            raise RuntimeError("setup() first: it wraps the model in DistributedDataParallel")
        loss = loss_fn(self.ddp(x), y)
        loss.backward()  # DDP runs the hook on every bucket: the gradients arrive averaged
        return loss.detach()

    def after_backward(self, model: nn.Module) -> None:
        self.stats.steps += 1

    def optimizer(self, model: nn.Module, optimizer_class: Any = None, **kwargs: Any) -> Any:
        raise TypeError(
            "torch_hook is PyTorch's own hook: in your own loop wrap the model in DistributedDataParallel "
            "and call register_comm_hook with torch.distributed.algorithms.ddp_comm_hooks' hook directly"
        )

    def before_eval(self, model: nn.Module) -> None:
        broadcast_module_state(model, "buffers")  # BN statistics: rank 0's on every rank

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        if self.hook_state is not None:
            log.warning("torch_hook %s restarts afresh after a resume (its state is keyed by DDP's bucket "
                        "index): the run is not bit-exact to an uninterrupted one", self.options.hook)  # fmt: skip
