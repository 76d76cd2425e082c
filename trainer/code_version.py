"""The version of the code a run ran: the git commit, ``-dirty`` when the code differs from it."""

from __future__ import annotations

import subprocess

from .paths import REPO_ROOT

CODE_PATHS = (
    "common",
    "trainer",
    "kernels",
    "harness",
    "papers",
    "pipelines",
    "pyproject.toml",
    "requirements.txt",
)


def git_sha() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10
        )
        sha = out.stdout.strip() or "unknown"
        dirty = subprocess.run(
            # Dirty means the code differs from the commit; outputs (results/, dvc.lock files that
            # a running pipeline rewrites) and documentation (READMEs edited during a run) do not.
            [
                "git",
                "status",
                "--porcelain",
                "--untracked-files=no",
                "--",
                *CODE_PATHS,
                ":(exclude)*.lock",
                ":(exclude)*.md",
            ],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        return f"{sha}-dirty" if dirty and sha != "unknown" else sha
    except (OSError, subprocess.SubprocessError):
        return "unknown"


_LOADED_SHA: str | None = None


def loaded_git_sha() -> str:
    """:func:`git_sha` when this process first asks: the commit of the code it loaded. A launch
    trains its runs one after the other in the same ranks; if a commit lands (or the tree is
    edited) meanwhile, the later runs still run the code the ranks imported, and record its sha, not
    the one HEAD has moved to (at git 4b9ec5d a launch's runs recorded 4 commits and a -dirty for
    the one set of code they ran)."""
    global _LOADED_SHA
    if _LOADED_SHA is None:
        _LOADED_SHA = git_sha()
    return _LOADED_SHA
