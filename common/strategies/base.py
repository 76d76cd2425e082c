"""Sync strategies: what crosses the wire in a training step, plugged into ``trainer``.

The training loop calls, each step: ``forward_backward`` -> ``after_backward`` -> optimizer step
-> ``after_step``. Data-parallel methods average gradients in ``after_backward``; gossip methods
mix parameters in ``after_step``; pipeline-parallel training overrides ``forward_backward``."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch
import torch.distributed as dist
from torch import Tensor, nn

from ..comm.collectives import get_world_size
from ..comm.hierarchy import HostHierarchy
from ..comm.stats import CommStats
from ..comm.sync import GradientSync
from ..compressors import build_compressor
from ..compressors.base import Compressor
from ..options import Options

if TYPE_CHECKING:
    from ..config import RunConfig

LossFn = Callable[[Tensor, Tensor], Tensor]

EXCHANGES = ("gradients", "parameters")
UPDATES = ("optimizer", "own")
MEMORIES = ("error_feedback", "own", "none")


@dataclass(frozen=True)
class MethodNeeds:
    """What a sync strategy needs from a run and the loop, declared by the strategy: the run's
    validation (:meth:`common.config.RunConfig.validate`) dispatches on it, never on the
    strategy's name.

    ``exchange``: ``"gradients"`` (collectives over every rank after the backward pass) or
    ``"parameters"`` (point to point with the neighbours after the update: gossip).
    ``compressor``: whether the run's ``compressor`` is what it sends (False: it has its own
    exchange, ``own_exchange`` says which; the run's compressor must stay identity).
    ``update``: ``"optimizer"`` (the optimizer applies the averaged gradient) or ``"own"`` (the
    strategy applies ``update_rule`` itself, DGC's momentum correction, DEF's update, sparse AxoNN's
    compact AdamW: the run's optimizer must be ``run_optimizer``, which then only carries the
    scheduled learning rate).
    ``memory``: ``"error_feedback"`` (the run's ``error_feedback`` decides), ``"own"`` (it keeps its
    own: momentum correction, a residual, ``own_memory`` says which; ``error_feedback`` must be
    false) or ``"none"``.
    """

    exchange: str = "gradients"
    compressor: bool = True
    own_exchange: str = ""
    update: str = "optimizer"
    update_rule: str = "momentum SGD"
    run_optimizer: str = "sgd"
    memory: str = "error_feedback"
    own_memory: str = ""

    def __post_init__(self) -> None:
        for name, allowed in (("exchange", EXCHANGES), ("update", UPDATES), ("memory", MEMORIES)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"unknown {name} {getattr(self, name)!r}; valid: {', '.join(allowed)}")
        if not self.compressor and not self.own_exchange:
            raise ValueError("a strategy without the run's compressor says what it exchanges (own_exchange)")


class SyncStrategy:
    """Base: a single process's plain step. Subclasses say what is communicated.

    A strategy selectable by name (``strategy:`` in a run; :data:`common.methods.STRATEGIES`)
    declares ``name``, ``needs`` (:class:`MethodNeeds`), ``ignores`` (run settings it does not
    read, each with its neutral value and why: any other value is an error naming it) and
    ``forces`` (run settings it overrides, each with the value it uses and why), validates its
    ``strategy_options`` in :meth:`check_options` and builds itself from a run in
    :meth:`from_config`.

    Every strategy is constructed in one shape::

        Strategy(compressor=None, *, options=None, seed=0, **parts)

    - ``compressor``: the :class:`~common.compressors.Compressor` it sends through (None: identity,
      where it can use one; DGC needs a sparsifier). A strategy with its own exchange
      (``needs.compressor`` false: sparse selection, gossip, torch's hooks, sparse AxoNN) refuses one.
    - ``options``: its typed options (what :meth:`check_options` returns), a mapping of them over
      the defaults, or None (the defaults).
    - ``seed``: the run's seed, for its generators (one that draws nothing keeps it and says so).
    - ``parts``: keyword-only, each with a default. A run setting it reads is named as the
      :class:`~common.config.RunConfig` field and defaults to that field's default (``momentum``,
      ``weight_decay``, ``bucket_numel``, ``error_feedback``, ``transport``, ``compress_per_tensor``,
      ``hierarchical``; sparse AxoNN's AdamW keeps torch's weight decay, 0.01); anything else is a
      built object the options would otherwise make (a MATCHA ``plan``, sparse AxoNN's ``masks``) or
      a switch of the library's (``fused``).

    A setting in ``forces`` is not a part: the strategy reads it from ``forces`` (DGC and DEF
    compress per tensor). A run may leave it at its RunConfig default, which the forced value
    overrides in the run's effective config (what it runs, logs and is checkpointed under:
    :func:`common.methods.effective_config`), or set the forced value; any other value is an error.
    """

    name: ClassVar[str] = ""
    needs: ClassVar[MethodNeeds] = MethodNeeds()
    ignores: ClassVar[tuple[tuple[str, Any, str], ...]] = ()
    #: Run settings the strategy overrides: (setting, the value it uses, why).
    forces: ClassVar[tuple[tuple[str, Any, str], ...]] = ()
    #: Whether ``hierarchical: true`` runs can use it (its sync takes a HostHierarchy).
    host_hierarchy: ClassVar[bool] = False
    stats: CommStats
    _groups: list[dict[str, Any]]  # what param_groups() returned, where a strategy reads its lr
    _attached: torch.optim.Optimizer | None = None

    def __init__(self) -> None:
        self.stats = CommStats()

    @classmethod
    def forced(cls, setting: str) -> Any:
        """The value this strategy uses for the run setting ``setting`` (declared in ``forces``)."""
        for name, value, _ in cls.forces:
            if name == setting:
                return value
        raise KeyError(f"strategy {cls.name!r} does not force {setting!r} (forces: {cls.forces!r})")

    @classmethod
    def check_compressor(cls, compressor: Any) -> Compressor | None:
        """``compressor`` as the constructor's first argument takes it: a Compressor, or None; a
        strategy with its own exchange (``needs.compressor`` false) takes none."""
        if compressor is None:
            return None
        if not cls.needs.compressor:
            raise ValueError(
                f"strategy {cls.name or cls.__name__} {cls.needs.own_exchange}: it takes no compressor, "
                f"got {type(compressor).__name__} (pass its options as options=..., its parts by keyword)"
            )
        if not isinstance(compressor, Compressor):
            raise TypeError(
                f"{cls.__name__} takes a Compressor (common.compressors.build_compressor) or None, got "
                f"{type(compressor).__name__} (settings such as error_feedback and bucket_numel are keywords)"
            )
        return compressor

    @classmethod
    def check_options(cls, options: dict[str, Any], world_size: int) -> Options:
        """``options`` over the defaults, validated: the typed options the strategy will use
        (:class:`common.options.Options`); the base takes none."""
        if options:
            raise ValueError(f"strategy {cls.name!r} takes no strategy_options, got {options!r}")
        return Options()

    @classmethod
    def from_config(cls, config: RunConfig, options: Options | None = None) -> SyncStrategy:
        """The strategy of a validated run whose ``strategy`` names this class, with its typed
        ``options`` as :meth:`check_options` parsed them (None: parsed from the run here)."""
        raise NotImplementedError(f"{cls.__name__} is not built from a run configuration")

    @classmethod
    def check_run(cls, config: RunConfig) -> None:
        """Checks of the whole run that the options alone cannot make (the model a strategy needs,
        a batch it splits), before any process starts; the base has none."""

    def shard(self, model: nn.Module, rebuild: Callable[[], nn.Module]) -> nn.Module:
        """The module this rank trains, from the built model (called once, before ``setup``).

        Data-parallel and gossip strategies train the whole model; a pipeline keeps this rank's
        stage, and ``rebuild()`` (a fresh whole model, the run's RNG untouched) for evaluation."""
        return model

    def batch_position(self, rank: int, world_size: int) -> tuple[int, int]:
        """``(index, count)`` of this rank's share of the data: ranks with the same index train on
        the same batches (a pipeline's stages of one replica). Called after ``shard``."""
        return rank, world_size

    def setup(self, model: nn.Module) -> None:
        """Called once, after the model is built and before the first step."""

    def forward_backward(self, model: nn.Module, x: Tensor, y: Tensor, loss_fn: LossFn) -> Tensor:
        loss = loss_fn(model(x), y)
        loss.backward()
        return loss.detach()

    def after_backward(self, model: nn.Module) -> None:
        """Gradients are local here; data-parallel strategies average them."""

    def after_step(self, model: nn.Module) -> None:
        """Parameters were just updated; decentralized strategies gossip them."""

    def before_eval(self, model: nn.Module) -> None:
        """Make the model that is evaluated well defined across ranks."""

    def after_eval(self, model: nn.Module) -> None:
        """Undo what ``before_eval`` changed that training must not see (e.g. swapped parameters)."""

    def param_groups(self, model: nn.Module) -> list[dict[str, Any]]:
        """The optimizer's parameter groups (a strategy may change a group's momentum or decay)."""
        return [{"params": [p for p in model.parameters() if p.requires_grad]}]

    def attach_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """The optimizer built over :meth:`param_groups` (the loop and :meth:`optimizer` call this):
        where a strategy that applies its own update reads the scheduled learning rate."""
        self._attached = optimizer

    @property
    def attached(self) -> torch.optim.Optimizer | None:
        """The optimizer :meth:`attach_optimizer` was given (None before)."""
        return self._attached

    def scheduled_lr(self) -> float:
        """This step's learning rate, as the scheduler set it: the attached optimizer's first group.

        Not the dict :meth:`param_groups` returned: ``Optimizer.load_state_dict`` (a resumed run)
        replaces the optimizer's group dicts, and the scheduler then writes into the new ones
        (before this was read through the optimizer, a resumed DEF, compact or pipeline run kept
        the learning rate of its first step). Without an attached optimizer, those dicts."""
        groups = self._attached.param_groups if self._attached is not None else getattr(self, "_groups", [])
        if not groups:
            raise RuntimeError(
                f"{type(self).__name__} reads the scheduled lr from its optimizer: build the optimizer "
                "from param_groups() (and attach_optimizer it, as the loop and strategy.optimizer() do)"
            )
        return float(groups[0]["lr"])

    def set_epoch(self, epoch: float) -> None:
        """Called before every step with the training progress in epochs (step / steps per epoch)."""

    def metrics(self) -> dict[str, float]:
        """Strategy-specific final metrics (this rank's), added to ``metrics.json``."""
        return {}

    def log_values(self) -> dict[str, float]:
        """Strategy-specific columns of the training curve, called at every logged step (e.g. the
        density actually sent since the last call). The same keys every call."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {"stats": self.stats.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.stats.load_state_dict(state["stats"])

    # -- in a user's own training loop ---------------------------------------------------------

    def optimizer(
        self, model: nn.Module, optimizer_class: type[torch.optim.Optimizer] = torch.optim.SGD, **kwargs: Any
    ) -> torch.optim.Optimizer:
        """This method in a user's own loop, two lines::

            optimizer = strategy.optimizer(model, torch.optim.SGD, lr=0.1, momentum=0.9)
            ...  strategy.set_epoch(step / steps_per_epoch); loss.backward(); optimizer.step()

        ``model`` is the plain module (no DDP wrapper: the strategy makes every exchange). ``setup``
        runs now (the same initial model on every rank); the optimizer is ``optimizer_class`` over
        the strategy's parameter groups, and each ``step()`` runs ``after_backward`` (averaging,
        compressing; DGC's and DEF's own update), the inner step, then ``after_step`` (gossip): the
        thinwire loop's order, so the same data and seed give the same parameters. Evaluate inside
        ``with strategy.evaluating(model):`` (DEF's virtual iterate, the gossip average).
        """
        self.setup(model)
        strategy = self

        class StrategyOptimizer(optimizer_class):  # type: ignore[valid-type, misc]
            def step(self, closure: Any = None) -> Any:
                loss = None
                if closure is not None:
                    with torch.enable_grad():
                        loss = closure()
                strategy.after_backward(model)
                super().step()
                strategy.after_step(model)
                return loss

        StrategyOptimizer.__name__ = StrategyOptimizer.__qualname__ = (
            f"{type(self).__name__}_{optimizer_class.__name__}"
        )
        optimizer = StrategyOptimizer(self.param_groups(model), **kwargs)
        self.attach_optimizer(optimizer)
        return optimizer

    @contextlib.contextmanager
    def evaluating(self, model: nn.Module) -> Iterator[nn.Module]:
        """``before_eval`` ... ``after_eval``: the model as the thinwire loop evaluates (and saves)
        it, yielded (a pipeline yields the whole model gathered from its stages)."""
        self.before_eval(model)
        try:
            yield model
        finally:
            self.after_eval(model)


def compressed_update_arguments(
    config: RunConfig, options_class: type[Options], options: Options | None = None
) -> dict[str, Any]:
    """The constructor arguments of a strategy that applies momentum SGD itself around the run's
    compressor (DGC, DEF) from a run: the same for both (``options``: typed already, or None to
    parse the run's)."""
    return {
        "compressor": build_compressor(config.compressor, **config.compressor_options),
        "options": options_class.from_mapping(config.strategy_options if options is None else options),
        "seed": config.seed,
        "momentum": config.momentum,
        "weight_decay": config.weight_decay,
        "bucket_numel": config.bucket_numel,
    }


def _as_dict(options: Options | Mapping[str, Any] | None) -> dict[str, Any]:
    """The options a strategy without options was given, as ``check_options`` takes them."""
    if options is None or (isinstance(options, Options) and not dataclasses.fields(options)):
        return {}
    return options.to_dict() if isinstance(options, Options) else dict(options)


def broadcast_module_state(model: nn.Module, tensors: str) -> None:
    """Copy rank 0's parameters or buffers to every rank (set-up traffic, not gradient traffic:
    deliberately not counted in CommStats)."""
    if get_world_size() == 1:
        return
    items = model.parameters() if tensors == "parameters" else model.buffers()
    with torch.no_grad():
        for t in items:
            dist.broadcast(t.data, src=0)


class DataParallel(SyncStrategy):
    """Synchronous data parallelism: every rank's gradients averaged through a :class:`GradientSync`
    of ``compressor`` (None: identity, a plain fp32 all-reduce) and the run's settings (parts;
    ``hierarchical``: dense inside each host, the compressor between hosts), seeded by ``seed``;
    no options. ``DataParallel(build_compressor("qsgd", bits=4), error_feedback=True)``."""

    name = "data_parallel"
    host_hierarchy = True

    def __init__(
        self,
        compressor: Compressor | None = None,
        *,
        options: Options | Mapping[str, Any] | None = None,
        seed: int = 0,
        error_feedback: bool = False,
        transport: str = "auto",
        bucket_numel: int | None = None,
        compress_per_tensor: bool = False,
        hierarchical: bool = False,
        fused: bool | None = None,
    ) -> None:
        self.options = self.check_options(_as_dict(options), get_world_size())
        self.sync = GradientSync(
            self.check_compressor(compressor) or build_compressor("identity"),
            error_feedback=error_feedback,
            transport=transport,
            bucket_numel=bucket_numel,
            compress_per_tensor=compress_per_tensor,
            seed=seed,
            hierarchy=HostHierarchy.build() if hierarchical else None,
            fused=fused,
        )
        self.stats = self.sync.stats

    @classmethod
    def from_config(cls, config: RunConfig, options: Options | None = None) -> DataParallel:
        return cls(
            build_compressor(config.compressor, **config.compressor_options),
            options=options,
            seed=config.seed,
            error_feedback=config.error_feedback,
            transport=config.transport,
            bucket_numel=config.bucket_numel,
            compress_per_tensor=config.compress_per_tensor,
            hierarchical=config.hierarchical,
        )

    def setup(self, model: nn.Module) -> None:
        broadcast_module_state(model, "parameters")
        broadcast_module_state(model, "buffers")

    def after_backward(self, model: nn.Module) -> None:
        self.sync.sync_gradients(model)

    def metrics(self) -> dict[str, float]:
        """Hierarchical runs: the bits this rank sent inside its host per step (``bits_per_step``
        is what it sent between hosts: nothing on a host's other ranks)."""
        hierarchy = self.sync.hierarchy
        if hierarchy is None:
            return {}
        return {"intra_host_bits_per_step": hierarchy.stats.bits_sent / max(self.stats.steps, 1)}

    def before_eval(self, model: nn.Module) -> None:
        # BatchNorm running statistics drift apart per rank (DDP broadcasts them every forward);
        # evaluate with rank 0's on every rank.
        broadcast_module_state(model, "buffers")

    def state_dict(self) -> dict[str, Any]:
        return {"sync": self.sync.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sync.load_state_dict(state["sync"])
