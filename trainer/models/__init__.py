"""Models shared by several papers, behind one plain-dict registry.

Every model is a plain ``nn.Module`` whose ``forward`` returns a logits tensor: ``[B, num_classes]``
for the image models (input ``[B, C, H, W]``; the MLP also takes it and flattens), ``[B, T, V]`` for
the language models (input int64 token ids ``[B, T]``). Nothing here picks a device: move the model
with ``.to(device)``. Parameters are initialised from torch's global RNG, so callers seed with
``torch.manual_seed`` before ``build_model`` and the same seed gives identical parameters.

>>> model = build_model("lenet5")  # MNIST: 1 x 28 x 28, 10 classes
>>> count_parameters(model)
61706
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable, Mapping
from typing import Any

from torch import nn

from common.checks import check_declared, declared_options
from common.registry import lookup

from .airbench import AirbenchNet
from .cifar import VGG16BN, CifarAlexNet, CifarResNet, VGGSmall, resnet20, resnet110
from .imagenet import AlexNet, ResNet50
from .language import GPT2LanguageModel, LSTMLanguageModel, bf16_lstm_supported
from .small import MLP, LeNet5

__all__ = [
    "MLP",
    "MODELS",
    "VGG16BN",
    "AirbenchNet",
    "AlexNet",
    "CifarAlexNet",
    "CifarResNet",
    "GPT2LanguageModel",
    "LSTMLanguageModel",
    "LeNet5",
    "ResNet50",
    "VGGSmall",
    "bf16_lstm_supported",
    "build_model",
    "check_model_options",
    "count_parameters",
    "model_options",
]

MODELS: dict[str, Callable[..., nn.Module]] = {
    "mlp": MLP,
    "lenet5": LeNet5,
    "resnet20": resnet20,
    "resnet110": resnet110,
    "vgg_small": VGGSmall,
    "vgg16_bn": VGG16BN,
    "airbench": AirbenchNet,
    "cifar10_alexnet": CifarAlexNet,
    "alexnet": AlexNet,
    "resnet50": ResNet50,
    "lstm_lm": LSTMLanguageModel,
    "gpt2_small": GPT2LanguageModel,
}

_COMMON_ARGS = ("num_classes", "in_channels", "image_size", "vocab_size")


def build_model(
    name: str,
    *,
    num_classes: int = 10,
    in_channels: int = 1,
    image_size: int = 28,
    vocab_size: int | None = None,
    **kwargs: Any,
) -> nn.Module:
    """Build the model registered as ``name``.

    ``num_classes``, ``in_channels`` and ``image_size`` go to the image models, ``vocab_size`` to the
    language models (required there); ``kwargs`` are the model's own options (e.g. ``hidden_sizes``,
    ``width``, ``hidden_dim``, ``n_layer``). Unknown names or options raise ``ValueError`` listing
    the valid ones, a value of the wrong type names the option and its type
    (:func:`check_model_options`); a ``vocab_size`` given to an image model is ignored with a warning.
    """
    check_model_options(name, kwargs)
    builder = MODELS[name]
    accepted = inspect.signature(builder).parameters
    common: dict[str, Any] = {
        "num_classes": num_classes,
        "in_channels": in_channels,
        "image_size": image_size,
        "vocab_size": vocab_size,
    }
    if "vocab_size" in accepted:
        if vocab_size is None:
            raise ValueError(f"model {name!r} is a language model and needs vocab_size")
    elif vocab_size is not None:
        warnings.warn(f"vocab_size={vocab_size} is ignored by model {name!r}", stacklevel=2)
    return builder(**{k: v for k, v in common.items() if k in accepted}, **kwargs)


def model_options(name: str) -> dict[str, Any]:
    """The options of model ``name`` (``model_options:`` of a run): option -> its declared type."""
    return declared_options(lookup(MODELS, name, "model"), skip=_COMMON_ARGS)


def check_model_options(name: str, options: Mapping[str, Any]) -> None:
    """Refuse an unknown model, an option it does not take or a value of the wrong type, each
    error naming the model and what is allowed (cheap: no model is built)."""
    declared = model_options(name)
    unknown = sorted(set(options) - set(declared))
    if unknown:
        raise ValueError(
            f"unknown option(s) for model {name!r}: {', '.join(unknown)}; "
            f"allowed: {', '.join(sorted(declared)) or '(none)'}"
        )
    check_declared(f"model {name!r} option", options, declared)


def count_parameters(model: nn.Module) -> int:
    """Number of scalar parameters; a tensor shared by several modules (tied weights) counts once."""
    return sum(p.numel() for p in model.parameters())
