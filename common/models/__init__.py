"""Models shared by several papers, behind one plain-dict registry (``common/models/cifar.py``)."""

from .cifar import (
    MLP,
    MODELS,
    VGG16BN,
    AirbenchNet,
    AlexNet,
    CifarAlexNet,
    CifarResNet,
    GPT2LanguageModel,
    LeNet5,
    LSTMLanguageModel,
    ResNet50,
    VGGSmall,
    bf16_lstm_supported,
    build_model,
    count_parameters,
)

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
    "count_parameters",
]
