"""The type check of a setting read from YAML: plain Python, importing nothing of thinwire.

YAML gives a bool for true/false, a number for 1 or 0.5, a string for "0.5" or no; a run's
settings (:mod:`common.config`), a strategy's options (:mod:`common.options`), a compressor's
options (its constructor's annotations, :func:`common.compressors.build_compressor`) and a model's
(:func:`trainer.models.build_model`) are all checked against their declared types here, with a
message naming the setting and the type it takes.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, Literal


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
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin is Literal:
        return "one of " + ", ".join(map(str, args))
    if origin is Sequence:
        return {int: "a list of integers", float: "a list of numbers", str: "a list of strings"}[args[0]]
    if args and origin not in (dict, tuple):
        return " or ".join(_describe(a) for a in args)
    if origin is tuple and args and args[0] is not int:
        return {float: "a list of numbers", str: "a list of strings"}[args[0]]
    return names[origin or kind]


def _is(value: Any, kind: Any) -> bool:
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin is Literal:  # the value's type too: 1 is not True, 4.0 is not 4
        return any(type(value) is type(a) and value == a for a in args)
    if origin is Sequence:  # a list from YAML, each entry of the declared type
        return isinstance(value, list | tuple) and all(_is(v, args[0]) for v in value)
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


def declared_options(fn: Callable[..., Any], skip: Collection[str] = ()) -> dict[str, Any]:
    """The keyword options ``fn`` (a function, or a class: its ``__init__``) takes, in its order:
    name -> declared type (``Any`` where none is declared); ``*args``, ``**kwargs`` and ``skip``
    are left out."""
    # a class: the __init__ it defines or inherits (the signature of the class itself has no hints)
    target = (
        next(c.__dict__["__init__"] for c in fn.__mro__ if "__init__" in c.__dict__)
        if isinstance(fn, type)
        else fn
    )
    hints = typing.get_type_hints(target)
    variadic = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    return {
        name: hints.get(name, Any)
        for name, param in inspect.signature(target).parameters.items()
        if name != "self" and name not in skip and param.kind not in variadic
    }


def check_declared(prefix: str, values: Mapping[str, Any], declared: Mapping[str, Any]) -> None:
    """Check each of ``values`` against its type in ``declared`` (:func:`declared_options`; an
    option declared ``Any`` is left to its constructor); a message starts ``{prefix} {name}``."""
    for name, value in values.items():
        kind = declared[name]
        if kind is not Any:
            check_type(f"{prefix} {name}", value, kind)
