"""The one place a method is assembled: every sync strategy a run can name (``strategy:``), the
checks of a run's method against the registries, and its typed options, parsed once.

A new strategy is one class with ``name``, ``needs``, ``ignores``, ``forces``, ``check_options``
and ``from_config`` (:class:`~common.strategies.base.SyncStrategy`, which also says the one
constructor shape) and one entry here: the run's validation and the loop read only its
declarations.

:class:`~common.config.RunConfig` is plain data with its own type and range checks; it imports
nothing of the library above it. :func:`checked_config` (a run from a mapping, checked) and
:func:`check_run` add what needs the method's registries: the compressor and transport names, the
compressor's options (names and types), and the strategy's options and declarations. The data set
and the model are the training loop's: ``trainer.checks`` checks a whole run (their names and
options, TernGrad's ``fp32_layers`` against the model's parameters) and then calls
:func:`check_run`. :func:`check_run` returns the :class:`Method`: the strategy class, its typed
options and the run's effective config (the settings the strategy ``forces`` at their forced
values), which :func:`build_strategy` hands to ``from_config`` (never parsed again). A forced
setting may be left at its RunConfig default (the forced value overrides it: DGC and DEF compress
per tensor whatever ``compress_per_tensor`` says while it is at its default, false) or set to the
forced value; any other value is an error naming the setting and why. The run logs, and is
checkpointed under, the effective config (:func:`effective_config`).

A paper's own strategy is an entry ``"module:attribute"``: the library never imports a paper, it
knows the paper's strategy by name only and imports it when a run asks for that name (as
torchtitan's core knows its experiments).
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .config import RunConfig, yaml_spelling
from .options import Options
from .strategies import (
    DataParallel,
    DetachedEFDataParallel,
    DGCDataParallel,
    SparseDataParallel,
    SyncStrategy,
    TorchHookDataParallel,
)

#: name -> the strategy class, or ``"module:attribute"`` of a paper's, imported when asked for.
STRATEGIES: dict[str, type[SyncStrategy] | str] = {
    DataParallel.name: DataParallel,
    DGCDataParallel.name: DGCDataParallel,
    DetachedEFDataParallel.name: DetachedEFDataParallel,
    SparseDataParallel.name: SparseDataParallel,
    "gossip": "papers.matcha.gossip:GossipStrategy",
    "compact": "papers.sparse_axonn.strategies.compact:CompactDataParallel",
    TorchHookDataParallel.name: TorchHookDataParallel,
    "pipeline": "papers.sparse_axonn.strategies.pipeline:PipelineDataParallel",
}


def strategy_class(name: str) -> type[SyncStrategy]:
    """The strategy class ``name`` (a ValueError lists the valid names); a paper's is imported now."""
    try:
        entry = STRATEGIES[name]
    except KeyError:
        raise ValueError(f"unknown strategy {name!r}; valid: {', '.join(STRATEGIES)}") from None
    if not isinstance(entry, str):
        return entry
    module, _, attribute = entry.partition(":")
    try:
        cls = getattr(importlib.import_module(module), attribute)
    except (ImportError, AttributeError) as error:
        raise ImportError(f"strategy {name!r} is {entry}, which cannot be imported: {error}") from error
    if not (isinstance(cls, type) and issubclass(cls, SyncStrategy) and cls.name == name):
        raise TypeError(f"strategy {name!r} is {entry}: not a SyncStrategy named {name!r}")
    return cls


@dataclass(frozen=True)
class Method:
    """A checked run's strategy class, its typed options (parsed once, by :func:`check_run`) and
    the run's effective config (the strategy's ``forces`` applied)."""

    strategy: type[SyncStrategy]
    options: Options
    config: RunConfig

    def build(self) -> SyncStrategy:
        """The strategy of the run these options were checked for."""
        return self.strategy.from_config(self.config, self.options)


def checked_config(values: Mapping[str, Any]) -> RunConfig:
    """A run from plain values (unknown keys refused), its method checked (:func:`check_run`)."""
    config = RunConfig.from_dict(values)  # unknown keys, types and ranges
    check_run(config)
    return config


def check_run(config: RunConfig) -> Method:
    """Check ``config``'s method: its own types and ranges, the compressor and transport registries
    (each error lists the valid names) and its strategy's declarations; fail before any process is
    started. Returns its :class:`Method`. (Its data set and model: ``trainer.checks.check_run``.)"""
    from .comm.sync import TRANSPORTS
    from .compressors import build_compressor

    config.validate()
    build_compressor(config.compressor, **config.compressor_options)  # names and types
    method = _check_strategy(config)
    if config.transport not in TRANSPORTS:
        raise ValueError(f"unknown transport {config.transport!r}; valid transports: {', '.join(TRANSPORTS)}")
    return method


def build_strategy(config: RunConfig) -> SyncStrategy:
    """The strategy ``config.strategy`` names, built from the checked run."""
    return check_run(config).build()


def effective_config(config: RunConfig) -> RunConfig:
    """``config`` with the settings its strategy forces at their forced values (``config`` itself
    when it has them already): what the run computes with, logs and is checkpointed under."""
    forced = {s: v for s, v, _ in strategy_class(config.strategy).forces if getattr(config, s) != v}
    return dataclasses.replace(config, **forced) if forced else config


def _check_strategy(config: RunConfig) -> Method:
    """The strategy's options and what its declarations (``needs``, ``ignores``) rule out."""
    cls = strategy_class(config.strategy)
    options = cls.check_options(config.strategy_options, config.world_size)
    cls.check_run(config)
    needs, name = cls.needs, config.strategy
    if not needs.compressor and (config.compressor != "identity" or config.error_feedback):
        raise ValueError(
            f"strategy {name} {needs.own_exchange}: set compressor: identity and error_feedback: "
            f"false (got {config.compressor!r}, error_feedback {config.error_feedback})"
        )
    if needs.update == "own" and config.optimizer != needs.run_optimizer:
        raise ValueError(
            f"strategy {name} applies {needs.update_rule} itself: optimizer must be "
            f"{needs.run_optimizer}, got {config.optimizer!r}"
        )
    if needs.memory == "own" and config.error_feedback:
        raise ValueError(
            f"strategy {name} keeps its own memory ({needs.own_memory}): set error_feedback: false"
        )
    if config.hierarchical and not cls.host_hierarchy:
        raise ValueError(
            f"strategy {name} does not synchronise hierarchically (a dense reduce inside each host, "
            f"its compressor between hosts): set hierarchical: false, or use strategy data_parallel"
        )
    for setting, neutral, why in cls.ignores:
        if getattr(config, setting) != neutral:
            raise ValueError(
                f"strategy {name} ignores {setting} (got {getattr(config, setting)!r}): {why}; "
                f"remove it or set {setting}: {yaml_spelling(neutral)}"
            )
    defaults = RunConfig()
    for setting, value, why in cls.forces:
        if getattr(config, setting) not in (value, getattr(defaults, setting)):
            raise ValueError(
                f"strategy {name} sets {setting} to {yaml_spelling(value)} (got {getattr(config, setting)!r}): "
                f"{why}; remove it or set {setting}: {yaml_spelling(value)}"
            )
    return Method(cls, options, effective_config(config))
