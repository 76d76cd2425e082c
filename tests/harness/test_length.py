"""The training-length study: each length judged by the one rule, the verdict text from the runs."""

from __future__ import annotations

import pytest

from harness import length


def _runs(accuracies: dict[int, float], epochs: int) -> dict[int, dict]:
    return {
        seed: {
            "evaluation": {"test_accuracy": value / 100},
            "info": {"config": {"epochs": epochs}, "mlflow_run_id": f"id{epochs}-{seed}"},
            "metrics": {"steps": 87 * epochs},
        }
        for seed, value in accuracies.items()
    }


FP32 = {0: 81.5, 1: 81.7, 2: 81.6}


def _suite(gap_1x: float) -> dict:
    return {
        "cifar_fp32": _runs(FP32, 10),
        "cifar_dgc": _runs({s: v + gap_1x + 0.1 * s for s, v in FP32.items()}, 10),
        "cifar_fp32x2": _runs({s: v + 0.4 for s, v in FP32.items()}, 20),
        "cifar_fp32x4": _runs({0: 82.2}, 40),
    }


def test_a_gap_that_closes_holds_from_the_first_length_it_is_reproduced_at():
    own = {
        "cifar_dgc_x2": _runs({s: v + 0.4 - 0.2 + 0.1 * s for s, v in FP32.items()}, 20),  # Δ -0.1 +- 0.1
        "cifar_dgc_x4": _runs({0: 82.0}, 40),
    }
    (study,) = length.studies(_suite(-5.8), own, "dgc", "DGC loses nothing")
    assert [r["epochs"] for r in study["rows"]] == [10, 20, 40]
    assert [r["seeds"] for r in study["rows"]] == [[3, 3], [3, 3], [1, 1]]
    assert [r["verdict"] for r in study["rows"]] == ["not reproduced", "reproduced", "inconclusive"]
    assert study["rows"][1]["difference"] == pytest.approx(-0.1)
    assert study["verdict"].startswith("holds at longer training: from 20 epochs (2x the recipe, Δ -0.10 [")


def test_a_gap_that_stays_outside_the_claim_does_not_close():
    own = {
        "cifar_dgc_x2": _runs({s: v + 0.4 - 4.0 + 0.1 * s for s, v in FP32.items()}, 20),
        "cifar_dgc_x4": _runs({0: 79.0}, 40),
    }
    (study,) = length.studies(_suite(-5.8), own, "dgc", "DGC loses nothing")
    # the longest length judged over 3 seeds is 20 epochs (40: one seed, no interval)
    assert study["verdict"].startswith("does not close within 20 epochs (10 epochs: Δ -5.70 [")
    assert "40 epochs: Δ -3.20 no interval (1 vs 1 runs), inconclusive)" in study["verdict"]
    text = "\n".join(length.markdown([study]))
    assert "## Training length" in text and "does not close within 20 epochs" in text


def test_a_gap_that_straddles_the_bound_at_the_longest_judged_length_is_undecided():
    own = {"cifar_dgc_x2": _runs({0: 81.9, 1: 80.6, 2: 82.3}, 20)}  # Δ -0.3, -1.5, +0.7 against fp32 x2
    (study,) = length.studies(_suite(-5.8), own, "dgc", "DGC loses nothing")
    assert study["rows"][1]["verdict"] == "inconclusive" and study["rows"][1]["enough_seeds"]
    assert study["verdict"].startswith("undecided: not reproduced at any length")


def test_no_longer_runs_no_study_and_a_missing_fp32_is_named():
    assert length.studies(_suite(-5.8), {}, "dgc", "DGC loses nothing") == []
    suite = _suite(-5.8)
    del suite["cifar_fp32x4"]
    own = {"cifar_dgc_x4": _runs({0: 79.0}, 40)}
    with pytest.raises(SystemExit, match="the suite's cifar_fp32x4 must be trained"):
        length.studies(suite, own, "dgc", "DGC loses nothing")
