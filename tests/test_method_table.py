"""Every row of the method table in docs/library.md runs as printed.

The section "Every method in your own loop, in two lines" gives, per method, the lines a user puts
in their own script. This reads the table's "two lines" cells and the import lines of the section's
Python blocks, and runs each row's code exactly as printed in a user's loop (the section's: set the
epoch, zero the gradients, backward, ``optimizer.step()``, evaluate inside ``evaluating``) on 2 gloo
ranks, real MNIST, a small CNN and a few steps. A row whose code breaks (a renamed class or
argument, a name not importable from where the page says, an option the strategy refuses) fails
here.

A cell's code spans that are statements (an assignment or a call; the rest is prose: an option's
name, a fragment) are the row's lines. Those that name ``model`` or ``ddp_model`` are ways of
training, each run on its own (DGC's ``install`` on DDP or ``optimizer`` on the plain module); the
others build what they use. ``ddp_model`` is the model wrapped in DDP; a span that gives no optimizer (a comm hook)
trains with the user's own SGD. The sparse AxoNN row's ``masks.pt`` is made by the section's own
recipe (the block that writes it).
"""

from __future__ import annotations

import ast
import contextlib
import math
import os
import re
from dataclasses import dataclass

import pytest
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from common.strategies import SyncStrategy
from tests.distributed import run_ranks
from trainer.data import load_dataset
from trainer.paths import REPO_ROOT

PAGE = REPO_ROOT / "docs" / "library.md"
SECTION = "## Every method in your own loop, in two lines"
#: The methods the issue asks the table to cover (a row's first cell starts with one of them).
METHODS = (
    *("TernGrad", "QSGD", "top-k", "PowerSGD", "signSGD", "DGC", "DEF", "DEF-A", "ExDyna", "MATCHA"),
    "sparse AxoNN",
)
MODEL_NAMES = {"model", "ddp_model"}
STEPS = 16  # batches of 64 per rank: enough to leave the untrained model's accuracy behind
EVAL_IMAGES = 1000


@dataclass(frozen=True)
class Variant:
    """One way a row trains: the spans that build (``setup``) and the one that trains (``use``)."""

    method: str
    setup: tuple[str, ...]
    use: str
    own_optimizer: str | None = None  # the user's optimizer after a comm hook, where the row gives it

    @property
    def id(self) -> str:
        return f"{self.method.split(' (')[0]}: {self.use}"


def section(text: str) -> str:
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    return text[start : end if end >= 0 else len(text)]


def python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", text, re.M | re.S)


def imports(text: str) -> str:
    """The import statements of the section's Python blocks, one per line."""
    found = []
    for block in python_blocks(text):
        tree = ast.parse(block)
        found += [ast.unparse(node) for node in tree.body if isinstance(node, ast.Import | ast.ImportFrom)]
    return "\n".join(dict.fromkeys(found))


def masks_recipe(text: str) -> str:
    """The statements (not imports) of the section's block that writes ``masks.pt``."""
    blocks = [b for b in python_blocks(text) if "masks.pt" in b]
    assert blocks, (
        f"{PAGE.name}: no Python block of the section makes masks.pt (the sparse AxoNN row loads it)"
    )
    tree = ast.parse(blocks[0])
    return "\n".join(ast.unparse(n) for n in tree.body if not isinstance(n, ast.Import | ast.ImportFrom))


def cells(line: str) -> list[str]:
    """A table row's cells; a ``|`` inside a code span does not split."""
    parts, current, in_code = [], "", False
    for char in line.strip().strip("|"):
        if char == "`":
            in_code = not in_code
        if char == "|" and not in_code:
            parts.append(current.strip())
            current = ""
        else:
            current += char
    return [*parts, current.strip()]


def names(code: str, context: type[ast.expr_context] = ast.expr_context) -> set[str]:
    """The names ``code`` reads or binds (``context``: ``ast.Load`` for those it reads only)."""
    return {n.id for n in ast.walk(ast.parse(code)) if isinstance(n, ast.Name) and isinstance(n.ctx, context)}


def is_line(span: str) -> bool:
    """A code span that is a line of a script (an assignment or a call), not a name or a fragment
    quoted in the cell's prose."""
    try:
        body = ast.parse(span).body
    except SyntaxError:
        return False
    line = body[0] if len(body) == 1 else None
    return isinstance(line, ast.Assign) or (isinstance(line, ast.Expr) and isinstance(line.value, ast.Call))


def table_variants(text: str) -> list[Variant]:
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| method | two lines |"))
    variants = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        method, two_lines, *_ = cells(line)
        spans = [span for span in re.findall(r"`([^`]+)`", two_lines) if is_line(span)]
        setup = tuple(s for s in spans if not names(s) & MODEL_NAMES)
        row: list[Variant] = []
        for span in (s for s in spans if names(s) & MODEL_NAMES):
            if is_own_optimizer(span) and row and row[-1].own_optimizer is None:
                row[-1] = Variant(method, setup, row[-1].use, span)  # goes with the hook before it
            else:
                row.append(Variant(method, setup, span))
        assert row, f"{PAGE.name}: the {method} row has no line that takes model or ddp_model"
        variants += row
    return variants


def is_own_optimizer(span: str) -> bool:
    """``optimizer = torch.optim.X(...)``: the user's own optimizer, not a strategy's."""
    return bool(re.match(r"^optimizer = torch\.optim\.\w+\(", span))


TEXT = section(PAGE.read_text())
VARIANTS = table_variants(TEXT)


def small_cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 16, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10),
    )  # fmt: skip


def _untrained_accuracy() -> float:
    torch.manual_seed(0)
    model = small_cnn()
    x, y = load_dataset("mnist", "test").get_batch(torch.arange(EVAL_IMAGES))
    with torch.no_grad():
        return float((model(x).argmax(1) == y).float().mean())


#: The ranks' model before its first step, on the images they evaluate (about chance, 0.1).
UNTRAINED = _untrained_accuracy()


def _train_row(rank: int, world: int, variant: Variant, header: str, folder: str) -> dict:
    """The row's lines in the section's loop, in ``folder`` (where masks.pt is)."""
    here = os.getcwd()
    os.chdir(folder)
    try:
        torch.manual_seed(0)
        model = small_cnn()
        space: dict = {"model": model}
        exec(header, space)  # the page's imports, nothing else
        if "ddp_model" in names(variant.use):
            space["ddp_model"] = DistributedDataParallel(model)
        for line in variant.setup:
            exec(line, space)
        tree = ast.parse(variant.use)
        if isinstance(tree.body[0], ast.Expr):
            made = eval(variant.use, space)
        else:
            exec(variant.use, space)
            made = space.get("optimizer")
        optimizer = made if isinstance(made, torch.optim.Optimizer) else None
        if optimizer is None and variant.own_optimizer is not None:  # the row's, after its hook
            exec(variant.own_optimizer, space)
            optimizer = space["optimizer"]
        if optimizer is None:  # a comm hook: the user's own optimizer (examples/ddp_hook_mnist.py's)
            optimizer = torch.optim.SGD(space["ddp_model"].parameters(), lr=0.05, momentum=0.9)
        strategy = next((v for v in space.values() if isinstance(v, SyncStrategy)), None)
        net = space.get("ddp_model", model) if "ddp_model" in names(variant.use) else model
        return _loop(rank, world, net, model, optimizer, strategy)
    finally:
        os.chdir(here)


def _loop(
    rank: int, world: int, net: nn.Module, model: nn.Module, optimizer: torch.optim.Optimizer, strategy
) -> dict:
    train = load_dataset("mnist", "train")
    steps_per_epoch = len(train) // (64 * world)
    losses = []
    for step in range(STEPS):
        order = torch.randperm(len(train), generator=torch.Generator().manual_seed(step))
        x, y = train.get_batch(order[rank * 64 : (rank + 1) * 64])
        if strategy is not None:
            strategy.set_epoch(step / steps_per_epoch)
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(net(x), y)
        loss.backward()
        optimizer.step()
        losses.append(float(loss))
    test = load_dataset("mnist", "test")
    evaluating = strategy.evaluating(model) if strategy is not None else contextlib.nullcontext()
    with torch.no_grad(), evaluating:
        x, y = test.get_batch(torch.arange(rank, EVAL_IMAGES, world))
        correct = torch.tensor([float((model(x).argmax(1) == y).sum()), float(len(y))])
    torch.distributed.all_reduce(correct)
    return {"losses": losses, "accuracy": float(correct[0] / correct[1])}


def test_the_table_has_every_method_and_the_page_imports_its_names():
    found = {v.method for v in VARIANTS}
    missing = [m for m in METHODS if not any(f.startswith(m) for f in found)]
    assert missing == [], f"{PAGE.name}: the method table has no row for {missing}"
    space: dict = {}
    exec(imports(TEXT), space)
    known = set(space) | MODEL_NAMES | set(dir(__builtins__))
    unknown = set()
    for v in VARIANTS:  # what a row reads that it does not bind itself
        lines = (*v.setup, v.use)
        bound = set().union(*(names(line, ast.Store) for line in lines))
        unknown |= set().union(*(names(line, ast.Load) for line in lines)) - bound - known
    unknown = sorted(unknown)
    assert unknown == [], f"{PAGE.name}: the table uses {unknown}, which no import line of the section names"


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.id)
def test_each_row_trains_as_printed(variant, tmp_path):
    if "masks.pt" in " ".join(variant.setup):  # the section's recipe, on the model the ranks build
        here = os.getcwd()
        os.chdir(tmp_path)
        try:
            torch.manual_seed(0)
            space: dict = {"model": small_cnn()}
            exec(imports(TEXT), space)
            exec(masks_recipe(TEXT), space)
        finally:
            os.chdir(here)
        assert (tmp_path / "masks.pt").is_file()
    results = run_ranks(_train_row, 2, variant, imports(TEXT), str(tmp_path), tmp_path=tmp_path, timeout=120)
    for result in results:
        assert all(math.isfinite(loss) for loss in result["losses"]), result["losses"]
    assert results[0]["accuracy"] == results[1]["accuracy"]  # summed over both ranks' halves
    assert results[0]["accuracy"] > UNTRAINED + 0.05, (variant.id, UNTRAINED, results[0])


def _renamed_keyword(code: str) -> tuple[str, str]:
    """``code`` with its first keyword argument renamed (``kw`` -> ``kw_renamed``), and that name."""
    tree = ast.parse(code)
    keyword = next(k for node in ast.walk(tree) if isinstance(node, ast.Call) for k in node.keywords if k.arg)
    keyword.arg = f"{keyword.arg}_renamed"
    return ast.unparse(tree), keyword.arg


def test_a_row_with_a_renamed_argument_fails(tmp_path):
    """The check can fail: a row whose constructor takes a keyword it no longer has is an error."""
    row = next(v for v in VARIANTS if v.method.startswith("DEF"))
    broken, keyword = _renamed_keyword(row.setup[0])
    with pytest.raises(AssertionError, match=f"unexpected keyword argument '{keyword}'"):
        run_ranks(
            _train_row, 2, Variant(row.method, (broken,), row.use), imports(TEXT), str(tmp_path),
            tmp_path=tmp_path, timeout=120,
        )  # fmt: skip


def test_the_parser_reads_a_row_as_its_lines():
    text = (
        "| method | two lines | example |\n|---|---|---|\n"
        '| X (a) | `s = A(b="|")`; `optimizer = s.optimizer(model, lr=0.1)` (`b`, `"b": 1`) or '
        "`s.install(ddp_model)` with `optimizer = torch.optim.SGD(ddp_model.parameters(), lr=1e-3)` "
        "| `x.py` |\n\nafter\n"
    )
    assert table_variants(text) == [
        Variant("X (a)", ('s = A(b="|")',), "optimizer = s.optimizer(model, lr=0.1)"),
        Variant(
            "X (a)", ('s = A(b="|")',), "s.install(ddp_model)",
            "optimizer = torch.optim.SGD(ddp_model.parameters(), lr=1e-3)",
        ),
    ]  # fmt: skip
