"""Where a pipeline's runs write (harness/folders.py)."""

from __future__ import annotations

from harness import folders


def test_pipeline_runs_under_results_keep_artifacts_under_artifacts(monkeypatch, tmp_path):
    """``artifacts_for``: a folder below results/ maps to the same place below artifacts/; any other
    folder (a hand run's --out) keeps its own."""
    monkeypatch.setattr(folders, "RESULTS_DIR", tmp_path / "results")
    monkeypatch.setattr(folders, "ARTIFACTS_DIR", tmp_path / "artifacts")
    run = tmp_path / "results" / "suite" / "runs" / "cifar_3" / "cifar_fp32" / "seed0"
    assert (
        folders.artifacts_for(run)
        == tmp_path / "artifacts" / "suite" / "runs" / "cifar_3" / "cifar_fp32" / "seed0"
    )
    assert folders.artifacts_for(tmp_path / "scratch" / "x") == tmp_path / "scratch" / "x"
