"""The one verdict rule, on synthetic numbers whose intervals are known."""

from __future__ import annotations

import math

import pytest
from scipy import stats

from harness.verdict import (
    INCONCLUSIVE,
    NOT_REPRODUCED,
    REPRODUCED,
    Claim,
    difference,
    judge,
    longer_training,
    mean_interval,
    min_seeds_for,
    plateau,
)


def test_paired_interval_by_hand() -> None:
    # per-seed differences 0.1, 0.1, -0.2: mean 0, sd sqrt(0.03), se 0.1, t_{0.975, 2} = 4.3027
    method = {0: 90.1, 1: 90.3, 2: 89.9}
    baseline = {0: 90.0, 1: 90.2, 2: 90.1}
    d = difference(method, baseline)
    assert d.paired and d.df == 2
    assert d.estimate == pytest.approx(0.0, abs=1e-12)
    assert d.half_width == pytest.approx(4.302653 * 0.1, rel=1e-5)


def test_paired_interval_matches_scipy() -> None:
    method = {1: 71.2, 2: 70.4, 3: 72.9, 4: 71.7}
    baseline = {1: 72.0, 2: 71.1, 3: 72.5, 4: 73.0}
    d = difference(method, baseline)
    ref = stats.ttest_rel([method[s] for s in (1, 2, 3, 4)], [baseline[s] for s in (1, 2, 3, 4)])
    ci = ref.confidence_interval(0.95)
    assert (d.low, d.high) == pytest.approx((ci.low, ci.high), rel=1e-9)


def test_welch_interval_matches_scipy_when_seeds_differ() -> None:
    method = {0: 80.1, 1: 81.5, 2: 79.7}
    baseline = {10: 81.0, 11: 81.2, 12: 80.6, 13: 81.9}
    d = difference(method, baseline)
    assert not d.paired
    ref = stats.ttest_ind(list(method.values()), list(baseline.values()), equal_var=False)
    ci = ref.confidence_interval(0.95)
    assert (d.low, d.high) == pytest.approx((ci.low, ci.high), rel=1e-9)
    assert d.df == pytest.approx(ref.df, rel=1e-9)


def test_mean_interval_matches_scipy_and_has_none_from_one_value() -> None:
    values = [1.2, 0.7, 1.9, 1.1]
    mean, half = mean_interval(values)
    ci = stats.ttest_1samp(values, 0.0).confidence_interval(0.95)
    assert (mean - half, mean + half) == pytest.approx((ci.low, ci.high), rel=1e-9)
    mean, half = mean_interval([3.5])
    assert mean == 3.5 and math.isnan(half)
    with pytest.raises(ValueError, match="at least one value"):
        mean_interval([])


def test_verdicts_inside_outside_straddling() -> None:
    baseline = {0: 90.0, 1: 90.2, 2: 90.1}
    same = difference({0: 90.1, 1: 90.3, 2: 89.9}, baseline)  # [-0.43, 0.43]
    worse = difference({0: 85.0, 1: 85.1, 2: 85.3}, baseline)  # about -5 +- 0.3
    assert judge(same, Claim(lower=-0.5), min_seeds=3).verdict == REPRODUCED
    assert judge(same, Claim(lower=-0.3), min_seeds=3).verdict == INCONCLUSIVE
    assert judge(worse, Claim(lower=-0.5), min_seeds=3).verdict == NOT_REPRODUCED
    # a two-sided claim ("loses a little": between -3 and 0 points)
    assert judge(worse, Claim(lower=-3.0, upper=0.0), min_seeds=3).verdict == NOT_REPRODUCED
    assert judge(same, Claim(lower=-3.0, upper=0.0), min_seeds=3).verdict == INCONCLUSIVE
    # "beats": the interval above zero
    assert judge(difference(baseline, {0: 85.0, 1: 85.1, 2: 85.3}), Claim(lower=0.0)).verdict == REPRODUCED


def test_never_a_verdict_from_one_run() -> None:
    d = difference({0: 99.0}, {0: 50.0})
    assert math.isnan(d.low) and math.isnan(d.high) and d.estimate == 49.0
    v = judge(d, Claim(lower=-0.5))
    assert v.verdict == INCONCLUSIVE and "1 run(s)" in v.reason
    with pytest.raises(ValueError, match="min_seeds must be >= 2"):
        judge(d, Claim(lower=-0.5), min_seeds=1)


def test_too_few_seeds_for_a_narrow_claim() -> None:
    assert min_seeds_for(Claim(lower=-0.5)) == 3
    assert min_seeds_for(Claim(lower=-5.0)) == 2
    assert min_seeds_for(Claim(upper=math.log(1.02))) == 3
    d = difference({0: 90.0, 1: 90.1}, {0: 90.0, 1: 90.05})
    assert judge(d, Claim(lower=-0.5), min_seeds=3).verdict == INCONCLUSIVE


RECIPE = {0: 81.0, 1: 81.5, 2: 82.0}  # mean 81.5


def test_a_baseline_whose_longer_run_moves_less_than_the_tolerance_is_converged() -> None:
    check = longer_training(RECIPE, {0: 81.9, 1: 82.4, 2: 82.1}, tolerance=1.0)  # mean 82.133
    assert check.change == pytest.approx(0.6333, abs=1e-4) and check.num_longer == 3
    assert check.converged and check.reason == ""
    d = difference({0: 81.2, 1: 81.4, 2: 81.9}, RECIPE)
    assert judge(d, Claim(lower=-1.0), min_seeds=3, baseline=check).verdict == REPRODUCED


@pytest.mark.parametrize("longer", [{0: 82.6, 1: 83.1, 2: 82.8}, {0: 80.1, 1: 80.5, 2: 80.4}])
def test_a_baseline_that_twice_the_epochs_moves_by_the_tolerance_is_not_converged(longer) -> None:
    """More than the tolerance either way (a longer run much better, or much worse) fails."""
    check = longer_training(RECIPE, longer, tolerance=1.0)
    assert abs(check.change) > 1.0 and not check.converged
    d = difference({0: 81.2, 1: 81.4, 2: 81.9}, RECIPE)
    v = judge(d, Claim(lower=-1.0), min_seeds=3, baseline=check)
    assert v.verdict == INCONCLUSIVE
    assert v.reason == (
        f"baseline failed the pre-registered 2x-epochs check: 2x the epochs changed its metric by "
        f"{check.change:+.4g} (|change| must be < 1, the claims' tolerance)"
    )


def test_a_loss_gains_when_it_falls_and_the_boundary_is_not_converged() -> None:
    # lower is better: the longer run's loss 0.01 nats lower is a gain of +0.01
    check = longer_training({0: 1.57, 1: 1.58}, {0: 1.56, 1: 1.57}, tolerance=0.0198, seeds_needed=2,
                            higher_is_better=False)  # fmt: skip
    assert check.change == pytest.approx(0.01) and check.converged
    edge = longer_training({0: 1.0}, {0: 0.5}, tolerance=0.5, seeds_needed=1, higher_is_better=False)
    assert edge.change == pytest.approx(0.5) and not edge.converged  # "less than": the bound fails


def test_a_check_with_too_few_longer_seeds_is_not_made() -> None:
    for longer in ({}, {0: 81.5}):
        check = longer_training(RECIPE, longer, tolerance=1.0, seeds_needed=3)
        assert not check.converged
        assert check.reason == (
            "baseline not checked: the pre-registered 2x-epochs check needs 3 seed(s) of fp32 at 2x the "
            f"epochs, {len(longer)} trained"
        )
    d = difference({0: 81.2, 1: 81.4, 2: 81.9}, RECIPE)
    v = judge(d, Claim(lower=-1.0), min_seeds=3, baseline=longer_training(RECIPE, {}, tolerance=1.0))
    assert v.verdict == INCONCLUSIVE and v.reason.startswith("baseline not checked")
    with pytest.raises(ValueError, match="tolerance must be > 0"):
        longer_training(RECIPE, {}, tolerance=0.0)
    with pytest.raises(ValueError, match="the baseline's own runs"):
        longer_training({}, {0: 1.0}, tolerance=1.0)


def test_too_few_seeds_are_named_before_the_convergence_check() -> None:
    d = difference({0: 81.2}, RECIPE)
    v = judge(d, Claim(lower=-1.0), min_seeds=3, baseline=longer_training(RECIPE, {}, tolerance=1.0))
    assert v.reason == "1 run(s) on one side, 3 needed for an interval"


def test_bad_inputs_are_named() -> None:
    with pytest.raises(ValueError, match="non-finite"):
        difference({0: math.nan}, {0: 1.0})
    with pytest.raises(ValueError, match="at least one run"):
        difference({}, {0: 1.0})
    with pytest.raises(ValueError, match="lower < upper"):
        Claim(lower=1.0, upper=0.0)


def test_plateau() -> None:
    steps = [100, 200, 300, 400, 500, 600, 700, 800, 900, 1000]
    rising = [50, 60, 68, 74, 78, 81, 83, 84.5, 85.5, 86.5]
    flat = [50, 60, 68, 74, 78, 81, 83, 84.0, 84.2, 84.3]
    # the last fifth: from step 800 to 1000
    assert plateau(steps, rising, tolerance=0.5).improvement == pytest.approx(2.0)
    assert not plateau(steps, rising, tolerance=0.5).reached
    assert plateau(steps, flat, tolerance=0.5).reached
    # lower is better (a loss)
    loss = [3.0, 2.0, 1.8, 1.7, 1.65, 1.62, 1.6, 1.59, 1.585, 1.58]
    p = plateau(steps, loss, tolerance=0.02, higher_is_better=False)
    assert p.improvement == pytest.approx(0.01) and p.reached and p.start_step == 800
    with pytest.raises(ValueError, match=">= 2 evaluations"):
        plateau([1], [1.0], tolerance=0.1)
