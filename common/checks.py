"""The type check of a setting read from YAML: plain Python, importing nothing of thinwire.

YAML gives a bool for true/false, a number for 1 or 0.5, a string for "0.5" or no; a run's
settings (:mod:`common.config`) and a method's options (:mod:`common.options`) are both checked
against their declared types here, with a message naming the setting and the type it takes.
"""

from __future__ import annotations

import typing
from collections.abc import Mapping
from typing import Any


def _describe(kind: Any) -> str:
    names = {
        str: "a string",
        bool: "true or false",
        int: "an integer",
        float: "a number",
        dict: "a mapping (key: value, or {})",
        tuple: "a list of integers",
        type(None): "null",
    }
    args = typing.get_args(kind)
    if args and typing.get_origin(kind) not in (dict, tuple):
        return " or ".join(_describe(a) for a in args)
    if typing.get_origin(kind) is tuple and args and args[0] is not int:
        return {float: "a list of numbers", str: "a list of strings"}[args[0]]
    return names[typing.get_origin(kind) or kind]


def _is(value: Any, kind: Any) -> bool:
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if args and origin not in (dict, tuple):  # a union such as int | None
        return any(_is(value, a) for a in args)
    if kind is bool:
        return isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if kind is str:
        return isinstance(value, str)
    if kind is type(None):
        return value is None
    if origin is dict:
        return isinstance(value, Mapping) and all(isinstance(k, str) for k in value)
    if origin is tuple:
        return isinstance(value, list | tuple)
    raise TypeError(f"no type check for {kind!r}")  # a new field type: teach _is about it


def check_type(name: str, value: Any, kind: Any) -> None:
    """Raise ValueError naming ``name`` unless ``value`` is of the declared field type ``kind``
    (YAML gives a bool for true/false, a number for 1 or 0.5, a string for "0.5" or no)."""
    if not _is(value, kind):
        raise ValueError(f"{name} must be {_describe(kind)}, got {value!r} ({type(value).__name__})")
