"""Sparse AxoNN's configuration: one frozen dataclass per component, built from params.yaml.

``pipelines/sparse_axonn/params.yaml`` has ``scale`` (the default scale), ``defaults`` (the settings of
every scale: ``dataset``, ``seq_len``, ``seed``, ``model``, ``prune``, ``train``), ``scales`` (name ->
overrides, merged one level deep: ``scales.smoke.prune.steps`` replaces only ``prune.steps``) and
``runs`` (name -> :class:`RunSpec`); ``extrapolation`` holds the report's assumptions for the paper's
setting (:class:`papers.sparse_axonn.extrapolate.PaperSetting`). Unknown keys are an error that names the allowed ones; a sparsity
outside [0, 1) is an error that names the run.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from .pruning import SCOPES, check_sparsity

METHODS = ("dense", "sparse", "sputnik")
GRADS = ("dense", "packed")
SCHEDULES = ("gpipe", "1f1b")
MASK_FAMILIES = ("oneshot_global", "oneshot_layerwise", "imp_global")
LR_DECAYS = ("constant", "cosine")

T = TypeVar("T")


def _build(cls: type[T], values: Mapping[str, Any], where: str) -> T:
    """``cls(**values)`` with unknown keys named, and the dataclass's own checks' errors located."""
    if not isinstance(values, Mapping):
        raise ValueError(f"{where} must be a mapping, got {type(values).__name__}")
    allowed = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
    unknown = sorted(set(values) - set(allowed))
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(allowed)}")
    try:
        return cls(**values)
    except (TypeError, ValueError) as error:
        raise ValueError(f"{where}: {error}") from None


def _positive_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")


def _positive_float(name: str, value: object, *, zero_ok: bool = False) -> None:
    ok = not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)
    if not ok or value < 0 or (value == 0 and not zero_ok):  # type: ignore[operator]
        raise ValueError(f"{name} must be a finite number {'>= 0' if zero_ok else '> 0'}, got {value!r}")


@dataclass(frozen=True)
class ModelConfig:
    """A small GPT-2 (``transformers.GPT2LMHeadModel``), untied so that it splits into stages."""

    n_layer: int = 4
    n_embd: int = 128
    n_head: int = 4
    n_positions: int = 64
    dropout: float = 0.0

    def __post_init__(self) -> None:
        for name in ("n_layer", "n_embd", "n_head", "n_positions"):
            _positive_int(name, getattr(self, name))
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")
        if not 0 <= self.dropout < 1:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")


@dataclass(frozen=True)
class OptimConfig:
    """AdamW with a linear warm-up to ``lr``, then constant (shared by pruning and training)."""

    lr: float = 3e-3
    weight_decay: float = 0.01
    warmup_steps: int = 10

    def __post_init__(self) -> None:
        _positive_float("lr", self.lr)
        _positive_float("weight_decay", self.weight_decay, zero_ok=True)
        if (
            isinstance(self.warmup_steps, bool)
            or not isinstance(self.warmup_steps, int)
            or self.warmup_steps < 0
        ):
            raise ValueError(f"warmup_steps must be an integer >= 0, got {self.warmup_steps!r}")

    def lr_at(self, step: int) -> float:
        """Learning rate of 0-based ``step``."""
        return self.lr * min(1.0, (step + 1) / self.warmup_steps) if self.warmup_steps else self.lr


@dataclass(frozen=True)
class PruneConfig:
    """The prune stage: dense training, then magnitude pruning with rewinding (lottery ticket)."""

    steps: int = 400  # dense training steps; every retraining runs steps - rewind_step from the rewind
    rewind_step: int = 25  # the state the unpruned weights are rewound to (late rewinding)
    batch_size: int = 16
    sparsities: tuple[float, ...] = (0.5, 0.8, 0.9)
    scopes: tuple[str, ...] = SCOPES
    iterative: bool = True  # imp_global: 0 -> s1 -> s2 -> ... (each round retrained from the rewind)
    eval_windows: int = 128
    log_every: int = 50
    # the schedule after the warm-up, over ``steps``: constant, or cosine down to min_lr_factor x lr
    # (nanoGPT's); every retraining follows the same schedule from the rewind step on
    lr_decay: str = "constant"
    min_lr_factor: float = 0.1
    num_evaluations: int = 10  # of the dense run on the validation windows, evenly spaced, the last at steps
    plateau: float = 0.03  # nats: the dense curve has converged when its last fifth gains less than this

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "eval_windows", "log_every", "num_evaluations"):
            _positive_int(name, getattr(self, name))
        if self.lr_decay not in LR_DECAYS:
            raise ValueError(f"lr_decay must be one of {list(LR_DECAYS)}, got {self.lr_decay!r}")
        _positive_float("min_lr_factor", self.min_lr_factor, zero_ok=True)
        if self.min_lr_factor > 1:
            raise ValueError(f"min_lr_factor must be in [0, 1], got {self.min_lr_factor!r}")
        _positive_float("plateau", self.plateau)
        if self.num_evaluations > self.steps:
            raise ValueError(f"num_evaluations ({self.num_evaluations}) must be <= steps ({self.steps})")
        if isinstance(self.rewind_step, bool) or not isinstance(self.rewind_step, int):
            raise ValueError(f"rewind_step must be an integer, got {self.rewind_step!r}")
        if not 0 <= self.rewind_step < self.steps:
            raise ValueError(f"rewind_step must be in [0, steps={self.steps}), got {self.rewind_step}")
        if not self.sparsities:
            raise ValueError("sparsities must list at least one sparsity in [0, 1)")
        values = tuple(check_sparsity(s, "prune sparsity") for s in self.sparsities)
        if list(values) != sorted(set(values)) or values[0] == 0:
            raise ValueError(f"sparsities must be distinct, increasing and > 0, got {list(values)}")
        object.__setattr__(self, "sparsities", values)
        bad = [s for s in self.scopes if s not in SCOPES]
        if bad or not self.scopes:
            raise ValueError(f"scopes must be a non-empty list of {list(SCOPES)}, got {list(self.scopes)}")
        object.__setattr__(self, "scopes", tuple(self.scopes))

    def lr_at(self, optim: OptimConfig, step: int) -> float:
        """Learning rate of 0-based ``step`` of dense training and of every retraining: the
        optimizer's warm-up, then constant or cosine from the end of the warm-up to ``steps``."""
        base = optim.lr_at(step)
        if self.lr_decay == "constant" or step < optim.warmup_steps:
            return base
        span = max(1, self.steps - optim.warmup_steps)
        progress = min(1.0, (step - optim.warmup_steps) / span)
        floor = self.min_lr_factor
        return optim.lr * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))

    def evaluation_steps(self) -> list[int]:
        """The steps (1-based counts) after which the dense run is evaluated: evenly spaced, the last
        at ``steps``."""
        n = self.num_evaluations
        return sorted({round(self.steps * (i + 1) / n) for i in range(n)})


@dataclass(frozen=True)
class TrainConfig:
    """The train stage: every run trains ``steps`` steps of the same global batches from the rewind."""

    steps: int = 60
    batch_size: int = 16  # global: split over the replicas, then into micro-batches
    num_microbatches: int = 2
    schedule: str = "gpipe"
    world_size: int = 4
    masks: str = "imp_global"  # which family of the prune stage's masks the sparse runs train with
    eval_windows: int = 128
    timing_skip: int = 2  # first steps left out of the medians (schedule set-up, cold caches)

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "num_microbatches", "world_size", "eval_windows"):
            _positive_int(name, getattr(self, name))
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {list(SCHEDULES)}, got {self.schedule!r}")
        if self.masks not in MASK_FAMILIES:
            raise ValueError(f"masks must be one of {list(MASK_FAMILIES)}, got {self.masks!r}")
        if not 0 <= self.timing_skip < self.steps:
            raise ValueError(f"timing_skip must be in [0, steps={self.steps}), got {self.timing_skip}")


@dataclass(frozen=True)
class RunSpec:
    """One row of the train stage: a method at a sparsity on a ``stages x (world / stages)`` grid.

    ``dense``: torch AdamW on every entry and AxoNN's flat dense all-reduce (sparsity must be 0).
    ``sparse``: sparse AxoNN (dense compute; compact fp32 master weights and Adam states; compact
    all-reduce of the kept gradient entries). ``grads: packed`` also drops the dense gradients:
    each is packed into the compact buffer as soon as autograd has accumulated it (see
    :mod:`papers.sparse_axonn.sparse_state`). ``sputnik``: the pruned layers as CSR matmuls
    (``papers.sparse_axonn.sparse_compute``) with the same compact optimizer and all-reduce.
    """

    method: str
    stages: int
    sparsity: float = 0.0
    grads: str = "dense"

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"method must be one of {list(METHODS)}, got {self.method!r}")
        _positive_int("stages", self.stages)
        object.__setattr__(self, "sparsity", check_sparsity(self.sparsity))
        if self.grads not in GRADS:
            raise ValueError(f"grads must be one of {list(GRADS)}, got {self.grads!r}")
        if self.method == "dense" and (self.sparsity != 0 or self.grads != "dense"):
            raise ValueError("method 'dense' trains every entry: sparsity must be 0 and grads 'dense'")
        if self.method != "dense" and self.sparsity == 0:
            raise ValueError(f"method {self.method!r} needs a sparsity in (0, 1) (a mask of the prune stage)")

    @property
    def percent(self) -> int:
        return round(100 * self.sparsity)


@dataclass(frozen=True)
class ScaleConfig:
    """Everything of one scale: data, model, prune stage, optimizer and train stage."""

    dataset: str = "tinyshakespeare"
    seq_len: int = 64
    seed: int = 0
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    prune: PruneConfig = field(default_factory=PruneConfig)
    train: TrainConfig = field(default_factory=TrainConfig)

    def __post_init__(self) -> None:
        _positive_int("seq_len", self.seq_len)
        if self.seq_len > self.model.n_positions:
            raise ValueError(
                f"seq_len ({self.seq_len}) exceeds the model's n_positions ({self.model.n_positions})"
            )
        if self.dataset not in ("tinyshakespeare", "ptb"):
            raise ValueError(f"dataset must be 'tinyshakespeare' or 'ptb', got {self.dataset!r}")
        family = self.train.masks
        scope = "layerwise" if family.endswith("layerwise") else "global"
        if scope not in self.prune.scopes or (family.startswith("imp") and not self.prune.iterative):
            raise ValueError(
                f"train.masks {family!r} is not made by the prune stage (scopes {list(self.prune.scopes)}, "
                f"iterative {self.prune.iterative})"
            )

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> ScaleConfig:
        parts: dict[str, type] = {
            "model": ModelConfig,
            "optim": OptimConfig,
            "prune": PruneConfig,
            "train": TrainConfig,
        }
        flat = {k: v for k, v in values.items() if k not in parts}
        nested: dict[str, Any] = {k: _build(c, values.get(k) or {}, k) for k, c in parts.items()}
        return _build(cls, {**flat, **nested}, "scale settings")

    @classmethod
    def smoke(cls) -> ScaleConfig:
        """Seconds on 2 cores: the tests' scale."""
        return cls(
            seq_len=32,
            model=ModelConfig(n_layer=2, n_embd=32, n_head=2, n_positions=32),
            optim=OptimConfig(warmup_steps=2),
            prune=PruneConfig(
                steps=8,
                rewind_step=2,
                batch_size=8,
                eval_windows=16,
                log_every=4,
                lr_decay="cosine",
                num_evaluations=4,
            ),
            train=TrainConfig(steps=4, batch_size=8, eval_windows=16, timing_skip=1),
        )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def check_run(name: str, spec: RunSpec, config: ScaleConfig) -> None:
    """A run fits the scale: its grid divides the world and the model, its sparsity was pruned."""
    train, model = config.train, config.model
    if train.world_size % spec.stages:
        raise ValueError(f"run {name!r}: {spec.stages} stages do not divide world_size {train.world_size}")
    if spec.stages > model.n_layer:
        raise ValueError(f"run {name!r}: {spec.stages} stages exceed the model's {model.n_layer} blocks")
    replicas = train.world_size // spec.stages
    if train.batch_size % (replicas * train.num_microbatches):
        raise ValueError(
            f"run {name!r}: batch_size {train.batch_size} must divide by replicas x micro-batches = "
            f"{replicas} x {train.num_microbatches}"
        )
    if train.schedule == "1f1b" and train.num_microbatches < spec.stages:
        raise ValueError(f"run {name!r}: 1f1b needs num_microbatches >= stages ({spec.stages})")
    if spec.method != "dense" and spec.sparsity not in config.prune.sparsities:
        raise ValueError(
            f"run {name!r}: sparsity {spec.sparsity} has no mask; the prune stage makes "
            f"{list(config.prune.sparsities)}"
        )


def _merge(base: Mapping[str, Any], over: Mapping[str, Any], where: str) -> dict[str, Any]:
    """``base`` updated by ``over``, one level deep for mapping values (``prune``, ``train``...)."""
    if not isinstance(over, Mapping):
        raise ValueError(f"{where} must be a mapping, got {type(over).__name__}")
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = {**out[key], **value}
        else:
            out[key] = value
    return out


def from_params(
    params: Mapping[str, Any], scale: str | None = None
) -> tuple[ScaleConfig, dict[str, RunSpec]]:
    """The scale's settings and every run, checked, from params.yaml's content."""
    # extrapolation: the report's; runs_module: the module the shared launcher asks for each run's config
    allowed = {"scale", "defaults", "scales", "runs", "extrapolation", "runs_module"}
    extra = sorted(k for k in params if k not in allowed and not str(k).startswith("."))
    if extra:
        raise ValueError(
            f"unknown top-level key(s) {', '.join(extra)}; allowed: {', '.join(sorted(allowed))}"
        )
    scale = scale or params.get("scale")
    scales = params.get("scales") or {}
    if scale not in scales:
        raise ValueError(f"unknown scale {scale!r}; params.yaml defines: {', '.join(scales)}")
    config = ScaleConfig.from_dict(_merge(params.get("defaults") or {}, scales[scale], f"scales.{scale}"))
    runs = {
        str(name): _build(RunSpec, values, f"run {name!r}")
        for name, values in (params.get("runs") or {}).items()
    }
    for name, spec in runs.items():
        check_run(name, spec, config)
    return config, runs
