"""Plain-dict registries with errors that list the valid names."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

T = TypeVar("T")


def lookup(registry: dict[str, T], name: str, kind: str) -> T:
    """Return ``registry[name]`` or raise a ``ValueError`` naming the valid keys.

    >>> lookup({"a": 1}, "b", "model")
    Traceback (most recent call last):
    ...
    ValueError: unknown model 'b'; valid names: a
    """
    try:
        return registry[name]
    except KeyError:
        valid = ", ".join(sorted(registry))
        raise ValueError(f"unknown {kind} {name!r}; valid names: {valid}") from None


def merge_options(options: Mapping[str, Any], defaults: Mapping[str, Any], kind: str) -> dict[str, Any]:
    """``options`` over ``defaults``; a ``ValueError`` names unknown keys and the allowed ones.

    >>> merge_options({"b": 2}, {"a": 1}, "gossip")
    Traceback (most recent call last):
    ...
    ValueError: unknown gossip option(s) b; allowed: a
    """
    unknown = sorted(set(options) - set(defaults))
    if unknown:
        raise ValueError(f"unknown {kind} option(s) {', '.join(unknown)}; allowed: {', '.join(defaults)}")
    return {**defaults, **options}
