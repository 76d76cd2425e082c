"""Detached error feedback (DEF, DEF-A; Xu & Huang, ICML 2022) as a sync strategy.

Per worker k, with momentum beta, learning rate lr, weight decay wd and detach coefficient mu; ``x``
is the global model (identical on every rank), ``e_k`` the worker's error, and the parameters the
model holds are the local point ``x - mu e_k`` at which the gradient is taken (the authors'
``optimizers/Def.py``)::

    g   = grad f_k(x - mu e_k) + wd (x - mu e_k)
    m_k = beta m_k + g                                  # momentum before communication
    p_k = e_k + lr m_k                                  # the update plus what was left out
    c   = (1/W) sum_k C(p_k)                            # e.g. random block: one dense all-reduce
    e_k = p_k - C(p_k)                                  # error feedback (exact conservation)
    x   = x - c;   parameters = x - mu e_k

``mu = 0`` is classic error feedback on the momentum update (the code's ``ef.py``), ``mu = 1``
step-ahead EF (SAEF); the paper's scripts use 0.3. ``feedback: false`` drops what C leaves out
(e = 0). The virtual iterate ``x - mean_k e_k`` follows plain momentum SGD on the averaged
updates; evaluation uses it by default (``eval_at: virtual``, the code's ``swap()``), or ``x``.

DEF-A is not pinned here from the paper's text. ``average_every: T`` implements the authors' code's
variant (``Def.py`` with ``period2``, commit 981d5de, removed later): every T steps the errors and
the momentum buffers are averaged across workers through a second random block of the same density,
``e_k <- (1/W) sum_j C2(e_j) + (e_k - C2(e_k))`` (the same for m_k): the workers' errors, hence
their gradient points, are pulled together. Its traffic is counted like the rest.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch
import torch.distributed as dist
from torch import Tensor, nn

from ..comm.collectives import get_world_size
from ..comm.stats import CommStats
from ..comm.sync import GradientSync
from ..compressors import build_compressor
from ..compressors.base import Compressor
from ..compressors.random_block import RandomBlock
from ..feedback import ErrorFeedback
from ..options import Options
from .base import MethodNeeds, SyncStrategy, broadcast_module_state, compressed_update_arguments

if TYPE_CHECKING:
    from ..config import RunConfig

EVAL_POINTS = ("virtual", "global")


@dataclass(frozen=True)
class DEFOptions(Options):
    """``strategy_options`` of ``strategy: def``."""

    kind: ClassVar[str] = "def"
    feedback: bool = True  # keep what the compressor leaves out (false: drop it, e = 0)
    mu: float = 0.3  # gradient at x - mu e: 0 classic error feedback, 1 SAEF, the paper's scripts 0.3
    average_every: int | None = None  # DEF-A (the authors' code): average errors and momentum every T steps
    eval_at: str = "virtual"  # evaluate x - mean(e) ("virtual", the code's swap) or x ("global")

    def __post_init__(self) -> None:
        if not isinstance(self.feedback, bool):
            raise ValueError(f"def feedback must be true or false, got {self.feedback!r}")
        mu = self.mu
        if isinstance(mu, bool) or not isinstance(mu, int | float) or not 0.0 <= mu <= 1.0:
            raise ValueError(
                f"def mu must be a number in [0, 1] (0: classic error feedback, 1: SAEF), got {mu!r}"
            )
        every = self.average_every
        if every is not None and (isinstance(every, bool) or not isinstance(every, int) or every < 1):
            raise ValueError(f"def average_every must be an int >= 1 (steps) or null, got {every!r}")
        if every is not None and not self.feedback:
            raise ValueError("def average_every (DEF-A) averages the errors: it needs feedback: true")
        if self.eval_at not in EVAL_POINTS:
            raise ValueError(f"def eval_at must be one of {', '.join(EVAL_POINTS)}, got {self.eval_at!r}")


def check_def_options(options: Mapping[str, Any] | DEFOptions | None) -> DEFOptions:
    """``options`` over the defaults, validated (the values the strategy will use)."""
    return DEFOptions.from_mapping(options)


class DetachedEFDataParallel(SyncStrategy):
    """The DEF step (see the module docstring) through any compressor, per tensor.

    The strategy owns the momentum and weight decay (applied before compression) and writes the
    parameters itself: the optimizer (SGD) only carries the learning rate its scheduler sets, and
    sees no gradient (``p.grad`` is cleared after the step). Linear compressors (random block,
    shared random-k) go through one dense all-reduce of their payloads, the others (top-k) through
    an all-gather.
    """

    name = "def"
    needs = MethodNeeds(
        update="own", memory="own", own_memory="momentum correction / error feedback on the update"
    )
    ignores = (("transport", "auto", "DEF all-reduces its shared-index blocks"),)
    forces = (("compress_per_tensor", True, "DEF sends one random block per tensor, also in a bucket"),)

    @classmethod
    def check_options(cls, options: dict[str, Any], world_size: int) -> Options:
        return check_def_options(options)

    @classmethod
    def from_config(cls, config: RunConfig, options: Options | None = None) -> DetachedEFDataParallel:
        return cls(**compressed_update_arguments(config, DEFOptions, options))

    def __init__(
        self,
        compressor: Compressor | None = None,
        *,
        options: Mapping[str, Any] | DEFOptions | None = None,
        seed: int = 0,
        momentum: float = 0.9,
        weight_decay: float = 0.0,
        bucket_numel: int | None = None,
    ) -> None:
        compressor = self.check_compressor(compressor) or build_compressor("identity")
        self.options = check_def_options(options)
        self.momentum = float(momentum)
        self.weight_decay = float(weight_decay)
        self.mu = float(self.options.mu) if self.options.feedback else 0.0
        self.stats = CommStats()
        self.sync = GradientSync(
            compressor,
            error_feedback=bool(self.options.feedback),
            bucket_numel=bucket_numel,
            compress_per_tensor=self.forced("compress_per_tensor"),
            seed=seed,
            stats=self.stats,
        )
        self.averager: GradientSync | None = None
        if self.options.average_every is not None:
            density = compressor.density
            if density is None:
                raise ValueError(
                    f"def average_every (DEF-A) averages through a random block at the compressor's "
                    f"density; compressor {compressor.name!r} has none"
                )
            self.averager = GradientSync(
                RandomBlock(density),
                error_feedback=ErrorFeedback(),  # holds v - C2(v) for one call, cleared before each
                bucket_numel=bucket_numel,
                compress_per_tensor=self.forced("compress_per_tensor"),
                seed=seed + 7_919,  # its own shared stream: C2's blocks differ from C's
                stats=self.stats,
            )
        self.x: dict[str, Tensor] = {}
        self.m: dict[str, Tensor] = {}
        self.steps = 0
        self._groups: list[dict[str, Any]] = []
        self._stash: dict[str, Tensor] = {}

    # -- set-up ---------------------------------------------------------------------------------

    def setup(self, model: nn.Module) -> None:
        broadcast_module_state(model, "parameters")
        broadcast_module_state(model, "buffers")
        with torch.no_grad():
            for name, p in self._named(model):
                self.x.setdefault(name, p.detach().clone())

    def param_groups(self, model: nn.Module) -> list[dict[str, Any]]:
        # Kept for a plain optimizer built from them; the lr is read through the attached one.
        self._groups = [{"params": [p for _, p in self._named(model)], "momentum": 0.0, "weight_decay": 0.0}]
        return self._groups

    @staticmethod
    def _named(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
        return [(n, p) for n, p in model.named_parameters() if p.requires_grad]

    def error(self, name: str) -> Tensor | None:
        """This rank's error for parameter ``name`` (flat), None before the first step or without
        feedback."""
        ef = self.sync.error_feedback
        return None if ef is None else ef.residuals.get(name)

    # -- the step -------------------------------------------------------------------------------

    def after_backward(self, model: nn.Module) -> None:
        lr = self.scheduled_lr()
        named = [(n, p) for n, p in self._named(model) if p.grad is not None]
        updates: list[tuple[str, Tensor]] = []
        with torch.no_grad():
            for name, p in named:
                assert p.grad is not None
                g = p.grad.add(p, alpha=self.weight_decay) if self.weight_decay else p.grad
                m = self.m.get(name)
                m = g.clone() if m is None else m.mul_(self.momentum).add_(g)  # m_1 = g_1
                self.m[name] = m
                updates.append((name, m * lr))
                p.grad = None  # the optimizer must not move the parameter again
        self.sync.sync(updates)  # in place: each update becomes the average of C(e + lr m)
        self.steps += 1
        every = self.options.average_every
        if self.averager is not None and every is not None and self.steps % every == 0:
            self._average_state([name for name, _ in named])
        with torch.no_grad():
            for (name, p), (_, mean) in zip(named, updates, strict=True):
                x = self.x[name]
                x.sub_(mean)
                e = self.error(name)
                if self.mu and e is not None:
                    p.copy_(x - self.mu * e.view_as(x))
                else:
                    p.copy_(x)

    def _average_state(self, names: list[str]) -> None:
        """DEF-A (the code's ``period2``): v <- mean_k C2(v_k) + (v_k - C2(v_k)) for the errors and
        the momentum buffers."""
        assert self.averager is not None and self.averager.error_feedback is not None
        ef = self.sync.error_feedback
        assert ef is not None
        dense_bits = self.stats.dense_bits  # the step's dense equivalent is the gradient's, once
        for store in ("error", "momentum"):
            tensors = {n: (ef.residuals[n] if store == "error" else self.m[n]).reshape(-1) for n in names}
            work = [(n, t.clone()) for n, t in tensors.items()]
            self.averager.error_feedback.residuals.clear()
            self.averager.sync(work, count_step=False)
            for name, mean in work:
                kept = self.averager.error_feedback.residuals[name]
                averaged = mean + kept
                if store == "error":
                    ef.residuals[name] = averaged
                else:
                    self.m[name] = averaged.view_as(self.m[name])
        self.averager.error_feedback.residuals.clear()
        self.stats.dense_bits = dense_bits

    # -- evaluation -----------------------------------------------------------------------------

    def before_eval(self, model: nn.Module) -> None:
        """Evaluate at ``x - mean(e)`` (virtual) or ``x`` (global), identical on every rank; BatchNorm
        statistics are rank 0's. The error average is instrumentation, not counted."""
        broadcast_module_state(model, "buffers")
        world = get_world_size()
        with torch.no_grad():
            for name, p in self._named(model):
                self._stash[name] = p.detach().clone()
                x = self.x[name]
                e = self.error(name)
                if self.options.eval_at == "virtual" and e is not None:
                    mean_e = e.clone()
                    if world > 1:
                        dist.all_reduce(mean_e)
                    p.copy_(x - mean_e.div_(world).view_as(x))
                else:
                    p.copy_(x)

    def after_eval(self, model: nn.Module) -> None:
        with torch.no_grad():
            for name, p in self._named(model):
                p.copy_(self._stash.pop(name))

    # -- checkpointing --------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {
            "sync": self.sync.state_dict(),
            "averager": self.averager.state_dict() if self.averager is not None else None,
            "x": {k: v.clone() for k, v in self.x.items()},
            "m": {k: v.clone() for k, v in self.m.items()},
            "steps": self.steps,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sync.load_state_dict(state["sync"])
        if self.averager is not None:
            self.averager.load_state_dict(state["averager"])
        self.x = {k: v.clone() for k, v in state["x"].items()}
        self.m = {k: v.clone() for k, v in state["m"].items()}
        self.steps = int(state["steps"])
