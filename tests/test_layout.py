"""The layout rules of STYLE.md that a machine can check."""

from __future__ import annotations

import ast
from pathlib import Path

from common.paths import REPO_ROOT


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_library_never_imports_papers_or_pipelines():
    offenders = [
        f"{path.relative_to(REPO_ROOT)} imports {sorted(bad)}"
        for package in ("common", "kernels")
        for path in (REPO_ROOT / package).rglob("*.py")
        if (bad := _imports(path) & {"papers", "pipelines", "benchmarks", "tests"})
    ]
    assert offenders == []


def test_library_never_prints():
    offenders = []
    for package in ("common", "kernels"):
        for path in (REPO_ROOT / package).rglob("*.py"):
            tree = ast.parse(path.read_text())
            for node in ast.walk(tree):
                if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "print":
                    offenders.append(f"{path.relative_to(REPO_ROOT)}:{node.lineno}")
    assert offenders == [], "library code logs, never prints"


TRAINERS = ("pipelines.launch", "pipelines.leaderboard", "pipelines.calibrate")


def test_every_stage_that_trains_depends_on_the_library_and_its_kernels():
    """A fix in common/ or kernels/ must rerun every stage whose numbers it can change."""
    import yaml

    offenders = []
    for path in [REPO_ROOT / "dvc.yaml", *sorted((REPO_ROOT / "pipelines").glob("*/dvc.yaml"))]:
        for name, stage in yaml.safe_load(path.read_text())["stages"].items():
            stage = stage.get("do", stage)
            if not any(trainer in stage["cmd"] for trainer in TRAINERS):
                continue
            deps = stage.get("deps", [])
            if "common" not in deps or not any(d == "kernels" or d.startswith("kernels/") for d in deps):
                offenders.append(f"{path.relative_to(REPO_ROOT)}:{name}")
    assert offenders == []


def test_every_stage_that_launches_runs_names_its_results_folder():
    """pipelines.launch without --out writes to the git-ignored scratch/ (hand runs): a stage must
    say where under results/ its runs go."""
    import yaml

    offenders = []
    for path in [REPO_ROOT / "dvc.yaml", *sorted((REPO_ROOT / "pipelines").glob("*/dvc.yaml"))]:
        for name, stage in yaml.safe_load(path.read_text())["stages"].items():
            cmd = stage.get("do", stage)["cmd"]
            if "pipelines.launch" in cmd and "--out results/" not in cmd:
                offenders.append(f"{path.relative_to(REPO_ROOT)}:{name}")
    assert offenders == []
