"""A compressor's options are checked against its constructor's annotations by
``build_compressor`` (so by the library and by a run's check before any worker starts): the error
names the compressor, the option, the value and what it takes."""

from __future__ import annotations

import inspect
import re
import typing
from collections.abc import Sequence

import pytest

from common.checks import check_type
from common.compressors import COMPRESSORS, DGC, RandomBlock, RandomK, build_compressor, compressor_options


# Issue 45's faults: each was accepted (``bool("no")`` is True; 4.0 passed ``bits in (2, ..., 8)``)
# and trained wrongly or crashed in the workers with a raw TypeError.
@pytest.mark.parametrize(
    ("name", "options", "message"),
    [
        ("randomk", {"density": 0.1, "scaled": "no"}, "compressor 'randomk' option scaled must be true or false, got 'no'"),
        ("random_block", {"density": 0.1, "scaled": "no"}, "compressor 'random_block' option scaled must be true or false, got 'no'"),
        ("randomk", {"density": 0.1, "shared_indices": "no"}, "compressor 'randomk' option shared_indices must be true or false, got 'no'"),
        ("dgc", {"resample": "no"}, "compressor 'dgc' option resample must be true or false, got 'no'"),
        ("dgc", {"strided_sample": "no"}, "compressor 'dgc' option strided_sample must be true or false, got 'no'"),
        ("qsgd", {"bits": 4.0}, "compressor 'qsgd' option bits must be an integer, got 4.0 (float)"),
        ("qsgd", {"bits": True}, "compressor 'qsgd' option bits must be an integer, got True (bool)"),
        ("qsgd", {"norm": "l1"}, "compressor 'qsgd' option norm must be one of l2, max, got 'l1' (str)"),
        ("dgc", {"truncation": "middle"}, "compressor 'dgc' option truncation must be one of magnitude, position, got 'middle'"),
        ("terngrad", {"fp32_layers": "fc"}, "compressor 'terngrad' option fp32_layers must be a list of strings, got 'fc'"),
        ("terngrad", {"fp32_layers": ["fc", 3]}, "compressor 'terngrad' option fp32_layers must be a list of strings, got ['fc', 3]"),
        ("terngrad", {"clip": "2.5"}, "compressor 'terngrad' option clip must be a number or null, got '2.5'"),
    ],
)  # fmt: skip
def test_an_option_of_the_wrong_type_names_the_compressor_the_option_and_the_type(name, options, message):
    with pytest.raises(ValueError) as error:
        build_compressor(name, **options)
    assert str(error.value).startswith(message), str(error.value)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: RandomK(0.1, scaled="no"), "scaled must be true or false, got 'no'"),
        (lambda: RandomK(0.1, shared_indices="no"), "shared_indices must be true or false, got 'no'"),
        (lambda: RandomBlock(0.1, scaled="no"), "scaled must be true or false, got 'no'"),
        (lambda: DGC(resample="no"), "resample must be true or false, got 'no'"),
        (lambda: DGC(strided_sample="no"), "strided_sample must be true or false, got 'no'"),
    ],
)
def test_a_direct_construction_refuses_a_switch_that_is_not_a_bool(make, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        make()


def test_number_options_take_integers_and_none_where_declared():
    dgc = build_compressor("dgc", density=1, upper_bound=2, sample_ratio=1)
    assert (dgc.density, dgc.upper_bound, dgc.sample_ratio) == (1.0, 2.0, 1.0)
    assert build_compressor("powersgd", min_compression_rate=3).min_compression_rate == 3.0
    assert build_compressor("terngrad", clip=None, fp32_layers=("fc",)).fp32_layers == ("fc",)


# Values of the wrong type for each declared option type (independent of the checker under test).
_WRONG = {
    bool: ["no", 1, None],
    int: [4.0, True, "4", None],
    float: ["0.5", True, None],
    float | None: ["0.5", True],
    str: [1, True, None],
    Sequence[str]: ["fc", [1], None],
}


def _option_cases():
    for name in COMPRESSORS:
        for option, kind in compressor_options(name).items():
            if typing.get_origin(kind) is typing.Literal:
                wrong = ["nope", 1, None]
            elif kind in _WRONG:
                wrong = _WRONG[kind]
            else:
                raise AssertionError(
                    f"compressor {name!r} option {option}: a new type {kind!r}: extend this test"
                )
            for value in wrong:
                yield pytest.param(name, option, value, id=f"{name}-{option}-{value!r}")


@pytest.mark.parametrize(("name", "option", "value"), list(_option_cases()))
def test_every_option_of_every_compressor_refuses_a_wrong_type_by_name(name, option, value):
    required = {"density": 0.5} if option != "density" and "density" in compressor_options(name) else {}
    with pytest.raises(ValueError) as error:
        build_compressor(name, **required, **{option: value})
    assert str(error.value).startswith(f"compressor {name!r} option {option} must be "), str(error.value)
    assert repr(value) in str(error.value)


@pytest.mark.parametrize("name", sorted(COMPRESSORS))
def test_every_option_default_passes_its_declared_type(name):
    """Each option is annotated with a type the check knows, and its default is of that type."""
    params = inspect.signature(COMPRESSORS[name]).parameters
    for option, kind in compressor_options(name).items():
        assert kind is not typing.Any, f"compressor {name!r} option {option} has no annotation"
        if params[option].default is not inspect.Parameter.empty:
            check_type(option, params[option].default, kind)


def test_unknown_name_and_option_errors_list_the_valid_ones():
    with pytest.raises(
        ValueError,
        match="unknown compressor 'tpok'; valid names: bf16, dgc, fp16, identity, powersgd, qsgd, random_block, randomk, signsgd, terngrad, topk",
    ):
        build_compressor("tpok")
    with pytest.raises(ValueError, match="unknown option.*ratio.*allowed: density"):
        build_compressor("topk", ratio=0.1)
