"""Run a release stage by stage on frozen code, and commit each stage with its lock.

A release runs every training stage at one commit (``results/release.md``: "every run records one
git sha") while work on the main checkout goes on, and takes longer than a sitting. So the stages
run in a worktree checked out at the frozen commit, and after each stage this copies the stage's
outputs and its ``dvc.lock`` entry back into the main checkout, appends the stage's row (finish
time, seconds, machine) to the release record, and commits those paths alone::

    git worktree add --detach ../release2 <sha>
    python -m harness.release --worktree ../release2 --commit <sha> \\
        'pipelines/suite/dvc.yaml:train@mnist_a' 'pipelines/suite/dvc.yaml:evaluate@mnist_a'

Each stage's DVC output goes to ``<log-dir>/<stage>.log`` (``dvc repro --single-item``: a stage
runs alone, after the stages it reads; the order is the caller's). A stage that fails stops the
run with its log's path; what finished before it is committed. Nothing is committed for a stage
whose outputs are missing after its run.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainer.paths import REPO_ROOT

RECORD = Path("results/release.md")
TABLE_HEADER = "| stage | finished (UTC) | seconds | machine |\n|---|---|---:|---|\n"


class ReleaseError(RuntimeError):
    """A release cannot go on: the message says what and how to fix it."""


@dataclass(frozen=True)
class StageFiles:
    """What a stage writes, relative to the repository: its outputs and its lock file."""

    name: str  # the stage's name in its dvc.yaml (``train@mnist_a``)
    outs: tuple[str, ...]
    lockfile: str


def stage_files(repo: Path, target: str) -> StageFiles:
    """Resolve ``target`` (``pipelines/x/dvc.yaml:train@key`` or a root stage name) in ``repo``."""
    from dvc.repo import Repo

    with contextlib.chdir(repo), Repo(str(repo)) as dvc_repo:  # targets are relative to the working directory
        try:
            stages = dvc_repo.stage.collect(target)
        except Exception as error:  # dvc raises several kinds for a name it does not know
            raise ReleaseError(f"no DVC stage {target!r} in {repo}: {error}") from None
        if len(stages) != 1:
            raise ReleaseError(f"{target!r} names {len(stages)} stages in {repo}: name one stage")
        stage = stages[0]
        dvcfile = Path(stage.dvcfile.relpath)
        return StageFiles(
            name=stage.name,
            outs=tuple(str(out.def_path) for out in stage.outs),
            lockfile=str(dvcfile.with_name("dvc.lock")),
        )


def merge_lock_entry(source: Path, destination: Path, name: str) -> None:
    """Put ``source``'s lock entry of stage ``name`` into ``destination`` (the others kept)."""
    from dvc.utils.serialize import dump_yaml, load_yaml

    entries = load_yaml(source).get("stages", {})
    if name not in entries:
        raise ReleaseError(f"{source} has no lock entry for stage {name!r} after its run")
    merged: dict[str, Any] = dict(load_yaml(destination)) if destination.exists() else {"schema": "2.0"}
    merged["stages"] = {**merged.get("stages", {}), name: entries[name]}
    dump_yaml(destination, merged)


def machine() -> str:
    """The machine in the words of the release record: CPU model, oneDNN's widest path, cores."""
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = " ".join(line.split(":", 1)[1].split()[:2])  # "AMD EPYC", "Intel(R) Xeon(R)"
                break
    except OSError:
        pass
    import torch

    if getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)():
        isa = "amx"
    elif getattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)():
        isa = "avx512_bf16"
    else:
        isa = torch.backends.cpu.get_cpu_capability().lower()
    return f"{model}, {platform.machine()}-{isa}, {os.cpu_count()} cores"


def append_row(record: Path, target: str, finished: datetime.datetime, seconds: float, where: str) -> None:
    """Append the stage's row to ``record``'s table (the header first if the file has none)."""
    text = record.read_text() if record.exists() else ""
    if TABLE_HEADER not in text:
        text += ("\n" if text and not text.endswith("\n\n") else "") + TABLE_HEADER
    stamp = finished.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    text += f"| `{target}` | {stamp} | {seconds:,.0f} | {where} |\n"
    record.write_text(text)


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


def _ignored(repo: Path, path: str) -> bool:
    return subprocess.run(["git", "-C", str(repo), "check-ignore", "-q", "--", path]).returncode == 0


def check_worktree(worktree: Path, commit: str) -> None:
    """The worktree is at ``commit`` with no change to a tracked file (its outputs aside)."""
    if not (worktree / ".git").exists():
        raise ReleaseError(
            f"{worktree} is not a git checkout: make one with `git worktree add --detach {worktree} {commit}`"
        )
    head = _git(worktree, "rev-parse", "HEAD").strip()
    wanted = _git(worktree, "rev-parse", f"{commit}^{{commit}}").strip()
    if head != wanted:
        raise ReleaseError(f"{worktree} is at {head[:9]}, not at the release's commit {wanted[:9]}")
    changed = _git(
        worktree, "status", "--porcelain", "--untracked-files=no", "--", ":!results", ":!*dvc.lock"
    )
    if changed.strip():
        raise ReleaseError(f"{worktree} has changes to tracked code; a release runs frozen code:\n{changed}")


def copy_back(worktree: Path, main: Path, files: StageFiles) -> list[str]:
    """Copy the stage's outputs and lock entry from the worktree into ``main``; the paths changed."""
    for out in files.outs:
        source, destination = worktree / out, main / out
        if not source.exists():
            raise ReleaseError(f"the stage {files.name!r} ran but its output {out} is missing in {worktree}")
        if destination.is_dir():
            shutil.rmtree(destination)
        elif destination.exists():
            destination.unlink()
        destination.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, destination)
        else:
            shutil.copy2(source, destination)
    merge_lock_entry(worktree / files.lockfile, main / files.lockfile, files.name)
    return [*files.outs, files.lockfile]


def run_stage(worktree: Path, target: str, log: Path) -> float:
    """``dvc repro --single-item target`` in the worktree, output to ``log``; its seconds."""
    log.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with log.open("w") as out:
        done = subprocess.run(
            [sys.executable, "-m", "dvc", "repro", "--single-item", target],
            cwd=worktree,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    if done.returncode != 0:
        raise ReleaseError(f"stage {target} failed (exit {done.returncode}): see {log}")
    return time.monotonic() - started


def release(
    worktree: Path,
    commit: str,
    targets: Sequence[str],
    *,
    main: Path = REPO_ROOT,
    record: Path = RECORD,
    log_dir: Path | None = None,
    commit_each: bool = True,
) -> None:
    """Run ``targets`` one by one in ``worktree`` and bring each stage into ``main`` (module docstring)."""
    check_worktree(worktree, commit)
    logs = log_dir if log_dir is not None else worktree / "release-logs"
    where = machine()
    for target in targets:
        files = stage_files(worktree, target)
        safe = target.replace("/", "_").replace(":", "_")
        seconds = run_stage(worktree, target, logs / f"{safe}.log")
        changed = copy_back(worktree, main, files)
        append_row(main / record, target, datetime.datetime.now(datetime.UTC), seconds, where)
        if commit_each:
            paths = [
                p for p in [*changed, str(record)] if not _ignored(main, p)
            ]  # data caches are not in git
            _git(main, "add", "--", *paths)
            message = f"Release: {target} at {commit[:9]} ({seconds:,.0f} s on {where})"
            _git(main, "commit", "-q", "-m", message, "--", *paths)
        print(f"{target}: {seconds:,.0f} s", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.release", description=__doc__.split("\n\n")[0])
    parser.add_argument("targets", nargs="+", help="DVC stages, in the order to run them")
    parser.add_argument("--worktree", type=Path, required=True, help="a checkout at the release's commit")
    parser.add_argument("--commit", required=True, help="the release's commit (the worktree must be at it)")
    parser.add_argument("--record", type=Path, default=RECORD, help=f"the release record (default {RECORD})")
    parser.add_argument(
        "--log-dir", type=Path, help="where each stage's log goes (default <worktree>/release-logs)"
    )
    parser.add_argument("--no-commit", action="store_true", help="copy back and record, commit nothing")
    args = parser.parse_args(argv)
    try:
        release(
            args.worktree.resolve(),
            args.commit,
            args.targets,
            record=args.record,
            log_dir=args.log_dir,
            commit_each=not args.no_commit,
        )
    except ReleaseError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
