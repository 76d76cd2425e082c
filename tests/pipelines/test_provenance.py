"""Where and when a committed run was made: its DVC stage and scale, and its files' times."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from pipelines import provenance


def _git(repo: Path, *args: str, **env: str) -> str:
    return subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
        cwd=repo,
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, **env},
    ).stdout


def test_a_committed_file_is_as_old_as_its_commit_and_a_changed_one_as_its_mtime(tmp_path: Path) -> None:
    """A clone's files all carry the clone's time: a committed output is dated by the commit that
    brought its content; one changed since (a run made here) by its own modification time."""
    results = tmp_path / "results"
    (results / "a").mkdir(parents=True)
    for name in ("metrics.json", "other.json"):
        (results / "a" / name).write_text("{}\n")
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", ".")
    when = "2026-12-03T21:15:22+00:00"
    _git(tmp_path, "commit", "-qm", "release", GIT_COMMITTER_DATE=when, GIT_AUTHOR_DATE=when)
    sha = _git(tmp_path, "rev-parse", "--short", "HEAD").strip()
    (results / "a" / "other.json").write_text('{"rerun": 1}\n')
    os.utime(results / "a" / "other.json", (1_000_000_000, 1_000_000_000))
    (results / "b.json").write_text("{}\n")  # untracked
    os.utime(results / "b.json", (1_100_000_000, 1_100_000_000))

    times = provenance.FileTimes(results)
    assert times.of(results / "a" / "metrics.json") == (1796332522.0, f"git commit {sha}")
    assert times.of(results / "a" / "other.json") == (1_000_000_000.0, "file time")
    assert times.of(results / "b.json") == (1_100_000_000.0, "file time")


def test_a_runs_stage_and_scale_come_from_the_lock_whose_outputs_hold_it(tmp_path: Path) -> None:
    (tmp_path / "pipelines" / "p").mkdir(parents=True)
    (tmp_path / "dvc.lock").write_text(
        "schema: '2.0'\nstages:\n  board:\n    cmd: python -m pipelines.board --scale smoke\n"
        "    params:\n      pipelines/board/params.yaml:\n        scale: cpu\n"
        "    outs:\n    - path: results/board/measured\n"
    )
    (tmp_path / "pipelines" / "p" / "dvc.lock").write_text(
        "schema: '2.0'\nstages:\n  train@g:\n    cmd: python -m pipelines.launch p r --out results/p/runs/g\n"
        "    params:\n      pipelines/p/params.yaml:\n        scale: cpu\n    outs:\n    - path: results/p/runs/g\n"
    )
    stages = provenance.dvc_stages(tmp_path)
    assert provenance.stage_of(stages, Path("results/p/runs/g/r/seed0")) == provenance.Stage(
        "pipelines/p/dvc.yaml:train@g", "cpu"
    )
    # the command's --scale wins over the params file's default
    assert provenance.stage_of(stages, Path("results/board/measured/x")) == provenance.Stage("board", "smoke")
    assert provenance.stage_of(stages, Path("results/p/recipe_pilot/r")) is None
