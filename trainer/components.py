"""A run's components, each built from its ``RunConfig``: data, model, strategy, optimizer, lr
schedule, training loss, batch sampling and augmentation. :mod:`trainer.run` calls each once;
what they return is all the loop reads."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from common.config import RunConfig
from common.strategies import SyncStrategy

from .checks import check_run
from .data import Dataset, drawn_batch, epoch_batches, load_dataset
from .data.augment import augment_batch, augment_generator
from .distributed import DistContext
from .models import build_model

LossFn = Callable[[Tensor, Tensor], Tensor]

# Data-dependent initialisation (airbench's whitening filters) reads this many training examples,
# the first of the split's fixed order: the same on every rank and for every seed.
INIT_FROM_DATA_EXAMPLES = 5000


def default_strategy(config: RunConfig) -> SyncStrategy:
    """The strategy ``config.strategy`` names (common.methods.STRATEGIES), built from the run
    checked whole (:func:`trainer.checks.check_run`: its data set and model too)."""
    return check_run(config).build()


def cross_entropy_loss(kind: str, label_smoothing: float = 0.0) -> LossFn:
    """The loss of a data set of ``kind`` (``"text"``: over every position), computed in fp32."""
    if kind == "text":
        return lambda logits, y: nn.functional.cross_entropy(
            logits.flatten(0, 1).float(), y.flatten(), label_smoothing=label_smoothing
        )
    return lambda logits, y: nn.functional.cross_entropy(logits.float(), y, label_smoothing=label_smoothing)


def load_data(config: RunConfig) -> tuple[Dataset, Dataset]:
    """The run's training and test splits (limited as the config says)."""
    train_set = load_dataset(
        config.dataset, "train", limit=config.train_limit, seq_len=config.seq_len, seed=config.seed
    )
    test_set = load_dataset(config.dataset, "test", limit=config.eval_limit, seq_len=config.seq_len)
    return train_set, test_set


def prepare_model(config: RunConfig, model: nn.Module, train_set: Dataset, device: torch.device) -> nn.Module:
    """A built model made ready to train: data-dependent initialisation for models that have one
    (``init_from_data(images)``, e.g. airbench's whitening), then the device and memory format."""
    init = getattr(model, "init_from_data", None)
    if callable(init):
        count = min(INIT_FROM_DATA_EXAMPLES, len(train_set))
        x, _ = train_set.get_batch(torch.arange(count))
        init(x)
    model = model.to(device)
    if config.channels_last:
        model = model.to(memory_format=torch.channels_last)
    return model


def model_for(config: RunConfig, dataset: Dataset) -> nn.Module:
    """``config.model`` shaped for ``dataset`` (its vocabulary, or its classes and image shape)."""
    info = dataset.info
    if info.kind == "text":
        return build_model(config.model, vocab_size=info.vocab_size, **config.model_options)
    assert info.input_shape is not None and info.num_classes is not None
    channels, size, _ = info.input_shape
    return build_model(
        config.model,
        num_classes=info.num_classes,
        in_channels=channels,
        image_size=size,
        **config.model_options,
    )


def optimizer_for(config: RunConfig, groups: list[dict[str, Any]]) -> torch.optim.Optimizer:
    if config.optimizer == "adamw":
        return torch.optim.AdamW(groups, lr=config.lr, weight_decay=config.weight_decay)
    return torch.optim.SGD(groups, lr=config.lr, momentum=config.momentum, weight_decay=config.weight_decay)


def lr_schedule(config: RunConfig, total_steps: int, steps_per_epoch: int) -> Callable[[int], float]:
    """The lr factor of each step: linear warm-up, then constant, cosine, or step decay (by
    ``lr_decay`` at the ``lr_milestones`` epochs, or at 50% and 75% of training)."""
    warmup = config.lr_warmup_steps
    milestones = [m * steps_per_epoch for m in config.lr_milestones]
    kind, end_factor, decay = config.lr_schedule, config.lr_end_factor, config.lr_decay

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, total_steps - warmup)
        if kind == "cosine":
            return 0.5 * (1 + math.cos(math.pi * progress))
        if kind == "linear":
            return 1.0 - (1.0 - end_factor) * progress
        if kind == "step":
            passed = (
                sum(step >= m for m in milestones) if milestones else (progress >= 0.5) + (progress >= 0.75)
            )
            return float(decay**passed)
        return 1.0

    return factor


def epoch_sampler(
    config: RunConfig, strategy: SyncStrategy, ctx: DistContext, num_examples: int
) -> Callable[[int], list[Tensor]]:
    """This rank's batches of an epoch (the same split on every rank, seeded by the run): its share
    of the data is the strategy's (a pipeline's stages share their replica's batches)."""
    share, shares = strategy.batch_position(ctx.rank, ctx.world_size)
    batch_size, seed = config.batch_size, config.seed

    def batches(epoch: int) -> list[Tensor]:
        return epoch_batches(num_examples, batch_size, rank=share, world_size=shares, seed=seed, epoch=epoch)

    return batches


def draw_sampler(
    config: RunConfig, strategy: SyncStrategy, ctx: DistContext, num_examples: int
) -> Callable[[int], Tensor]:
    """This rank's batch of a run step (0-based) when every step draws its own (``sampling: draws``),
    counted from the config's ``first_step``."""
    share, shares = strategy.batch_position(ctx.rank, ctx.world_size)
    batch_size, seed, first_step = config.batch_size, config.seed, config.first_step

    def batch(step: int) -> Tensor:
        return drawn_batch(
            num_examples, batch_size, rank=share, world_size=shares, seed=seed, step=first_step + step
        )

    return batch


def augmenter(config: RunConfig, rank: int) -> Callable[[Tensor, int], Tensor] | None:
    """``(images, step) -> augmented images`` of the run's ``augment`` on this rank (None: none),
    each step from its own generator (:func:`trainer.data.augment.augment_generator`)."""
    kind, seed = config.augment, config.seed
    if kind == "none":
        return None

    def augment(x: Tensor, step: int) -> Tensor:
        return augment_batch(x, kind, augment_generator(seed, rank, step))

    return augment
