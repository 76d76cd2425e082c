"""Sharded sampling for data-parallel training: per-epoch permutations, or per-step draws."""

from __future__ import annotations

import hashlib
import operator

import torch


def _epoch_seed(seed: int, epoch: int) -> int:
    # Hash rather than seed + epoch, so that (seed, epoch + 1) and (seed + 1, epoch) differ.
    digest = hashlib.sha256(f"thinwire-epoch:{seed}:{epoch}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1  # fits torch.Generator.manual_seed


def _as_int(name: str, value: int) -> int:
    if isinstance(value, bool):
        raise ValueError(f"{name} must be an int, got {value!r}")
    try:
        return operator.index(value)  # int, numpy and torch integer scalars
    except TypeError:
        raise ValueError(f"{name} must be an int, got {value!r}") from None


def _check_shard(
    num_examples: int, batch_size: int, rank: int, world_size: int, seed: int, *, min_examples: int
) -> tuple[int, int, int, int, int]:
    """The sampling arguments as ints, checked (a bad one is an error naming it and its range)."""
    num_examples, batch_size = _as_int("num_examples", num_examples), _as_int("batch_size", batch_size)
    rank, world_size, seed = _as_int("rank", rank), _as_int("world_size", world_size), _as_int("seed", seed)
    if num_examples < min_examples:
        raise ValueError(f"num_examples must be >= {min_examples}, got {num_examples}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, world_size={world_size}), got {rank}")
    return num_examples, batch_size, rank, world_size, seed


def epoch_batches(
    num_examples: int, batch_size: int, *, rank: int, world_size: int, seed: int, epoch: int
) -> list[torch.Tensor]:
    """This rank's batches of example indices for one epoch.

    The permutation comes from a private ``torch.Generator`` seeded by ``(seed, epoch)`` (the global
    RNG is not touched), so every rank computes the same one; rank ``r`` takes ``perm[r::world_size]``
    and cuts it into full batches of ``batch_size`` (the last partial batch is dropped). Every rank
    gets the same number of batches, ``num_examples // world_size // batch_size`` (zero when there
    are fewer than ``world_size * batch_size`` examples), and no index appears on two ranks.
    """
    num_examples, batch_size, rank, world_size, seed = _check_shard(
        num_examples, batch_size, rank, world_size, seed, min_examples=0
    )
    epoch = _as_int("epoch", epoch)
    if epoch < 0:
        raise ValueError(f"epoch must be >= 0, got {epoch}")
    # Empty when num_examples < world_size * batch_size; the caller decides whether that is an error.
    num_batches = num_examples // world_size // batch_size
    generator = torch.Generator(device="cpu")
    generator.manual_seed(_epoch_seed(seed, epoch))
    perm = torch.randperm(num_examples, generator=generator)
    shard = perm[rank::world_size][: num_batches * batch_size]
    return list(shard.view(num_batches, batch_size).unbind(0))


def drawn_batch(
    num_examples: int, batch_size: int, *, rank: int, world_size: int, seed: int, step: int
) -> torch.Tensor:
    """This rank's batch of step ``step`` when every step draws its own (``sampling: draws``).

    The global batch, ``world_size x batch_size`` indices, is drawn uniformly with replacement from a
    private generator seeded by ``seed * 1_000_003 + step`` (sparse AxoNN's stage's rule: every
    method and every retraining sees the same examples at the same step); rank ``r`` takes its
    consecutive ``batch_size`` of them, ``[r b, (r + 1) b)``, as a pipeline splits a global batch
    over its replicas. The global RNG is not touched.
    """
    num_examples, batch_size, rank, world_size, seed = _check_shard(
        num_examples, batch_size, rank, world_size, seed, min_examples=1
    )
    step = _as_int("step", step)
    generator = torch.Generator().manual_seed(seed * 1_000_003 + step)
    draw = torch.randint(num_examples, (world_size * batch_size,), generator=generator)
    return draw[rank * batch_size : (rank + 1) * batch_size]
