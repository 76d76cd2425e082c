"""Alpha-beta-gamma cost model: formulas, fitting, rate parsing, extrapolation."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from harness.costmodel import (
    OPS,
    LinkParams,
    MethodProfile,
    StepSample,
    collective_time,
    comm_time,
    extrapolate,
    extrapolation_markdown,
    fit,
    format_rate,
    op_terms,
    parse_rate,
    step_time,
)

TRUE = LinkParams(alpha=50e-6, efficiency=1.08, gamma=0.4e-9)
MIX = {"all_reduce": (1.0, 2.4e6), "all_gather": (1.0, 60e3), "all_gather_counts": (1.0, 32.0)}
LATENCY_BOUND = {"all_gather_counts": (200.0, 200 * 32.0), "all_reduce": (20.0, 20 * 4096.0)}


def synthetic(params, workers, rates, mixes, noise=0.0, seed=0, compute=0.05):
    rng = np.random.default_rng(seed)
    samples = []
    for p in workers:
        for rate in rates:
            for i, ops in enumerate(mixes):
                comm = comm_time(ops, p, rate, params) * (1 + noise * rng.standard_normal())
                samples.append(
                    StepSample(p, rate, ops, comm, compute_seconds=compute, label=f"p{p}-{rate:g}-{i}")
                )
    return samples


def assert_params_close(got, want, rel):
    for name in ("alpha", "efficiency", "gamma"):
        assert getattr(got, name) == pytest.approx(getattr(want, name), rel=rel), name


def test_fit_recovers_parameters_exactly_without_noise():
    result = fit(synthetic(TRUE, (2, 4, 8), (100e6, 300e6, 1e9), [MIX]))
    assert_params_close(result.params, TRUE, rel=1e-6)
    assert result.max_abs_comm_error < 1e-6
    assert result.max_abs_step_error < 1e-6
    assert result.notes == []


def test_fit_with_noise_reproduces_the_times():
    """On 100 Mbit/s-1 Gbit/s links the wire dominates: efficiency is pinned down, the model's times too."""
    result = fit(synthetic(TRUE, (2, 4, 8), (100e6, 300e6, 1e9), [MIX], noise=0.03, seed=0))
    assert result.params.efficiency == pytest.approx(TRUE.efficiency, rel=0.1)
    assert result.max_abs_comm_error < 0.1
    assert result.max_abs_step_error < 0.1
    json.dumps(result.to_dict())


def test_fit_with_noise_recovers_all_three_given_a_wide_design():
    """alpha and gamma are a few percent of the time on slow links; fast links and small messages expose
    them (communication-only samples, as from a collectives benchmark: the fit weighs each sample
    relative to its whole step, so compute would hide the fast links' terms)."""
    samples = synthetic(
        TRUE,
        (2, 4, 8),
        (100e6, 300e6, 1e9, 10e9, 100e9),
        [MIX, LATENCY_BOUND],
        noise=0.03,
        seed=0,
        compute=0.0,
    )
    result = fit(samples)
    assert_params_close(result.params, TRUE, rel=0.1)
    assert all(result.stderr[name] < 0.1 * getattr(TRUE, name) for name in result.stderr)
    assert result.max_abs_comm_error < 0.15


def test_fit_without_reduction_leaves_gamma_at_zero_and_says_so():
    ops = {"all_gather": (2.0, 1e5), "send": (1.0, 3e4)}
    result = fit(synthetic(TRUE, (2, 4, 8), (100e6, 1e9), [ops]))
    assert result.params.gamma == 0.0
    assert result.params.alpha == pytest.approx(TRUE.alpha, rel=1e-6)
    assert any("gamma" in note for note in result.notes)
    assert math.isnan(result.stderr["gamma"])


def test_fit_markdown_has_header_and_a_row_per_sample():
    samples = synthetic(TRUE, (2, 4, 8), (100e6, 1e9), [MIX])
    text = fit(samples).markdown()
    assert "µs" in text and "efficiency" in text and "ns/byte" in text
    assert "100 Mbit/s" in text and "1 Gbit/s" in text
    for s in samples:
        assert s.label in text


def test_fit_refuses_too_few_samples_and_non_positive_times():
    samples = synthetic(TRUE, (2, 4, 8), (1e9,), [MIX])
    with pytest.raises(ValueError, match="at least 3 samples.*got 2"):
        fit(samples[:2])
    bad = StepSample(4, 1e9, MIX, comm_seconds=0.0, label="broken")
    with pytest.raises(ValueError, match="broken.*comm_seconds=0.0"):
        fit([*samples, bad])


def test_ring_all_reduce_by_hand():
    n, rate = 1e6, 1e9
    beta = TRUE.efficiency * 8 / rate
    want = 2 * 3 * TRUE.alpha + 1.5 * n * beta + 0.75 * n * TRUE.gamma
    assert collective_time("all_reduce", 4, n, rate, TRUE) == pytest.approx(want, rel=1e-12)
    assert op_terms("all_reduce", 4, 1, n) == pytest.approx((6, 1.5 * n, 0.75 * n))


@pytest.mark.parametrize("op", OPS)
def test_one_rank_costs_nothing(op):
    assert op_terms(op, 1, 5, 1e6) == (0.0, 0.0, 0.0)
    assert collective_time(op, 1, 1e6, 1e9, TRUE) == 0.0


def test_other_ops_by_hand():
    assert op_terms("broadcast", 5, 2, 100) == (6, 300, 0)  # ceil(log2 5) = 3
    assert op_terms("send", 8, 3, 100) == (3, 100, 0)
    assert op_terms("parameter_server", 4, 1, 100) == (2, 800, 400)
    assert op_terms("reduce_scatter", 4, 1, 100) == pytest.approx((3, 75, 75))
    assert op_terms("all_gather_counts", 4, 1, 32) == (3, 96, 0)


def test_all_gather_grows_linearly_all_reduce_saturates():
    n, rate = 60e3, 10e9
    no_latency = LinkParams(alpha=0.0, efficiency=1.0, gamma=0.0)
    t = {p: collective_time("all_gather", p, n, rate, no_latency) for p in (2, 3, 5, 9)}
    assert [t[p] / t[2] for p in (3, 5, 9)] == pytest.approx([2, 4, 8])
    ratio = collective_time("all_reduce", 512, n, rate, no_latency) / collective_time(
        "all_reduce", 64, n, rate, no_latency
    )
    assert 1.0 < ratio < 1.02


def test_step_time_adds_compute():
    sample = StepSample(4, 1e9, MIX, comm_seconds=0.1, compute_seconds=0.25)
    assert step_time(sample, TRUE) == pytest.approx(0.25 + comm_time(MIX, 4, 1e9, TRUE))


@pytest.mark.parametrize(
    "text,bps",
    [
        ("100mbit", 100e6),
        ("1gbit", 1e9),
        ("2.5gbit", 2.5e9),
        ("10Gbit", 10e9),
        ("500kbit", 500e3),
        ("1e9", 1e9),
        ("100 Mbit/s", 100e6),
    ],
)
def test_parse_rate(text, bps):
    assert parse_rate(text) == pytest.approx(bps)


@pytest.mark.parametrize("bps", [500e3, 100e6, 300e6, 1e9, 2.5e9, 10e9, 25e9, 100e9, 1.5e12])
def test_format_rate_round_trips(bps):
    assert parse_rate(format_rate(bps)) == pytest.approx(bps)


def test_format_rate_reads_well():
    assert format_rate(100e6) == "100 Mbit/s"
    assert format_rate(1e9) == "1 Gbit/s"
    assert format_rate(2.5e9) == "2.5 Gbit/s"


@pytest.mark.parametrize("text", ["fast", "-1mbit", "0gbit", "", "1gbyte", "inf", "nan"])
def test_parse_rate_errors_name_the_text(text):
    with pytest.raises(ValueError, match=f"{text!r}.*valid examples"):
        parse_rate(text)


def test_bad_inputs_name_the_value():
    with pytest.raises(ValueError, match="'allreduce'.*valid ops: all_reduce, all_gather"):
        op_terms("allreduce", 4, 1, 10)
    with pytest.raises(ValueError, match=r"integer >= 1, got 0"):
        op_terms("all_reduce", 0, 1, 10)
    with pytest.raises(ValueError, match="nbytes.*-5"):
        op_terms("all_reduce", 4, 1, -5)
    with pytest.raises(ValueError, match="calls.*-1"):
        op_terms("all_reduce", 4, -1, 5)
    with pytest.raises(ValueError, match="rate_bps.*0"):
        comm_time(MIX, 4, 0, TRUE)
    with pytest.raises(ValueError, match="'bogus'"):
        StepSample(4, 1e9, {"bogus": (1, 1)}, comm_seconds=0.1)
    with pytest.raises(ValueError, match="'cubic'.*valid scalings"):
        MethodProfile("x", 0.1, 0.0, MIX, 4, scaling={"all_reduce": "cubic"})
    with pytest.raises(ValueError, match="efficiency.*-1"):
        LinkParams(alpha=0.0, efficiency=-1.0, gamma=0.0)


def profiles():
    dense = 25e6 * 4  # 25M fp32 parameters
    return [
        MethodProfile(
            "fp32", compute_seconds=0.2, compress_seconds=0.0, ops={"all_reduce": (1, dense)}, p_measured=4
        ),
        MethodProfile(
            "topk",
            compute_seconds=0.2,
            compress_seconds=0.01,
            ops={"all_gather": (1, dense / 100), "all_gather_counts": (1, 8)},
            p_measured=4,
        ),
    ]


def test_extrapolation():
    rows = extrapolate(profiles(), TRUE)
    assert len(rows) == 2 * 4 * 3
    for row in rows:
        assert row["step_seconds"] == pytest.approx(
            row["comm_seconds"] + (0.2 if row["method"] == "fp32" else 0.21)
        )
        assert 0 < row["comm_fraction"] < 1
        if row["method"] == "fp32":
            assert row["speedup"] == 1.0
    at_10g = {r["method"]: r for r in rows if r["rate_bps"] == 10e9 and r["workers"] == 64}
    assert at_10g["topk"]["step_seconds"] < at_10g["fp32"]["step_seconds"]
    assert at_10g["topk"]["speedup"] > 1
    text = extrapolation_markdown(rows)
    assert "fp32" in text and "topk" in text
    assert "512 workers" in text and "10 Gbit/s" in text and "(1.0x)" in text
    json.dumps(rows)


def test_extrapolation_without_fp32_has_nan_speedup_and_scaling_applies():
    prof = MethodProfile(
        "sharded", 0.1, 0.0, {"reduce_scatter": (1, 1e6)}, p_measured=8, scaling={"reduce_scatter": "inverse"}
    )
    assert prof.ops_at(16)["reduce_scatter"] == (1, 5e5)
    rows = extrapolate([prof], TRUE, workers=(8,), rates=(1e9,))
    assert math.isnan(rows[0]["speedup"])
    assert "sharded" in extrapolation_markdown(rows)
