"""The committed DVC locks and result folders describe the stages the dvc.yaml files define now.

A stage that is renamed or dropped (release 1's suite groups ``mnist_3``, TernGrad's per-run
stages) leaves its ``dvc.lock`` entry and its output folder behind unless someone removes them:
a lock then describes outputs no stage writes, and a report that reads a whole ``runs/`` folder
reads the old runs beside the new ones of the same name. And README.md names exactly the stages a
fresh clone's ``dvc status`` lists (a release leaves those whose outputs are in DVC's cache only).
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
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


def _main_commit(cell: str) -> str | None:
    found = re.search(r"report code of main \(([0-9a-f]{7,40})\)", cell)
    return found.group(1) if found else None


def _release_record() -> tuple[str, list[tuple[str, str]]]:
    """The newest release record (``results/release.md``; older ones are ``release<N>.md``): its
    file and the (stage, commit) rows of its "## Stages at git <sha>" table."""
    record = "results/release.md"
    text = (REPO_ROOT / record).read_text()
    found = re.search(r"^## Stages at git ([0-9a-f]{7,40})\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert found, f"{record} has no '## Stages at git <sha>' table"
    rows = re.findall(r"^\| `([^`]+)` \|[^|]*\|([^|]*)\|", found.group(2), re.M)
    # A report may run with main's report code in the main checkout; its row names that commit.
    return record, [(stage, _main_commit(seconds) or found.group(1)) for stage, seconds in rows]


def _outputs(stage: str) -> tuple[str, ...] | None:
    """The outputs of a record's stage, as its dvc.yaml defines them; None when none defines it."""
    dvcfile, _, name = stage.rpartition(":")  # a root stage has no ``<dvc.yaml>:`` prefix
    return _defined().get(str(Path(dvcfile or "dvc.yaml").with_name("dvc.lock")), {}).get(name)


def test_every_stage_in_the_release_record_is_defined_once() -> None:
    record, rows = _release_record()
    stages = [stage for stage, _ in rows]
    assert stages, f"{record} has an empty stage table"
    repeated = sorted({s for s in stages if stages.count(s) > 1})
    assert not repeated, f"{record} lists these stages more than once: {repeated}"
    undefined = [s for s in stages if _outputs(s) is None]
    assert not undefined, f"{record} lists stages no dvc.yaml defines: {undefined}"


def test_every_run_of_a_released_stage_records_the_release_commit() -> None:
    """What a release stage wrote (``run.json``, evaluation records) names the commit it ran at.

    A stage rerun by hand at another commit, or outputs left over from the previous release inside a
    released stage's folder, would show up here as a second sha.
    """
    record, rows = _release_record()
    wrong: list[str] = []
    checked = 0
    for stage, commit in rows:
        for out in _outputs(stage) or ():
            root = REPO_ROOT / out
            files = (
                sorted(root.rglob("*.json")) if root.is_dir() else [root] if root.suffix == ".json" else []
            )
            for path in files:
                try:
                    sha = json.loads(path.read_text()).get("git_sha")
                except (ValueError, AttributeError):
                    continue
                if sha is None:
                    continue
                checked += 1
                if sha != commit:
                    wrong.append(f"{path.relative_to(REPO_ROOT)}: {sha}, not {commit}")
    assert checked, f"no run records found under the outputs of {record}'s stages"
    assert not wrong, (
        f"{record} names the commit each stage ran at, but these records name another: {wrong[:20]}"
    )


def _clone_lists() -> list[str]:
    """The stages a fresh clone's ``dvc status`` lists: those with an output in DVC's cache and not in
    git (the clone lacks it), and those that read such an output; ``<dvc.yaml>:<stage>``."""
    from dvc.repo import Repo

    tracked = set(
        subprocess.run(
            ["git", "-C", str(REPO_ROOT), "ls-files"], check=True, capture_output=True, text=True
        ).stdout.splitlines()
    )

    def in_git(path: str) -> bool:
        return path in tracked or any(name.startswith(f"{path}/") for name in tracked)

    with contextlib.chdir(REPO_ROOT), Repo(str(REPO_ROOT)) as repo:
        stages = list(repo.index.stages)
        root = Path(repo.root_dir)
        absent = {
            out.fs_path
            for stage in stages
            for out in stage.outs
            if out.use_cache and not in_git(str(Path(out.fs_path).relative_to(root)))
        }
        return sorted(
            f"{stage.dvcfile.relpath}:{stage.name}"
            for stage in stages
            if any(o.fs_path in absent for o in stage.outs) or any(d.fs_path in absent for d in stage.deps)
        )


def test_the_readme_names_every_stage_a_fresh_clone_lists() -> None:
    """README.md's paragraph on a fresh clone's ``dvc status`` names exactly the stages it lists."""
    listed = _clone_lists()
    paragraph = next(
        (p for p in (REPO_ROOT / "README.md").read_text().split("\n\n") if "fresh clone's `dvc status`" in p),
        None,
    )
    assert paragraph is not None, "README.md has no paragraph on a fresh clone's `dvc status`"
    files = {name.rpartition(":")[0] for name in listed}
    assert all(f"`{f}`" in paragraph for f in files), f"README.md: name the dvc.yaml of {sorted(files)}"
    defined = {name for stages in _defined().values() for name in stages}
    named = {token for token in re.findall(r"`([^`]+)`", paragraph) if token in defined}
    expected = {name.rpartition(":")[2] for name in listed}
    assert named == expected, (
        f"README.md names {sorted(named - expected)} but a clone does not list them, and does not name "
        f"{sorted(expected - named)}, which a clone lists"
    )
    assert re.search(rf"\b{len(listed)}\s+stages\b", paragraph), f"README.md: say '{len(listed)} stages'"
