"""The layout rules of STYLE.md that a machine can check."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from trainer.paths import REPO_ROOT


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


# What each top-level package may never import: the arrows run pipelines -> papers -> harness ->
# trainer -> common -> kernels, one way.
FORBIDDEN = {
    "common": {"trainer", "harness", "papers", "pipelines", "benchmarks", "tests"},
    "kernels": {"trainer", "harness", "papers", "pipelines", "benchmarks", "tests"},
    "trainer": {"harness", "papers", "pipelines", "benchmarks", "tests"},
    "harness": {"papers", "pipelines", "benchmarks", "tests"},
    "papers": {"pipelines", "benchmarks", "tests"},
}


def test_each_package_imports_only_below_it():
    offenders = [
        f"{path.relative_to(REPO_ROOT)} imports {sorted(bad)}"
        for package, forbidden in FORBIDDEN.items()
        for path in (REPO_ROOT / package).rglob("*.py")
        if (bad := _imports(path) & forbidden)
    ]
    assert offenders == []


def test_a_paper_never_imports_another_paper():
    """Code two papers need lives in common/, trainer/ or harness/; a paper imports only its own
    folder."""
    offenders = []
    for path in sorted((REPO_ROOT / "papers").rglob("*.py")):
        parts = path.relative_to(REPO_ROOT / "papers").parts
        if len(parts) < 2:
            continue  # papers/__init__.py
        own = parts[0]
        others = {
            name.split(".")[1]
            for name in _module_imports(path, REPO_ROOT)
            if name.startswith("papers.") and name.split(".")[1] != own
        }
        if others:
            offenders.append(f"{path.relative_to(REPO_ROOT)} imports papers {sorted(others)}")
    assert offenders == []


def test_library_never_prints():
    offenders = []
    for package in ("common", "trainer", "kernels"):
        for path in (REPO_ROOT / package).rglob("*.py"):
            tree = ast.parse(path.read_text())
            for node in ast.walk(tree):
                if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "print":
                    offenders.append(f"{path.relative_to(REPO_ROOT)}:{node.lineno}")
    assert offenders == [], "library code logs, never prints"


TRAINERS = ("pipelines.launch", "pipelines.leaderboard", "pipelines.calibrate")


def test_every_stage_that_trains_depends_on_the_library_the_loop_the_harness_and_the_kernels():
    """A fix in common/, trainer/ (the loop, data sets, models), harness/ (the launcher's network
    emulation and run lock) or kernels/ must rerun every stage whose numbers it can change."""
    import yaml

    offenders = []
    for path in [REPO_ROOT / "dvc.yaml", *sorted((REPO_ROOT / "pipelines").glob("*/dvc.yaml"))]:
        for name, stage in yaml.safe_load(path.read_text())["stages"].items():
            stage = stage.get("do", stage)
            if not any(trainer in stage["cmd"] for trainer in TRAINERS):
                continue
            deps = stage.get("deps", [])
            if not {"common", "trainer", "harness", "kernels"} <= set(deps):
                offenders.append(f"{path.relative_to(REPO_ROOT)}:{name}")
    assert offenders == []


def _paper_files(module: str) -> set[Path]:
    """The file of ``module`` and of every module under papers/ it imports, transitively."""
    seen: set[Path] = set()
    todo = [module]
    while todo:
        base = REPO_ROOT.joinpath(*todo.pop().split("."))
        path = base.with_suffix(".py") if base.with_suffix(".py").is_file() else base / "__init__.py"
        if path not in seen:
            seen.add(path)
            todo.extend(m for m in _module_imports(path, REPO_ROOT) if m.startswith("papers."))
    return seen


def _named_strategies(node: object) -> set[str]:
    """Every ``strategy:`` value in a loaded params file (anchors and merges resolved)."""
    if isinstance(node, dict):
        found = {node["strategy"]} if isinstance(node.get("strategy"), str) else set()
        return found.union(*(_named_strategies(value) for value in node.values()))
    if isinstance(node, list):
        return set().union(*(_named_strategies(value) for value in node))
    return set()


def test_every_stage_that_launches_a_papers_strategy_depends_on_its_code():
    """A run naming a paper's strategy (``"module:attribute"`` in common.methods.STRATEGIES, e.g.
    MATCHA's gossip) imports that paper's module and what it imports under papers/: the stage that
    launches it must rerun when they change. (Sparse AxoNN picks its strategies in its own code,
    not in params.yaml; its train stage lists them by hand.)"""
    import re

    import yaml

    from common.methods import STRATEGIES

    offenders = []
    for path in [REPO_ROOT / "dvc.yaml", *sorted((REPO_ROOT / "pipelines").glob("*/dvc.yaml"))]:
        for name, stage in yaml.safe_load(path.read_text())["stages"].items():
            stage = stage.get("do", stage)
            launched = re.search(r"pipelines\.launch (\w+)", stage["cmd"])
            if launched is None:
                continue
            params = yaml.safe_load((REPO_ROOT / "pipelines" / launched[1] / "params.yaml").read_text())
            deps = [REPO_ROOT / dep for dep in stage.get("deps", [])]
            for strategy in sorted(_named_strategies(params)):
                entry = STRATEGIES.get(strategy)
                if not isinstance(entry, str):
                    continue  # the library's own: the stage depends on common/
                for file in sorted(_paper_files(entry.partition(":")[0])):
                    if not any(file == dep or file.is_relative_to(dep) for dep in deps):
                        offenders.append(
                            f"{path.relative_to(REPO_ROOT)}:{name} misses {file.relative_to(REPO_ROOT)}"
                        )
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


def _module_imports(path: Path, package_root: Path) -> set[str]:
    """Modules of this repository that ``path`` imports (absolute or relative, TYPE_CHECKING and
    function-level imports included: an arrow is an arrow), as dotted names."""
    module = ".".join(path.relative_to(package_root).with_suffix("").parts)
    package = module.rsplit(".", 1)[0] if path.name != "__init__.py" else module.removesuffix(".__init__")
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            submodules = [f"{target}.{alias.name}" for alias in node.names]
            named = [m for m in submodules if _is_module(package_root, m)]
            # ``from pkg import submodule`` is an arrow to the submodule; any other name, to pkg
            candidates = named + ([target] if len(named) < len(submodules) else [])
        elif isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        else:
            continue
        found.update(name for name in candidates if _is_module(package_root, name))
    return found


def _is_module(package_root: Path, name: str) -> bool:
    file = package_root.joinpath(*name.split("."))
    return file.with_suffix(".py").is_file() or (file / "__init__.py").is_file()


def _circles(folder: str) -> list[list[str]]:
    """Import circles among the modules under ``folder`` (strongly connected components of more
    than one module, or a module importing itself)."""
    root = REPO_ROOT
    modules = {
        ".".join(p.relative_to(root).with_suffix("").parts).removesuffix(".__init__"): p
        for p in (root / folder).rglob("*.py")
    }
    edges = {m: {t for t in _module_imports(p, root) if t in modules and t != m} for m, p in modules.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in edges[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for module in sorted(modules):
        if module not in index:
            visit(module)
    return circles


def test_gradient_syncs_routes_import_no_circle():
    """GradientSync imports its routes and the routes import only what is below them
    (common/comm/routes/base.py), never sync.py: no circle in common/comm."""
    assert _circles("common/comm") == []


def test_the_library_imports_no_circle():
    """The run's plain data (config.py, options.py, checks.py) imports nothing above it; the
    registries' checks of a run live in methods.py, which imports the strategies."""
    assert _circles("common") == []


def test_the_training_loop_imports_no_circle():
    """trainer/: its run checks (checks.py) import the data and model registries and common's
    methods, never the loop's assembly."""
    assert _circles("trainer") == []


def test_config_and_options_import_nothing_above_them():
    from trainer.paths import REPO_ROOT as root

    for name in ("config", "options", "checks"):
        imported = _module_imports(root / "common" / f"{name}.py", root)
        assert imported <= {"common.checks", "common.registry"}, (
            f"common/{name}.py imports {sorted(imported)}"
        )


def test_gradient_syncs_routes_never_import_sync():
    """Each route (common/comm/routes/) sees GradientSync only through the RouteHost protocol."""
    for path in sorted((REPO_ROOT / "common/comm/routes").glob("*.py")):
        assert "common.comm.sync" not in _module_imports(path, REPO_ROOT), path


def test_harness_and_papers_import_no_circle():
    assert _circles("harness") == []
    assert _circles("papers") == []


@pytest.mark.parametrize("package", ["common", "trainer"])
def test_tests_mirror_the_library_and_the_loop(package):
    """tests/<package>/<pkg>/ tests <package>/<pkg>/; a module at tests/<package>/ tests a module at
    <package>/ (common/: the library; trainer/: the loop).

    A test folder that names no package (a typo, a package that moved) fails here, and no test of
    the library or of the loop imports a paper, the harness or a pipeline.
    """
    tests_root = REPO_ROOT / "tests" / package
    folders = sorted(p.name for p in tests_root.iterdir() if p.is_dir() and p.name != "__pycache__")
    missing = [name for name in folders if not (REPO_ROOT / package / name / "__init__.py").is_file()]
    assert missing == [], f"tests/{package}/ folders with no {package}/<folder>/ package: {missing}"
    offenders = [
        f"{path.relative_to(REPO_ROOT)} imports {sorted(bad)}"
        for path in sorted(tests_root.rglob("*.py"))
        if (bad := _imports(path) & {"papers", "harness", "pipelines"})
    ]
    assert offenders == []


def test_library_modules_and_functions_stay_small():
    """STYLE.md: a module past ~400 lines or a function past ~60 is asking to be split. In common/
    and trainer/ none is; one that must be says why in a comment ``# long: <why>`` on its ``def``
    line."""
    long_modules, long_functions = [], []
    paths = [*(REPO_ROOT / "common").rglob("*.py"), *(REPO_ROOT / "trainer").rglob("*.py")]
    for path in sorted(paths):
        lines = path.read_text().splitlines()
        name = str(path.relative_to(REPO_ROOT))
        if len(lines) > 400:
            long_modules.append(f"{name}: {len(lines)} lines")
        for node in ast.walk(ast.parse("\n".join(lines))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno is not None:
                size = node.end_lineno - node.lineno + 1
                if size > 60 and "# long:" not in lines[node.lineno - 1]:
                    long_functions.append(f"{name}:{node.lineno} {node.name}: {size} lines")
    assert long_modules == [] and long_functions == [], (long_modules, long_functions)
