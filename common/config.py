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
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

OPTIMIZERS = ("sgd", "adamw")
STRATEGIES = ("data_parallel", "dgc", "def", "sparse", "gossip")
AUGMENTATIONS = ("none", "crop_flip")  # common.data.augment (kept here: validation imports no torch)
LR_SCHEDULES = ("constant", "cosine", "step")


@dataclass(frozen=True)
class RunConfig:
    """Everything that decides what one training run computes (and nothing that does not)."""

    dataset: str = "mnist"
    model: str = "mlp"
    model_options: dict[str, Any] = field(default_factory=dict)
    compressor: str = "identity"
    compressor_options: dict[str, Any] = field(default_factory=dict)
    error_feedback: bool = False
    # How a step communicates (common.strategies): "data_parallel" (GradientSync of every gradient
    # through the compressor), "dgc" (Deep Gradient Compression's step; strategy_options are
    # common.strategies.DGC_OPTIONS) or "def" (detached error feedback on the momentum update,
    # DEF/DEF-A, classic EF at mu 0; options common.strategies.DEF_OPTIONS) or "sparse" (one selector
    # over the whole flattened gradient: ExDyna and its baselines; common.strategies.SPARSE_OPTIONS)
    # or "gossip" (decentralized SGD over activated matchings, MATCHA and its baselines: parameters,
    # not gradients, cross the wire; common.gossip.GOSSIP_OPTIONS).
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
    batch_size: int = 64  # per rank
    epochs: int = 1
    max_steps: int | None = None  # stop early (smoke scale); None = all epochs
    train_limit: int | None = None  # first N training examples only (smoke/cpu scale)
    eval_limit: int | None = None
    seq_len: int = 64  # language-model datasets
    augment: str = "none"  # image training batches: "crop_flip" (pad 4, random crop, flip)
    eval_every: int = 100
    log_every: int = 10
    checkpoint_every: int = 100
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

        def positive_int(name: str, allow_none: bool = False) -> None:
            value = getattr(self, name)
            if value is None and allow_none:
                return
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(
                    f"{name} must be a positive integer{' or null' if allow_none else ''}, got {value!r}"
                )

        for name in (
            "batch_size",
            "epochs",
            "seq_len",
            "eval_every",
            "log_every",
            "checkpoint_every",
            "world_size",
        ):
            positive_int(name)
        for name in ("max_steps", "train_limit", "eval_limit", "bucket_numel"):
            positive_int(name, allow_none=True)
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"unknown optimizer {self.optimizer!r}; valid: {', '.join(OPTIMIZERS)}")
        if self.augment not in AUGMENTATIONS:
            raise ValueError(f"unknown augment {self.augment!r}; valid: {', '.join(AUGMENTATIONS)}")
        if self.lr_schedule not in LR_SCHEDULES:
            raise ValueError(f"unknown lr_schedule {self.lr_schedule!r}; valid: {', '.join(LR_SCHEDULES)}")
        if not (isinstance(self.lr, int | float) and math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"lr must be a positive number, got {self.lr!r}")
        if not 0 <= self.momentum < 1:
            raise ValueError(f"momentum must be in [0, 1), got {self.momentum!r}")
        if self.weight_decay < 0:
            raise ValueError(f"weight_decay must be >= 0, got {self.weight_decay!r}")
        milestones = list(self.lr_milestones)
        if any(
            isinstance(m, bool) or not isinstance(m, int) or m < 1 for m in milestones
        ) or milestones != sorted(set(milestones)):
            raise ValueError(
                f"lr_milestones must be increasing positive epochs (e.g. [30, 60, 80]), got {milestones!r}"
            )
        if milestones and self.lr_schedule != "step":
            raise ValueError(f"lr_milestones {milestones} need lr_schedule: step, got {self.lr_schedule!r}")
        if not 0 < self.lr_decay <= 1:
            raise ValueError(f"lr_decay must be in (0, 1], got {self.lr_decay!r}")
        if self.lr_warmup_steps < 0 or self.max_restarts < 0:
            raise ValueError("lr_warmup_steps and max_restarts must be >= 0")
        # Names are checked against the registries (each error lists the valid names).
        from .compressors import build_compressor
        from .data import DATASETS
        from .models import MODELS
        from .registry import lookup

        lookup(DATASETS, self.dataset, "dataset")
        lookup(MODELS, self.model, "model")
        build_compressor(self.compressor, **self.compressor_options)
        if self.strategy not in STRATEGIES:
            raise ValueError(f"unknown strategy {self.strategy!r}; valid: {', '.join(STRATEGIES)}")
        if self.strategy in ("dgc", "def"):
            from .strategies import check_def_options, check_dgc_options

            if self.strategy == "dgc":
                check_dgc_options(self.strategy_options)
            else:
                check_def_options(self.strategy_options)
            if self.optimizer != "sgd":
                raise ValueError(
                    f"strategy {self.strategy} applies momentum SGD itself: optimizer must be sgd, "
                    f"got {self.optimizer!r}"
                )
            if self.error_feedback:
                raise ValueError(
                    f"strategy {self.strategy} keeps its own memory (momentum correction / error "
                    "feedback on the update): set error_feedback: false"
                )
        elif self.strategy == "sparse":
            from .strategies import check_sparse_options

            check_sparse_options(self.strategy_options)
            if self.compressor != "identity" or self.error_feedback:
                raise ValueError(
                    "strategy sparse selects from the whole gradient and keeps its own residual: set "
                    f"compressor: identity and error_feedback: false (got {self.compressor!r}, "
                    f"error_feedback {self.error_feedback})"
                )
        elif self.strategy == "gossip":
            from .gossip import check_gossip_options

            check_gossip_options(self.strategy_options, self.world_size)
            if self.compressor != "identity" or self.error_feedback:
                raise ValueError(
                    "strategy gossip exchanges whole models between neighbours, uncompressed: set "
                    f"compressor: identity and error_feedback: false (got {self.compressor!r}, "
                    f"error_feedback {self.error_feedback})"
                )
        elif self.strategy_options:
            raise ValueError(
                f"strategy {self.strategy!r} takes no strategy_options, got {self.strategy_options!r}"
            )
        from .comm.sync import TRANSPORTS

        if self.transport not in TRANSPORTS:
            raise ValueError(
                f"unknown transport {self.transport!r}; valid transports: {', '.join(TRANSPORTS)}"
            )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def fingerprint(self) -> str:
        """Short hash of everything that changes the computation (checkpoints are keyed by it)."""
        ignore = {"eval_every", "log_every", "checkpoint_every", "max_restarts"}
        values = {k: v for k, v in self.to_dict().items() if k not in ignore}
        return hashlib.sha256(json.dumps(values, sort_keys=True, default=str).encode()).hexdigest()[:12]


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
