"""The cross-paper summary: every claim of every report in one table, beside the paper's figure."""

from __future__ import annotations

import json

import pytest

from pipelines import summary


def _judged(
    claim, verdict, seeds=(3, 3), low=-0.5, high=0.3, paper="ResNet-110 93.87 % [MEM]", reason="why it is so"
):
    return {
        "claim": claim,
        "metric": "accuracy",
        "method_mean": 80.5,
        "baseline_mean": 80.6,
        "seeds": list(seeds),
        "difference": -0.1,
        "low": low,
        "high": high,
        "paired": True,
        "bound": ">= -1 pts",
        "verdict": verdict,
        "reason": reason,
        "paper": paper,
    }


@pytest.fixture
def results(tmp_path, monkeypatch):
    root = tmp_path / "results"
    for name, report in {
        "terngrad": {
            "rows": [{"git_sha": "abc1234", "run": "a"}],
            "claims": [
                _judged("CIFAR-10: TernGrad loses nothing", "reproduced"),
                _judged(
                    "MNIST: it | loses nothing",
                    "inconclusive",
                    seeds=(1, 3),
                    low=None,
                    high=None,
                    reason="1 run(s) on one side, 3 needed for an interval",
                ),
                _judged(
                    "CIFAR-10: QSGD loses nothing",
                    "inconclusive",
                    reason="baseline failed the pre-registered 2x-epochs check: 2x the epochs changed its "
                    "metric by +1.3 (|change| must be < 1, the claims' tolerance)",
                ),
            ],
        },
        "matcha": {
            "rows": [{"git_sha": "abc1234"}],
            "claims": [
                _judged(
                    "MATCHA: less time",
                    "inconclusive",
                    paper="up to 5x [ABS]",
                    reason="the interval straddles a bound of the claim",
                )
            ],
            "not_tested": [{"paper": "32 % faster than DeepSpeed-3D [ABS]", "why": "no baseline built"}],
        },
        "baseline": {"rows": [{"git_sha": "abc1234"}]},
    }.items():
        (root / name).mkdir(parents=True)
        (root / name / "report.json").write_text(json.dumps(report))
        (root / name / "report.md").write_text(f"# {name}\n\n## a table\n")
        run = root / name / "runs" / "group" / "run" / "seed0"
        run.mkdir(parents=True)
        (run / "run.json").write_text(json.dumps({"git_sha": "abc1234", "mlflow_run_id": "x"}))
    pilot = root / "terngrad" / "recipe_pilot" / "runs" / "run"
    pilot.mkdir(parents=True)
    (pilot / "run.json").write_text(json.dumps({"git_sha": "0ld0000"}))  # history: not counted
    monkeypatch.setattr(summary, "RESULTS_DIR", root)
    return root


def test_every_claim_is_one_row_beside_the_papers_figure(results):
    text = summary.claims_section()
    rows = [line for line in text.splitlines() if line.startswith("| ") and not line.startswith("| claim")]
    assert len(rows) == 4
    assert (
        "1 reproduced, 0 not reproduced, 3 inconclusive (1 for an interval straddling a bound, "
        "1 for too few seeds, 1 for a baseline that failed or lacks its convergence check)" in text
    )
    assert "**1 claim(s) are inconclusive for lack of seeds**" in text
    failed = next(r for r in rows if "QSGD" in r)
    assert (
        "baseline failed the pre-registered 2x-epochs check: 2x the epochs changed its metric by +1.3"
        in failed
    )
    judged = next(r for r in rows if "TernGrad loses nothing" in r)
    assert "ResNet-110 93.87 % [MEM]" in judged and "80.50 against 80.60: Δ -0.10 pts" in judged
    assert "[-0.50, 0.30]" in judged and "**reproduced**" in judged
    single = next(r for r in rows if "MNIST" in r)
    assert "it \\| loses nothing" in single  # a | in a claim does not split the row
    assert "none (1 seed)" in single and "1 vs 3" in single
    assert next(r for r in rows if "MATCHA" in r).startswith("| matcha: MATCHA: less time | up to 5x [ABS] |")
    assert all(r.count(" | ") == 7 for r in rows)  # eight cells each
    # a paper's claim no run can decide is listed under the table, not counted
    assert "- matcha: 32 % faster than DeepSpeed-3D [ABS]: no baseline built." in text


def test_every_seed_short_claim_gone_is_said(results):
    path = results / "terngrad" / "report.json"
    report = json.loads(path.read_text())
    report["claims"] = [c for c in report["claims"] if "MNIST" not in c["claim"]]
    path.write_text(json.dumps(report))
    assert "No claim is inconclusive for lack of seeds." in summary.claims_section()


def test_a_report_of_release_1s_form_is_refused_with_how_to_fix(results):
    path = results / "matcha" / "report.json"
    path.write_text(json.dumps({"measured_claims": [{"claim": "x"}]}))
    with pytest.raises(
        SystemExit, match="matcha/report.json has 'measured_claims'.*rerun that pipeline's report"
    ):
        summary.claims_section()


def test_the_summary_names_the_commit_of_every_run(results):
    summary.main()
    text = (results / "summary.md").read_text()
    assert "Every run recorded git abc1234." in text
    assert "\n### a table\n" in text  # each report's headings one level down
    later = results / "matcha" / "runs" / "group" / "other" / "seed0"
    later.mkdir(parents=True)
    (later / "run.json").write_text(json.dumps({"git_sha": "def5678"}))
    assert "The runs recorded 2 commits: baseline abc1234; matcha abc1234, def5678; terngrad abc1234." in (
        summary.commits_section()
    )


def test_a_claim_about_time_is_written_in_seconds():
    claim = {
        **_judged("MATCHA at C_b 0.5 takes less time than vanilla", "inconclusive", low=-3.25, high=1.5),
        "metric": "seconds",
        "method_mean": 33.04,
        "baseline_mean": 46.1,
        "difference": -13.06,
        "bound": "<= +0 s",
        "reason": "the interval straddles a bound of the claim",
    }
    row = summary.judged_row("matcha", claim)
    assert "33.04 against 46.10: Δ -13.06 s" in row and "[-3.25, 1.50]" in row and "<= +0 s" in row
    assert summary.why_inconclusive(claim["reason"]) == "an interval straddling a bound"
    with pytest.raises(ValueError, match="unknown claim metric 'furlongs'; valid: accuracy, loss, seconds"):
        summary.judged_row("matcha", {**claim, "metric": "furlongs"})
