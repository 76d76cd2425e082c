"""Run configuration: one frozen dataclass, built from plain dicts with unknown keys refused.

YAML is parsed only at entry points (``pipelines/``); the library sees :class:`RunConfig`.
A pipeline's ``params.yaml`` composes a run as ``defaults`` <- ``scales[scale]`` <- ``runs[run]``
(later wins; see :func:`compose`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .checks import check_type

OPTIMIZERS = ("sgd", "adamw")
AUGMENTATIONS = ("none", "crop_flip", "flip_translate")  # trainer.data.augment (validation imports no torch)
LR_SCHEDULES = ("constant", "cosine", "step", "linear")
SAMPLINGS = ("epochs", "draws")  # trainer.data.sampling
# bf16: autocast of the forward and backward; weights and gradients stay fp32. fp16: the same in
# fp16, with a dynamic loss scale (trainer.loss_scale); a GPU option (on a CPU it is emulated).
PRECISIONS = ("fp32", "bf16", "fp16")


@dataclass(frozen=True)
class RunConfig:
    """Everything that decides what one training run computes (and nothing that does not)."""

    dataset: str = "mnist"
    model: str = "mlp"
    model_options: dict[str, Any] = field(default_factory=dict)
    compressor: str = "identity"
    compressor_options: dict[str, Any] = field(default_factory=dict)
    error_feedback: bool = False
    # How a step communicates: a strategy's name (common.methods.STRATEGIES): "data_parallel"
    # (GradientSync of every gradient through the compressor), "dgc" (Deep Gradient Compression's
    # step), "def" (detached error feedback, DEF/DEF-A), "sparse" (one selector over the whole
    # flattened gradient: ExDyna and its baselines), "gossip" (MATCHA and its baselines) or
    # "compact" (sparse AxoNN's all-reduce and AdamW over the unpruned entries);
    # strategy_options are checked by the strategy's check_options, and the settings its
    # declarations rule out are errors naming them.
    strategy: str = "data_parallel"
    strategy_options: dict[str, Any] = field(default_factory=dict)
    transport: str = "auto"
    bucket_numel: int | None = None
    compress_per_tensor: bool = False  # with buckets: compress per tensor, one collective per bucket
    optimizer: str = "sgd"
    lr: float = 0.05
    momentum: float = 0.9
    weight_decay: float = 0.0
    lr_schedule: str = "constant"
    lr_warmup_steps: int = 0
    # "step" schedule: multiply the lr by lr_decay at each of these epochs (e.g. [30, 60, 80]);
    # empty: at 50% and 75% of training.
    lr_milestones: tuple[int, ...] = ()
    lr_decay: float = 0.1
    # "linear" schedule: after the warm-up, the lr falls linearly to lr_end_factor x lr at the last
    # step (with a warm-up, a one-cycle / airbench "triangle" schedule).
    lr_end_factor: float = 0.0
    label_smoothing: float = 0.0  # of the training loss (evaluation losses are never smoothed)
    # Each rank clips its own gradient to this global norm before anything is communicated, the
    # same for every method (DGC's paper clips locally too); None: no clipping.
    grad_clip_norm: float | None = None
    # Compute, not communication: "bf16" runs forward and backward under autocast (weights,
    # gradients and everything a compressor sees stay fp32). channels_last: NHWC convolutions.
    # Both pay on CPUs with AMX/AVX-512 bf16 (measured 2.7x together on the suite's CIFAR net); a
    # CPU without bf16 units computes a bf16 run in fp32 (trainer.compute_precision).
    precision: str = "fp32"
    channels_last: bool = False
    # Hierarchical synchronisation (common.comm.hierarchy): a dense reduce inside each host, the
    # compressor between hosts' leaders only, a broadcast inside the host; hosts as torchrun lays
    # them out (LOCAL_WORLD_SIZE ranks each). For strategies that declare host_hierarchy.
    hierarchical: bool = False
    batch_size: int = 64  # per rank
    epochs: int = 1
    max_steps: int | None = None  # stop early (smoke scale); None = all epochs
    # Time-to-target runs (the leaderboard): stop after the first evaluation at or past the target,
    # {"test_accuracy": 0.99} (>=) or {"test_loss": 1.6} (<=). Unlike max_steps, the lr schedule
    # still spans every step, so up to the stop the run is the full run's trajectory.
    stop_at: dict[str, float] = field(default_factory=dict)
    # How a step's examples are chosen: "epochs" (each epoch a permutation, cut into every rank's
    # batches) or "draws" (each step draws its global batch with replacement from a generator seeded
    # by (seed, first_step + step), each data-parallel share taking its consecutive part: sparse
    # AxoNN's, where a retraining from the rewind step continues its dense run's data order).
    sampling: str = "epochs"
    first_step: int = 0  # draws only: the draw of the run's first step
    # None: each step's batch decoded in the training process. N >= 0: through a DataLoader with N
    # worker processes, prefetching (and pinned memory on CUDA): the same batches, decoded ahead
    # (trainer.data.loader; sampling: epochs only). Changes no result, only where decoding runs.
    data_workers: int | None = None
    train_limit: int | None = None  # first N training examples only (smoke/cpu scale)
    eval_limit: int | None = None
    seq_len: int = 64  # language-model datasets
    augment: str = "none"  # image training batches: "crop_flip" (pad 4, random crop, flip)
    eval_every: int = 100
    log_every: int = 10
    # Evaluate / log this many times per run, evenly spaced, the last at the last step (overrides
    # eval_every / log_every; the same count at every scale).
    num_evaluations: int | None = None
    num_logs: int | None = None
    checkpoint_every: int = 100
    keep_checkpoints: int = 2  # the last N are kept; a damaged newest one falls back to the one before
    # A rank blocked this long in one collective (a dead or stopped peer) dumps its stack and exits
    # non-zero instead of waiting for gloo's 30 minutes; longer than any legitimate wait (an
    # evaluation, rank 0's checkpoint or tracking write).
    collective_timeout_s: float = 300.0
    seed: int = 0
    world_size: int = 4  # ranks the launcher starts (torchrun --nproc_per_node)
    max_restarts: int = 1  # torchrun --max-restarts: a killed worker resumes from the last checkpoint

    def __post_init__(self) -> None:
        if isinstance(self.lr_milestones, list):  # YAML lists; a tuple keeps the config hashable
            object.__setattr__(self, "lr_milestones", tuple(self.lr_milestones))

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> RunConfig:
        allowed = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(values) - set(allowed))
        if unknown:
            raise ValueError(f"unknown run parameter(s) {', '.join(unknown)}; allowed: {', '.join(allowed)}")
        config = cls(**dict(values))
        config.validate()
        return config

    def validate(self) -> None:
        """Cheap checks that need no data or model: fail before any process is started."""
        for f in dataclasses.fields(self):  # the numbers' checks below also say their range
            if f.name not in _RANGE_CHECKED:
                check_type(f.name, getattr(self, f.name), _FIELD_TYPES[f.name])
        self._check_numbers()
        self._check_schedule()
        check_stop_at(self.stop_at)

    def _check_numbers(self) -> None:
        """Counts, switches, choices and numbers against their ranges (:data:`_RANGES`)."""
        for name in _POSITIVE_INTS:
            _check_positive_int(name, getattr(self, name))
        for name in _OPTIONAL_POSITIVE_INTS:
            _check_positive_int(name, getattr(self, name), allow_none=True)
        for name in ("error_feedback", "compress_per_tensor", "channels_last", "hierarchical"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false, got {getattr(self, name)!r}")
        for name, choices in (
            ("optimizer", OPTIMIZERS),
            ("augment", AUGMENTATIONS),
            ("lr_schedule", LR_SCHEDULES),
            ("precision", PRECISIONS),
            ("sampling", SAMPLINGS),
        ):
            if getattr(self, name) not in choices:
                raise ValueError(f"unknown {name} {getattr(self, name)!r}; valid: {', '.join(choices)}")
        for name, (low, high, low_open, high_open, allow_none) in _RANGES.items():
            _check_number(name, getattr(self, name), low, high, low_open, high_open, allow_none)
        for name in ("lr_warmup_steps", "max_restarts", "seed", "first_step"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
        if self.first_step and self.sampling != "draws":
            raise ValueError(f"first_step {self.first_step} needs sampling: draws, got {self.sampling!r}")
        if self.data_workers is not None:
            if (
                isinstance(self.data_workers, bool)
                or not isinstance(self.data_workers, int)
                or self.data_workers < 0
            ):
                raise ValueError(f"data_workers must be null or an integer >= 0, got {self.data_workers!r}")
            if self.sampling != "epochs":
                raise ValueError(
                    f"data_workers {self.data_workers} needs sampling: epochs (a drawn example may recur "
                    f"within an epoch, and its augmentation draw is counted where it is decoded), got {self.sampling!r}"
                )

    def _check_schedule(self) -> None:
        milestones = list(self.lr_milestones)
        if any(
            isinstance(m, bool) or not isinstance(m, int) or m < 1 for m in milestones
        ) or milestones != sorted(set(milestones)):
            raise ValueError(
                f"lr_milestones must be increasing positive epochs (e.g. [30, 60, 80]), got {milestones!r}"
            )
        if milestones and self.lr_schedule != "step":
            raise ValueError(f"lr_milestones {milestones} need lr_schedule: step, got {self.lr_schedule!r}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def fingerprint(self) -> str:
        """Short hash of everything that changes the computation (checkpoints are keyed by it)."""
        ignore = {
            "eval_every",
            "log_every",
            "num_evaluations",
            "num_logs",
            "checkpoint_every",
            "keep_checkpoints",
            "collective_timeout_s",
            "max_restarts",
            "data_workers",
        }
        values = {k: v for k, v in self.to_dict().items() if k not in ignore}
        added_later = (("sampling", "epochs"), ("first_step", 0), ("hierarchical", False))
        for key, default in added_later:  # at their defaults,
            if values[key] == default:  # a run keeps the fingerprint (and checkpoints) it had before
                del values[key]
        return hashlib.sha256(json.dumps(values, sort_keys=True, default=str).encode()).hexdigest()[:12]


_POSITIVE_INTS = (
    "batch_size",
    "epochs",
    "seq_len",
    "eval_every",
    "log_every",
    "checkpoint_every",
    "keep_checkpoints",
    "world_size",
)
_OPTIONAL_POSITIVE_INTS = (
    "max_steps",
    "train_limit",
    "eval_limit",
    "bucket_numel",
    "num_evaluations",
    "num_logs",
)
# name -> (low, high, low open, high open, null allowed)
_RANGES: dict[str, tuple[float, float, bool, bool, bool]] = {
    "lr": (0, math.inf, True, False, False),
    "momentum": (0, 1, False, True, False),
    "weight_decay": (0, math.inf, False, False, False),
    "lr_decay": (0, 1, True, False, False),
    "lr_end_factor": (0, 1, False, False, False),
    "label_smoothing": (0, 1, False, True, False),
    "grad_clip_norm": (0, math.inf, True, False, True),
    "collective_timeout_s": (1, math.inf, False, False, False),  # under 1 s a busy peer looks dead
}


def _check_positive_int(name: str, value: Any, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(
            f"{name} must be a positive integer{' or null' if allow_none else ''}, got {value!r}"
        )


def _check_number(
    name: str, value: Any, low: float, high: float, low_open: bool, high_open: bool, allow_none: bool
) -> None:
    """``value`` is a finite number in the interval (open or closed at each end), or null if allowed."""
    if value is None and allow_none:
        return
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if ok:
        ok = (value > low if low_open else value >= low) and (value < high if high_open else value <= high)
    if not ok:
        if math.isinf(high):
            allowed = f"a number {'>' if low_open else '>='} {low:g}"
        else:
            allowed = f"a number in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
        raise ValueError(f"{name} must be {allowed}{' or null' if allow_none else ''}, got {value!r}")


def yaml_spelling(value: Any) -> str:
    """How params.yaml spells ``value`` (null, false, auto)."""
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


STOP_METRICS = {"test_accuracy": "at or above", "test_loss": "at or below"}


def check_stop_at(stop_at: Mapping[str, Any]) -> None:
    """``stop_at`` is {} or one evaluation metric with a finite target (see RunConfig.stop_at)."""
    if not stop_at:
        return
    allowed = ", ".join(f"{{{name}: X}} (stop {how} X)" for name, how in STOP_METRICS.items())
    if len(stop_at) != 1 or next(iter(stop_at)) not in STOP_METRICS:
        raise ValueError(f"stop_at must be one of {allowed}, or {{}}; got {dict(stop_at)!r}")
    ((name, value),) = stop_at.items()
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"stop_at {name} must be a finite number, got {value!r}")


def stop_reached(stop_at: Mapping[str, float], result: Mapping[str, float]) -> bool:
    """Whether an evaluation ``result`` reaches the run's ``stop_at`` target (never for {})."""
    if not stop_at:
        return False
    ((name, target),) = stop_at.items()
    return result[name] >= target if name == "test_accuracy" else result[name] <= target


_FIELD_TYPES = typing.get_type_hints(RunConfig)
# Fields whose own checks in RunConfig.validate reject a wrong type with their allowed range.
_RANGE_CHECKED = {
    name for name, kind in _FIELD_TYPES.items() if kind in (bool, int, float, int | None, float | None)
}


def compose(params: Mapping[str, Any], run: str, scale: str | None = None) -> dict[str, Any]:
    """The flat run parameters of ``run`` at ``scale`` from a pipeline's params.yaml content.

    ``params`` has ``defaults`` (optional), ``scale`` (the default scale), ``scales`` (name ->
    overrides) and ``runs`` (name -> overrides); ``runs_from`` (a folder of extra run files) and
    ``stage`` (settings of the stage driver, not of a run) are read by the pipeline, not here;
    keys starting with ``.`` only hold YAML anchors for the runs to merge. Unknown run or scale
    names list the valid ones.
    """
    from .registry import lookup

    allowed_top = {"defaults", "scale", "scales", "runs", "runs_from", "stage"}
    extra = sorted(k for k in set(params) - allowed_top if not str(k).startswith("."))
    if extra:
        raise ValueError(
            f"unknown top-level key(s) {', '.join(extra)} in params; allowed: {', '.join(sorted(allowed_top))}"
        )
    scale = scale or params.get("scale")
    scales = params.get("scales") or {}
    runs = params.get("runs") or {}
    if not isinstance(scale, str):
        raise ValueError(f"params must name a scale (one of: {', '.join(scales)}), got {scale!r}")
    merged: dict[str, Any] = {}
    for layer in (params.get("defaults") or {}, lookup(scales, scale, "scale"), lookup(runs, run, "run")):
        merged.update(layer)
    return merged
