"""Plain-dict registries with errors that list the valid names."""

from __future__ import annotations

from typing import TypeVar

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
