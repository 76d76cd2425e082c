"""A whole run's checks before any process starts: the data set and the model (names, options, and
TernGrad's ``fp32_layers`` against the model's parameters), then the method
(:func:`common.methods.check_run`: compressor, transport, strategy). The library checks a method
only; the data sets and models are this package's, so their checks are too."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

import torch

from common.compressors import build_compressor
from common.compressors.base import check_fp32_layers
from common.config import RunConfig
from common.methods import Method
from common.methods import check_run as check_method
from common.registry import lookup

from .data import DATASETS
from .models import MODELS, build_model, check_model_options


def checked_config(values: Mapping[str, Any]) -> RunConfig:
    """A run from plain values (unknown keys refused), checked whole (:func:`check_run`)."""
    config = RunConfig.from_dict(values)  # unknown keys, types and ranges
    check_run(config)
    return config


def check_run(config: RunConfig) -> Method:
    """Check ``config`` whole: its own types and ranges, the data set and model registries and the
    model's options (each error lists the valid names), then its method
    (:func:`common.methods.check_run`). Returns its :class:`~common.methods.Method`."""
    config.validate()
    lookup(DATASETS, config.dataset, "dataset")
    check_model_options(config.model, config.model_options)  # the model's name too
    compressor = build_compressor(config.compressor, **config.compressor_options)  # names and types
    if compressor.fp32_layers:
        check_fp32_layers(compressor.fp32_layers, parameter_names(config), f"of model {config.model!r}")
    return check_method(config)


def parameter_names(config: RunConfig) -> list[str]:
    """The parameter names of ``config``'s model, built on the meta device (no memory, no
    initialisation, no data read: milliseconds even for ResNet-50). Names do not depend on the
    sizes, so a text set's vocabulary stands in at 2 entries, and a set whose shape is known only
    once read (ImageNet's folder) at 3 x 224 x 224 with 1000 classes."""
    if "vocab_size" in inspect.signature(MODELS[config.model]).parameters:
        sizes: dict[str, Any] = {"vocab_size": 2}
    else:
        source = DATASETS[config.dataset]
        channels, size, _ = getattr(source, "input_shape", (3, 224, 224))
        classes = len(getattr(source, "classes", ())) or 1000
        sizes = {"num_classes": classes, "in_channels": channels, "image_size": size}
    with torch.device("meta"):
        model = build_model(config.model, **sizes, **config.model_options)
    return [name for name, _ in model.named_parameters()]
