"""Verdicts on a paper's claim from runs over seeds: one rule for every pipeline.

A claim is about the difference ``method - baseline`` of one metric (test accuracy in points,
test loss in nats, ...), in that metric's units: "no accuracy loss beyond 0.5 points" is
``Claim(lower=-0.5)``, "DEF beats EF" is ``Claim(lower=0.0)``, "perplexity within +2 %" is
``Claim(upper=math.log(1.02))`` on the test loss (perplexity = exp(loss), so a relative perplexity
bound is an absolute loss bound).

The difference gets a 95 % confidence interval over seeds (Student's t):

- **paired** when both sides ran the same seeds (seed ``k`` of the method and of the baseline share
  the initialisation and the batch order, so their difference is the method's effect on that
  draw): the mean of the per-seed differences, ``t_{n-1}`` times its standard error;
- **Welch** otherwise: the difference of the means with the Welch-Satterthwaite degrees of freedom.

The verdict: **reproduced** when the whole interval lies inside the claim's bounds, **not
reproduced** when it lies wholly outside them, **inconclusive** when it straddles a bound, when a
side has fewer than ``min_seeds`` runs (never a verdict from one run), or when the baseline failed
its convergence check.

The convergence check (pre-registered for release 2, :func:`longer_training`): a task's fp32 baseline
counts as converged when training it for twice the epochs (the same recipe stretched, the
pre-registered number of seeds) changes its metric by less than the claims' tolerance on that task.
Release 1 used :func:`plateau` (the last fifth of the curve gains less than a per-task amount),
which a one-cycle schedule cannot pass by construction: the anneal is what the last fifth gains.
The last-fifth gain stays a reported figure.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

REPRODUCED = "reproduced"
NOT_REPRODUCED = "not reproduced"
INCONCLUSIVE = "inconclusive"
VERDICTS = (REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE)


def t_quantile(confidence: float, df: float) -> float:
    """The two-sided Student-t critical value: P(|T_df| <= q) = confidence."""
    from scipy import stats

    return float(stats.t.ppf(0.5 + confidence / 2, df))


@dataclass(frozen=True)
class Difference:
    """``method - baseline`` with its confidence interval ``[low, high]`` (NaN when a side has
    fewer than two runs: no interval can be had)."""

    estimate: float
    low: float
    high: float
    num_method: int
    num_baseline: int
    paired: bool
    df: float
    confidence: float

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2


def _mean_var(values: Sequence[float]) -> tuple[float, float]:
    n = len(values)
    mean = sum(values) / n
    var = sum((v - mean) ** 2 for v in values) / (n - 1) if n > 1 else math.nan
    return mean, var


def difference(
    method: Mapping[int, float],
    baseline: Mapping[int, float],
    *,
    confidence: float = 0.95,
) -> Difference:
    """The difference of ``method`` and ``baseline`` (seed -> final metric), paired when both ran
    exactly the same seeds, Welch otherwise."""
    if not method or not baseline:
        raise ValueError(
            f"a difference needs at least one run on each side, got {len(method)} and {len(baseline)}"
        )
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    for name, side in (("method", method), ("baseline", baseline)):
        bad = {k: v for k, v in side.items() if not math.isfinite(v)}
        if bad:
            raise ValueError(f"{name} has non-finite values {bad}: a diverged run has no metric to compare")
    m, b = len(method), len(baseline)
    if set(method) == set(baseline):
        diffs = [method[s] - baseline[s] for s in sorted(method)]
        estimate, var = _mean_var(diffs)
        if m < 2:
            return Difference(estimate, math.nan, math.nan, m, b, True, math.nan, confidence)
        df = float(m - 1)
        half = t_quantile(confidence, df) * math.sqrt(var / m)
        return Difference(estimate, estimate - half, estimate + half, m, b, True, df, confidence)
    mean_m, var_m = _mean_var(list(method.values()))
    mean_b, var_b = _mean_var(list(baseline.values()))
    estimate = mean_m - mean_b
    if m < 2 or b < 2:
        return Difference(estimate, math.nan, math.nan, m, b, False, math.nan, confidence)
    se2 = var_m / m + var_b / b
    if se2 == 0:
        return Difference(estimate, estimate, estimate, m, b, False, math.inf, confidence)
    df = se2**2 / ((var_m / m) ** 2 / (m - 1) + (var_b / b) ** 2 / (b - 1))
    half = t_quantile(confidence, df) * math.sqrt(se2)
    return Difference(estimate, estimate - half, estimate + half, m, b, False, df, confidence)


def mean_interval(values: Sequence[float], *, confidence: float = 0.95) -> tuple[float, float]:
    """The mean of ``values`` (one per seed) and the half-width of its ``confidence`` Student-t
    interval (NaN with fewer than two values: no interval), for the tables beside the verdicts."""
    if not values:
        raise ValueError("a mean needs at least one value, got none")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    mean, var = _mean_var(values)
    if len(values) < 2:
        return mean, math.nan
    return mean, t_quantile(confidence, len(values) - 1) * math.sqrt(var / len(values))


@dataclass(frozen=True)
class Claim:
    """What a paper says about ``method - baseline``: it lies in ``[lower, upper]`` (metric units)."""

    lower: float = -math.inf
    upper: float = math.inf

    def __post_init__(self) -> None:
        if not self.lower < self.upper or math.isnan(self.lower) or math.isnan(self.upper):
            raise ValueError(f"a claim needs lower < upper, got [{self.lower}, {self.upper}]")

    def describe(self, unit: str = "") -> str:
        if math.isinf(self.upper):
            return f">= {self.lower:+g}{unit}"
        if math.isinf(self.lower):
            return f"<= {self.upper:+g}{unit}"
        return f"in [{self.lower:+g}, {self.upper:+g}]{unit}"


@dataclass(frozen=True)
class LongerTraining:
    """The baseline against itself trained for ``factor`` times the epochs (the same recipe
    stretched): the pre-registered convergence check. ``change`` is the longer runs' mean less the
    recipe's, in metric units and signed so that positive is better (points gained, nats lost)."""

    recipe_mean: float
    longer_mean: float  # NaN when no longer run was trained
    change: float
    tolerance: float
    num_longer: int
    seeds_needed: int
    factor: int = 2

    @property
    def converged(self) -> bool:
        return self.num_longer >= self.seeds_needed and abs(self.change) < self.tolerance

    @property
    def reason(self) -> str:
        """Why the baseline does not count as converged ("" when it does)."""
        check = f"the pre-registered {self.factor}x-epochs check"
        if self.num_longer < self.seeds_needed:
            return (
                f"baseline not checked: {check} needs {self.seeds_needed} seed(s) of fp32 at "
                f"{self.factor}x the epochs, {self.num_longer} trained"
            )
        if self.converged:
            return ""
        return (
            f"baseline failed {check}: {self.factor}x the epochs changed its metric by "
            f"{self.change:+.4g} (|change| must be < {self.tolerance:g}, the claims' tolerance)"
        )


def longer_training(
    recipe: Mapping[int, float],
    longer: Mapping[int, float],
    *,
    tolerance: float,
    seeds_needed: int = 3,
    higher_is_better: bool = True,
    factor: int = 2,
) -> LongerTraining:
    """The convergence check of a baseline (seed -> final metric of the recipe, and of the recipe
    stretched to ``factor`` times the epochs): converged when the longer runs' mean differs from the
    recipe's by less than ``tolerance`` (either way: a baseline that a longer run moves by more
    than the claims' tolerance cannot anchor them), with at least ``seeds_needed`` longer runs."""
    if not recipe:
        raise ValueError("a convergence check needs the baseline's own runs, got none")
    if not tolerance > 0:
        raise ValueError(f"tolerance must be > 0 (the claims' tolerance on the task), got {tolerance!r}")
    if seeds_needed < 1:
        raise ValueError(f"seeds_needed must be >= 1, got {seeds_needed}")
    recipe_mean = sum(recipe.values()) / len(recipe)
    if not longer:
        return LongerTraining(recipe_mean, math.nan, math.nan, float(tolerance), 0, seeds_needed, factor)
    longer_mean = sum(longer.values()) / len(longer)
    change = longer_mean - recipe_mean if higher_is_better else recipe_mean - longer_mean
    return LongerTraining(
        recipe_mean, longer_mean, change, float(tolerance), len(longer), seeds_needed, factor
    )


@dataclass(frozen=True)
class Verdict:
    verdict: str
    reason: str
    difference: Difference
    claim: Claim


def judge(
    diff: Difference,
    claim: Claim,
    *,
    min_seeds: int = 2,
    baseline: LongerTraining | None = None,
) -> Verdict:
    """The verdict of ``claim`` given the measured ``diff`` (see the module docstring); a
    ``baseline`` that failed its convergence check makes it inconclusive, its reason the check's
    (None: no check applies, e.g. a claim between two methods)."""
    if min_seeds < 2:
        raise ValueError(f"min_seeds must be >= 2 (never a verdict from one run), got {min_seeds}")
    fewest = min(diff.num_method, diff.num_baseline)
    if fewest < min_seeds:
        return Verdict(
            INCONCLUSIVE, f"{fewest} run(s) on one side, {min_seeds} needed for an interval", diff, claim
        )
    if baseline is not None and not baseline.converged:
        return Verdict(INCONCLUSIVE, baseline.reason, diff, claim)
    if claim.lower <= diff.low and diff.high <= claim.upper:
        return Verdict(REPRODUCED, "the interval lies inside the claim", diff, claim)
    if diff.high < claim.lower or diff.low > claim.upper:
        return Verdict(NOT_REPRODUCED, "the interval lies outside the claim", diff, claim)
    return Verdict(INCONCLUSIVE, "the interval straddles a bound of the claim", diff, claim)


def min_seeds_for(claim: Claim, *, wide_margin: float = 2.0) -> int:
    """Seeds each side needs: 3 when a bound of the claim is closer than ``wide_margin`` metric
    units to zero (a claim of "no loss beyond 0.5 points" must be resolved from noise), else 2."""
    bounds = [abs(b) for b in (claim.lower, claim.upper) if math.isfinite(b)]
    return 3 if any(b < wide_margin for b in bounds) else 2


@dataclass(frozen=True)
class Plateau:
    """Whether a curve has flattened: its improvement over the last ``fraction`` of training
    (release 1's convergence rule; since release 2 a reported figure beside :func:`longer_training`)."""

    improvement: float  # metric gained over the last fraction (positive = better)
    tolerance: float
    start_step: float
    end_step: float

    @property
    def reached(self) -> bool:
        return self.improvement < self.tolerance


def plateau(
    steps: Sequence[float],
    values: Sequence[float],
    *,
    tolerance: float,
    fraction: float = 0.2,
    higher_is_better: bool = True,
) -> Plateau:
    """The improvement of an evaluation curve between the evaluation at or just before
    ``(1 - fraction)`` of its last step and its last evaluation; it has plateaued when that is
    below ``tolerance`` (metric units). Needs at least two evaluations."""
    if len(steps) != len(values) or len(steps) < 2:
        raise ValueError(f"a plateau check needs >= 2 evaluations (steps and values), got {len(steps)}")
    if not 0 < fraction < 1:
        raise ValueError(f"fraction must be in (0, 1), got {fraction!r}")
    order = sorted(range(len(steps)), key=lambda i: steps[i])
    last = order[-1]
    cut = (1 - fraction) * steps[last]
    before = [i for i in order if steps[i] <= cut] or [order[0]]
    start = before[-1]
    gain = values[last] - values[start]
    if not higher_is_better:
        gain = -gain
    return Plateau(float(gain), float(tolerance), float(steps[start]), float(steps[last]))
