"""Bad input stops before any training, with an error that names the value and what is allowed."""

from __future__ import annotations

import os
import re

import pytest
import yaml

from common.config import RunConfig, compose
from common.methods import STRATEGIES, checked_config
from tests.helpers.refusal import launch_refusal


def test_defaults_are_valid_and_fingerprint_ignores_logging_knobs():
    a = checked_config({})
    assert a.fingerprint() == checked_config({"log_every": 3, "eval_every": 7}).fingerprint()
    assert a.fingerprint() != checked_config({"lr": 0.1}).fingerprint()


@pytest.mark.parametrize(
    "values,message",
    [
        ({"compresor": "topk"}, r"unknown run parameter\(s\) compresor; allowed: dataset, model, "),
        (
            {"compressor": "tpok"},
            "unknown compressor 'tpok'; valid names: bf16, dgc, fp16, identity, powersgd, qsgd, random_block, randomk, signsgd, terngrad, topk",
        ),
        (
            {"compressor": "topk", "compressor_options": {"density": 0}},
            r"density must be a number in \(0, 1\]",
        ),
        (
            {"compressor": "topk", "compressor_options": {"density": 1.5}},
            r"density must be a number in \(0, 1\] \(the fraction of entries kept\), got 1.5",
        ),
        (
            {"compressor": "topk", "compressor_options": {"ratio": 0.1}},
            "unknown option.*ratio.*allowed: density",
        ),
        ({"batch_size": 0}, "batch_size must be a positive integer, got 0"),
        ({"lr": -1}, "lr must be a number > 0, got -1"),
        # a string where a number belongs is named, not a raw TypeError (issue 18)
        ({"momentum": "0.9"}, r"momentum must be a number in \[0, 1\), got '0.9'"),
        ({"weight_decay": "5e-4"}, "weight_decay must be a number >= 0, got '5e-4'"),
        ({"lr_warmup_steps": "10"}, "lr_warmup_steps must be an integer >= 0, got '10'"),
        ({"max_restarts": "1"}, "max_restarts must be an integer >= 0, got '1'"),
        ({"error_feedback": "no"}, "error_feedback must be true or false, got 'no'"),
        ({"label_smoothing": 1.0}, r"label_smoothing must be a number in \[0, 1\), got 1.0"),
        ({"lr_end_factor": 2}, r"lr_end_factor must be a number in \[0, 1\], got 2"),
        ({"grad_clip_norm": 0}, "grad_clip_norm must be a number > 0 or null, got 0"),
        # a timeout shorter than one busy collective would kill healthy runs (issue 45)
        ({"collective_timeout_s": 0.001}, "collective_timeout_s must be a number >= 1, got 0.001"),
        ({"collective_timeout_s": 0}, "collective_timeout_s must be a number >= 1, got 0"),
        ({"precision": "fp8"}, "unknown precision 'fp8'; valid: fp32, bf16"),
        ({"channels_last": 1}, "channels_last must be true or false, got 1"),
        ({"optimizer": "lamb"}, "unknown optimizer 'lamb'; valid: sgd, adamw"),
        ({"transport": "ring"}, "unknown transport 'ring'; valid transports: auto, allreduce, allgather"),
        (
            {"lr_schedule": "step", "lr_milestones": [60, 30]},
            r"lr_milestones must be increasing positive epochs \(e.g. \[30, 60, 80\]\), got \[60, 30\]",
        ),
        ({"lr_schedule": "cosine", "lr_milestones": [30]}, "lr_milestones \\[30\\] need lr_schedule: step"),
        ({"lr_schedule": "step", "lr_decay": 0}, r"lr_decay must be a number in \(0, 1\], got 0"),
    ],
)
def test_bad_run_parameters_are_rejected(values, message):
    with pytest.raises(ValueError, match=message):
        checked_config(values)


# Issue 45: compressor and model options were checked by name only, fp32_layers in the workers (the
# model's options and fp32_layers against its parameters: tests/trainer/test_checks.py).
@pytest.mark.parametrize(
    "values, message",
    [
        ({"compressor": "randomk", "compressor_options": {"density": 0.1, "scaled": "no"}},
         "compressor 'randomk' option scaled must be true or false, got 'no' (str)"),
        ({"compressor": "random_block", "compressor_options": {"density": 0.1, "scaled": "no"}},
         "compressor 'random_block' option scaled must be true or false, got 'no' (str)"),
        ({"compressor": "randomk", "compressor_options": {"density": 0.1, "shared_indices": "no"}},
         "compressor 'randomk' option shared_indices must be true or false, got 'no' (str)"),
        ({"compressor": "dgc", "compressor_options": {"density": 0.01, "resample": "no"}},
         "compressor 'dgc' option resample must be true or false, got 'no' (str)"),
        ({"compressor": "dgc", "compressor_options": {"density": 0.01, "strided_sample": "no"}},
         "compressor 'dgc' option strided_sample must be true or false, got 'no' (str)"),
        ({"compressor": "qsgd", "compressor_options": {"bits": 4.0}},
         "compressor 'qsgd' option bits must be an integer, got 4.0 (float)"),
    ],
)  # fmt: skip
def test_compressor_options_are_checked_before_any_worker_starts(values, message):
    with pytest.raises(ValueError) as error:
        checked_config(values)
    assert str(error.value).startswith(message), str(error.value)


def test_compose_layers_and_errors():
    params = {
        "scale": "cpu",
        "defaults": {"lr": 0.1, "epochs": 1},
        "scales": {"cpu": {"epochs": 2}, "smoke": {"epochs": 1, "max_steps": 3}},
        "runs": {"a": {"lr": 0.2}},
    }
    assert compose(params, "a") == {"lr": 0.2, "epochs": 2}
    assert compose(params, "a", "smoke") == {"lr": 0.2, "epochs": 1, "max_steps": 3}
    with pytest.raises(ValueError, match="unknown run 'b'; valid names: a"):
        compose(params, "b")
    with pytest.raises(ValueError, match="unknown scale 'gpu'; valid names: cpu, smoke"):
        compose(params, "a", "gpu")
    with pytest.raises(ValueError, match=r"unknown top-level key\(s\) run in params"):
        compose({**params, "run": {}}, "a")


def test_launcher_refuses_before_starting_any_worker(monkeypatch):
    message = launch_refusal(monkeypatch, ["baseline", "nope"])  # fails the test if torchrun would start
    assert "unknown run 'nope'; valid names: fp16, fp32, topk1_ef" in message
    message = launch_refusal(monkeypatch, ["nonexistent", "fp32"])
    assert "unknown pipeline 'nonexistent'" in message and "baseline" in message


def test_launcher_refuses_a_compressor_option_of_the_wrong_type_before_any_worker(tmp_path, monkeypatch):
    pipeline = tmp_path / "own"  # a pipeline of one's own: a folder with params.yaml
    pipeline.mkdir()
    options = {"density": 0.1, "scaled": "no"}
    params = {"scale": "t", "scales": {"t": {}}, "defaults": {"compressor": "randomk"}, "runs": {"r": {"compressor_options": options}}}  # fmt: skip
    (pipeline / "params.yaml").write_text(yaml.safe_dump(params))
    monkeypatch.setattr(os, "environ", dict(os.environ))  # main() exports settings for its workers
    message = launch_refusal(monkeypatch, [str(pipeline), "r", "--out", str(tmp_path / "run")])
    assert message.endswith(
        "run 'r': compressor 'randomk' option scaled must be true or false, got 'no' (str)"
    ), message
    assert not (tmp_path / "run").exists()


def test_launcher_names_the_data_folder_it_looked_in(tmp_path, monkeypatch):
    env = {"THINWIRE_DATA": str(tmp_path), "THINWIRE_CACHE": str(tmp_path / "cache")}
    message = launch_refusal(monkeypatch, ["baseline", "fp32"], **env)
    assert str(tmp_path) in message and "THINWIRE_DATA" in message
    assert "train-images-idx3-ubyte.gz" in message


# -- every key type-checked (issue 18): a fuzz over wrong types for every field ----------------------
_WRONG = {
    "string": "1",
    "word": "no",
    "float": 1.5,
    "bool": True,
    "null": None,
    "list": [1],
    "mapping": {"a": 1},
    "nan": float("nan"),
}


def _rejects(kind, value) -> bool:
    """Whether a field declared ``kind`` must refuse ``value`` (written independently of
    common.config's checker: what YAML can produce against what the field holds)."""
    import typing

    args = typing.get_args(kind)
    if args and typing.get_origin(kind) not in (dict, tuple):
        if value is None and type(None) in args:
            return False
        (kind,) = [a for a in args if a is not type(None)]
    if value is None:
        return True
    if kind is bool:
        return not isinstance(value, bool)
    if kind is int:
        return isinstance(value, bool) or not isinstance(value, int)
    if kind is float:
        return isinstance(value, bool | str | list | dict) or value != value  # nan is not a number
    if kind is str:
        return not isinstance(value, str)
    if typing.get_origin(kind) is dict:
        return not isinstance(value, dict)
    if typing.get_origin(kind) is tuple:
        return not isinstance(value, list | tuple)
    raise AssertionError(f"a new field type {kind!r}: extend this test")


def _fuzz_cases():
    import dataclasses
    import typing

    hints = typing.get_type_hints(RunConfig)
    for f in dataclasses.fields(RunConfig):
        for label, value in _WRONG.items():
            if _rejects(hints[f.name], value):
                yield pytest.param(f.name, value, id=f"{f.name}-{label}")


@pytest.mark.parametrize("name,value", list(_fuzz_cases()))
def test_every_key_refuses_a_wrong_type_by_name(name, value):
    with pytest.raises(ValueError) as error:
        checked_config({name: value})
    assert str(error.value).startswith(f"{name} must be "), str(error.value)
    assert repr(value) in str(error.value)


# the papers' strategies' ignored settings: tests/papers/<paper>/test_registered_by_name.py
@pytest.mark.parametrize(
    "values, message",
    [
        ({"strategy": "dgc", "compressor": "dgc", "transport": "allreduce"},
         "strategy dgc ignores transport (got 'allreduce'): DGC all-gathers its sparse payloads; remove it or set "
         "transport: auto"),
        ({"strategy": "def", "compressor": "random_block", "compressor_options": {"density": 0.1}, "transport": "allgather"}, "strategy def ignores transport"),
        ({"strategy": "sparse", "bucket_numel": 4096},
         "strategy sparse ignores bucket_numel (got 4096): it selects from the whole flattened gradient"),
        ({"strategy": "sparse", "compress_per_tensor": True}, "set compress_per_tensor: false"),
    ],
)  # fmt: skip
def test_a_setting_the_strategy_ignores_is_an_error_naming_it(values, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        checked_config(values)


def test_the_settings_a_strategy_ignores_pass_at_their_neutral_value():
    for strategy, cls in STRATEGIES.items():
        if isinstance(cls, str):
            continue  # a paper's, imported by its own tests (tests/papers/)
        neutral = {name: value for name, value, _ in cls.ignores}
        assert neutral == {name: getattr(RunConfig(), name) for name in neutral}, strategy  # the defaults
    checked_config(
        {"strategy": "sparse", "bucket_numel": None, "compress_per_tensor": False, "transport": "auto"}
    )
