"""Checks every SyncStrategy must pass, for the library's tests and the papers' alike."""

from __future__ import annotations

import inspect
from inspect import Parameter

import torch

from common.comm import GradientSync
from common.config import RunConfig
from common.methods import effective_config
from common.strategies import SyncStrategy


def assert_scheduled_lr_survives_a_resume(
    strategy: SyncStrategy, optimizer_class: type[torch.optim.Optimizer]
) -> None:
    """``strategy.scheduled_lr()`` follows a LambdaLR through ``Optimizer.load_state_dict`` (a resume),
    which replaces the optimizer's group dicts that the scheduler then writes into."""
    model = torch.nn.Sequential(torch.nn.Linear(4, 3))
    optimizer = strategy.optimizer(model, optimizer_class, lr=0.5)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: (step + 1) / 4)
    assert strategy.scheduled_lr() == 0.125
    optimizer.load_state_dict(optimizer.state_dict())  # resume: new group dicts
    scheduler.step()
    assert optimizer.param_groups[0]["lr"] == 0.25
    assert strategy.scheduled_lr() == 0.25


def assert_one_constructor_shape(cls: type[SyncStrategy]) -> None:
    """``cls(compressor=None, *, options=None, seed=0, **parts)``, every part keyword-only with a
    default (the shape :class:`SyncStrategy`'s docstring gives)."""
    assert cls.__init__ is not SyncStrategy.__init__, f"{cls.__name__} has no constructor of its own"
    parameters = list(inspect.signature(cls.__init__).parameters.values())[1:]
    head = [(p.name, p.kind, p.default) for p in parameters[:3]]
    assert head == [
        ("compressor", Parameter.POSITIONAL_OR_KEYWORD, None),
        ("options", Parameter.KEYWORD_ONLY, None),
        ("seed", Parameter.KEYWORD_ONLY, 0),
    ], f"{cls.__name__}{inspect.signature(cls.__init__)}"
    for part in parameters[3:]:
        assert part.kind is Parameter.KEYWORD_ONLY and part.default is not Parameter.empty, (
            f"{cls.__name__}: part {part.name} must be keyword-only with a default"
        )


#: The run settings a GradientSync is built from (besides the compressor and the seed).
SYNC_SETTINGS = ("transport", "bucket_numel", "compress_per_tensor", "error_feedback", "hierarchical")


def sync_settings_mismatches(strategy: SyncStrategy, config: RunConfig) -> tuple[int, list[str]]:
    """(how many GradientSyncs ``strategy`` sends the run's compressor through, and where their
    settings differ from the run's effective config): each difference is an override the strategy
    did not declare in ``forces``. A sync of the strategy's own with another compressor (DGC's dense
    tensors) is not the run's; a strategy that keeps its own memory (``needs.memory``) sets
    ``error_feedback`` itself."""
    cls, effective = type(strategy), effective_config(config)
    count, mismatches = 0, []
    for attribute, sync in vars(strategy).items():
        if not isinstance(sync, GradientSync):
            continue
        compressor = getattr(sync.compressor, "inner", sync.compressor)  # DGC counts what it sends
        if compressor.name != config.compressor:
            continue
        count += 1
        linear = compressor.linear
        built = {
            "transport": sync.transport,
            "bucket_numel": sync.bucket_numel,
            "compress_per_tensor": sync.compress_per_tensor,
            "seed": sync.seed,
            "hierarchical": sync.hierarchy is not None,
        }
        wanted = {
            "transport": "allreduce"
            if effective.transport == "allreduce" or (effective.transport == "auto" and linear)
            else "allgather",
            "bucket_numel": effective.bucket_numel,
            "compress_per_tensor": effective.compress_per_tensor,
            "seed": effective.seed,
            "hierarchical": effective.hierarchical,
        }
        if cls.needs.memory == "error_feedback":
            built["error_feedback"] = sync.error_feedback is not None
            wanted["error_feedback"] = effective.error_feedback
        mismatches += [
            f"{cls.__name__}.{attribute}.{key} is {built[key]!r}, the run's {wanted[key]!r}"
            for key in built
            if built[key] != wanted[key]
        ]
    return count, mismatches


def undeclared_sync_settings(cls: type[SyncStrategy]) -> list[str]:
    """The GradientSync settings of a run that a strategy without the run's compressor
    (``needs.compressor`` false) neither declares (``ignores``, ``forces``) nor rules out by its
    other declarations (its own memory, no host hierarchy)."""
    if cls.needs.compressor:
        return []  # it reads them: sync_settings_mismatches checks what it built
    declared = {setting for setting, _, _ in (*cls.ignores, *cls.forces)}
    if cls.needs.memory != "error_feedback":
        declared.add("error_feedback")  # a run's error_feedback: true is refused
    if not cls.host_hierarchy:
        declared.add("hierarchical")  # a run's hierarchical: true is refused
    return [setting for setting in SYNC_SETTINGS if setting not in declared]
