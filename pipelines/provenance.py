"""Where and when a committed run was made, read from what the repository holds besides the run.

A run's ``run.json`` records its config, git sha and fingerprint; runs trained before it also
recorded their tags and times lack the DVC stage and scale they ran at, and a clone's files all
carry the clone's time. This recovers both for the MLflow import:

- :func:`dvc_stages` / :func:`stage_of`: the DVC stage whose outputs hold a folder, from the
  ``dvc.lock`` files (the root's and each pipeline's), and the scale it ran at: its command's
  ``--scale``, else the ``scale`` parameter the lock recorded;
- :func:`derived_tags`: the tags a training run logs, from its folder, config and stage;
- :func:`recorded_times`: ``run.json``'s own start and end, where it has them;
- :class:`FileTimes`: when a file was written: the time of the git commit that brought its current
  content (a release commits each stage's outputs when the stage ends), or its modification time
  where it is not committed as it is (a run made here).
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml


@dataclass(frozen=True)
class Stage:
    """A DVC stage: ``name`` as DVC prints it (``pipelines/suite/dvc.yaml:train@cifar_1``)."""

    name: str
    scale: str | None


def _scale(stage: dict[str, Any]) -> str | None:
    command = stage.get("cmd", "")
    words = " ".join(command if isinstance(command, list) else [str(command)]).split()
    for i, word in enumerate(words):
        if word == "--scale" and i + 1 < len(words):
            return words[i + 1]
        if word.startswith("--scale="):
            return word.removeprefix("--scale=")
    for values in (stage.get("params") or {}).values():
        if isinstance(values, dict) and isinstance(values.get("scale"), str):
            return str(values["scale"])
    return None


def dvc_stages(root: Path) -> dict[Path, Stage]:
    """Each output path of a locked stage (relative to ``root``, the repository) -> its stage."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # the suite's lock is 5,000 lines
    outputs: dict[Path, Stage] = {}
    for lock in [root / "dvc.lock", *sorted((root / "pipelines").glob("*/dvc.lock"))]:
        if not lock.is_file():
            continue
        data = yaml.load(lock.read_text(), Loader=loader) or {}
        dvcfile = lock.with_name("dvc.yaml").relative_to(root).as_posix()
        for name, stage in (data.get("stages") or {}).items():
            found = Stage(name if dvcfile == "dvc.yaml" else f"{dvcfile}:{name}", _scale(stage))
            for out in stage.get("outs") or []:
                path = Path(out["path"])  # relative to the stage's wdir: the root here (wdir: ../..)
                if not (root / path).exists() and (lock.parent / path).exists():
                    path = (lock.parent / path).resolve().relative_to(root.resolve())
                outputs[path] = found
    return outputs


def stage_of(stages: dict[Path, Stage], path: Path) -> Stage | None:
    """The stage whose outputs hold ``path`` (relative to the repository), or None."""
    for candidate in (path, *path.parents):
        if candidate in stages:
            return stages[candidate]
    return None


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-c", "core.quotepath=off", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout


class FileTimes:
    """When each file under ``folder`` was written: its commit's time, or its modification time."""

    def __init__(self, folder: Path) -> None:
        self._commits: dict[Path, tuple[int, str]] = {}  # file -> (unix seconds, short sha)
        self._changed: set[Path] = set()  # differs from its last commit, or untracked
        try:
            top = Path(_git(folder, "rev-parse", "--show-toplevel").strip()).resolve()
            where = folder.resolve().relative_to(top).as_posix() or "."
            log = _git(top, "log", "--format=%x00%ct %h", "--name-only", "--", where)
            status = _git(top, "status", "--porcelain", "-z", "--untracked-files=all", "--", where)
        except (OSError, subprocess.SubprocessError, ValueError):
            return  # not in a repository (or no git): modification times
        for entry in log.split("\0")[1:]:
            head, _, names = entry.partition("\n")
            seconds, sha = head.split()
            for name in names.splitlines():
                if not name:
                    continue
                self._commits.setdefault(top / name, (int(seconds), sha))  # newest first
        self._changed = {top / entry[3:] for entry in status.split("\0") if len(entry) > 3}

    def of(self, path: Path) -> tuple[float, str]:
        """(unix seconds, where that comes from) for ``path``."""
        path = path.resolve()
        if path in self._commits and path not in self._changed:
            seconds, sha = self._commits[path]
            return float(seconds), f"git commit {sha}"
        return path.stat().st_mtime, "file time"


def recorded_times(info: dict[str, Any]) -> tuple[float, float] | None:
    """``run.json``'s ``started_at`` and ``ended_at`` (ISO 8601 or unix seconds), if it has both."""
    from datetime import datetime

    def seconds(value: Any) -> float:
        return (
            float(value) if isinstance(value, int | float) else datetime.fromisoformat(str(value)).timestamp()
        )

    try:
        return seconds(info["started_at"]), seconds(info["ended_at"])
    except (KeyError, ValueError, TypeError):
        return None


def derived_tags(
    relative: Path, info: dict[str, Any], final: dict[str, float], stage: Stage | None
) -> dict[str, str]:
    """The tags a training run logs, for a run (``relative``: its folder under ``results/``) whose
    ``run.json`` predates recording them: its run name (``stage``, ``<run>-seed<k>`` for a seed),
    pipeline, method, world size, and the scale and DVC stage of the lock that made it. Not the
    backend or device: nothing committed records them."""
    parts = [p for p in relative.parts[1:] if p != "runs"] or [relative.parts[0]]
    seed = parts[-1] if re.fullmatch(r"seed\d+", parts[-1]) and len(parts) > 1 else None
    method = parts[-2] if seed else parts[-1]
    tags = {"pipeline": relative.parts[0], "method": method, "stage": f"{method}-{seed}" if seed else method}
    world_size = (info.get("config") or {}).get("world_size") or final.get("world_size")
    if world_size:
        tags["world_size"] = str(int(world_size))
    if stage is not None:
        tags["dvc_stage"] = stage.name
        if stage.scale:
            tags["scale"] = stage.scale
    return tags
