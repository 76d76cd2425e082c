"""The one training loop (see :mod:`common.train.run`)."""

from .run import (
    MODEL_FILE,
    Callback,
    StepInfo,
    autocast,
    compute_precision,
    cpu_has_bf16,
    default_strategy,
    evaluate,
    evaluate_trained,
    prepare_model,
    train,
    trained_model_file,
)

__all__ = [
    "MODEL_FILE",
    "Callback",
    "StepInfo",
    "autocast",
    "compute_precision",
    "cpu_has_bf16",
    "default_strategy",
    "evaluate",
    "evaluate_trained",
    "prepare_model",
    "train",
    "trained_model_file",
]
