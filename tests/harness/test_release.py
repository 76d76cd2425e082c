"""harness.release on a small DVC project in a temporary git repository: a stage run in a worktree at
the frozen commit lands in the main checkout with its outputs, its lock entry and its row, in a
commit of those paths alone."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.release import ReleaseError, merge_lock_entry, release

DVC_YAML = """\
stages:
  make:
    foreach: [a, b]
    do:
      cmd: python make.py ${item}
      deps: [make.py]
      outs:
        - out/${item}:
            cache: false
  broken:
    cmd: python -c "raise SystemExit(3)"
    outs:
      - never:
          cache: false
"""

MAKE_PY = """\
import sys
from pathlib import Path
Path("out", sys.argv[1]).mkdir(parents=True, exist_ok=True)
Path("out", sys.argv[1], "value.txt").write_text(sys.argv[1] * 3)
"""


def _run(cwd: Path, *args: str) -> str:
    env = {**os.environ, "DVC_NO_ANALYTICS": "1", "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}  # fmt: skip
    return subprocess.run(args, cwd=cwd, check=True, capture_output=True, text=True, env=env).stdout


@pytest.fixture
def project(tmp_path):
    main = tmp_path / "main"
    main.mkdir()
    _run(main, "git", "init", "-q", "-b", "main")
    _run(main, sys.executable, "-m", "dvc", "init", "-q")
    (main / "dvc.yaml").write_text(DVC_YAML)
    (main / "make.py").write_text(MAKE_PY)
    (main / "results").mkdir()
    (main / "results" / "release.md").write_text("# Release 2\n\nIntro.\n\n")
    _run(main, "git", "add", "-A")
    _run(main, "git", "commit", "-q", "-m", "frozen")
    sha = _run(main, "git", "rev-parse", "HEAD").strip()
    worktree = tmp_path / "frozen"
    _run(main, "git", "worktree", "add", "-q", "--detach", str(worktree), sha)
    return main, worktree, sha


def test_a_stage_lands_with_its_outputs_lock_entry_and_row_in_one_commit(project, tmp_path, monkeypatch):
    main, worktree, sha = project
    monkeypatch.setenv("DVC_NO_ANALYTICS", "1")
    # main moves on (docs) while the release runs on the frozen commit
    (main / "notes.md").write_text("work in progress\n")
    release(worktree, sha, ["dvc.yaml:make@a"], main=main, log_dir=tmp_path / "logs")

    assert (main / "out" / "a" / "value.txt").read_text() == "aaa"
    assert not (main / "out" / "b").exists()
    lock = (main / "dvc.lock").read_text()
    assert "make@a:" in lock and "make@b:" not in lock
    rows = [line for line in (main / "results" / "release.md").read_text().splitlines() if "make@a" in line]
    assert len(rows) == 1 and rows[0].startswith("| `dvc.yaml:make@a` | 20") and "cores |" in rows[0]
    committed = _run(main, "git", "show", "--name-only", "--format=%s", "HEAD").split("\n")
    assert committed[0].startswith(f"Release: dvc.yaml:make@a at {sha[:9]}")
    assert sorted(filter(None, committed[1:])) == ["dvc.lock", "out/a/value.txt", "results/release.md"]
    assert "notes.md" in _run(main, "git", "status", "--porcelain")  # the rest of main is untouched
    # the main checkout's DVC agrees that the stage is up to date there
    assert "make@a" not in _run(main, sys.executable, "-m", "dvc", "status", "dvc.yaml:make@a")

    release(worktree, sha, ["dvc.yaml:make@b"], main=main, log_dir=tmp_path / "logs")
    lock = (main / "dvc.lock").read_text()
    assert "make@a:" in lock and "make@b:" in lock  # the second entry joins the first


def test_a_failing_stage_stops_with_its_log_and_commits_nothing(project, tmp_path):
    main, worktree, sha = project
    before = _run(main, "git", "rev-parse", "HEAD")
    with pytest.raises(ReleaseError, match=r"stage dvc.yaml:broken failed \(exit \d+\): see .*broken\.log"):
        release(worktree, sha, ["dvc.yaml:broken", "dvc.yaml:make@a"], main=main, log_dir=tmp_path / "logs")
    assert _run(main, "git", "rev-parse", "HEAD") == before
    assert not (main / "out").exists()


def test_frozen_code_only(project, tmp_path):
    main, worktree, sha = project
    (main / "make.py").write_text(MAKE_PY + "# changed\n")
    _run(main, "git", "commit", "-q", "-am", "later")
    later = _run(main, "git", "rev-parse", "HEAD").strip()
    with pytest.raises(ReleaseError, match=rf"is at {sha[:9]}, not at the release's commit {later[:9]}"):
        release(worktree, later, ["dvc.yaml:make@a"], main=main)
    (worktree / "make.py").write_text("edited\n")
    with pytest.raises(ReleaseError, match=r"has changes to tracked code; a release runs frozen code"):
        release(worktree, sha, ["dvc.yaml:make@a"], main=main)
    with pytest.raises(ReleaseError, match=r"is not a git checkout: make one with `git worktree add"):
        release(tmp_path / "nowhere", sha, ["dvc.yaml:make@a"], main=main)


def test_an_unknown_stage_is_named(project):
    main, worktree, sha = project
    with pytest.raises(ReleaseError, match=r"no DVC stage 'dvc.yaml:make@c'"):
        release(worktree, sha, ["dvc.yaml:make@c"], main=main)


def test_merge_lock_entry_keeps_the_other_stages(tmp_path):
    source, destination = tmp_path / "src.lock", tmp_path / "dst.lock"
    source.write_text("schema: '2.0'\nstages:\n  x:\n    cmd: new\n  y:\n    cmd: other\n")
    destination.write_text("schema: '2.0'\nstages:\n  x:\n    cmd: old\n  z:\n    cmd: kept\n")
    merge_lock_entry(source, destination, "x")
    text = destination.read_text()
    assert "cmd: new" in text and "cmd: kept" in text and "cmd: other" not in text and "cmd: old" not in text
    with pytest.raises(ReleaseError, match=r"has no lock entry for stage 'w'"):
        merge_lock_entry(source, destination, "w")
