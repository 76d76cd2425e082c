"""What each selector of ``strategy: sparse`` declares, and ExDyna's partitions and online threshold
scaling (Yoon & Oh, CCGrid 2024; the algorithm and the official code's constants are described in
:mod:`common.strategies.sparse`).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SelectorNeeds:
    """How a selector's choice is exchanged and kept up (declared per selector; the strategy
    dispatches on it, not on the selector's name).

    ``exchange``: ``"gather"`` (every rank's values and indices all-gathered and summed: the
    union can grow up to W k, and each rank's residual forgets only its own selection),
    ``"union"`` (the disjoint indices all-gathered, then one all-reduce of every rank's values
    there: the union is zeroed in every residual) or ``"leader"`` (one rank's indices broadcast,
    then the same all-reduce). ``fixed_count``: every rank sends exactly k (the all-gather skips
    the count exchange). ``partitions``: ExDyna's owned partitions, rebalanced after each step.
    ``online_threshold``: the threshold is scaled after each step towards k selected entries.
    """

    exchange: str
    fixed_count: bool = False
    partitions: bool = False
    online_threshold: bool = False


SELECTORS: dict[str, SelectorNeeds] = {
    "exdyna": SelectorNeeds("union", partitions=True, online_threshold=True),
    "topk": SelectorNeeds("gather", fixed_count=True),
    "dgc": SelectorNeeds("gather"),
    "threshold": SelectorNeeds("gather"),
    "cltk": SelectorNeeds("leader"),
}
BLOCK_MULTIPLE = 32
# The code's threshold scaling: up above BAND, down at or below BAND_LOW (its literal 0.909).
SCALE_UP, SCALE_BAND, SCALE_DOWN, BAND, BAND_LOW = 1.005, 1.00125, 0.995, 1.1, 0.909


class Partitions:
    """ExDyna's partitions of a d-entry vector: W runs of contiguous fine-grained blocks.

    ``bounds[p]`` is partition p's first block; the last partition also takes the entries past the
    last whole block. Sizes change one block at a time (:meth:`rebalance`), never below
    ``min_blocks``.
    """

    def __init__(self, numel: int, world: int, *, blocks: int = 1024, tolerance: float = 1.05) -> None:
        num_blocks = min(blocks, numel // BLOCK_MULTIPLE)
        if num_blocks < world:
            raise ValueError(
                f"{world} workers but the {numel}-entry gradient has only {num_blocks} blocks of at least "
                f"{BLOCK_MULTIPLE} entries: ExDyna needs one block per worker (fewer workers or a "
                "larger model)"
            )
        self.numel = numel
        self.world = world
        self.num_blocks = num_blocks
        self.block_size = numel // num_blocks // BLOCK_MULTIPLE * BLOCK_MULTIPLE
        self.tolerance = tolerance
        self.min_blocks = max(1, num_blocks // (4 * world))
        base, extra = divmod(num_blocks, world)
        self.bounds = [0]
        for p in range(world):
            self.bounds.append(self.bounds[-1] + base + (1 if p < extra else 0))

    def blocks_of(self, p: int) -> int:
        return self.bounds[p + 1] - self.bounds[p]

    def span(self, p: int) -> tuple[int, int]:
        """Entries [start, end) of partition p."""
        start = self.bounds[p] * self.block_size
        end = self.numel if p == self.world - 1 else self.bounds[p + 1] * self.block_size
        return start, end

    def rebalance(self, counts: list[int]) -> int:
        """Move boundaries after a step whose partition p selected ``counts[p]`` entries; left to
        right, an overloaded partition gives one block to an underloaded neighbour. Returns the
        number of moves."""
        total = sum(counts)
        # The code's integers: k_acc = int(k_prev / n), k_move = int(sz_blk * (k_prev / d)).
        mean = total // self.world
        if mean == 0 or self.world == 1:
            return 0
        estimate = list(counts)
        shift = int(self.block_size * (total / self.numel))  # the count one block carries, on average
        low = round(1 / self.tolerance, 5)  # the code's 0.95238 for 1.05
        moves = 0
        for i in range(self.world - 1):
            left, right = estimate[i] / mean, estimate[i + 1] / mean
            if left > self.tolerance and right < low and self.blocks_of(i) > self.min_blocks:
                self.bounds[i + 1] -= 1
                estimate[i] -= shift
                estimate[i + 1] += shift
                moves += 1
            elif right > self.tolerance and left < low and self.blocks_of(i + 1) > self.min_blocks:
                self.bounds[i + 1] += 1
                estimate[i] += shift
                estimate[i + 1] -= shift
                moves += 1
        return moves


def scale_threshold(threshold: float, selected: int, k: int) -> float:
    """One step of online threshold scaling (the code's factors) after ``selected`` entries."""
    ratio = selected / k
    if ratio > BAND:
        return threshold * SCALE_UP
    if ratio > BAND_LOW:
        return threshold * SCALE_BAND
    return threshold * SCALE_DOWN
