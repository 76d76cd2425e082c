"""The committed DVC locks and result folders describe the stages the dvc.yaml files define now.

A stage that is renamed or dropped (release 1's suite groups ``mnist_3``, TernGrad's per-run
stages) leaves its ``dvc.lock`` entry and its output folder behind unless someone removes them:
a lock then describes outputs no stage writes, and a report that reads a whole ``runs/`` folder
reads the old runs beside the new ones of the same name.
"""

from __future__ import annotations

import contextlib
from functools import cache
from pathlib import Path

import pytest
import yaml

from trainer.paths import REPO_ROOT


@cache
def _defined() -> dict[str, dict[str, tuple[str, ...]]]:
    """For each dvc.lock (relative to the root): its dvc.yaml's stage names and their outputs."""
    from dvc.repo import Repo

    stages: dict[str, dict[str, tuple[str, ...]]] = {}
    with contextlib.chdir(REPO_ROOT), Repo(str(REPO_ROOT)) as repo:
        for stage in repo.index.stages:
            lock = str(Path(stage.dvcfile.relpath).with_name("dvc.lock"))
            stages.setdefault(lock, {})[stage.name] = tuple(str(out.def_path) for out in stage.outs)
    return stages


LOCKS = [
    str(p.relative_to(REPO_ROOT))
    for p in [REPO_ROOT / "dvc.lock", *sorted(REPO_ROOT.glob("pipelines/*/dvc.lock"))]
    if p.exists()
]


@pytest.mark.parametrize("lock", LOCKS)
def test_every_lock_entry_names_a_stage_its_dvc_yaml_defines(lock: str) -> None:
    entries = yaml.safe_load((REPO_ROOT / lock).read_text())["stages"]
    defined = _defined().get(lock, {})
    stale = sorted(set(entries) - set(defined))
    assert not stale, (
        f"{lock} has entries for stages its dvc.yaml does not define: {stale}; drop them (and their "
        "outputs) in the commit that renames or removes the stage"
    )


def test_every_committed_run_folder_is_a_defined_stages_output() -> None:
    """``results/<pipeline>/runs/<group>`` and ``evaluations/<group>``: each is (inside) a stage's output."""
    outs = [Path(out) for stages in _defined().values() for paths in stages.values() for out in paths]
    folders = [
        folder.relative_to(REPO_ROOT)
        for kind in ("runs", "evaluations")
        for folder in sorted(REPO_ROOT.glob(f"results/*/{kind}/*"))
        if folder.is_dir()
    ]
    assert folders, "no committed run folders found under results/"
    orphans = [str(f) for f in folders if not any(f == out or out in f.parents for out in outs)]
    assert not orphans, (
        f"result folders that no stage of any dvc.yaml writes: {orphans}; remove them (`git rm -r`, "
        "they stay in git history) or name the stage that writes them"
    )
