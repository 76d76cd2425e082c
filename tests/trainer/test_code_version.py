"""git_sha: which edits mark a run's code as dirty, and the commit a process loaded."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from trainer import code_version


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "common").mkdir()
    (tmp_path / "common" / "x.py").write_text("a = 1\n")
    (tmp_path / "papers").mkdir()
    (tmp_path / "papers" / "README.md").write_text("# notes\n")
    (tmp_path / "pipelines").mkdir()
    (tmp_path / "pipelines" / "dvc.lock").write_text("schema: '2.0'\n")
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init")
    monkeypatch.setattr(code_version, "REPO_ROOT", tmp_path)
    return tmp_path


def test_clean_checkout_has_no_suffix(repo: Path) -> None:
    sha = code_version.git_sha()
    assert len(sha) >= 7 and not sha.endswith("-dirty")


def test_code_edit_is_dirty(repo: Path) -> None:
    (repo / "common" / "x.py").write_text("a = 2\n")
    assert code_version.git_sha().endswith("-dirty")


def test_documentation_and_locks_are_not_code(repo: Path) -> None:
    (repo / "papers" / "README.md").write_text("# notes, edited while a pipeline runs\n")
    (repo / "pipelines" / "dvc.lock").write_text("schema: '2.0'\nstages: {}\n")
    (repo / "results.txt").write_text("untracked output\n")
    assert not code_version.git_sha().endswith("-dirty")


def test_outside_a_repository_is_unknown(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(code_version, "REPO_ROOT", tmp_path)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
    assert code_version.git_sha() == "unknown"


def test_a_process_records_the_commit_it_loaded_not_where_head_moved(
    repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A launch's later runs ran the code its ranks imported: a commit landing meanwhile (or an
    edit) does not change the sha they record."""
    monkeypatch.setattr(code_version, "_LOADED_SHA", None)
    loaded = code_version.loaded_git_sha()
    assert loaded == code_version.git_sha() and not loaded.endswith("-dirty")
    (repo / "common" / "x.py").write_text("a = 2\n")
    assert code_version.git_sha().endswith("-dirty")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "later")
    assert code_version.git_sha() != loaded
    assert code_version.loaded_git_sha() == loaded
