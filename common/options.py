"""Typed options of a sync strategy: a frozen dataclass per strategy, built from a run's mapping.

A strategy's ``strategy_options`` are checked as the run's own settings are: an unknown key is an
error listing the allowed ones, a value of the wrong type an error naming the option and the type
it takes (YAML gives a bool for true/false, a number for 1 or 0.5, a string for "0.5"), and each
class's ``__post_init__`` checks ranges and how options combine. No torch import: validation runs
before any process is started.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from typing import Any, ClassVar, TypeVar, cast

from .checks import check_type

OptionsT = TypeVar("OptionsT", bound="Options")


@dataclasses.dataclass(frozen=True)
class Options:
    """Base of a strategy's options (subclasses are frozen dataclasses with defaults)."""

    #: The strategy's name in messages ("dgc masking must be true or false, ...").
    kind: ClassVar[str] = "strategy"

    @classmethod
    def from_mapping(cls: type[OptionsT], values: Mapping[str, Any] | Options | None) -> OptionsT:
        """The options ``values`` set over the defaults (an instance is returned as it is; another
        strategy's options are a TypeError).

        Subclasses check ranges in ``__post_init__`` robustly to wrong types (a range message names
        the allowed range); the declared type of every given value is checked after that."""
        if isinstance(values, cls):
            return values
        if isinstance(values, Options):
            raise TypeError(f"{cls.kind} takes {cls.__name__}, got {type(values).__name__}")
        values = dict(cast(Mapping[str, Any], values or {}))
        allowed = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(values) - set(allowed))
        if unknown:
            raise ValueError(
                f"unknown {cls.kind} option(s) {', '.join(unknown)}; allowed: {', '.join(allowed)}"
            )
        # YAML lists become tuples (the options stay hashable); __post_init__ checks ranges and
        # combinations with messages that say the allowed range, then every value's type is checked.
        options = cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in values.items()})
        hints = typing.get_type_hints(cls)
        for name in values:
            check_type(f"{cls.kind} {name}", getattr(options, name), hints[name])
        return options

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
