"""Every command, module, flag, path and link that README.md and docs/*.md name exists.

A page drifts when the code moves under it (a module renamed, a flag dropped, a make target
changed). This reads each page's shell and Python code blocks and its inline code, outside the
generated blocks (``tests/test_readme.py`` holds those to their reports), and checks without
running anything:

- ``python -m M`` / ``torchrun ... -m M``: M is a module of the repository (or an installed
  package); ``python path.py`` / ``torchrun ... path.py``: the file exists;
- each ``--flag`` after a repository module or script appears as a string in its source (also in
  ``name.py --flag``, a script of ``examples/`` named alone);
- ``python -m pipelines.launch|train P R1,R2``: ``pipelines/P/params.yaml`` has runs R1 and R2;
- ``make T``: T is a target of the Makefile; ``dvc repro -s S``: S is a stage of ``dvc.yaml``;
- a path under a top-level entry of the repository (``common/...``, ``results/...``, ``Makefile``)
  exists, ``<placeholders>`` and ``{a,b}`` read as globs; ``file.py: Name``: Name is in the file;
- ``common.x.y`` / ``kernels.x.y``: the module exists and defines or imports y;
- ``from M import a, b`` in a Python block: M exists and names a and b;
- a relative link resolves, and its ``#anchor`` is a heading of the page it points to;
- the leaderboard tables in ``docs/leaderboard.md`` equal ``results/leaderboard/report.json``, and
  README.md's verdict counts per paper equal ``results/summary.md``'s.
"""

from __future__ import annotations

import ast
import importlib.util
import itertools
import json
import re
import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent

#: Git-ignored things a command makes (the venv, caches, hand runs' outputs): never in a checkout.
MADE_AT_RUN_TIME = {".venv", ".cache", "artifacts", "scratch", "mlflow.db", "mlruns", "mlartifacts"}
#: Packages of the repository: a dotted name under one of them must resolve to its source.
PACKAGES = {
    "common",
    "trainer",
    "kernels",
    "papers",
    "pipelines",
    "benchmarks",
    "examples",
    "tests",
    "harness",
}
#: torchrun options that take no value (every other option before the script takes one).
TORCHRUN_SWITCHES = {"--standalone", "--no-python", "--no_python", "--run-path", "--run_path"}
DVC_COMMANDS = {"repro", "status", "metrics", "params", "plots", "dag", "config", "pull", "push", "exp", "gc"}
#: Options whose value names something the command makes, not something that must exist.
OUTPUT_OPTIONS = {"--out", "--listing"}

START = re.compile(r'^<!-- from \S+ "#+ [^"]+" -->$')
END = "<!-- end -->"
FENCE = re.compile(r"^```(\w*)\s*$")
SPAN = re.compile(r"`([^`]+)`")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
DOTTED = re.compile(r"^((?:" + "|".join(sorted(PACKAGES)) + r")(?:\.[A-Za-z_]\w*)+)")
NAMED_IN_FILE = re.compile(r"^([\w./-]+\.py): ([A-Za-z_]\w*)$")


def pages(root: Path = REPO) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


class Page:
    """One markdown page split into what the checks read: its prose (with line numbers), its
    code blocks and its headings; generated blocks are left out."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.prose: list[tuple[int, str]] = []  # (line number, text) outside code blocks
        self.blocks: list[tuple[int, str, str]] = []  # (first line, language, text)
        self.headings: list[str] = []
        lang, block, first, generated = None, [], 0, False
        for number, line in enumerate(path.read_text().splitlines(), 1):
            fence = FENCE.match(line)
            if lang is not None:
                if line.startswith("```"):
                    self.blocks.append((first, lang, "\n".join(block)))
                    lang = None
                else:
                    block.append(line)
                continue
            if fence:
                lang, block, first = fence.group(1), [], number + 1
                continue
            if line.startswith("#"):
                self.headings.append(line.lstrip("#").strip())
            if START.match(line):
                generated = True
            elif line == END:
                generated = False
            elif not generated:
                self.prose.append((number, line))

    def spans(self) -> Iterator[tuple[int, str]]:
        """Inline code spans (one may wrap over lines), whitespace collapsed."""
        text = "\n".join(line for _, line in self.prose)
        numbers = [number for number, _ in self.prose]
        for match in SPAN.finditer(text):
            yield numbers[text.count("\n", 0, match.start())], " ".join(match.group(1).split())

    def links(self) -> Iterator[tuple[int, str]]:
        for number, line in self.prose:
            for match in LINK.finditer(SPAN.sub("", line)):
                yield number, match.group(1)


def shell_lines(text: str, first: int) -> Iterator[tuple[int, str]]:
    """A shell block's commands, a backslash-continued one joined, each with the number of its
    first line; comments dropped."""
    number, joined = first, ""
    for offset, line in enumerate(text.splitlines()):
        if not joined:
            number = first + offset
        line = re.sub(r"(^|\s)#.*$", "", line)
        if line.rstrip().endswith("\\"):
            joined += line.rstrip()[:-1] + " "
            continue
        yield number, joined + line
        joined = ""
    if joined:
        yield number, joined


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.lower().replace("`", ""))
    return text.replace(" ", "-")


class Checker:
    """The checks, against the repository at ``root``; each returns a list of problems."""

    def __init__(self, root: Path = REPO) -> None:
        self.root = root
        self.top = {p.name for p in root.iterdir()} - {".git"}
        makefile = root / "Makefile"
        self.targets = (
            set(re.findall(r"^([\w.-]+)\s*:(?!=)", makefile.read_text(), re.M))
            if makefile.exists()
            else set()
        )
        stages = (
            yaml.safe_load((root / "dvc.yaml").read_text())["stages"] if (root / "dvc.yaml").exists() else {}
        )
        self.stages = set(stages)

    # -- modules and sources ------------------------------------------------------------------
    def module_file(self, module: str, run: bool = False) -> Path | None:
        """The source of a repository module (a package's ``__main__.py`` when ``run``)."""
        base = self.root.joinpath(*module.split("."))
        candidates = [base / "__main__.py"] if run else [base.with_suffix(".py"), base / "__init__.py"]
        if run:
            candidates.insert(0, base.with_suffix(".py"))
        return next((p for p in candidates if p.is_file()), None)

    def check_module(self, module: str, run: bool = False) -> tuple[list[str], Path | None]:
        if module.split(".")[0] in PACKAGES:
            source = self.module_file(module, run)
            return ([] if source else [f"module {module} not found in the repository"]), source
        if importlib.util.find_spec(module.split(".")[0]) is None:
            return [f"module {module} is not installed"], None
        return [], None

    def check_dotted(self, dotted: str) -> list[str]:
        """``trainer.precision.autocast``: the longest module prefix, then the next name in it."""
        parts = dotted.split(".")
        for n in range(len(parts), 0, -1):
            source = self.module_file(".".join(parts[:n]))
            if source:
                if n == len(parts) or re.search(rf"\b{re.escape(parts[n])}\b", source.read_text()):
                    return []
                return [f"{'.'.join(parts[:n])} ({source.relative_to(self.root)}) has no {parts[n]!r}"]
        return [f"module {dotted} not found in the repository"]

    def check_flags(self, flags: list[str], source: Path | None, what: str) -> list[str]:
        if source is None:
            return []
        text = source.read_text()
        return [
            f"{what} has no option {flag} (not in {source.relative_to(self.root)})"
            for flag in flags
            if f'"{flag}"' not in text and f"'{flag}'" not in text
        ]

    # -- paths ----------------------------------------------------------------------------------
    def is_path(self, token: str) -> bool:
        first = token.split("/")[0]
        return bool(token) and first in self.top and first not in MADE_AT_RUN_TIME and " " not in token

    def check_path(self, token: str) -> list[str]:
        token = token.rstrip(".,;:)").split("|")[0].split("#")[0]
        token = re.sub(r"(dvc\.yaml):[\w@.-]+$", r"\1", token)  # a DVC stage address: its file
        if not self.is_path(token):
            return []
        pattern = re.sub(r"<[^>]*>", "*", token)
        options = re.findall(r"\{([^}]*)\}", pattern)
        template = re.sub(r"\{[^}]*\}", "{}", pattern)
        for choice in itertools.product(*(o.split(",") for o in options)):
            path = template.format(*choice)
            found = list(self.root.glob(path.rstrip("/"))) if path.rstrip("/") else [self.root]
            if path.endswith("/"):
                found = [p for p in found if p.is_dir()]
            if not found:
                return [f"path {token} does not exist"]
        return []

    # -- commands -------------------------------------------------------------------------------
    def check_command(self, command: str) -> list[str]:
        try:
            tokens = shlex.split(command)
        except ValueError as err:
            return [f"cannot parse {command!r}: {err}"]
        while tokens and re.match(r"^[A-Z_][A-Z0-9_]*=", tokens[0]):
            tokens.pop(0)
        if not tokens:
            return []
        program, args = tokens[0].rsplit("/", 1)[-1], tokens[1:]
        problems = [p for token in self.path_arguments(args) for p in self.check_path(token)]
        if program in ("python", "python3"):
            problems += self.check_python(args)
        elif program == "torchrun":
            problems += self.check_torchrun(args)
        elif program == "make":
            problems += [
                f"make target {t!r} is not in the Makefile"
                for t in args
                if not t.startswith("-") and t not in self.targets
            ]
        elif program == "dvc":
            problems += self.check_dvc(args)
        elif program in ("bash", "sh", "pytest"):
            problems += [
                f"path {a} does not exist"
                for a in args[:1]
                if not a.startswith("-") and not (self.root / a).exists()
            ]
        return problems

    @staticmethod
    def path_arguments(args: list[str]) -> Iterator[str]:
        skip = False
        for token in args:
            if not skip and not token.startswith("-"):
                yield token
            skip = token in OUTPUT_OPTIONS

    def check_python(self, args: list[str]) -> list[str]:
        if len(args) >= 2 and args[0] == "-m":
            return self.check_run(args[1], args[2:], module=True)
        if args and args[0].endswith(".py"):
            return self.check_run(args[0], args[1:], module=False)
        return []

    def check_torchrun(self, args: list[str]) -> list[str]:
        i = 0
        while i < len(args):
            token = args[i]
            if token == "-m" and i + 1 < len(args):
                return self.check_run(args[i + 1], args[i + 2 :], module=True)
            if not token.startswith("-"):
                return self.check_run(token, args[i + 1 :], module=False) if token.endswith(".py") else []
            i += 1 if token in TORCHRUN_SWITCHES or "=" in token else 2
        return []

    def check_run(self, target: str, args: list[str], module: bool) -> list[str]:
        if module:
            problems, source = self.check_module(target, run=True)
        else:
            source = self.root / target if self.is_path(target) else None
            if source is not None and not source.is_file():
                return []  # the path check names it
            problems = []
        flags = [a.split("=")[0] for a in args if a.startswith("--")]
        problems += self.check_flags(flags, source, target)
        if module and target in ("pipelines.launch", "pipelines.train"):
            problems += self.check_runs(args)
        return problems

    def check_runs(self, args: list[str]) -> list[str]:
        """``pipelines.launch P R1,R2``: P's params.yaml has those runs."""
        positional = list(itertools.takewhile(lambda a: not a.startswith("-"), args))
        if (
            len(positional) < 2
            or any(c in positional[0] + positional[1] for c in "</$")
            or positional[0].isupper()
        ):
            return []
        params = self.root / "pipelines" / positional[0] / "params.yaml"
        if not params.is_file():
            return [f"pipeline {positional[0]!r} has no pipelines/{positional[0]}/params.yaml"]
        runs = yaml.safe_load(params.read_text()).get("runs") or {}
        return [
            f"{params.relative_to(self.root)} has no run {run!r}"
            for run in positional[1].split(",")
            if run not in runs
        ]

    def check_dvc(self, args: list[str]) -> list[str]:
        if not args:
            return []
        if args[0] not in DVC_COMMANDS:
            return [f"dvc {args[0]}: not a dvc command this project uses ({', '.join(sorted(DVC_COMMANDS))})"]
        problems = []
        for flag, value in itertools.pairwise(args):
            if flag == "-s" and ":" not in value and value not in self.stages:
                problems.append(
                    f"dvc.yaml has no stage {value!r} (its stages: {', '.join(sorted(self.stages))})"
                )
        return problems

    # -- inline code and Python blocks ----------------------------------------------------------
    def check_span(self, span: str) -> list[str]:
        if re.match(r"^([A-Z_][A-Z0-9_]*=\S* )*(\S*/)?(python3?|torchrun|make|dvc|pytest|bash) ", span + " "):
            return self.check_command(span)
        short = re.match(r"^([\w-]+\.py) --", span)
        if short and (self.root / "examples" / short.group(1)).is_file():  # the method table's column
            return self.check_command(f"python examples/{span}")
        named = NAMED_IN_FILE.match(span)
        if named:
            path, name = named.groups()
            problems = self.check_path(path)
            if (
                not problems
                and self.is_path(path)
                and not re.search(rf"\b{name}\b", (self.root / path).read_text())
            ):
                problems.append(f"{path} has no {name!r}")
            return problems
        dotted = DOTTED.match(span)
        if dotted and "/" not in span:
            return self.check_dotted(dotted.group(1))
        span = re.sub(r"<[^>]*>", lambda m: m.group(0).replace(" ", "_"), span)  # <folder name>
        return [p for token in span.split() for p in self.check_path(token)]

    def check_python_block(self, text: str) -> list[tuple[int, str]]:
        """Its imports, as (line in the block from 0, problem)."""
        try:
            tree = ast.parse(text)
        except SyntaxError as err:
            return [(0, f"Python block does not parse: {err}")]
        problems = []
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                found, source = self.check_module(node.module)
                problems += [(node.lineno - 1, p) for p in found]
                for alias in node.names if source is not None else ():
                    submodule = self.module_file(f"{node.module}.{alias.name}")
                    if not submodule and not re.search(rf"\b{alias.name}\b", source.read_text()):
                        where = f"{node.module} ({source.relative_to(self.root)})"
                        problems.append((node.lineno - 1, f"{where} has no {alias.name!r}"))
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    problems += [(node.lineno - 1, p) for p in self.check_module(alias.name)[0]]
        return problems

    def check_link(self, page: Path, target: str) -> list[str]:
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):
            return []
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            return [f"link {target} points at nothing"]
        headings = Page(linked).headings if anchor and linked.suffix == ".md" else []
        if headings and anchor not in {slug(h) for h in headings}:
            return [f"link {target}: {linked.name} has no heading with anchor #{anchor}"]
        return []

    def check_page(self, path: Path) -> list[str]:
        page = Page(path)
        problems: list[tuple[int, str]] = []
        for first, lang, text in page.blocks:
            if lang in ("bash", "sh", "console"):
                for number, line in shell_lines(text, first):
                    for command in re.split(r"&&|\|\||;|\|", line):
                        problems += [(number, p) for p in self.check_command(command.strip())]
            elif lang == "python":
                problems += [(first + offset, p) for offset, p in self.check_python_block(text)]
        problems += [(n, p) for n, span in page.spans() for p in self.check_span(span)]
        problems += [(n, p) for n, target in page.links() for p in self.check_link(path, target)]
        name = path.relative_to(self.root)
        return [f"{name}:{n}: {p}" for n, p in sorted(problems)]


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_command_path_and_link_a_page_names_exists(page):
    assert page.exists()
    assert Checker().check_page(page) == []


def test_the_checker_finds_what_does_not_exist(tmp_path):
    (tmp_path / "Makefile").write_text("VENV ?= .venv\nrepro: setup\n\tdvc repro\nsetup:\n")
    (tmp_path / "dvc.yaml").write_text("stages:\n  calibrate:\n    cmd: x\n")
    (tmp_path / "pipelines" / "suite").mkdir(parents=True)
    (tmp_path / "pipelines" / "__init__.py").write_text("")
    (tmp_path / "pipelines" / "launch.py").write_text('parser.add_argument(\n    "--scale")\nadd("--out")\n')
    (tmp_path / "pipelines" / "suite" / "params.yaml").write_text("runs:\n  mnist_fp32: {}\n")
    (tmp_path / "common").mkdir()
    (tmp_path / "examples").mkdir()
    (tmp_path / "examples" / "ex.py").write_text('add("--steps")\n')
    (tmp_path / "common" / "__init__.py").write_text("from .comm import install_ddp_hook\n")
    (tmp_path / "common" / "precision.py").write_text("def compute_precision(): ...\n")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "other.md").write_text("# Other\n\n## A section's title\n")
    page = tmp_path / "docs" / "guide.md"
    page.write_text(
        "# Guide\n\n"
        "```bash\n"
        "make repro && make tests   # a comment: `make nothing`\n"
        "python -m pipelines.launch suite mnist_fp32,mnist_fp64 --scale smoke --seeds 0 \\\n"
        "    --out scratch/x\n"
        "python -m pipelines.gone\n"
        "dvc repro -s calibrate && dvc repro -s leaderboard\n"
        "torchrun --standalone --nproc_per_node 2 examples/missing.py --x 1\n"
        "```\n\n"
        "```python\n"
        "from common import install_ddp_hook, build_compressor\n"
        "```\n\n"
        "Inline: `common/precision.py`, `common/none.py`, `pipelines/<pipeline>/params.yaml`,\n"
        "`common/precision.py: compute_precision`, `common/precision.py: train`, `common.precision.compute_precision`,\n"
        "`common.precision.evaluate`, `ex.py --steps 3 --bogus`, `scratch/suite/` (made by a run), `.venv/bin/mlflow ui`, `density=0.01`.\n\n"
        '<!-- from results/x.md "## Y" -->\n`common/generated.py` is the report\'s\n<!-- end -->\n\n'
        "[ok](other.md#a-sections-title) [bad anchor](other.md#nothing) [gone](gone.md) "
        "[web](https://example.org) [here](#guide)\n"
    )
    assert Checker(tmp_path).check_page(page) == [
        "docs/guide.md:4: make target 'tests' is not in the Makefile",
        "docs/guide.md:5: pipelines.launch has no option --seeds (not in pipelines/launch.py)",
        "docs/guide.md:5: pipelines/suite/params.yaml has no run 'mnist_fp64'",
        "docs/guide.md:7: module pipelines.gone not found in the repository",
        "docs/guide.md:8: dvc.yaml has no stage 'leaderboard' (its stages: calibrate)",
        "docs/guide.md:9: path examples/missing.py does not exist",
        "docs/guide.md:13: common (common/__init__.py) has no 'build_compressor'",
        "docs/guide.md:16: path common/none.py does not exist",
        "docs/guide.md:17: common/precision.py has no 'train'",
        "docs/guide.md:18: common.precision (common/precision.py) has no 'evaluate'",
        "docs/guide.md:18: examples/ex.py has no option --bogus (not in examples/ex.py)",
        "docs/guide.md:24: link gone.md points at nothing",
        "docs/guide.md:24: link other.md#nothing: other.md has no heading with anchor #nothing",
    ]


def _leaderboard_cell(row: dict, kind: str) -> str:
    """A time-to-target cell as docs/leaderboard.md writes it, from one row of report.json."""
    if not row["within"]:
        return "not within 2x steps"
    return f"{row[f'{kind}_seconds']:.1f} s ({row['speedup']:.2f}x)"


def _leaderboard_steps(row: dict) -> str:
    """The steps-to-target cell: each seed's steps, "—" for a seed that never reached the target."""
    return ", ".join("—" if s is None else f"{s:.0f}" for s in row["steps_to_target"])


def test_the_leaderboard_tables_are_the_reports():
    """The hand-laid tables (per task: steps and time to target per rate) against report.json."""
    rows = json.loads((REPO / "results" / "leaderboard" / "report.json").read_text())["rows"]
    by_key = {(r["method"], r["task"], r["rate"]): r for r in rows}
    lines = (REPO / "docs" / "leaderboard.md").read_text().splitlines()
    tasks = {"MNIST": "mnist", "CIFAR-10": "cifar", "Shakespeare": "shakespeare"}
    rates = {"100 Mbit/s": "100mbit", "1 Gbit/s": "1gbit", "10 Gbit/s": "10gbit"}
    starts = [i for i, line in enumerate(lines) if line.startswith("| method | steps to target, per seed |")]
    seen: set[tuple[str, str, str]] = set()
    for start in starts:
        header = [c.strip() for c in lines[start].strip("|").split("|")]
        columns = []
        for cell in header[2:]:
            match = re.match(r"^(MNIST|CIFAR-10|Shakespeare) (100 Mbit/s|1 Gbit/s|10 Gbit/s)", cell)
            assert match, f"docs/leaderboard.md:{start + 1}: a column the check cannot read: {cell!r}"
            kind = "modelled" if "modelled" in cell else "measured"
            columns.append((tasks[match[1]], rates[match[2]], kind))
        for line in itertools.takewhile(lambda x: x.startswith("|"), lines[start + 2 :]):
            method, steps, *cells = [c.strip().replace("**", "") for c in line.strip("|").split("|")]
            for (task, rate, kind), cell in zip(columns, cells, strict=True):
                row = by_key[(method, task, rate)]
                expected = _leaderboard_cell(row, kind)
                assert cell == expected, (
                    f"docs/leaderboard.md: {method}, {task} at {rate}: {cell!r}, report.json: {expected!r}"
                )
                assert steps == _leaderboard_steps(row), (
                    f"docs/leaderboard.md: {method}, {task}: steps {steps!r}, report.json: "
                    f"{_leaderboard_steps(row)!r}"
                )
                seen.add((method, task, rate))
    missing = sorted(set(by_key) - seen)
    assert not missing, f"docs/leaderboard.md: report.json rows no table shows: {missing[:5]} ..."


def test_the_readmes_verdict_counts_are_the_summarys():
    """README.md's papers table counts each paper's verdicts as ``results/summary.md`` gives them."""
    summary = (REPO / "results" / "summary.md").read_text()
    section = summary.split("## Every claim", 1)[1].split("\n## ", 1)[0]
    counts: dict[str, list[int]] = {}
    undecidable: dict[str, int] = {}
    verdicts = ["**reproduced**", "**not reproduced**", "inconclusive"]
    for line in section.splitlines():
        paper = re.match(r"^\| (\w+): ", line)
        if paper:
            verdict = next(v for v in verdicts if f"| {v} |" in line)
            counts.setdefault(paper[1], [0, 0, 0])[verdicts.index(verdict)] += 1
        listed = re.match(r"^- (\w+): ", line)
        if listed:
            undecidable[listed[1]] = undecidable.get(listed[1], 0) + 1
    readme = (REPO / "README.md").read_text()
    shown = {
        m[1]: m[2]
        for m in re.finditer(r"^\| [^|]+ \| \[papers/(\w+)\][^|]*\|[^|]*\| ([^|]+) \|$", readme, re.M)
    }
    assert set(shown) == set(counts), (
        f"README.md's papers table: {sorted(shown)}, the summary: {sorted(counts)}"
    )
    for paper, (yes, no, open_) in counts.items():
        expected = f"{yes} / {no} / {open_}"
        if paper in undecidable:
            expected += f" (and {undecidable[paper]} no run here can decide)"
        assert shown[paper].strip() == expected, (
            f"README.md, {paper}: {shown[paper]!r}, results/summary.md: {expected!r}"
        )
