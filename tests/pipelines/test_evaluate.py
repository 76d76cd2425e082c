"""The evaluate stage's choice of run folders."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipelines.evaluate import evaluate_group, trained_runs


def _trained(root: Path, run: str, seed: int) -> Path:
    folder = root / run / f"seed{seed}"
    folder.mkdir(parents=True)
    (folder / "metrics.json").write_text("{}")
    return folder


def test_only_the_pipelines_runs_are_evaluated_and_leftovers_are_named(tmp_path, capsys):
    kept = [_trained(tmp_path, "cifar_noclip", s) for s in (0, 1)]
    _trained(tmp_path, "cifar_fp32", 0)  # a run an earlier version of the pipeline had
    (tmp_path / "cifar_noshare" / "seed0").mkdir(parents=True)  # started, never finished
    assert trained_runs(tmp_path) == sorted([*kept, tmp_path / "cifar_fp32" / "seed0"])
    assert trained_runs(tmp_path, {"cifar_noclip", "cifar_noshare"}) == kept
    assert "skipping cifar_fp32: not a run of this pipeline's params.yaml" in capsys.readouterr().err


def test_a_leftover_without_its_model_no_longer_fails_the_stage_but_a_run_does(tmp_path):
    root = tmp_path / "terngrad"
    _trained(root / "runs" / "cifar", "cifar_fp32", 0)  # not in pipelines/terngrad/params.yaml
    with pytest.raises(SystemExit, match="no trained runs in"):
        evaluate_group("terngrad", "cifar", root=root, track=False)
    _trained(root / "runs" / "cifar", "cifar_noclip", 0)
    with pytest.raises(
        SystemExit, match=r"no model.pt for .*cifar_noclip/seed0 \(final models are not committed\): retrain"
    ):
        evaluate_group("terngrad", "cifar", root=root, track=False)
