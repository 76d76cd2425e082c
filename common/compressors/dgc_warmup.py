"""Deep Gradient Compression's "warm-up training" (Lin et al., ICLR 2018): the density follows an
exponentially decreasing schedule over the first epochs (the sparsity an exponentially increasing
one), then the final density. Apply it with :meth:`common.compressors.dgc.DGC.set_density` at the
start of each epoch.
"""

from __future__ import annotations

from collections.abc import Sequence

from .base import check_density

#: The paper's warm-up densities for the first five epochs (75 % -> 99.9 % sparsity, "exponentially
#: increasing"); the code's README writes them rounded as [0.25, 0.063, 0.015, 0.004, 0.001].
PAPER_WARMUP: tuple[float, ...] = (0.25, 0.0625, 0.015625, 0.00390625, 0.001)


def warmup_density(epoch: int, final: float, schedule: Sequence[float] | None = None) -> float:
    """The density for ``epoch`` (0-based): ``schedule[epoch]`` during the warm-up, then ``final``.

    ``schedule`` defaults to the paper's :data:`PAPER_WARMUP` (five epochs); ``()`` means no
    warm-up. A warm-up is never sparser than the final density: an entry below ``final`` gives
    ``final`` (as the code's exponential rule does with its ``max(..., final)``).

    Pitfall: the official code's default (``warmup_coeff=None``) is *not* this schedule but
    ``max(final ** ((epoch + 1) / (W + 1)), final)``; for final 0.001 and W = 5 warm-up epochs that
    is 0.316, 0.1, 0.0316, 0.01, 0.00316 (much denser than the paper). Its configs must pass the
    list explicitly to get the paper's schedule, which is what this function does by default.
    """
    if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
        raise ValueError(f"epoch must be an int >= 0, got {epoch!r}")
    final = check_density(final)
    entries = PAPER_WARMUP if schedule is None else tuple(schedule)
    for position, entry in enumerate(entries):
        if isinstance(entry, bool) or not isinstance(entry, int | float) or not 0.0 < entry <= 1.0:
            raise ValueError(
                f"warm-up schedule entries must be densities in (0, 1], got {entry!r} at position {position}"
            )
    if epoch < len(entries):
        return max(float(entries[epoch]), final)
    return final
