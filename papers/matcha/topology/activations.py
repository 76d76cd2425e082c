"""Per-step activation flags: MATCHA's Bernoulli draws and the periodic and vanilla baselines.

A flag array is bool with shape (steps, M): ``flags[k, j]`` says matching j is active at step k, so
at step k rank i averages with its partners in the active matchings. All ranks must agree on the
flags (a link is used by both of its ends), so MATCHA's flags come from a numpy Generator seeded
with the same ``seed`` on every rank, as in the official code (which seeds numpy identically on all
ranks); no global RNG is touched.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .mixing import check_budget, check_probabilities


def _check_steps(steps: int) -> int:
    if isinstance(steps, bool) or not isinstance(steps, int | np.integer) or steps < 0:
        raise ValueError(f"steps must be an integer >= 0, got {steps!r}")
    return int(steps)


def draw_activations(p: Sequence[float] | np.ndarray, steps: int, seed: int) -> np.ndarray:
    """Bernoulli flags, a bool array (steps, M): ``flags[k, j]`` says matching j is active at step k.

    Drawn from ``numpy.random.default_rng(seed)`` (uniforms compared with p), so every rank given the
    same seed gets the same flags (the gossip partners must agree), without touching global RNGs.
    """
    probs = np.asarray(p, dtype=np.float64)
    if probs.ndim != 1 or probs.size == 0:
        raise ValueError(
            f"p must be a non-empty 1-D array (one probability per matching), got shape {probs.shape}"
        )
    probs = check_probabilities(probs, probs.size)
    steps = _check_steps(steps)
    return np.random.default_rng(seed).random((steps, probs.shape[0])) < probs


def periodic_period(budget: float) -> int:
    """Steps between full communications of periodic DecenSGD: round(1 / C_b) (ties to even).

    The realised fraction 1 / period equals C_b when 1 / C_b is an integer and is the nearest such
    fraction otherwise (0.333 for C_b = 0.3).
    """
    return max(1, round(1.0 / check_budget(budget)))


def periodic_activations(num_matchings: int, steps: int, budget: float) -> np.ndarray:
    """Periodic baseline, bool (steps, M): all matchings at steps k with (k + 1) % period == 0, else none.

    The whole graph thus communicates after every ``period`` = round(1 / C_b) local steps.
    """
    if (
        isinstance(num_matchings, bool)
        or not isinstance(num_matchings, int | np.integer)
        or num_matchings < 1
    ):
        raise ValueError(f"num_matchings must be an integer >= 1, got {num_matchings!r}")
    period = periodic_period(budget)
    on = (np.arange(_check_steps(steps)) + 1) % period == 0
    return np.repeat(on[:, None], int(num_matchings), axis=1)


def vanilla_activations(num_matchings: int, steps: int) -> np.ndarray:
    """Vanilla decentralized SGD: every matching at every step (all True, shape (steps, M))."""
    return periodic_activations(num_matchings, steps, 1.0)
