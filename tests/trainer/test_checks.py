"""A whole run is checked before any worker starts: its data set and model here (names, options,
TernGrad's fp32_layers against the model's parameters), then its method (common.methods, whose
checks tests/common/test_config.py and test_methods.py cover)."""

from __future__ import annotations

import pytest

from common.config import RunConfig
from common.methods import check_run as check_method
from common.methods import checked_config as checked_method
from trainer.checks import check_run, checked_config, parameter_names


@pytest.mark.parametrize(
    "values,message",
    [
        ({"model": "resnet21"}, "unknown model 'resnet21'; valid names: .*resnet20"),
        (
            {"dataset": "imagenet22k"},
            "unknown dataset 'imagenet22k'; valid names: cifar10, fashion-mnist, .*mnist, ptb, tinyshakespeare",
        ),
    ],
)
def test_an_unknown_data_set_or_model_is_rejected(values, message):
    with pytest.raises(ValueError, match=message):
        checked_config(values)
    checked_method(values)  # the library checks the method only: no registry of data or models


# Issue 45: model options were checked by name only, fp32_layers in the workers.
@pytest.mark.parametrize(
    "values, message",
    [
        ({"model": "mlp", "model_options": {"hidden": [32]}},
         "unknown option(s) for model 'mlp': hidden; allowed: hidden_sizes"),
        ({"model": "lenet5", "model_options": {"width": 2}}, "unknown option(s) for model 'lenet5': width; allowed: (none)"),
        ({"model": "mlp", "model_options": {"hidden_sizes": 32}},
         "model 'mlp' option hidden_sizes must be a list of integers, got 32 (int)"),
        ({"model": "mlp", "model_options": {"hidden_sizes": [32.5]}},
         "model 'mlp' option hidden_sizes must be a list of integers, got [32.5] (list)"),
        ({"dataset": "cifar10", "model": "airbench", "model_options": {"whiten": "no"}},
         "model 'airbench' option whiten must be true or false, got 'no' (str)"),
        ({"dataset": "cifar10", "model": "cifar10_alexnet", "compressor": "terngrad",
          "compressor_options": {"fp32_layers": ["logit"]}},
         "fp32_layers names no parameter or module of model 'cifar10_alexnet': logit (closest: logits); a name is "
         "a parameter or a module holding some: top-level modules conv1, conv2, fc3, fc4, logits; 10 parameters "
         "conv1.weight, conv1.bias, conv2.weight, conv2.bias, ..., logits.weight, logits.bias"),
        ({"model": "mlp", "compressor": "terngrad", "compressor_options": {"fp32_layers": ["layers.9"]}},
         "fp32_layers names no parameter or module of model 'mlp': layers.9 (closest: layers.5)"),
    ],
)  # fmt: skip
def test_model_options_are_checked_before_any_worker_starts(values, message):
    with pytest.raises(ValueError) as error:
        checked_config(values)
    assert str(error.value).startswith(message), str(error.value)


def test_fp32_layers_that_name_a_module_or_a_parameter_pass():
    for names in (["logits"], ["logits.weight", "conv1"], ["fc3", "fc4"]):
        options = {"fp32_layers": names}
        config = checked_config({"dataset": "cifar10", "model": "cifar10_alexnet", "compressor": "terngrad", "compressor_options": options})  # fmt: skip
        assert config.compressor_options == options


def test_run_config_alone_imports_no_registry():
    """RunConfig checks types and ranges only; a bad model name is an error of checked_config."""
    config = RunConfig.from_dict({"model": "no_such_model"})
    with pytest.raises(ValueError, match="unknown model 'no_such_model'"):
        checked_config(config.to_dict())


@pytest.mark.parametrize(
    "values, message",
    [
        ({"compressor": "tpok"}, "unknown compressor 'tpok'; valid names: "),
        ({"transport": "ring"}, "unknown transport 'ring'; valid transports: auto, allreduce, allgather"),
        ({"strategy": "ddp"}, "unknown strategy 'ddp'; valid: data_parallel, dgc, "),
        ({"strategy": "dgc", "compressor": "dgc", "optimizer": "adamw"}, "strategy dgc applies "),
        ({"batch_size": 0}, "batch_size must be a positive integer, got 0"),
    ],
)
def test_the_whole_run_check_includes_the_methods(values, message):
    """What the library refuses, the run's check refuses with the same message."""
    with pytest.raises(ValueError) as library:
        checked_method(values)
    with pytest.raises(ValueError) as run:
        checked_config(values)
    assert str(run.value) == str(library.value) and str(run.value).startswith(message), str(run.value)


def test_a_bad_model_is_named_before_a_bad_method():
    """The order of the checks: the run's own settings, data set, model, compressor, fp32_layers,
    strategy, transport (the first problem is the one named)."""
    with pytest.raises(ValueError, match="batch_size must be"):
        checked_config({"batch_size": 0, "model": "resnet21"})
    with pytest.raises(ValueError, match="unknown model 'resnet21'"):
        checked_config({"model": "resnet21", "compressor": "tpok", "transport": "ring"})
    with pytest.raises(ValueError, match="fp32_layers names no parameter"):
        options = {"fp32_layers": ["x"]}
        checked_config(
            {"model": "mlp", "compressor": "terngrad", "compressor_options": options, "transport": "ring"}
        )


def test_the_run_check_returns_the_methods_method():
    config = RunConfig.from_dict(
        {"strategy": "dgc", "compressor": "dgc", "compressor_options": {"density": 0.1}, "momentum": 0.9}
    )
    assert check_run(config) == check_method(config)
    assert check_run(config).config.compress_per_tensor  # the effective config (dgc forces it)


def test_parameter_names_are_the_built_models():
    names = parameter_names(RunConfig.from_dict({"dataset": "cifar10", "model": "cifar10_alexnet"}))
    assert names[:2] == ["conv1.weight", "conv1.bias"] and names[-2:] == ["logits.weight", "logits.bias"]
    assert len(names) == 10
    text = parameter_names(RunConfig.from_dict({"dataset": "tinyshakespeare", "model": "lstm_lm"}))
    assert text and all(isinstance(name, str) for name in text)
